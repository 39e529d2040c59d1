"""Every argument rule of the Python layer raises ValueError with a message
naming the tensor (checked through the meta kernel, which runs the same
checks as the CUDA kernel), C errors become ValueError / RuntimeError carrying
m3qkv_last_error(), and the cache-format dispatch."""
import ctypes

import pytest
import torch

import m3qkv
from m3qkv import _capi

E4M3 = torch.float8_e4m3fn
M, K = 5, 256


def base(dev="meta", layout=(16, 1, 1, 1), bs=16, pages=3, m=M):
    """Valid arguments of fused_qkv (uninitialized tensors) on `dev`."""
    nq, nkv, niq, nik = layout
    n = (nq + 2 * nkv + niq + nik) * 128

    def t(shape, dtype):
        return torch.empty(shape, dtype=dtype, device=dev)

    a = dict(xq=t((m, K), E4M3), xsf=t(((m + 127) // 128 * 128 * 8,), torch.uint8), wq=t((n, K), E4M3),
             wsf=t(((n + 127) // 128 * 128 * 8,), torch.uint8), positions=t((m,), torch.int64),
             cos_sin_cache=t((64, 64), torch.bfloat16), q_norm_weight=t((128,), torch.bfloat16),
             k_norm_weight=t((128,), torch.bfloat16),
             index_q_norm_weight=t((128,), torch.bfloat16) if niq else None,
             index_k_norm_weight=t((128,), torch.bfloat16) if nik else None, eps=1e-6)
    kw = dict(slot_mapping=t((m,), torch.int64), index_slot_mapping=t((m,), torch.int64) if nik else None,
              kv_cache=t((pages, 2 * nkv, bs, 72), torch.uint8),
              index_cache=t((pages, bs, 72), torch.uint8) if nik else None,
              index_q_out=t((m, niq * 128), E4M3) if niq else None, q_out=t((m, nq * 128), torch.bfloat16),
              q_fp8_out=t((m, nq * 128), E4M3))
    return a, kw


def call(a, kw):
    torch.ops.m3qkv.fused_qkv(*a.values(), **kw)


def paged(shape, stride0, dtype=torch.uint8, dev="meta"):
    inner = torch.empty(shape[1:]).stride()
    return torch.empty_strided(shape, (stride0,) + inner, dtype=dtype, device=dev)


def test_valid_call_traces():
    call(*base())
    a, kw = base(layout=(8, 1, 1, 1))
    call(a, dict(kw, nq=8, nkv=1))  # TP8 with explicit counts (niq, nik from index_q_out / index_cache)
    a, kw = base(layout=(8, 2, 0, 0))
    call(a, dict(kw, nq=8, nkv=2, niq=0, nik=0))  # dense
    a, kw = base(pages=4)
    call(a, dict(kw, kv_cache=paged((4, 2, 16, 72), 2 * 16 * 72 + 96)))  # a padded page stride


# (description, mutation of (args, kwargs), expected message fragment)
CASES = [
    ("xq dtype", lambda a, k: a.update(xq=torch.empty(M, K, dtype=torch.bfloat16, device="meta")),
     "xq must have dtype torch.float8_e4m3fn"),
    ("xq 3-D", lambda a, k: a.update(xq=torch.empty(1, M, K, dtype=E4M3, device="meta")), "xq must be 2-D"),
    ("xq strided", lambda a, k: a.update(xq=torch.empty(K, M, dtype=E4M3, device="meta").t()),
     "xq must be contiguous"),
    ("wq K", lambda a, k: a.update(wq=torch.empty(2560, 128, dtype=E4M3, device="meta")), "wq must be [N, K = 256]"),
    ("xsf size", lambda a, k: a.update(xsf=torch.empty(100, dtype=torch.uint8, device="meta")),
     "xsf must hold the F8_128x4-swizzled e8m0 scales of xq [5, 256]"),
    ("xsf dtype", lambda a, k: a.update(xsf=torch.empty(1024, dtype=torch.int8, device="meta")),
     "xsf must have dtype torch.uint8"),
    ("wsf size", lambda a, k: a.update(wsf=torch.empty(1024, dtype=torch.uint8, device="meta")),
     "wsf must hold the F8_128x4-swizzled e8m0 scales of wq [2560, 256]"),
    ("N not inferable", lambda a, k: (a.update(wq=torch.empty(1536, K, dtype=E4M3, device="meta"),
                                               wsf=torch.empty(1536 * 8, dtype=torch.uint8, device="meta"))),
     "wq has N = 1536 rows, which is not (19·nkv + 1)·128"),
    ("explicit counts mismatch", lambda a, k: k.update(nq=8, nkv=1), "give (nq + 2·nkv + niq + nik)·128 = 1536"),
    ("only nq", lambda a, k: k.update(nq=16), "explicit head counts need at least nq and nkv"),
    ("positions dtype", lambda a, k: a.update(positions=torch.empty(M, dtype=torch.int32, device="meta")),
     "positions must have dtype torch.int64"),
    ("positions length", lambda a, k: a.update(positions=torch.empty(M + 1, dtype=torch.int64, device="meta")),
     "positions must have shape [5] (one per token)"),
    ("cos_sin width", lambda a, k: a.update(cos_sin_cache=torch.empty(64, 128, dtype=torch.bfloat16, device="meta")),
     "cos_sin_cache must be [max_position, 64]"),
    ("cos_sin dtype", lambda a, k: a.update(cos_sin_cache=torch.empty(64, 64, dtype=torch.float32, device="meta")),
     "cos_sin_cache must have dtype torch.bfloat16"),
    ("q_norm_weight shape", lambda a, k: a.update(q_norm_weight=torch.empty(64, dtype=torch.bfloat16, device="meta")),
     "q_norm_weight must have shape [128]"),
    ("k_norm_weight dtype", lambda a, k: a.update(k_norm_weight=torch.empty(128, dtype=torch.float32, device="meta")),
     "k_norm_weight must have dtype torch.bfloat16"),
    ("index_q_norm_weight missing", lambda a, k: a.update(index_q_norm_weight=None), "index_q_norm_weight is required"),
    ("index_k_norm_weight missing", lambda a, k: a.update(index_k_norm_weight=None), "index_k_norm_weight is required"),
    ("slot_mapping dtype", lambda a, k: k.update(slot_mapping=torch.empty(M, dtype=torch.int32, device="meta")),
     "slot_mapping must have dtype torch.int64"),
    ("slot_mapping length", lambda a, k: k.update(slot_mapping=torch.empty(3, dtype=torch.int64, device="meta")),
     "slot_mapping must have shape [5]"),
    ("index_slot_mapping missing", lambda a, k: k.update(index_slot_mapping=None), "index_slot_mapping is required"),
    ("no q output", lambda a, k: k.update(q_out=None, q_fp8_out=None), "at least one of q_out (bf16) and q_fp8_out"),
    ("q_out dtype", lambda a, k: k.update(q_out=torch.empty(M, 2048, dtype=torch.float16, device="meta")),
     "q_out must have dtype torch.bfloat16"),
    ("q_out rows", lambda a, k: k.update(q_out=torch.empty(M, 1024, dtype=torch.bfloat16, device="meta")),
     "q_out must hold [5, 2048] values"),
    ("q_fp8_out strided", lambda a, k: k.update(q_fp8_out=torch.empty(2048, M, dtype=E4M3, device="meta").t()),
     "q_fp8_out must be contiguous"),
    ("index_q_out missing", lambda a, k: k.update(index_q_out=None), "index_q_out is required"),
    ("index_q_out size", lambda a, k: k.update(index_q_out=torch.empty(M, 256, dtype=E4M3, device="meta")),
     "index_q_out must hold [5, 128] values"),
    ("kv_cache missing", lambda a, k: k.update(kv_cache=None), "kv_cache is required"),
    ("kv_cache heads", lambda a, k: k.update(kv_cache=torch.empty(3, 4, 16, 72, dtype=torch.uint8, device="meta")),
     "an NVFP4 kv_cache (uint8) must be [num_blocks, 2·nkv = 2, block_size, 72]"),
    ("kv_cache inner strides", lambda a, k: k.update(
        kv_cache=torch.empty(3, 16, 2, 72, dtype=torch.uint8, device="meta").transpose(1, 2)),
     "kv_cache pages must be packed inside"),
    ("kv_cache dtype", lambda a, k: k.update(kv_cache=torch.empty(3, 2, 16, 72, dtype=torch.int8, device="meta")),
     "kv_cache must be uint8 (NVFP4 pages"),
    ("v_cache with NVFP4", lambda a, k: k.update(v_cache=torch.empty(3, 2, 16, 72, dtype=torch.uint8, device="meta")),
     "v_cache must be None with an NVFP4 kv_cache"),
    ("index_cache missing", lambda a, k: k.update(index_cache=None), "index_cache is required when nik > 0"),
    ("index_cache block size", lambda a, k: k.update(
        index_cache=torch.empty(3, 32, 72, dtype=torch.uint8, device="meta")),
     "an NVFP4 index_cache (uint8) must be [num_index_blocks, block_size = 16, 72]"),
    ("index_cache dtype", lambda a, k: k.update(index_cache=torch.empty(3, 16, 72, dtype=torch.float16, device="meta")),
     "index_cache must be uint8 (NVFP4"),
    ("fp8 kv 4-D without v_cache", lambda a, k: k.update(kv_cache=torch.empty(3, 16, 1, 128, dtype=E4M3, device="meta")),
     "v_cache is required with a 4-D kv_cache"),
    ("bf16 kv 5-D heads", lambda a, k: k.update(
        kv_cache=torch.empty(3, 2, 16, 2, 128, dtype=torch.bfloat16, device="meta")),
     "a 5-D kv_cache must be [num_blocks, 2, block_size, nkv = 1, 128]"),
    ("fp8 v_cache mismatch", lambda a, k: k.update(kv_cache=torch.empty(3, 16, 1, 128, dtype=E4M3, device="meta"),
                                                   v_cache=torch.empty(3, 16, 1, 128, dtype=torch.bfloat16,
                                                                       device="meta")),
     "v_cache must match kv_cache in dtype, shape, strides and device"),
    ("fp8 index cache width", lambda a, k: k.update(index_cache=torch.empty(3, 16, 72, dtype=E4M3, device="meta")),
     "index_cache must be [num_index_blocks, block_size = 16, 128]"),
    ("error_flags dtype", lambda a, k: k.update(error_flags=torch.empty(1, dtype=torch.int64, device="meta")),
     "error_flags must have dtype torch.int32"),
    ("error_flags empty", lambda a, k: k.update(error_flags=torch.empty(0, dtype=torch.int32, device="meta")),
     "error_flags must hold at least one int32"),
    ("device mix", lambda a, k: k.update(slot_mapping=torch.empty(M, dtype=torch.int64)),
     "slot_mapping is on cpu, but xq is on meta: every tensor must be on one CUDA device"),
]


@pytest.mark.parametrize("desc,mutate,message", CASES, ids=[c[0] for c in CASES])
def test_argument_error(desc, mutate, message):
    a, kw = base()
    mutate(a, kw)
    with pytest.raises(ValueError) as e:
        call(a, kw)
    assert message in str(e.value), f"{desc}: got {e.value}"
    assert str(e.value).startswith("m3qkv.fused_qkv: ")


def test_new_cache_formats_trace():
    """FP8/BF16 caches in the vLLM flash layouts pass the checks (fake/meta)."""
    a, kw = base()
    call(a, dict(kw, kv_cache=torch.empty(3, 2, 16, 1, 128, dtype=E4M3, device="meta"),
                 index_cache=torch.empty(3, 16, 128, dtype=E4M3, device="meta")))
    kv = torch.empty(3, 16, 1, 128, dtype=torch.bfloat16, device="meta")
    call(a, dict(kw, kv_cache=kv, v_cache=torch.empty_like(kv),
                 index_cache=torch.empty(3, 16, 128, dtype=torch.bfloat16, device="meta")))


def test_insert_gemm_quantize_errors():
    a, kw = base()
    rest = {k: v for k, v in a.items() if k not in ("xq", "xsf", "wq", "wsf")}
    qkv = torch.empty(M, 2560, dtype=torch.bfloat16, device="meta")
    torch.ops.m3qkv.qknorm_rope_kv_insert(qkv, *rest.values(), **kw)
    with pytest.raises(ValueError, match=r"m3qkv.qknorm_rope_kv_insert: qkv must have dtype torch.bfloat16"):
        torch.ops.m3qkv.qknorm_rope_kv_insert(qkv.to(torch.float16), *rest.values(), **kw)
    with pytest.raises(ValueError, match=r"qkv has N = 2432 rows, which is not"):
        torch.ops.m3qkv.qknorm_rope_kv_insert(qkv[:, :2432].contiguous(), *rest.values(), **kw)
    with pytest.raises(ValueError, match=r"m3qkv.qknorm_rope_kv_insert: positions is on cpu, but qkv is on meta"):
        torch.ops.m3qkv.qknorm_rope_kv_insert(qkv, *dict(rest, positions=torch.zeros(M, dtype=torch.int64)).values(),
                                              **kw)
    out = torch.ops.m3qkv.mxfp8_gemm(a["xq"], a["xsf"], a["wq"], a["wsf"])
    assert out.shape == (M, 2560) and out.dtype == torch.bfloat16 and out.device.type == "meta"
    with pytest.raises(ValueError, match=r"m3qkv.mxfp8_gemm: wsf must hold"):
        torch.ops.m3qkv.mxfp8_gemm(a["xq"], a["xsf"], a["wq"], a["xsf"])
    x = torch.empty(M, K, dtype=torch.bfloat16, device="meta")
    xq, xsf = torch.ops.m3qkv.mxfp8_quantize(x)
    assert xq.shape == (M, K) and xq.dtype == E4M3 and xsf.shape == (128 * 8,) and xsf.dtype == torch.uint8
    with pytest.raises(ValueError, match=r"m3qkv.mxfp8_quantize: x must be \[M, K\] with K % 128 == 0"):
        torch.ops.m3qkv.mxfp8_quantize(torch.empty(M, 96, dtype=torch.bfloat16, device="meta"))
    with pytest.raises(ValueError, match=r"m3qkv.mxfp8_quantize: x must have dtype torch.bfloat16"):
        m3qkv.mxfp8_quantize(torch.empty(M, K, device="meta"))


def test_cpu_tensors_are_refused_by_name():
    a, kw = base("cpu")
    with pytest.raises(ValueError, match=r"m3qkv.fused_qkv: the tensors must be CUDA tensors, got device cpu"):
        m3qkv.fused_qkv(*a.values(), **kw)
    with pytest.raises(ValueError, match=r"m3qkv.mxfp8_quantize: the tensors must be CUDA tensors"):
        m3qkv.mxfp8_quantize(torch.zeros(M, K, dtype=torch.bfloat16))


def test_new_formats_need_a_new_library():
    lib = m3qkv.library()
    a, kw = base("cpu")
    kw = dict(kw, kv_cache=torch.zeros(3, 2, 16, 1, 128, dtype=torch.bfloat16))
    if lib.cache_formats:
        with pytest.raises(ValueError, match="must be CUDA tensors"):
            call(a, kw)
    else:
        with pytest.raises(NotImplementedError, match=r"needs the FP8/BF16 cache formats .* predates them"):
            call(a, kw)


def test_c_errors_carry_the_library_message():
    lib = m3qkv.library()
    a = _capi.FusedArgs()
    a.struct_size = lib.fused_struct_size
    a.m, a.k, a.nq, a.nkv = 7, 100, 16, 1
    err = lib.error(lib.fused_qkv(ctypes.addressof(a), None))
    assert isinstance(err, ValueError) and err.status == _capi.ERROR_INVALID_SHAPE
    assert str(err) == "M3QKV_ERROR_INVALID_SHAPE: m3qkv_fused_qkv: k = 100 is not a multiple of 128"
    a.k = 256
    err = lib.error(lib.fused_qkv(ctypes.addressof(a), None))
    assert isinstance(err, ValueError) and "block_size = 0 must be > 0" in str(err)
    g = _capi.GemmArgs()
    g.struct_size = ctypes.sizeof(g)
    g.m, g.n, g.k = 1, 100, 128
    err = lib.error(lib.mxfp8_gemm(ctypes.addressof(g), None))
    assert isinstance(err, ValueError) and "n = 100" in str(err)
    for st, cls in [(_capi.ERROR_CUDA_ERROR, RuntimeError), (_capi.ERROR_UNSUPPORTED_DEVICE, RuntimeError),
                    (_capi.ERROR_INTERNAL, RuntimeError), (_capi.ERROR_MISALIGNED, ValueError),
                    (_capi.ERROR_NULL_POINTER, ValueError), (_capi.ERROR_STRUCT_SIZE, ValueError),
                    (_capi.ERROR_TOO_LARGE, ValueError), (_capi.ERROR_INVALID_ARGUMENT, ValueError)]:
        e = lib.error(st)
        assert isinstance(e, cls) and isinstance(e, m3qkv.M3qkvError) and e.status == st


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA device")
def test_no_gpu_is_a_runtime_error():
    with pytest.raises(RuntimeError, match="M3QKV_ERROR_UNSUPPORTED_DEVICE"):
        m3qkv.library().backend_of(0)
    with pytest.raises(m3qkv.M3qkvRuntimeError):
        torch.ops.m3qkv.backend(0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA device")
def test_no_gpu_warmup_is_the_library_error():
    # Not torch's RuntimeError from torch.cuda.current_device(): the library's
    # UNSUPPORTED_DEVICE with its message, as backend() raises.
    for args in ((), (0,)):
        with pytest.raises(m3qkv.M3qkvRuntimeError, match="M3QKV_ERROR_UNSUPPORTED_DEVICE: .*m3qkv_warmup: ") as e:
            m3qkv.warmup(*args)
        assert e.value.status == _capi.ERROR_UNSUPPORTED_DEVICE
    with pytest.raises(m3qkv.M3qkvRuntimeError, match="M3QKV_ERROR_UNSUPPORTED_DEVICE: .*m3qkv_backend: "):
        m3qkv.backend()


def test_release_stream_is_exported_and_bound():
    """m3qkv.release_stream exists, and the library the package loaded has
    m3qkv_release_stream (CPU: its call needs a CUDA stream, tested on a GPU)."""
    import m3qkv
    assert "release_stream" in m3qkv.__all__ and callable(m3qkv.release_stream)
    assert m3qkv.library().release_stream is not None


@pytest.mark.gpu
def test_release_stream_frees_and_the_next_call_allocates_again():
    import m3qkv
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        m3qkv.release_stream()  # nothing held yet: no error
    s.synchronize()
    m3qkv.release_stream(s)


@pytest.mark.parametrize("cls,text,want,status", [
    (ValueError, "M3QKV_ERROR_INVALID_ARGUMENT: m3qkv_fused_qkv: eps must be finite and > 0, got -1",
     m3qkv.M3qkvValueError, 1),
    (ValueError, "M3QKV_ERROR_MISALIGNED: m3qkv_fused_qkv: xq must be 16-byte aligned", m3qkv.M3qkvValueError, 2),
    (RuntimeError, "M3QKV_ERROR_CUDA_ERROR: m3qkv_fused_qkv: cudaLaunchKernelEx failed", m3qkv.M3qkvRuntimeError, 4),
    (RuntimeError, "M3QKV_ERROR_UNSUPPORTED_DEVICE: m3qkv_fused_qkv: no device", m3qkv.M3qkvRuntimeError, 3),
])
def test_from_native_maps_c_errors(cls, text, want, status):
    """The module functions re-raise a C++ op's C-call error as the M3qkvError
    subclass the ctypes path raises: same class, status and text."""
    e = m3qkv._capi.from_native(cls(text))
    assert type(e) is want and e.status == status and str(e) == text
    assert isinstance(e, cls)


@pytest.mark.parametrize("e", [
    ValueError("m3qkv.fused_qkv: xq must have dtype torch.float8_e4m3fn, got torch.bfloat16 [1, 256] on cuda:0"),
    ValueError("M3QKV_ERROR_NOT_A_STATUS: text"),
    RuntimeError("fused_qkv() Expected a value of type 'Tensor' for argument 'wq'"),
    m3qkv.M3qkvValueError(1, "already mapped"),
])
def test_from_native_keeps_other_errors(e):
    assert m3qkv._capi.from_native(e) is e
