"""bf16 activations (x_bf16, W8A16; issue 28 item 2) in the Python ops.

CPU (meta tensors through the fake kernels, which run the same checks as the
CUDA kernels, and the C library's host-side validation): the schemas keep
every earlier call binding and append `Tensor? x_bf16=None`; exactly one of
x_bf16 and (xq, xsf), named errors for every misuse; the ctypes mirror and
the loaded library agree on the new struct sizes; the C library rejects both /
neither / misaligned and reads x_bf16 as NULL at the 0.2 struct size; the
torch reference (w8a16_acc, dequantize_activations, the exact bf16 recipe)
against the C golden model and an f64 sum.
GPU (marked gpu): fused_qkv and mxfp8_gemm with x_bf16 bit-exact against the
reference on exact data (poisoned outputs, every path: module function,
dispatcher op, full-check kernel), x_bf16 = the dequantized xq writes the bytes
of the MXFP8 call, random data within 1e-5.
"""
import ctypes

import pytest
import torch

import m3qkv
from m3qkv import _capi, _ops
from m3qkv import reference as ref
from problems import diff_outputs, make_outputs, make_problem
from test_errors import K, M, base

E4M3 = torch.float8_e4m3fn
POISON = 0x5A


def bf16_base(dev="meta", **kw):
    a, k = base(dev, **kw)
    m = a["xq"].shape[0]
    a = dict(a, xq=None, xsf=None)
    k = dict(k, x_bf16=torch.empty(m, K, dtype=torch.bfloat16, device=dev))
    return a, k


def call(a, kw):
    torch.ops.m3qkv.fused_qkv(*a.values(), **kw)


# ------------------------------------------------------------------ schema
def test_schema_appends_an_optional_x_bf16():
    s = torch.ops.m3qkv.fused_qkv.default._schema
    names = [x.name for x in s.arguments]
    assert names[-1] == "x_bf16" and s.arguments[-1].kwarg_only
    assert str(s.arguments[-1].type) == "Optional[Tensor]"
    assert s.arguments[-1].default_value is None
    assert names[:4] == ["xq", "xsf", "wq", "wsf"]  # positions unchanged: old calls bind as before
    assert str(s.arguments[0].type) == "Optional[Tensor]" and str(s.arguments[1].type) == "Optional[Tensor]"
    assert all(not x.alias_info for x in s.arguments[:4] + [s.arguments[-1]]), "inputs, never written"
    g = torch.ops.m3qkv.mxfp8_gemm.default._schema
    assert [x.name for x in g.arguments] == ["xq", "xsf", "wq", "wsf", "use_pdl", "grid", "x_bf16"]
    assert str(g.arguments[-1].type) == "Optional[Tensor]" and g.arguments[-1].kwarg_only


def test_valid_calls_trace():
    call(*bf16_base())
    a, kw = bf16_base(layout=(8, 2, 0, 0))
    call(a, dict(kw, nq=8, nkv=2, niq=0, nik=0))
    call(*base())  # the MXFP8 call, unchanged
    a, _ = base()
    out = torch.ops.m3qkv.mxfp8_gemm(None, None, a["wq"], a["wsf"],
                                     x_bf16=torch.empty(M, K, dtype=torch.bfloat16, device="meta"))
    assert out.shape == (M, 2560) and out.dtype == torch.bfloat16 and out.device.type == "meta"


# ------------------------------------------------------------------ errors
CASES = [
    ("x_bf16 and xq", lambda a, k: a.update(xq=torch.empty(M, K, dtype=E4M3, device="meta")),
     "x_bf16 and xq are given: pass either x_bf16 (bf16 activations [M, K]) or xq and xsf"),
    ("x_bf16 and both", lambda a, k: a.update(xq=torch.empty(M, K, dtype=E4M3, device="meta"),
                                              xsf=torch.empty(1024, dtype=torch.uint8, device="meta")),
     "x_bf16 and xq and xsf are given"),
    ("x_bf16 and xsf", lambda a, k: a.update(xsf=torch.empty(1024, dtype=torch.uint8, device="meta")),
     "x_bf16 and xsf are given"),
    ("neither", lambda a, k: k.update(x_bf16=None), "xq is required (or bf16 activations as x_bf16="),
    ("x_bf16 dtype", lambda a, k: k.update(x_bf16=torch.empty(M, K, dtype=torch.float16, device="meta")),
     "x_bf16 must have dtype torch.bfloat16"),
    ("x_bf16 3-D", lambda a, k: k.update(x_bf16=torch.empty(1, M, K, dtype=torch.bfloat16, device="meta")),
     "x_bf16 must be 2-D"),
    ("x_bf16 strided", lambda a, k: k.update(x_bf16=torch.empty(K, M, dtype=torch.bfloat16, device="meta").t()),
     "x_bf16 must be contiguous"),
    ("x_bf16 K", lambda a, k: k.update(x_bf16=torch.empty(M, 128, dtype=torch.bfloat16, device="meta")),
     "wq must be [N, K = 128] (K-major, K as in x_bf16)"),
    ("x_bf16 M", lambda a, k: k.update(x_bf16=torch.empty(M + 1, K, dtype=torch.bfloat16, device="meta")),
     "positions must have shape [6] (one per token)"),
    ("device mix", lambda a, k: k.update(slot_mapping=torch.empty(M, dtype=torch.int64)),
     "slot_mapping is on cpu, but x_bf16 is on meta"),
]


@pytest.mark.parametrize("desc,mutate,message", CASES, ids=[c[0] for c in CASES])
def test_argument_error(desc, mutate, message):
    a, kw = bf16_base()
    mutate(a, kw)
    with pytest.raises(ValueError) as e:
        call(a, kw)
    assert message in str(e.value), f"{desc}: got {e.value}"
    assert str(e.value).startswith("m3qkv.fused_qkv: ")


def test_bf16_tensor_as_xq_says_where_it_goes():
    a, kw = base()
    a.update(xq=torch.empty(M, K, dtype=torch.bfloat16, device="meta"), xsf=None)
    with pytest.raises(ValueError, match=r"xq must have dtype torch.float8_e4m3fn .* pass bf16 activations as x_bf16="):
        call(a, kw)
    a, kw = base()
    a.update(xsf=None)
    with pytest.raises(ValueError, match=r"m3qkv.fused_qkv: xsf is required with xq"):
        call(a, kw)


def test_gemm_errors():
    a, _ = base()
    xb = torch.empty(M, K, dtype=torch.bfloat16, device="meta")
    with pytest.raises(ValueError, match=r"m3qkv.mxfp8_gemm: x_bf16 and xq and xsf are given"):
        torch.ops.m3qkv.mxfp8_gemm(a["xq"], a["xsf"], a["wq"], a["wsf"], x_bf16=xb)
    with pytest.raises(ValueError, match=r"m3qkv.mxfp8_gemm: xq is required \(or bf16 activations as x_bf16="):
        torch.ops.m3qkv.mxfp8_gemm(None, None, a["wq"], a["wsf"])
    with pytest.raises(ValueError, match=r"m3qkv.mxfp8_gemm: x_bf16 must have dtype torch.bfloat16"):
        torch.ops.m3qkv.mxfp8_gemm(None, None, a["wq"], a["wsf"], x_bf16=xb.to(torch.float32))
    with pytest.raises(ValueError, match=r"m3qkv.mxfp8_gemm: wq is on cpu, but x_bf16 is on meta"):
        torch.ops.m3qkv.mxfp8_gemm(None, None, torch.empty(2560, K, dtype=E4M3), a["wsf"], x_bf16=xb)


def test_cpu_tensors_are_refused_by_name():
    a, kw = bf16_base("cpu")
    with pytest.raises(ValueError, match=r"m3qkv.fused_qkv: the tensors must be CUDA tensors, got device cpu"):
        m3qkv.fused_qkv(*a.values(), **kw)
    with pytest.raises(ValueError, match=r"m3qkv.mxfp8_gemm: the tensors must be CUDA tensors"):
        m3qkv.mxfp8_gemm(None, None, a["wq"], a["wsf"], x_bf16=kw["x_bf16"])


# ------------------------------------------------------------ C library
def test_library_speaks_the_new_structs():
    lib = m3qkv.library()
    assert lib.x_bf16 and lib.cache_formats
    assert lib.fused_struct_size == ctypes.sizeof(_capi.FusedArgs) == 312
    assert lib.gemm_struct_size == ctypes.sizeof(_capi.GemmArgs) == 88
    assert _capi.FusedArgs.x_bf16.offset == 296 and _capi.GemmArgs.x_bf16.offset == 80


def host_struct(a, kw):
    """The m3qkv_fused_args of a CPU-tensor call (host pointers): used only
    with a defect that validation rejects, so nothing is ever launched."""
    _, s = _ops.fused_qkv_args(*a.values(), **kw)
    return s


def c_status(s, size=None):
    lib = m3qkv.library()
    s.struct_size = size or ctypes.sizeof(_capi.FusedArgs)
    st = lib.fused_qkv(ctypes.addressof(s), None)
    return st, (lib.last_error() or b"").decode()


def test_c_rules_both_neither_misaligned():
    a, kw = bf16_base("cpu")
    s = host_struct(a, kw)
    assert s.x_bf16 == kw["x_bf16"].data_ptr() and not s.xq and not s.xsf
    s.q_out = s.q_out + 2  # misaligned: validation stops there at the latest (nothing launches)
    x = kw["x_bf16"]
    s.xq = x.data_ptr()  # both
    st, msg = c_status(s)
    assert st == _capi.ERROR_INVALID_ARGUMENT
    assert f"x_bf16 = 0x{x.data_ptr():x} and xq = 0x{x.data_ptr():x}" in msg and "exactly one of x_bf16" in msg
    s.xq, s.x_bf16 = None, None  # neither
    st, msg = c_status(s)
    assert st == _capi.ERROR_NULL_POINTER and "xq = NULL, xsf = NULL and x_bf16 = NULL" in msg
    s.x_bf16 = x.data_ptr() + 8  # misaligned x_bf16
    st, msg = c_status(s)
    assert st == _capi.ERROR_MISALIGNED and f"x_bf16 = 0x{x.data_ptr() + 8:x} is not 16-byte aligned" in msg


def test_c_reads_x_bf16_as_null_at_the_0_2_size():
    """Both operands given: refused at 312 bytes; at 0.2's 296 bytes x_bf16 is
    not read, so the call gets past that rule to the misaligned q_out."""
    a, kw = base("cpu", m=7)
    s = host_struct(a, kw)
    s.x_bf16 = kw["q_out"].data_ptr()
    s.q_out = s.q_out + 2
    st, msg = c_status(s, 312)
    assert st == _capi.ERROR_INVALID_ARGUMENT and "exactly one of x_bf16" in msg
    st, msg = c_status(s, 296)
    assert st == _capi.ERROR_MISALIGNED and "q_out = 0x" in msg, msg
    st, msg = c_status(s, 300)
    assert st == _capi.ERROR_STRUCT_SIZE and "264 (m3qkv 0.1), 296 (m3qkv 0.2) or 312 (this version)" in msg


def test_c_gemm_rules():
    lib = m3qkv.library()
    g = _capi.GemmArgs()
    g.struct_size = lib.gemm_struct_size
    buf = torch.zeros(4096, dtype=torch.uint8)
    p = buf.data_ptr() + (-buf.data_ptr()) % 16
    g.m, g.n, g.k = 1, 128, 128
    g.xq, g.xsf, g.wq, g.wsf, g.out, g.x_bf16 = p, p, p, p, p + 1, p  # both (and a misaligned out)
    st = lib.mxfp8_gemm(ctypes.addressof(g), None)
    assert st == _capi.ERROR_INVALID_ARGUMENT and b"m3qkv_mxfp8_gemm: x_bf16 = 0x" in lib.last_error()
    g.struct_size = 80  # 0.1: x_bf16 not read; the misaligned out is next
    st = lib.mxfp8_gemm(ctypes.addressof(g), None)
    assert st == _capi.ERROR_MISALIGNED and b"out = 0x" in lib.last_error()


def test_full_checks_fill_x_bf16_and_the_fast_path_leaves_it_to_them():
    a, kw = bf16_base("cpu")
    _, s = _ops.fused_qkv_args(*a.values(), **kw)
    assert s.x_bf16 == kw["x_bf16"].data_ptr() and not s.xq and not s.xsf and s.k == K
    # the thread's struct is reused: the next MXFP8 call clears x_bf16
    a2, kw2 = base("cpu")
    _, s2 = _ops.fused_qkv_args(*a2.values(), **kw2)
    assert s2 is s and not s2.x_bf16 and s2.xq == a2["xq"].data_ptr()
    from test_fast_path import DEFAULTS, ORDER
    d = dict(DEFAULTS, **a2, **kw2)
    assert _ops.fused_fast_args(*(d[k] for k in ORDER)) is not None
    assert _ops.fused_fast_args(*(d[k] for k in ORDER), x_bf16=kw["x_bf16"]) is None


# ------------------------------------------------------------ reference
def test_reference_w8a16_acc_matches_f64_and_the_golden_model(golden):
    g = torch.Generator().manual_seed(int(torch.randint(1, 2**31, (1,))))
    m, k, n = 9, 256, 2560
    x = (torch.randn(m, k, generator=g) * torch.exp2(torch.rand(m, 1, generator=g) * 6 - 3)).to(torch.bfloat16)
    w = (torch.randn(n, k, generator=g) * 0.02).to(torch.bfloat16)
    wq, wsf = ref.mxfp8_quantize(w)
    acc = ref.w8a16_acc(x, wq, wsf)
    exact = x.double() @ ref.mxfp8_decode(wq, wsf, n, k).T
    assert torch.all((acc.double() - exact).abs() <= 1e-5 * exact.abs() + 1e-12)
    p = make_problem("TP4", m=m, k=k, exact=False)
    p["x_bf16"] = x
    p["wq"], p["wsf"] = wq, wsf
    assert torch.equal(golden.acc(p).view(torch.int32), acc.view(torch.int32))


def test_reference_dequantized_activations_and_the_exact_recipe(golden):
    p = make_problem("TP4", m=37, k=512, exact=True)
    x = ref.dequantize_activations(p["xq"], p["xsf"])
    assert torch.equal(ref.w8a16_acc(x, p["wq"], p["wsf"]).view(torch.int32),
                       ref.mxfp8_acc(p["xq"], p["xsf"], p["wq"], p["wsf"]).view(torch.int32))
    # the exact bf16 recipe: 8-bit significands, order-independent sums (f32 in a shuffled order)
    g = torch.Generator().manual_seed(p["seed"])
    xb = ref.make_exact_bf16_activations(37, 512, g)
    assert int(((xb.view(torch.int16) & 1) != 0).sum()) > 50  # lowest significand bit used
    acc = ref.w8a16_acc(xb, p["wq"], p["wsf"])
    rows = 4  # the products of 4 rows (exact in f64), summed in f32 in a shuffled order
    prods = xb[:rows].double()[:, None, :] * ref.mxfp8_decode(p["wq"], p["wsf"], p["n"], 512)[None, :, :]
    perm = torch.randperm(512, generator=g)
    s = torch.zeros(rows, p["n"], dtype=torch.float32)
    for i in perm.tolist():
        s += prods[:, :, i].float()
    assert torch.equal(s.view(torch.int32), acc[:rows].view(torch.int32))
    assert int((acc != 0).sum()) > acc.numel() // 2
    q = dict(p, x_bf16=xb, xq=None, xsf=None)
    assert torch.equal(golden.acc(q).view(torch.int32), acc.view(torch.int32))


# ------------------------------------------------------------------ GPU
@pytest.fixture
def golden_optional(request):
    try:
        return request.getfixturevalue("golden")
    except pytest.skip.Exception:
        return None


def cuda_problem(p):
    d = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in p.items()}
    for name in ("xq", "wq"):
        if d.get(name) is not None:
            d[name] = d[name].view(E4M3)
    return d


def run(g, out, flags, op, x_bf16):
    f = {False: m3qkv.fused_qkv, True: torch.ops.m3qkv.fused_qkv, "full": _ops.fused_qkv_impl}[op]
    xq, xsf = (None, None) if x_bf16 is not None else (g["xq"], g["xsf"])
    f(xq, xsf, g["wq"], g["wsf"], g["positions"], g["cos_sin_cache"], g["q_norm_weight"], g["k_norm_weight"],
      g["index_q_norm_weight"], g["index_k_norm_weight"], g["eps"], slot_mapping=g["slot_mapping"],
      index_slot_mapping=g["index_slot_mapping"], kv_cache=out["kv_cache"], index_cache=out["index_cache"],
      index_q_out=out["index_q_out"], q_out=out["q_out"], q_fp8_out=out["q_fp8_out"], q_fp8_scale=g["q_fp8_scale"],
      k_scale=g["k_scale"], v_scale=g["v_scale"], error_flags=flags, nq=g["nq"], nkv=g["nkv"], niq=g["niq"],
      nik=g["nik"], x_bf16=x_bf16)


def reference_outputs(p, acc):
    want = make_outputs(p, POISON)
    flags = ref.epilogue(acc, nq=p["nq"], nkv=p["nkv"], niq=p["niq"], nik=p["nik"], positions=p["positions"],
                         cos_sin_cache=p["cos_sin_cache"], q_norm_weight=p["q_norm_weight"],
                         k_norm_weight=p["k_norm_weight"], index_q_norm_weight=p["index_q_norm_weight"],
                         index_k_norm_weight=p["index_k_norm_weight"], eps=p["eps"], slot_mapping=p["slot_mapping"],
                         index_slot_mapping=p["index_slot_mapping"], kv_cache=want["kv_cache"],
                         index_cache=want["index_cache"], q_out=want["q_out"], q_fp8_out=want["q_fp8_out"],
                         index_q_out=want["index_q_out"], q_fp8_scale=p["q_fp8_scale"], k_scale=p["k_scale"],
                         v_scale=p["v_scale"])
    return want, flags


def backend_runs_x_bf16():
    if m3qkv.backend() == "sm100":
        pytest.skip("the sm100 backend refuses x_bf16 (test_gpu_sm100_refuses covers it)")


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["TP4", "TP8", "dense", "TP1"])
@pytest.mark.parametrize("m", [1, 37, 300])
def test_gpu_fused_x_bf16_exact_bit_exact(layout, m, golden_optional):
    backend_runs_x_bf16()
    p = make_problem(layout, m=m if layout != "TP1" else min(m, 37), k=512, exact=True, oor=True)
    g = torch.Generator().manual_seed(p["seed"] ^ 0x5EED)
    p["x_bf16"] = ref.make_exact_bf16_activations(p["m"], 512, g)
    want, wflags = reference_outputs(p, ref.w8a16_acc(p["x_bf16"], p["wq"], p["wsf"]))
    d = cuda_problem(p)
    for op in (False, True, "full"):
        out = make_outputs(p, POISON, device="cuda")
        flags = torch.zeros(1, dtype=torch.int32, device="cuda")
        run(d, out, flags, op, d["x_bf16"])
        torch.cuda.synchronize()
        diff = diff_outputs(want, out)
        assert not diff, f"path {op}, seed {p['seed']}:\n{diff}"
        assert int(flags.item()) & 0xFFFFFFFF == wflags and wflags != 0
    if golden_optional is not None:
        gold = make_outputs(p, POISON)
        gflags = golden_optional.fused(dict(p, xq=None, xsf=None), gold)
        assert not diff_outputs(gold, out) and gflags == wflags


@pytest.mark.gpu
def test_gpu_dequantized_x_bf16_writes_the_bytes_of_the_mxfp8_call():
    backend_runs_x_bf16()
    p = make_problem("TP4", m=129, k=1024, exact=False, oor=True)
    d = cuda_problem(p)
    x = ref.dequantize_activations(p["xq"], p["xsf"]).cuda()
    outs = []
    for xb in (None, x):
        out = make_outputs(p, POISON, device="cuda")
        flags = torch.zeros(1, dtype=torch.int32, device="cuda")
        run(d, out, flags, False, xb)
        torch.cuda.synchronize()
        outs.append((out, int(flags.item())))
    assert not diff_outputs(outs[0][0], outs[1][0]) and outs[0][1] == outs[1][1], f"seed {p['seed']}"
    # and not vacuously: q_out was written
    assert int((outs[1][0]["q_out"].view(torch.uint8) != POISON).sum()) > outs[1][0]["q_out"].numel()


@pytest.mark.gpu
def test_gpu_mxfp8_gemm_x_bf16():
    p = make_problem("TP2", m=77, k=512, exact=True)
    g = torch.Generator().manual_seed(p["seed"])
    xb = ref.make_exact_bf16_activations(77, 512, g)
    d = cuda_problem(p)
    y = m3qkv.mxfp8_gemm(None, None, d["wq"], d["wsf"], x_bf16=xb.cuda())
    y2 = torch.ops.m3qkv.mxfp8_gemm(None, None, d["wq"], d["wsf"], x_bf16=xb.cuda())
    torch.cuda.synchronize()
    want = ref.f32_to_bf16(ref.w8a16_acc(xb, p["wq"], p["wsf"])).view(torch.int16)
    assert torch.equal(y.cpu().view(torch.int16), want) and torch.equal(y2.cpu().view(torch.int16), want)
    # random bf16 data: within one bf16 ulp + 1e-5·max|ref| of the f64 product
    x = (torch.randn(77, 512, generator=g) * 3).to(torch.bfloat16)
    exact = x.double() @ ref.mxfp8_decode(p["wq"], p["wsf"], p["n"], 512).T
    y = m3qkv.mxfp8_gemm(None, None, d["wq"], d["wsf"], x_bf16=x.cuda()).cpu().double()
    tol = exact.abs() * 2.0 ** -8 + 1e-5 * exact.abs().max()
    assert torch.all((y - exact).abs() <= tol)


@pytest.mark.gpu
def test_gpu_sm100_refuses():
    if m3qkv.backend() != "sm100":
        pytest.skip(f"the automatic backend is {m3qkv.backend()}, not sm100")
    p = make_problem("TP4", m=7, k=256, exact=True)
    d = cuda_problem(p)
    out = make_outputs(p, POISON, device="cuda")
    with pytest.raises(ValueError, match=r"x_bf16 \(bf16 activations\) is not supported by the sm100 backend"):
        run(d, out, None, False, torch.zeros(7, 256, dtype=torch.bfloat16, device="cuda"))
