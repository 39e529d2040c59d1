"""python/examples/vllm_minimax_m3.py: vLLM's cache tensors handed to m3qkv.

CPU: the views the example passes are vLLM's memory with vLLM's strides (K/V
offsets and strides from the layout's own arithmetic, not from the example);
the op's checks and the C library's validation accept them, and refuse the
mistakes the example's comments warn about (a raw uint8 FP8 cache, K and V on
the same bytes); the reference run through the vLLM layout writes each real
token's V where vLLM reads it (e4m3 of the raw accumulator, contract §4.3) and
nothing for padding tokens; without a GPU the example says so and exits 3.
GPU (marked gpu): the whole example, every byte equal in eager and graph replay.
"""
import ctypes
import importlib.util
import pathlib

import pytest

torch = pytest.importorskip("torch")

import m3qkv  # noqa: E402
from m3qkv import _capi, _ops  # noqa: E402
from m3qkv import reference as ref  # noqa: E402

PATH = pathlib.Path(__file__).resolve().parents[1] / "examples" / "vllm_minimax_m3.py"
spec = importlib.util.spec_from_file_location("vllm_minimax_m3", PATH)
ex = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ex)

E4M3 = torch.float8_e4m3fn
SMALL = dict(tp=2, m=13, pad=3, k=256, block_size=16, seed=7)  # nkv = 2: head strides matter


@pytest.mark.parametrize("layout", ["one", "two"])
@pytest.mark.parametrize("index_cache", ["fp8", "bf16"])
def test_cache_views_are_vllms_memory(layout, index_cache):
    nb, bs, nkv = 5, 16, 2
    kv, ix = ex.vllm_caches(nb, bs, nkv, index_cache)
    assert kv.dtype == torch.uint8 and kv.shape == (nb, 2, bs, nkv, 128) and kv.is_contiguous()
    v = ex.m3qkv_cache_args(kv, ix, layout)
    assert v["kv_cache"].dtype == E4M3 and v["kv_cache"].data_ptr() == kv.data_ptr()
    if layout == "one":
        assert v["v_cache"] is None and v["kv_cache"].shape == (nb, 2, bs, nkv, 128)
    else:
        page = 2 * bs * nkv * 128  # one page holds K then V of block_size tokens (1-byte elements)
        assert v["v_cache"].data_ptr() == kv.data_ptr() + bs * nkv * 128
        for t in (v["kv_cache"], v["v_cache"]):
            assert t.shape == (nb, bs, nkv, 128) and t.stride() == (page, nkv * 128, 128, 1)
    assert v["index_cache"].data_ptr() == ix.data_ptr() and v["index_cache"].shape == (nb, bs, 128)
    assert v["index_cache"].dtype == (E4M3 if index_cache == "fp8" else torch.bfloat16)


def test_op_checks_accept_the_views_and_refuse_raw_fp8_bytes():
    p = ex.problem(**SMALL)
    for layout in ("one", "two"):
        ex.check_on_fake(*ex.call_args(p, ex.outputs(p, layout, "fp8")))
    o = ex.outputs(p, "one", "fp8")
    o["kv_cache"] = o["kv"]  # vLLM's uint8 FP8 tensor without the view: read as NVFP4 pages
    with pytest.raises(ValueError, match="NVFP4 kv_cache"):
        ex.check_on_fake(*ex.call_args(p, o))


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the C call would launch on host pointers")
@pytest.mark.parametrize("layout", ["one", "two"])
def test_c_validation_accepts_the_views(layout):
    """With CPU tensors the C library validates the whole struct (shapes, strides,
    overlaps) and only then finds no GPU: UNSUPPORTED_DEVICE means it was accepted."""
    lib = m3qkv.library()
    if not lib.cache_formats:
        pytest.skip(f"{lib.path} predates the FP8/BF16 cache formats")
    p = ex.problem(**SMALL)
    args, kw = ex.call_args(p, ex.outputs(p, layout, "fp8"))
    _, s = _ops.fused_qkv_args(*args, **kw)
    assert lib.fused_qkv(ctypes.addressof(s), None) == _capi.ERROR_UNSUPPORTED_DEVICE, lib.last_error()
    if layout == "two":  # K and V on the same bytes: the C overlap rule must refuse it
        kw["v_cache"] = kw["kv_cache"]
        _, s = _ops.fused_qkv_args(*args, **kw)
        assert lib.fused_qkv(ctypes.addressof(s), None) == _capi.ERROR_INVALID_ARGUMENT


@pytest.mark.parametrize("layout", ["one", "two"])
def test_reference_writes_real_tokens_where_vllm_reads_them(layout):
    p = ex.problem(**SMALL)
    o = ex.outputs(p, layout, "fp8")
    acc = ex.reference(p, o)
    m, pad, bs, nq, nkv = p["m"], p["pad"], p["block_size"], p["nq"], p["nkv"]
    slots = p["slot_mapping"]
    assert (slots[m - pad:] == -1).all() and (slots[:m - pad] >= 0).all()
    vsf = ref.rcp_rn(p["v_scale"])
    for t in range(m - pad):
        page, off = int(slots[t]) // bs, int(slots[t]) % bs
        for h in range(nkv):  # V of head h = e4m3(raw accumulator · RN(1/v_scale)), at vLLM's [page, 1, off, h]
            col = (nq + nkv + h) * 128
            want = ref.f32_to_e4m3(acc[t, col:col + 128] * vsf)
            assert torch.equal(o["kv"][page, 1, off, h], want), (t, h)
    # Only the real tokens' rows changed, in both caches: padding wrote nothing.
    kv_rows = (o["kv"] != ex.POISON).any(-1).any(-1)  # [nb, 2, bs]
    assert int(kv_rows[:, 0].sum()) == int(kv_rows[:, 1].sum()) == m - pad
    ix_rows = (o["ix"].view(torch.uint8) != ex.POISON).any(-1)
    assert int(ix_rows.sum()) == m - pad


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU exit is for machines without CUDA")
def test_example_without_gpu_runs_the_cpu_parts(capsys):
    assert ex.main(["--k", "256", "--m", "9", "--pad", "2"]) == 3
    out = capsys.readouterr().out
    assert "pass the op's checks" in out and "no CUDA device" in out


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["one", "two"])
@pytest.mark.parametrize("index_cache", ["fp8", "bf16"])
@pytest.mark.parametrize("tp", [1, 4])
def test_example_on_gpu_every_byte(layout, index_cache, tp, capsys):
    rc = ex.main(["--tp", str(tp), "--m", "37", "--pad", "5", "--k", "512", "--layout", layout,
                  "--index-cache", index_cache])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert out.count("every byte equals the reference") == 2, out
