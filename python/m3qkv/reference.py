"""A torch port of m3qkv's CPU golden model (src/golden/, docs/contract.md).

Everything after the f32 accumulator is bit-exact with the golden model: each
rounding of the contract is reproduced exactly, on any device torch runs on:
  - f32 add/mul/div are torch's IEEE f32 ops (one kernel per op, so nothing is
    contracted into an FMA);
  - fma(a, b, c) is computed in f64: a·b is exact there, the sum is rounded to
    odd (TwoSum error term + one step), then rounded once to f32, which equals
    the correctly rounded f32 FMA (53 >= 24 + 2 bits);
  - rsqrt_rn is 1/sqrt in f64 rounded to f32, then corrected by deciding exactly
    on which side of 1/sqrt(t) each neighbouring midpoint lies (m²·t vs 1 with
    a Veltkamp split, no rounding);
  - x·rc rounded toward zero is the exact f64 product rounded to f32 and
    stepped one ulp toward zero when that moved away from zero;
  - the e4m3 / bf16 / e2m1 conversions are bit manipulations on int64.
The accumulator (mxfp8_acc; w8a16_acc for bf16 activations) is an f64 matmul
rounded once to f32: exact on the exact-data construction (make_exact_operands,
make_exact_bf16_activations), within f64 rounding otherwise.

Used by `python -m m3qkv.demo` and the tests; python/tests/test_reference.py
checks it against the C golden model byte for byte.
"""
from __future__ import annotations

import math

import torch

HEAD = 128
NVFP4_TOKEN_BYTES = 72
_RN_ONE_SIXTH = 0.16666667163372040  # RN(1/6) = 0x3E2AAAAB
_E4M3_LUT = None


# ---------------------------------------------------------------- helpers
def _u32(x: torch.Tensor) -> torch.Tensor:
    """f32 bits as non-negative int64."""
    return x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def _f32(u: torch.Tensor) -> torch.Tensor:
    """int64 holding f32 bits -> f32."""
    u = u & 0xFFFFFFFF
    return torch.where(u >= 2**31, u - 2**32, u).to(torch.int32).view(torch.float32)


def _u16_to_bf16(u: torch.Tensor) -> torch.Tensor:
    return torch.where(u >= 2**15, u - 2**16, u).to(torch.int16).view(torch.bfloat16)


def bf16_to_f32(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float32)  # exact


def f32_scalar(v: float) -> float:
    """v rounded to f32 (as a Python float)."""
    return torch.tensor(v, dtype=torch.float32).item()


def rcp_rn(v: float) -> float:
    """RN(1/v) in f32 (IEEE f32 division on the CPU)."""
    one = torch.tensor(1.0, dtype=torch.float32)
    return (one / torch.tensor(v, dtype=torch.float32)).item()


# ------------------------------------------------------------ arithmetic
def fma_f32(a: torch.Tensor, b, c) -> torch.Tensor:
    """Correctly rounded f32 a·b + c (one rounding), elementwise, broadcasting."""
    a = torch.as_tensor(a, dtype=torch.float32)
    dev = a.device
    b = torch.as_tensor(b, dtype=torch.float32, device=dev)
    c = torch.as_tensor(c, dtype=torch.float32, device=dev)
    p = a.double() * b.double()  # exact
    cd = c.double()
    s = p + cd
    bb = s - p
    err = (p - (s - bb)) + (cd - bb)  # TwoSum: s + err == p + cd exactly
    even = (s.view(torch.int64) & 1) == 0
    fix = (err != 0) & even & torch.isfinite(s) & torch.isfinite(err)
    inf = torch.full_like(s, math.inf)
    step = torch.nextafter(s, torch.where(err > 0, inf, -inf))
    return torch.where(fix, step, s).to(torch.float32)


def mul_rz(a: torch.Tensor, b) -> torch.Tensor:
    """a·b rounded toward zero (f32)."""
    b = torch.as_tensor(b, dtype=torch.float32, device=a.device)
    p = a.double() * b.double()
    f = p.to(torch.float32)
    away = f.double().abs() > p.abs()
    special = torch.isnan(p) | torch.isinf(p) | (p == 0)
    return torch.where(away & ~special, torch.nextafter(f, torch.zeros_like(f)), f)


def _mid_cmp(mid: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """sign(mid²·t - 1), exact. mid has <= 26 significant bits, t <= 24."""
    m2 = mid * mid  # <= 52 bits: exact
    g = m2 * 134217729.0  # Veltkamp split into two 26-bit halves
    hi = g - (g - m2)
    lo = m2 - hi
    td = t.double()
    x = hi * td  # exact (<= 50 bits)
    y = lo * td  # exact
    d = (x - 1.0) + y  # x - 1 exact (Sterbenz: x is within a few ulp of 1); the sum keeps the sign
    return torch.sign(d)


def rsqrt_rn(t: torch.Tensor) -> torch.Tensor:
    """Correctly rounded f32 1/sqrt(t); IEEE for NaN, negatives, ±0, +inf."""
    t = t.to(torch.float32)
    r = (1.0 / torch.sqrt(t.double())).to(torch.float32)
    ok = torch.isfinite(t) & (t > 0)
    r = torch.where(ok, r, torch.ones_like(r))
    tt = torch.where(ok, t, torch.ones_like(t))
    inf = torch.full_like(r, math.inf)
    zero = torch.zeros_like(r)
    for _ in range(4):
        up = torch.nextafter(r, inf)
        dn = torch.nextafter(r, zero)
        hi = (up.double() + r.double()) * 0.5
        lo = (dn.double() + r.double()) * 0.5
        go_up = _mid_cmp(hi, tt) <= 0
        go_dn = ~go_up & (_mid_cmp(lo, tt) >= 0)
        r = torch.where(go_up, up, torch.where(go_dn, dn, r))
    nan = torch.full_like(r, math.nan)
    out = torch.where(ok, r, nan)
    out = torch.where(t == 0, torch.copysign(inf, t), out)
    out = torch.where(torch.isinf(t) & (t > 0), zero, out)
    return out


# ----------------------------------------------------------- conversions
def f32_to_bf16(x: torch.Tensor) -> torch.Tensor:
    """cvt.rn.bf16.f32: RN-even, overflow to inf, any NaN -> 0x7FFF."""
    u = _u32(x.to(torch.float32))
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
    r = torch.where((u & 0x7FFFFFFF) > 0x7F800000, torch.full_like(r, 0x7FFF), r)
    return _u16_to_bf16(r)


def bf16_ulps_at_head_scale(want: torch.Tensor, got: torch.Tensor) -> torch.Tensor:
    """|got - want| of bf16 head rows [..., 128·h] in bf16 ulps at each element's
    scale: the larger of |want| and its head row's RMS. An accumulator that is
    not exact (random data, f32 against the f64 reference) moves every output
    by a tiny amount at the row's scale; where RoPE cancels (a·cos - b·sin near
    0) that amount is many ulps of the small result itself, so ulps of |want|
    alone flag correct kernels (159 of them on a simulated 2^-22 accumulator
    error, 1 at the row scale)."""
    a, b = want.float(), got.float()
    rows = a.reshape(-1, HEAD)
    rms = rows.pow(2).mean(-1, keepdim=True).sqrt().expand_as(rows).reshape(a.shape)
    scale = torch.maximum(a.abs(), rms).clamp(min=2.0 ** -120)
    return (a - b).abs() / torch.exp2(torch.floor(torch.log2(scale)) - 7)


def f32_to_e4m3(x: torch.Tensor) -> torch.Tensor:
    """cvt.rn.satfinite.e4m3x2.f32 as uint8 codes: RN-even (subnormals down to
    2^-9), |x| >= 448 and ±inf -> ±448, any NaN -> 0x7F."""
    x = x.to(torch.float32)
    u = _u32(x)
    sign = (u >> 24) & 0x80
    a = u & 0x7FFFFFFF
    e = a >> 23
    lsb = (a >> 20) & 1
    normal = ((a + 0x7FFFF + lsb) >> 20) - (120 << 3)
    scaled = _f32(a) * 512.0  # exact
    k = torch.floor(scaled)
    frac = scaled - k
    ki = k.to(torch.int64)
    ki = ki + ((frac > 0.5) | ((frac == 0.5) & (ki % 2 == 1))).to(torch.int64)
    code = torch.where(e >= 121, normal, ki)
    code = torch.where(a >= 0x43E00000, torch.full_like(code, 0x7E), code)
    code = sign | code
    code = torch.where(a > 0x7F800000, torch.full_like(code, 0x7F), code)
    return code.to(torch.uint8)


def _e4m3_lut(device) -> torch.Tensor:
    global _E4M3_LUT
    if _E4M3_LUT is None:
        vals = []
        for b in range(256):
            s = -1.0 if b & 0x80 else 1.0
            e, m = (b >> 3) & 0xF, b & 7
            if e == 0xF and m == 7:
                vals.append(math.nan)
            elif e == 0:
                vals.append(s * m / 512.0)
            else:
                vals.append(s * (1.0 + m / 8.0) * 2.0 ** (e - 7))
        _E4M3_LUT = torch.tensor(vals, dtype=torch.float32)
    return _E4M3_LUT.to(device)


def e4m3_to_f32(b: torch.Tensor) -> torch.Tensor:
    """uint8 (or float8_e4m3fn) codes -> f32, exact."""
    if b.dtype != torch.uint8:
        b = b.view(torch.uint8)
    return _e4m3_lut(b.device)[b.long()]


def f32_to_e2m1(x: torch.Tensor) -> torch.Tensor:
    """cvt.rn.satfinite.e2m1x2.f32 codes (int64, sign in bit 3): RN-even on
    {0, .5, 1, 1.5, 2, 3, 4, 6}, saturating at 6, NaN -> +6 (0x7)."""
    u = _u32(x)
    sign = (u >> 28) & 0x8
    a = x.abs()
    c = torch.zeros_like(u)
    for thr, inclusive, code in [(0.25, True, 1), (0.75, False, 2), (1.25, True, 3), (1.75, False, 4),
                                 (2.5, True, 5), (3.5, False, 6), (5.0, True, 7)]:
        c = torch.where((a > thr) if inclusive else (a >= thr), torch.full_like(c, code), c)
    c = sign | c
    return torch.where(torch.isnan(x), torch.full_like(c, 0x7), c)


_E2M1_MAG = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def e2m1_to_f32(c: torch.Tensor) -> torch.Tensor:
    lut = torch.tensor(_E2M1_MAG + [-v for v in _E2M1_MAG], dtype=torch.float32, device=c.device)
    return lut[c.long() & 0xF]


# ----------------------------------------------------------------- MXFP8
def f8_128x4_bytes(rows: int, cols: int) -> int:
    return (rows + 127) // 128 * 128 * ((cols + 3) // 4 * 4)


def f8_128x4_offsets(rows: int, cols: int, device=None) -> torch.Tensor:
    """Byte offset of scale (r, c) in the F8_128x4 layout, int64 [rows, cols]."""
    r = torch.arange(rows, device=device).view(-1, 1)
    c = torch.arange(cols, device=device).view(1, -1)
    kt = (cols + 3) // 4
    return ((r // 128) * kt + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + (c % 4)


def swizzle_scales(sf: torch.Tensor, pad: int = 0x7F) -> torch.Tensor:
    """uint8 [rows, cols] -> the F8_128x4 buffer (padding bytes = `pad`)."""
    rows, cols = sf.shape
    out = torch.full((f8_128x4_bytes(rows, cols),), pad, dtype=torch.uint8, device=sf.device)
    out[f8_128x4_offsets(rows, cols, sf.device).reshape(-1)] = sf.reshape(-1)
    return out


def unswizzle_scales(buf: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    return buf.reshape(-1).view(torch.uint8)[f8_128x4_offsets(rows, cols, buf.device)]


def mxfp8_quantize(x: torch.Tensor):
    """bf16 [M, K] -> (xq uint8 [M, K], xsf uint8 F8_128x4 buffer), OCP MX rule
    of m3qkv_quantize_args; padding scale bytes are 0x7F."""
    m, k = x.shape
    xf = x.to(torch.float32).view(m, k // 32, 32)
    a = xf.abs()
    amax = torch.where(torch.isnan(a), torch.zeros_like(a), a).amax(dim=-1)
    bits = _u32(amax)
    be = bits >> 23
    # floor(log2(amax)) from the bits; a subnormal's is -149 + its top set bit
    top = torch.zeros_like(bits)
    for b in range(1, 23):
        top = torch.where(bits >= (1 << b), torch.full_like(top, b), top)
    fl = torch.where(be != 0, be - 127, -149 + top)
    e = (fl - 8).clamp(-127, 127)
    e = torch.where(amax > 0, e, torch.full_like(e, -127))
    e = torch.where(torch.isinf(amax), torch.full_like(e, 127), e)
    # 2^-e as f32 bits, exact: normal for -e >= -126, 2^-127 = 0x00400000
    scale = _f32(torch.where(-e >= -126, (127 - e) << 23, torch.full_like(e, 0x00400000)))
    q = f32_to_e4m3(xf * scale.unsqueeze(-1)).view(m, k)
    sf = (e + 127).to(torch.uint8)
    return q, swizzle_scales(sf)


def mxfp8_decode(q: torch.Tensor, sf_buf: torch.Tensor, rows: int, k: int) -> torch.Tensor:
    """MXFP8 operand -> f64 [rows, k] (exact)."""
    s = unswizzle_scales(sf_buf, rows, k // 32).to(torch.float64)
    sc = torch.where(s == 255, torch.full_like(s, math.nan), torch.exp2(s - 127))
    v = e4m3_to_f32(q.reshape(rows, k)).double().view(rows, k // 32, 32)
    return (v * sc.unsqueeze(-1)).view(rows, k)


def fold_fp8(q: torch.Tensor, sf_buf: torch.Tensor, rows: int, k: int):
    """m3qkv_prepare_weights_fp8 (docs/contract.md §3.9) -> (q' uint8 [rows, k], the
    F8_128x4 buffer with each 128-K group's largest block byte in its four blocks):
    each block's values times 2^(e - E), rounded to e4m3 (RN-even, satfinite); NaN
    codes kept; a group with a 0xFF byte left as it is."""
    s = unswizzle_scales(sf_buf, rows, k // 32).to(torch.int64).view(rows, k // 128, 4)
    big = s.amax(dim=-1, keepdim=True)
    nan_group = (s == 255).any(dim=-1, keepdim=True)
    big = torch.where(nan_group, torch.full_like(big, 255), big)
    shift = (big - s).clamp(max=32).view(rows, k // 32, 1)
    qb = q.reshape(rows, k).view(torch.uint8)
    v = e4m3_to_f32(qb).view(rows, k // 32, 32) * torch.exp2(-shift.to(torch.float32))
    out = f32_to_e4m3(v).view(rows, k)
    keep = ((qb & 0x7F) == 0x7F) | nan_group.expand(rows, k // 128, 4).reshape(rows, k // 32, 1).expand(
        rows, k // 32, 32).reshape(rows, k)
    out = torch.where(keep, qb, out)
    sf = big.expand(rows, k // 128, 4).reshape(rows, k // 32).to(torch.uint8)
    return out, swizzle_scales(sf)


def mxfp8_acc(xq, xsf, wq, wsf) -> torch.Tensor:
    """The f32 accumulator [M, N]: f64 matmul of the decoded operands, rounded
    once. Exact (order-independent) on the exact-data construction."""
    m, k = xq.shape
    n = wq.shape[0]
    return (mxfp8_decode(xq, xsf, m, k) @ mxfp8_decode(wq, wsf, n, k).T).to(torch.float32)


def w8a16_acc(x_bf16, wq, wsf) -> torch.Tensor:
    """The f32 accumulator [M, N] with bf16 activations (x_bf16 [M, K], W8A16):
    f64 matmul of float(x_bf16) and the decoded weight, rounded once (every
    product is exact in f64), as the golden model's w8a16_acc."""
    m, k = x_bf16.shape
    n = wq.shape[0]
    return (x_bf16.double() @ mxfp8_decode(wq, wsf, n, k).T).to(torch.float32)


def dequantize_activations(xq, xsf) -> torch.Tensor:
    """bf16 [M, K] holding exactly the values of the MXFP8 activations (xq, xsf):
    w8a16_acc on it equals mxfp8_acc on them bit for bit. Raises ValueError when
    a value is not exact in bf16 (scales outside the quantizer's range)."""
    m, k = xq.shape
    v = mxfp8_decode(xq, xsf, m, k)
    x = v.to(torch.bfloat16)
    bad = ~((x.double() == v) | (torch.isnan(v) & torch.isnan(x.double())))
    if bool(bad.any()):
        i = int(bad.flatten().nonzero()[0])
        raise ValueError(f"dequantize_activations: element {i} = {float(v.flatten()[i])!r} is not exact in bf16")
    return x


# -------------------------------------------------------------- epilogue
def head_rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma RMSNorm of head rows x f32 [..., 128] with bf16 weight w [128]."""
    shp = x.shape
    # class cls(c) = (c >> 1) & 3: column c = 8j + 2·cls + b; ascending order per class = (j, b)
    xs = x.reshape(-1, 16, 4, 2).permute(0, 2, 1, 3).reshape(-1, 4, 32)
    s = torch.zeros(xs.shape[:2], dtype=torch.float32, device=x.device)
    for i in range(32):
        s = fma_f32(xs[..., i], xs[..., i], s)
    total = (s[:, 0] + s[:, 1]) + (s[:, 2] + s[:, 3])
    t = fma_f32(total, 0.0078125, f32_scalar(eps))
    r = rsqrt_rn(t).view(-1, 1)
    n = x.reshape(-1, HEAD) * r
    y = fma_f32(n, w.to(torch.float32), n)
    return y.view(shp)


def head_rope(y: torch.Tensor, cs: torch.Tensor) -> torch.Tensor:
    """NeoX RoPE on columns 0..63 of y f32 [T, H, 128]; cs f32 [T, 64]."""
    u, v = y[..., :32], y[..., 32:64]
    co, si = cs[:, None, :32], cs[:, None, 32:]
    a = fma_f32(u, co, -(v * si))
    b = fma_f32(v, co, u * si)
    return torch.cat([a, b, y[..., 64:]], dim=-1)


def nvfp4_quant(y: torch.Tensor, sf: float | None):
    """NVFP4 of head rows y f32 [R, 128] -> (data uint8 [R, 64], scales uint8 [R, 8])."""
    g = y.view(-1, 8, 16)
    a = g.abs()
    amax = torch.where(torch.isnan(a), torch.zeros_like(a), a).amax(dim=-1)
    s = amax * f32_scalar(_RN_ONE_SIXTH)
    if sf is not None:
        s = s * sf
    s = torch.maximum(s, torch.full_like(s, 2.0 ** -9))
    s8 = f32_to_e4m3(s)
    rc = 1.0 / e4m3_to_f32(s8)
    if sf is not None:
        rc = rc * sf
    codes = f32_to_e2m1(mul_rz(g, rc.unsqueeze(-1)))
    codes = torch.where((codes & 7) == 0, torch.zeros_like(codes), codes).view(-1, 128)
    data = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    return data, s8


def _flat_bytes(cache: torch.Tensor, span: int) -> torch.Tensor:
    """A 1-D uint8 view of `span` bytes from the start of `cache`."""
    u8 = cache.view(torch.uint8) if cache.dtype != torch.uint8 else cache
    return torch.as_strided(u8, (span,), (1,), u8.storage_offset())


def last_sharer(slots):
    """Whether each token is the last of the call to name its slot
    (docs/contract.md §4.4: it alone writes the slot's row)."""
    m = slots.numel()
    if m == 0:
        return torch.ones(0, dtype=torch.bool, device=slots.device)
    _, inv = torch.unique(slots, return_inverse=True)
    idx = torch.arange(m, device=slots.device)
    last = torch.full((int(inv.max()) + 1,), -1, dtype=torch.int64, device=slots.device)
    last = last.scatter_reduce(0, inv, idx, reduce="amax")
    return last[inv] == idx


def _store_nvfp4(flat, page_stride, block_size, slot_in_page, slots, data, scales, v_swizzle):
    """Writes rows (data [T, 64], scales [T, 8]) at cache slot ids `slots` [T]."""
    if slots.numel() == 0:
        return
    page, t = slots // block_size, slots % block_size
    base = page * page_stride + slot_in_page * block_size * NVFP4_TOKEN_BYTES
    d = base[:, None] + t[:, None] * 64 + torch.arange(64, device=slots.device)[None, :]
    flat[d.reshape(-1)] = data.reshape(-1)
    gidx = torch.arange(8, device=slots.device)[None, :]
    tt = t[:, None]
    if v_swizzle:
        so = ((tt // 4) * 4 + gidx // 2) * 8 + (gidx % 2) * 4 + tt % 4
    else:
        so = tt * 8 + gidx
    flat[(base[:, None] + block_size * 64 + so).reshape(-1)] = scales.reshape(-1)


def epilogue(acc: torch.Tensor, *, nq: int, nkv: int, niq: int, nik: int, positions, cos_sin_cache,
             q_norm_weight, k_norm_weight, index_q_norm_weight=None, index_k_norm_weight=None, eps: float,
             slot_mapping, index_slot_mapping=None, kv_cache, index_cache=None, q_out=None, q_fp8_out=None,
             index_q_out=None, q_fp8_scale: float = 1.0, k_scale: float = 1.0, v_scale: float = 1.0,
             v_cache=None) -> int:
    """The epilogue of the contract on acc f32 [M, N], writing the given output
    tensors in place exactly as the golden model does (NVFP4 caches: kv_cache
    uint8 [nb, 2·nkv, bs, 72] and index_cache uint8 [nb, bs, 72] at any page
    stride; FP8/BF16 caches of docs/contract.md §4.3 in the vLLM flash layouts, as the
    Python op takes them; skipped and out-of-range slots untouched). Returns
    the M3QKV_FLAG_* bits."""
    m = acc.shape[0]
    dev = acc.device
    flags = 0
    if m == 0:
        return 0
    acc = acc.view(m, -1, HEAD).to(torch.float32)
    maxp = cos_sin_cache.shape[0]
    pos = positions.to(torch.int64)
    if bool(((pos < 0) | (pos >= maxp)).any()):
        flags |= 0x4
    cs = bf16_to_f32(cos_sin_cache)[pos.clamp(0, maxp - 1)]
    o = 0

    def normed(h0, nh, w):
        return head_rope(head_rms(acc[:, h0:h0 + nh], w, eps), cs)

    yq = normed(0, nq, q_norm_weight)
    if q_out is not None:
        q_out.view(m, nq * HEAD).copy_(f32_to_bf16(yq).view(m, nq * HEAD))
    if q_fp8_out is not None:
        qinv = rcp_rn(q_fp8_scale)
        q_fp8_out.view(torch.uint8).view(m, nq * HEAD).copy_(f32_to_e4m3(yq * qinv).view(m, nq * HEAD))
    o = nq
    nvfp4 = kv_cache.dtype == torch.uint8
    # NVFP4 [nb, 2·nkv, bs, 72]; FP8/BF16 [nb, 2, bs, nkv, 128] or [nb, bs, nkv, 128] + v_cache
    bs = kv_cache.shape[2] if nvfp4 or kv_cache.dim() == 5 else kv_cache.shape[1]
    nb = kv_cache.shape[0]
    slots = slot_mapping.to(torch.int64)
    if bool((slots >= nb * bs).any()):
        flags |= 0x1
    wr = (slots >= 0) & (slots < nb * bs) & last_sharer(slots)
    rows = torch.nonzero(wr).view(-1)
    ksf, vsf = rcp_rn(k_scale), rcp_rn(v_scale)
    yk = normed(o, nkv, k_norm_weight)
    if nvfp4:
        kv_stride = kv_cache.stride(0)
        kv_flat = _flat_bytes(kv_cache, (nb - 1) * kv_stride + 2 * nkv * bs * NVFP4_TOKEN_BYTES)
        for h in range(nkv):
            d, s = nvfp4_quant(yk[rows, h], ksf)
            _store_nvfp4(kv_flat, kv_stride, bs, 2 * h, slots[rows], d, s, False)
            d, s = nvfp4_quant(acc[rows, o + nkv + h], vsf)
            _store_nvfp4(kv_flat, kv_stride, bs, 2 * h + 1, slots[rows], d, s, True)
    else:
        kc, vc = (kv_cache[:, 0], kv_cache[:, 1]) if kv_cache.dim() == 5 else (kv_cache, v_cache)
        sl = slots[rows]
        page, t = sl // bs, sl % bs
        kc[page, t] = _dense(yk[rows], kv_cache.dtype, ksf)
        vc[page, t] = _dense(acc[rows, o + nkv:o + 2 * nkv], kv_cache.dtype, vsf)
    o += 2 * nkv
    if niq:
        yiq = normed(o, niq, index_q_norm_weight)
        index_q_out.view(torch.uint8).view(m, niq * HEAD).copy_(f32_to_e4m3(yiq).view(m, niq * HEAD))
        o += niq
    if nik:
        islots = index_slot_mapping.to(torch.int64)
        inb = index_cache.shape[0]
        if bool((islots >= inb * bs).any()):
            flags |= 0x2
        irows = torch.nonzero((islots >= 0) & (islots < inb * bs) & last_sharer(islots)).view(-1)
        yik = normed(o, 1, index_k_norm_weight)
        if index_cache.dtype == torch.uint8:
            ix_stride = index_cache.stride(0)
            ix_flat = _flat_bytes(index_cache, (inb - 1) * ix_stride + bs * NVFP4_TOKEN_BYTES)
            d, s = nvfp4_quant(yik[irows, 0], None)
            _store_nvfp4(ix_flat, ix_stride, bs, 0, islots[irows], d, s, False)
        else:
            sl = islots[irows]
            index_cache[sl // bs, sl % bs] = _dense(yik[irows, 0], index_cache.dtype, None)
    return flags


def _dense(v: torch.Tensor, dtype, sf: float | None) -> torch.Tensor:
    """FP8 / BF16 cache values (docs/contract.md §4.3): e4m3_satfinite_rn(v · sf) (sf = None:
    unit scale), or bf16_rn(v) (scales ignored)."""
    if dtype == torch.bfloat16:
        return f32_to_bf16(v)
    return f32_to_e4m3(v * sf if sf is not None else v).view(torch.float8_e4m3fn)


def decode_nvfp4(cache: torch.Tensor, slot_in_page: int, slots: torch.Tensor, v_swizzle: bool,
                 sf: float | None) -> torch.Tensor:
    """Tokens at slot ids `slots` of one NVFP4 slot kind -> f32 [T, 128]
    (e2m1 · scale / sf; sf = RN(1/k_scale) etc., None for index_k)."""
    nb, bs = cache.shape[0], cache.shape[-2]
    stride = cache.stride(0)
    nslots = cache.shape[1] if cache.dim() == 4 else 1
    flat = _flat_bytes(cache, (nb - 1) * stride + nslots * bs * NVFP4_TOKEN_BYTES)
    page, t = slots // bs, slots % bs
    base = page * stride + slot_in_page * bs * NVFP4_TOKEN_BYTES
    data = flat[base[:, None] + t[:, None] * 64 + torch.arange(64, device=slots.device)].long()
    codes = torch.stack([data & 0xF, data >> 4], dim=-1).view(-1, 128)
    g = torch.arange(8, device=slots.device)[None, :]
    tt = t[:, None]
    so = (((tt // 4) * 4 + g // 2) * 8 + (g % 2) * 4 + tt % 4) if v_swizzle else tt * 8 + g
    sc = e4m3_to_f32(flat[base[:, None] + bs * 64 + so])
    v = e2m1_to_f32(codes).view(-1, 8, 16) * sc.unsqueeze(-1)
    if sf is not None:
        v = v / sf
    return v.view(-1, 128)


# ------------------------------------------------- exact-data construction
def make_exact_operands(m: int, k: int, n: int, generator: torch.Generator, device=None):
    """MXFP8 operands on which every partial sum of every dot product, in any
    order, is exactly representable with 12 significant bits (the recipe of
    tests/common/problem.cpp): x and w elements in {±1, ±2}, x sparse (1 to 127
    nonzeros per row), scales 2^(base + {0, 1}) with bases in [-2, 1] per x row
    and per w head of 128 rows. Any products are integer multiples of the row's
    smallest product p_min, |product| <= 16·p_min, so |partial sum| <= 127·16·p_min
    < 2^11·p_min. Returns (xq, xsf, wq, wsf) as uint8 on `device`."""
    g = generator

    def codes(shape):
        r = torch.randint(0, 4, shape, generator=g)
        return torch.where((r & 1) == 1, 0x40, 0x38) | torch.where((r & 2) == 2, 0x80, 0)

    cols = k // 32
    xq = torch.zeros(m, k, dtype=torch.int64)
    nnz = torch.randint(1, 128, (m,), generator=g).clamp(max=k)
    for r in range(m):
        idx = torch.randperm(k, generator=g)[: int(nnz[r])]
        xq[r, idx] = codes((int(nnz[r]),))
    bx = torch.randint(-2, 2, (m, 1), generator=g)
    xsf = (127 + bx + torch.randint(0, 2, (m, cols), generator=g)).to(torch.uint8)
    wq = codes((n, k))
    bw = torch.randint(-2, 2, ((n + 127) // 128, 1), generator=g).repeat_interleave(128, dim=0)[:n]
    wsf = (127 + bw + torch.randint(0, 2, (n, cols), generator=g)).to(torch.uint8)
    return (xq.to(torch.uint8).to(device), swizzle_scales(xsf).to(device),
            wq.to(torch.uint8).to(device), swizzle_scales(wsf).to(device))


def make_exact_bf16_activations(m: int, k: int, generator: torch.Generator, device=None) -> torch.Tensor:
    """bf16 activations [M, K] for the exact-data weights of make_exact_operands
    (the recipe of tests/common/problem.cpp with cfg.x_bf16): per row a base
    bx in [-2, 1] and 1 to 127 nonzeros ±j·2^(bx − 6), j in [1, 255] (up to 8
    significant bits, exact in bf16). Every product with an exact weight is an
    integer multiple j·w of p_min = 2^(bx − 6 + bw), j·w <= 1020, so every
    partial sum is an integer < 127·1020 < 2^17 times p_min: exact in f32 in
    any order."""
    g = generator
    x = torch.zeros(m, k, dtype=torch.float64)
    nnz = torch.randint(1, 128, (m,), generator=g).clamp(max=k)
    bx = torch.randint(-2, 2, (m,), generator=g)
    for r in range(m):
        idx = torch.randperm(k, generator=g)[: int(nnz[r])]
        j = torch.randint(1, 256, (int(nnz[r]),), generator=g).double()
        sign = torch.where(torch.randint(0, 2, (int(nnz[r]),), generator=g) == 1, -1.0, 1.0)
        x[r, idx] = sign * j * 2.0 ** (int(bx[r]) - 6)
    return x.to(torch.bfloat16).to(device)


def rope_table(max_position: int, device=None) -> torch.Tensor:
    """bf16 [max_position, 64] NeoX cos/sin table (theta 10000, 64 rotary dims)."""
    pos = torch.arange(max_position, dtype=torch.float64).view(-1, 1)
    inv = 10000.0 ** (-2.0 * torch.arange(32, dtype=torch.float64) / 64.0)
    ang = pos * inv
    return torch.cat([torch.cos(ang), torch.sin(ang)], dim=1).to(torch.float32).to(torch.bfloat16).to(device)


def unique_slots(m: int, capacity: int, generator: torch.Generator, skip: float = 0.125) -> torch.Tensor:
    """m distinct slot ids from [0, capacity), a fraction `skip` of them -1."""
    s = torch.randperm(capacity, generator=generator)[:m]
    drop = torch.rand(m, generator=generator) < skip
    return torch.where(drop, torch.full_like(s, -1), s)
