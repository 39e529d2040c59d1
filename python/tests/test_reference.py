"""The torch port of the golden model (m3qkv.reference) against the C golden
model (tests/tools/golden_capi.cpp), byte for byte, on the CPU: the epilogue
on random and on special-valued accumulators in every head layout, the MXFP8
quantizer on random and special bf16 values, the exact-data accumulator."""
import math

import pytest
import torch

from m3qkv import reference as ref
from problems import LAYOUTS, diff_outputs, make_outputs, make_problem, fresh_seed


def special_acc(m, n, seed):
    """Random f32 accumulator rows with a mix of magnitudes, zero heads, and a
    sprinkling of NaN / ±inf / huge / subnormal values."""
    g = torch.Generator().manual_seed(seed)
    acc = torch.randn(m, n, generator=g) * torch.exp2(torch.randint(-20, 20, (m, n // 128, 1), generator=g)
                                                      .float()).repeat_interleave(128, 1).view(m, n)
    if m > 3:
        acc[1, :128] = 0.0  # an all-zero q head
        acc[2, 128:256] = -0.0
    sel = torch.rand(m, n, generator=g)
    specials = torch.tensor([math.nan, math.inf, -math.inf, 3e38, -3e38, 1e-40, -1e-44, 448.0, 6.0 * 2 ** -9])
    idx = torch.randint(0, len(specials), (m, n), generator=g)
    acc = torch.where(sel < 0.002, specials[idx], acc)
    return acc.to(torch.float32)


def ref_epilogue(p, acc, got):
    """m3qkv.reference's epilogue of problem p on acc into the outputs `got`; its flags."""
    return ref.epilogue(acc, nq=p["nq"], nkv=p["nkv"], niq=p["niq"], nik=p["nik"], positions=p["positions"],
                        cos_sin_cache=p["cos_sin_cache"], q_norm_weight=p["q_norm_weight"],
                        k_norm_weight=p["k_norm_weight"], index_q_norm_weight=p["index_q_norm_weight"],
                        index_k_norm_weight=p["index_k_norm_weight"], eps=p["eps"], slot_mapping=p["slot_mapping"],
                        index_slot_mapping=p["index_slot_mapping"], kv_cache=got["kv_cache"],
                        index_cache=got["index_cache"], q_out=got["q_out"], q_fp8_out=got["q_fp8_out"],
                        index_q_out=got["index_q_out"], q_fp8_scale=p["q_fp8_scale"], k_scale=p["k_scale"],
                        v_scale=p["v_scale"])


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("accs", ["random", "special"])
def test_epilogue_matches_golden(golden, layout, accs):
    seed = fresh_seed()
    p = make_problem(layout, m=21, k=128, block_size=16 if layout != "TP8" else 64, exact=False, seed=seed,
                     oor=True)
    acc = torch.randn(p["m"], p["n"], generator=torch.Generator().manual_seed(seed)) * 3 if accs == "random" \
        else special_acc(p["m"], p["n"], seed)
    want, got = make_outputs(p), make_outputs(p)
    fw = golden.epilogue(p, acc, want)
    fg = ref_epilogue(p, acc, got)
    d = diff_outputs(want, got)
    assert not d, f"seed {seed}:\n{d}"
    assert fw == fg, f"seed {seed}: flags golden 0x{fw:x}, port 0x{fg:x}"
    assert fw == 0x7 if p["nik"] else fw == 0x5  # the out-of-range slots and positions were seen
    # and something was written: the caches and q are no longer all poison
    assert (want["kv_cache"] != 0xA5).any() and (want["q_fp8_out"].view(torch.uint8) != 0xA5).any()


@pytest.mark.parametrize("layout", ["TP4", "TP8"])
def test_shared_slots_match_golden(golden, layout):
    """Half the tokens take another token's slot and index slot (docs/contract.md
    §4.4: the last of them writes the row): the port equals the C golden model."""
    seed = fresh_seed()
    p = make_problem(layout, m=40, k=128, block_size=16, exact=False, seed=seed, oor=True)
    g = torch.Generator().manual_seed(seed)
    for key in ("slot_mapping", "index_slot_mapping"):
        s = p[key].clone()
        take = torch.rand(s.numel(), generator=g) < 0.5
        src = torch.randint(0, 3, (s.numel(),), generator=g)  # a few hot tokens, often
        src = torch.where(torch.rand(s.numel(), generator=g) < 0.5, src,
                          torch.randint(0, s.numel(), (s.numel(),), generator=g))
        p[key] = torch.where(take, s[src], s)
    assert (p["slot_mapping"].unique().numel() < p["slot_mapping"].numel())
    acc = torch.randn(p["m"], p["n"], generator=g) * 3
    want, got = make_outputs(p), make_outputs(p)
    fw = golden.epilogue(p, acc, want)
    fg = ref_epilogue(p, acc, got)
    d = diff_outputs(want, got)
    assert not d, f"seed {seed}:\n{d}"
    assert fw == fg


def test_last_sharer():
    s = torch.tensor([5, 3, 5, -1, 3, 7, -1, 5])
    assert ref.last_sharer(s).tolist() == [False, False, False, False, True, True, True, True]


def test_quantize_matches_golden(golden):
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    m, k = 130, 256
    x = (torch.randn(m, k, generator=g) * torch.exp2(torch.randint(-140, 120, (m, k // 32, 1), generator=g)
                                                      .float()).repeat_interleave(32, 1).view(m, k))
    bits = x.to(torch.bfloat16).view(torch.int16)
    # special bf16 patterns: ±0, subnormals, ±inf, quiet and signalling NaN, max finite
    sp = torch.tensor([0x0000, 0x8000, 0x0001, 0x807F, 0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0x7F7F, 0xFF7F],
                      dtype=torch.int32)
    sp = torch.where(sp >= 2**15, sp - 2**16, sp).to(torch.int16)
    sel = torch.rand(m, k, generator=g) < 0.01
    bits = torch.where(sel, sp[torch.randint(0, len(sp), (m, k), generator=g)], bits)
    bits[5, :32] = 0  # an all-zero block
    x = bits.view(torch.bfloat16)
    wq, wsf = golden.quantize(x)
    gq, gsf = ref.mxfp8_quantize(x)
    assert torch.equal(wq, gq), f"seed {seed}: xq differs at {torch.nonzero(wq != gq)[:5].tolist()}"
    assert torch.equal(wsf, gsf), f"seed {seed}: xsf differs at {torch.nonzero(wsf != gsf)[:5].tolist()}"


@pytest.mark.parametrize("layout", ["TP4", "dense"])
def test_exact_data_accumulator_and_fused(golden, layout):
    seed = fresh_seed()
    p = make_problem(layout, m=9, k=512, exact=True, seed=seed)
    acc = ref.mxfp8_acc(p["xq"], p["xsf"], p["wq"], p["wsf"])
    gacc = golden.acc(p)
    assert torch.equal(acc.view(torch.int32), gacc.view(torch.int32)), f"seed {seed}"
    assert (acc != 0).float().mean() > 0.5  # not a zero problem
    # the whole fused model: golden GEMM + epilogue == port GEMM + port epilogue
    want, got = make_outputs(p), make_outputs(p)
    golden.fused(p, want)
    golden.epilogue(p, acc, got)
    assert not diff_outputs(want, got)
    # bf16 GEMM output
    assert torch.equal(golden.gemm(p).view(torch.int16), ref.f32_to_bf16(acc).view(torch.int16))


def test_rsqrt_rn_is_correctly_rounded():
    from fractions import Fraction
    g = torch.Generator().manual_seed(fresh_seed())
    t = torch.exp2(torch.rand(4000, generator=g, dtype=torch.float64) * 250 - 140).to(torch.float32)
    t = t[(t > 0) & torch.isfinite(t)]
    r = ref.rsqrt_rn(t)
    for tv, rv in zip(t.tolist()[:600], r.tolist()[:600]):
        # r is the f32 nearest 1/sqrt(t) iff both neighbouring midpoints bracket it
        up = torch.nextafter(torch.tensor(rv), torch.tensor(math.inf)).item()
        dn = torch.nextafter(torch.tensor(rv), torch.tensor(0.0)).item()
        T = Fraction(tv)
        hi, lo = (Fraction(up) + Fraction(rv)) / 2, (Fraction(dn) + Fraction(rv)) / 2
        assert lo * lo * T < 1 < hi * hi * T, f"rsqrt_rn({tv!r}) = {rv!r} is not the nearest f32"


@pytest.mark.parametrize("kind", ["fp8-5d", "bf16-4d"])
def test_dense_cache_formats_write_only_valid_slots(kind):
    """The FP8/BF16 cache path of the port (no C golden model for it yet):
    valid slots hold the converted values, skipped / out-of-range slots and
    everything else keep the poison."""
    p = make_problem("TP2", m=13, k=128, exact=False, seed=fresh_seed(), oor=True)
    nb, bs, nkv = p["pages"], p["block_size"], p["nkv"]
    dt = torch.float8_e4m3fn if kind.startswith("fp8") else torch.bfloat16
    poison = lambda shape: torch.full(shape, 0x5A if dt == torch.float8_e4m3fn else 0x5A5A,  # noqa: E731
                                      dtype=torch.uint8 if dt == torch.float8_e4m3fn else torch.int16).view(dt)
    kv = poison((nb, 2, bs, nkv, 128)) if kind.endswith("5d") else poison((nb, bs, nkv, 128))
    v = None if kind.endswith("5d") else poison((nb, bs, nkv, 128))
    ix = poison((nb, bs, 128))
    acc = torch.randn(p["m"], p["n"])
    out = make_outputs(p)
    ref.epilogue(acc, nq=p["nq"], nkv=nkv, niq=p["niq"], nik=p["nik"], positions=p["positions"],
                 cos_sin_cache=p["cos_sin_cache"], q_norm_weight=p["q_norm_weight"], k_norm_weight=p["k_norm_weight"],
                 index_q_norm_weight=p["index_q_norm_weight"], index_k_norm_weight=p["index_k_norm_weight"],
                 eps=p["eps"], slot_mapping=p["slot_mapping"], index_slot_mapping=p["index_slot_mapping"],
                 kv_cache=kv, v_cache=v, index_cache=ix, q_out=out["q_out"], q_fp8_out=out["q_fp8_out"],
                 index_q_out=out["index_q_out"], k_scale=p["k_scale"], v_scale=p["v_scale"])
    kc, vc = (kv[:, 0], kv[:, 1]) if v is None else (kv, v)
    cap = nb * bs
    for slots, caches in [(p["slot_mapping"], (kc, vc)), (p["index_slot_mapping"], (ix,))]:
        valid = slots[(slots >= 0) & (slots < cap)]
        for c in caches:
            touched = torch.zeros(nb * bs, dtype=torch.bool)
            touched[valid] = True
            flat = c.reshape(nb * bs, -1).float()
            changed = (c.reshape(nb * bs, -1).view(torch.uint8) != poison((1,)).view(torch.uint8)[0]).any(-1)
            assert torch.equal(changed, touched)
            assert torch.isfinite(flat[touched]).all()
    # V is the raw projection: the cache holds it (within the format's precision)
    t = int(torch.nonzero((p["slot_mapping"] >= 0) & (p["slot_mapping"] < cap))[0])
    s = int(p["slot_mapping"][t])
    got = vc[s // bs, s % bs].float()
    want = acc[t, (p["nq"] + nkv) * 128:(p["nq"] + 2 * nkv) * 128].view(nkv, 128)
    sc = p["v_scale"] if dt == torch.float8_e4m3fn else 1.0
    assert torch.allclose(got * sc, want, rtol=0.07, atol=1e-2)


def test_bf16_ulps_at_head_scale():
    """The q_out tolerance of the random-data checks (demo, test_gpu): ulps at
    the larger of |want| and the head row's RMS."""
    g = torch.Generator().manual_seed(11)
    want = (torch.randn(3, 2 * ref.HEAD, generator=g)).to(torch.bfloat16)
    want[0, 5] = 2.0 ** -12  # a RoPE cancellation: far below its row's RMS (about 1)
    assert ref.bf16_ulps_at_head_scale(want, want).max().item() == 0.0
    rms = want[0, :ref.HEAD].float().pow(2).mean().sqrt().item()
    row_ulp = 2.0 ** (math.floor(math.log2(rms)) - 7)
    for ulps in (1, 2):
        got = want.clone()
        got[0, 5] = (want[0, 5].float() + ulps * row_ulp).to(torch.bfloat16)
        d = ref.bf16_ulps_at_head_scale(want, got)
        assert d[0, 5].item() == float(ulps), (ulps, d[0, 5].item())
        assert d.sum().item() == float(ulps), "an element that did not change counted"
    # A large element: ulps of its own magnitude.
    big = int(want[1, :ref.HEAD].float().abs().argmax())
    got = want.clone()
    own_ulp = 2.0 ** (math.floor(math.log2(abs(want[1, big].item()))) - 7)
    got[1, big] = (want[1, big].float() + own_ulp).to(torch.bfloat16)
    assert ref.bf16_ulps_at_head_scale(want, got)[1, big].item() == 1.0
