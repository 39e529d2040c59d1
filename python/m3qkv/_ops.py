"""torch custom ops m3qkv::* over the C API: schemas, argument checks, the
ctypes kernels, the fake kernels and the eager fast path.

The ops are implemented twice. When libm3qkv_torch_ops.so is usable (see
_native.py) it defines fused_qkv, qknorm_rope_kv_insert, mxfp8_gemm and
mxfp8_quantize with the schemas of SCHEMAS below and runs their CUDA and CPU
kernels in C++ (the checks of this file ported rule for rule); this module
then registers only the fake kernels and the backend op. Otherwise the ctypes
kernels below are the CUDA and CPU kernels.

Each op has one argument check (_check_*), shared by the ctypes kernel, the
fake/meta kernel (so that torch.compile and torch.export trace the same rules)
and the direct eager entry points of m3qkv/__init__.py. The check returns the
scalar fields of the C struct; the CUDA kernel adds the data pointers and the
current stream and calls the library. Nothing synchronizes the host, so the
ops can be captured into CUDA graphs.
"""
from __future__ import annotations

import ctypes
import threading

import torch

from . import _capi, _native

_E4M3 = torch.float8_e4m3fn
_SF_DTYPES = (torch.uint8,) + ((torch.float8_e8m0fnu,) if hasattr(torch, "float8_e8m0fnu") else ())
_FLAG_DTYPES = (torch.int32,) + ((torch.uint32,) if hasattr(torch, "uint32") else ())

# Common tail of the two epilogue ops' schemas (keyword-only).
_EPILOGUE_KW = ("Tensor slot_mapping, Tensor? index_slot_mapping, Tensor(a!) kv_cache, Tensor(b!)? index_cache, "
                "Tensor(c!)? index_q_out, Tensor(d!)? q_out=None, Tensor(e!)? q_fp8_out=None, "
                "float q_fp8_scale=1.0, float k_scale=1.0, float v_scale=1.0")
_EPILOGUE_TAIL = ("bool use_pdl=True, int? grid=None, Tensor(f!)? v_cache=None, int? nq=None, int? nkv=None, "
                  "int? niq=None, int? nik=None, Tensor(g!)? error_flags=None")

# The op schemas (python/csrc/m3qkv_torch_ops.cpp declares the same strings;
# _native.py checks that the two agree). bf16 activations (x_bf16, appended in
# 0.3): the optional last argument of fused_qkv and mxfp8_gemm; with it xq and
# xsf are None (hence `Tensor?`: every call written for the earlier schema
# still binds the same way).
SCHEMAS = {
    "fused_qkv": "fused_qkv(Tensor? xq, Tensor? xsf, Tensor wq, Tensor wsf, Tensor positions, Tensor cos_sin_cache, "
                 "Tensor q_norm_weight, Tensor k_norm_weight, Tensor? index_q_norm_weight, "
                 "Tensor? index_k_norm_weight, "
                 f"float eps, *, {_EPILOGUE_KW}, int? cta_group=None, {_EPILOGUE_TAIL}, Tensor? x_bf16=None) -> ()",
    "qknorm_rope_kv_insert": "qknorm_rope_kv_insert(Tensor qkv, Tensor positions, Tensor cos_sin_cache, "
                             "Tensor q_norm_weight, Tensor k_norm_weight, Tensor? index_q_norm_weight, "
                             "Tensor? index_k_norm_weight, float eps, *, "
                             f"{_EPILOGUE_KW}, {_EPILOGUE_TAIL}) -> ()",
    "mxfp8_gemm": "mxfp8_gemm(Tensor? xq, Tensor? xsf, Tensor wq, Tensor wsf, *, bool use_pdl=True, int? grid=None, "
                  "Tensor? x_bf16=None) -> Tensor",
    "mxfp8_quantize": "mxfp8_quantize(Tensor x, *, bool use_pdl=True) -> (Tensor, Tensor)",
    "backend": "backend(int device=-1) -> str",
}
# The ops libm3qkv_torch_ops.so implements (backend stays in Python).
CPP_OPS = ("fused_qkv", "qknorm_rope_kv_insert", "mxfp8_gemm", "mxfp8_quantize")

# The C++ library, when used, is loaded here: it defines its ops as it loads.
TORCH_OPS = _native.load(SCHEMAS, CPP_OPS)
# A fragment: the C++ library's ops live in the same namespace.
LIBRARY = torch.library.Library("m3qkv", "FRAGMENT")
for _name, _schema in SCHEMAS.items():
    if _name not in TORCH_OPS["ops"]:
        LIBRARY.define(_schema)


# ---------------------------------------------------------------- checks
def _fail(fn, msg):
    raise ValueError(f"{fn}: {msg}")


def _desc(t):
    return f"{t.dtype} {list(t.shape)} on {t.device}"


# The tensor whose device the others must share, per op (fused_qkv and
# mxfp8_gemm: x_bf16 instead of xq when the call has bf16 activations; the
# check of the call sets it for its thread, see _activations).
_FIRST = {"m3qkv.fused_qkv": "xq", "m3qkv.qknorm_rope_kv_insert": "qkv", "m3qkv.mxfp8_gemm": "xq",
          "m3qkv.mxfp8_quantize": "x"}
_first_tls = threading.local()


def _device(fn, name, t, dev):
    if t.device != dev:
        first = getattr(_first_tls, "name", None) if fn in ("m3qkv.fused_qkv", "m3qkv.mxfp8_gemm") else None
        _fail(fn, f"{name} is on {t.device}, but {first or _FIRST[fn]} is on {dev}: every tensor must be on one CUDA "
                  f"device")


def _tensor(fn, name, t, dtype, dev, ndim=None):
    """t is a contiguous tensor of `dtype` (or one of a tuple) on device `dev`."""
    if t is None:
        _fail(fn, f"{name} is required here")
    if isinstance(dtype, tuple):
        if t.dtype not in dtype:
            _fail(fn, f"{name} must have dtype {' or '.join(map(str, dtype))}, got {_desc(t)}")
    elif t.dtype != dtype:
        _fail(fn, f"{name} must have dtype {dtype}, got {_desc(t)}")
    if t.device != dev:
        _device(fn, name, t, dev)
    if ndim is not None and t.dim() != ndim:
        _fail(fn, f"{name} must be {ndim}-D, got {_desc(t)}")
    if not t.is_contiguous():
        _fail(fn, f"{name} must be contiguous, got strides {t.stride()} for {_desc(t)}")


def _shape(fn, name, t, shape, what=""):
    if tuple(t.shape) != shape:
        _fail(fn, f"{name} must have shape {list(shape)}{what}, got {_desc(t)}")


def _rows(fn, name, t, m, width, dtype, dev):
    """An output of m rows × width values: [m, width] or any contiguous shape
    with m leading rows and m·width elements (e.g. [m, heads, 128])."""
    _tensor(fn, name, t, dtype, dev)
    if t.dim() < 1 or t.shape[0] != m or t.numel() != m * width:
        _fail(fn, f"{name} must hold [{m}, {width}] values (m rows), got {_desc(t)}")


def f8_128x4_bytes(rows, k):
    cols = k // 32
    return (rows + 127) // 128 * 128 * ((cols + 3) // 4 * 4)


def _scales(fn, name, t, rows, k, dev, of):
    _tensor(fn, name, t, _SF_DTYPES, dev)
    want = f8_128x4_bytes(rows, k)
    if t.numel() != want:
        _fail(fn, f"{name} must hold the F8_128x4-swizzled e8m0 scales of {of} [{rows}, {k}]: "
                  f"ceil({rows}/128)·128 · ceil({k // 32}/4)·4 = {want} bytes, got {_desc(t)}")


def _heads(fn, what, n, nq, nkv, niq, nik, index_q_out, index_cache):
    if nq is None and nkv is None and niq is None and nik is None:
        h, r = n // 128, n % 128
        if r or h < 20 or (h - 1) % 19:
            _fail(fn, f"{what} has N = {n} rows, which is not (19·nkv + 1)·128 for any nkv >= 1 "
                      f"(the layout nq = 16·nkv, niq = nkv, nik = 1 inferred when no head counts are given); "
                      f"pass nq=, nkv=, niq=, nik= for other layouts (TP8: nq=8, nkv=1, niq=1, nik=1 -> N = 1536; "
                      f"dense: niq=0, nik=0)")
        kv = (h - 1) // 19
        return 16 * kv, kv, kv, 1
    if nq is None or nkv is None:
        _fail(fn, f"explicit head counts need at least nq and nkv (got nq={nq}, nkv={nkv})")
    if niq is None:
        niq = nkv if index_q_out is not None else 0
    if nik is None:
        nik = 1 if index_cache is not None else 0
    if (nq + 2 * nkv + niq + nik) * 128 != n:
        _fail(fn, f"{what} has N = {n} rows, but the head counts nq={nq}, nkv={nkv}, niq={niq}, nik={nik} "
                  f"give (nq + 2·nkv + niq + nik)·128 = {(nq + 2 * nkv + niq + nik) * 128}")
    return nq, nkv, niq, nik


def _no_formats(fn, what):
    lib = _capi.library()
    raise NotImplementedError(
        f"{fn}: {what} needs the FP8/BF16 cache formats (kv_cache_dtype / index_cache_dtype, docs/contract.md §4.3), "
        f"but the loaded {lib.path} predates them (its m3qkv_fused_args has {lib.fused_struct_size} bytes); "
        f"only NVFP4 caches (uint8, last dim 72) work with this library")


def _no_x_bf16(fn):
    lib = _capi.library()
    raise NotImplementedError(
        f"{fn}: x_bf16 (bf16 activations) needs m3qkv 0.3, but the loaded {lib.path} predates it (its "
        f"m3qkv_fused_args has {lib.fused_struct_size} bytes, m3qkv_gemm_args {lib.gemm_struct_size}); pass MXFP8 "
        f"activations (xq, xsf from m3qkv.mxfp8_quantize) with this library")


def _activations(fn, xq, xsf, x_bf16, fake):
    """The activations: exactly one of x_bf16 (bf16 [M, K]) and (xq, xsf)
    (MXFP8; xsf is checked by the caller, once N is known). -> (device, m, k, name)."""
    if x_bf16 is not None:
        if xq is not None or xsf is not None:
            given = " and ".join(n for n, t in (("xq", xq), ("xsf", xsf)) if t is not None)
            _fail(fn, f"x_bf16 and {given} are given: pass either x_bf16 (bf16 activations [M, K]) or xq and xsf "
                      f"(MXFP8 activations), not both (xq=None, xsf=None with x_bf16)")
        _first_tls.name = "x_bf16"
        dev = x_bf16.device
        _tensor(fn, "x_bf16", x_bf16, torch.bfloat16, dev, 2)
        if not fake and not _capi.library().x_bf16:
            _no_x_bf16(fn)
        return dev, x_bf16.shape[0], x_bf16.shape[1], "x_bf16"
    _first_tls.name = "xq"
    if xq is None:
        _fail(fn, "xq is required (or bf16 activations as x_bf16=, with xq=None and xsf=None)")
    if xq.dtype == torch.bfloat16:
        _fail(fn, f"xq must have dtype torch.float8_e4m3fn (MXFP8, with its scales xsf), got {_desc(xq)}: pass bf16 "
                  f"activations as x_bf16= (with xq=None and xsf=None)")
    dev = xq.device
    _tensor(fn, "xq", xq, _E4M3, dev, 2)
    if xsf is None:
        _fail(fn, "xsf is required with xq (the F8_128x4-swizzled e8m0 scales of xq)")
    return dev, xq.shape[0], xq.shape[1], "xq"


def _kv_cache(fn, kv, v, nkv, dev, fake):
    """-> (format, num_blocks, block_size, page, token, head strides in bytes, V byte offset or None)."""
    if kv is None:
        _fail(fn, "kv_cache is required")
    _device(fn, "kv_cache", kv, dev)
    if kv.dtype == torch.uint8:
        if kv.dim() != 4 or kv.shape[1] != 2 * nkv or kv.shape[3] != 72:
            _fail(fn, f"an NVFP4 kv_cache (uint8) must be [num_blocks, 2·nkv = {2 * nkv}, block_size, 72], "
                      f"got {_desc(kv)}")
        bs = kv.shape[2]
        if kv.stride(3) != 1 or kv.stride(2) != 72 or kv.stride(1) != bs * 72:
            _fail(fn, f"kv_cache pages must be packed inside ([.., 2·nkv, block_size, 72] contiguous; any page "
                      f"stride): got strides {kv.stride()} for {_desc(kv)}")
        if v is not None:
            _fail(fn, "v_cache must be None with an NVFP4 kv_cache (K and V share the pages)")
        return _capi.CACHE_NVFP4, kv.shape[0], bs, kv.stride(0), 0, 0, None
    if kv.dtype not in (_E4M3, torch.bfloat16):
        _fail(fn, f"kv_cache must be uint8 (NVFP4 pages [num_blocks, 2·nkv, block_size, 72]) or float8_e4m3fn / "
                  f"bfloat16 (vLLM flash layout [num_blocks, 2, block_size, nkv, 128] or K and V as two "
                  f"[num_blocks, block_size, nkv, 128]), got {_desc(kv)}")
    fmt = _capi.CACHE_FP8 if kv.dtype == _E4M3 else _capi.CACHE_BF16
    e = kv.element_size()
    if kv.dim() == 5:
        if tuple(kv.shape[1:2]) != (2,) or kv.shape[3] != nkv or kv.shape[4] != 128:
            _fail(fn, f"a 5-D kv_cache must be [num_blocks, 2, block_size, nkv = {nkv}, 128], got {_desc(kv)}")
        if v is not None:
            _fail(fn, "v_cache must be None when kv_cache holds K and V ([num_blocks, 2, block_size, nkv, 128])")
        if kv.stride(4) != 1:
            _fail(fn, f"kv_cache's last dimension must be contiguous, got strides {kv.stride()}")
        out = (fmt, kv.shape[0], kv.shape[2], kv.stride(0) * e, kv.stride(2) * e, kv.stride(3) * e,
               kv.stride(1) * e)
    elif kv.dim() == 4:
        if kv.shape[2] != nkv or kv.shape[3] != 128:
            _fail(fn, f"a 4-D {kv.dtype} kv_cache must be [num_blocks, block_size, nkv = {nkv}, 128], got {_desc(kv)}")
        if v is None:
            _fail(fn, "v_cache is required with a 4-D kv_cache (K alone: [num_blocks, block_size, nkv, 128])")
        if v.dtype != kv.dtype or tuple(v.shape) != tuple(kv.shape) or v.stride() != kv.stride() or v.device != dev:
            _fail(fn, f"v_cache must match kv_cache in dtype, shape, strides and device: kv_cache {_desc(kv)} "
                      f"strides {kv.stride()}, v_cache {_desc(v)} strides {v.stride()}")
        if kv.stride(3) != 1:
            _fail(fn, f"kv_cache's last dimension must be contiguous, got strides {kv.stride()}")
        out = (fmt, kv.shape[0], kv.shape[1], kv.stride(0) * e, kv.stride(1) * e, kv.stride(2) * e, None)
    else:
        _fail(fn, f"a {kv.dtype} kv_cache must be 5-D [num_blocks, 2, block_size, nkv, 128] or 4-D "
                  f"[num_blocks, block_size, nkv, 128] with v_cache, got {_desc(kv)}")
    if not fake and not _capi.library().cache_formats:
        _no_formats(fn, f"a {kv.dtype} kv_cache")
    return out


def _index_cache(fn, ix, bs, dev, fake):
    """-> (format, num_index_blocks, page stride in bytes)."""
    if ix is None:
        _fail(fn, "index_cache is required when nik > 0")
    _device(fn, "index_cache", ix, dev)
    if ix.dtype == torch.uint8:
        if ix.dim() != 3 or ix.shape[2] != 72 or ix.shape[1] != bs:
            _fail(fn, f"an NVFP4 index_cache (uint8) must be [num_index_blocks, block_size = {bs}, 72], got {_desc(ix)}")
        if ix.stride(2) != 1 or ix.stride(1) != 72:
            _fail(fn, f"index_cache pages must be packed inside ([.., block_size, 72] contiguous; any page stride): "
                      f"got strides {ix.stride()}")
        return _capi.CACHE_NVFP4, ix.shape[0], ix.stride(0)
    if ix.dtype not in (_E4M3, torch.bfloat16):
        _fail(fn, f"index_cache must be uint8 (NVFP4 [num_index_blocks, block_size, 72]) or float8_e4m3fn / bfloat16 "
                  f"([num_index_blocks, block_size, 128]), got {_desc(ix)}")
    if ix.dim() != 3 or ix.shape[1] != bs or ix.shape[2] != 128:
        _fail(fn, f"a {ix.dtype} index_cache must be [num_index_blocks, block_size = {bs}, 128], got {_desc(ix)}")
    if ix.stride(2) != 1 or ix.stride(1) != 128:
        _fail(fn, f"index_cache tokens must be packed ([.., block_size, 128] contiguous; any page stride): got "
                  f"strides {ix.stride()}")
    if not fake and not _capi.library().cache_formats:
        _no_formats(fn, f"a {ix.dtype} index_cache")
    return (_capi.CACHE_FP8 if ix.dtype == _E4M3 else _capi.CACHE_BF16), ix.shape[0], ix.stride(0) * ix.element_size()


def _check_epilogue(fn, dev, m, heads, positions, cos_sin_cache, q_norm_weight, k_norm_weight,
                    index_q_norm_weight, index_k_norm_weight, slot_mapping, index_slot_mapping, kv_cache,
                    index_cache, index_q_out, q_out, q_fp8_out, v_cache, error_flags, fake):
    nq, nkv, niq, nik = heads
    _tensor(fn, "positions", positions, torch.int64, dev)
    _shape(fn, "positions", positions, (m,), " (one per token)")
    _tensor(fn, "cos_sin_cache", cos_sin_cache, torch.bfloat16, dev, 2)
    if cos_sin_cache.shape[1] != 64:
        _fail(fn, f"cos_sin_cache must be [max_position, 64] (row = [cos 0..31 | sin 0..31]), got {_desc(cos_sin_cache)}")
    _tensor(fn, "q_norm_weight", q_norm_weight, torch.bfloat16, dev)
    _shape(fn, "q_norm_weight", q_norm_weight, (128,))
    _tensor(fn, "k_norm_weight", k_norm_weight, torch.bfloat16, dev)
    _shape(fn, "k_norm_weight", k_norm_weight, (128,))
    if niq:
        _tensor(fn, "index_q_norm_weight", index_q_norm_weight, torch.bfloat16, dev)
        _shape(fn, "index_q_norm_weight", index_q_norm_weight, (128,), f" (niq = {niq})")
        _rows(fn, "index_q_out", index_q_out, m, niq * 128, _E4M3, dev)
    if nik:
        _tensor(fn, "index_k_norm_weight", index_k_norm_weight, torch.bfloat16, dev)
        _shape(fn, "index_k_norm_weight", index_k_norm_weight, (128,), f" (nik = {nik})")
        _tensor(fn, "index_slot_mapping", index_slot_mapping, torch.int64, dev)
        _shape(fn, "index_slot_mapping", index_slot_mapping, (m,), " (one per token)")
    _tensor(fn, "slot_mapping", slot_mapping, torch.int64, dev)
    _shape(fn, "slot_mapping", slot_mapping, (m,), " (one per token)")
    if q_out is None and q_fp8_out is None:
        _fail(fn, "at least one of q_out (bf16) and q_fp8_out (float8_e4m3fn) is required")
    if q_out is not None:
        _rows(fn, "q_out", q_out, m, nq * 128, torch.bfloat16, dev)
    if q_fp8_out is not None:
        _rows(fn, "q_fp8_out", q_fp8_out, m, nq * 128, _E4M3, dev)
    if error_flags is not None:
        _tensor(fn, "error_flags", error_flags, _FLAG_DTYPES, dev)
        if error_flags.numel() < 1:
            _fail(fn, "error_flags must hold at least one int32")
    kvf = _kv_cache(fn, kv_cache, v_cache, nkv, dev, fake)
    ixf = _index_cache(fn, index_cache, kvf[2], dev, fake) if nik else (_capi.CACHE_NVFP4, 0, 0)
    return kvf, ixf


def _check_fused(xq, xsf, wq, wsf, positions, cos_sin_cache, q_norm_weight, k_norm_weight, index_q_norm_weight,
                 index_k_norm_weight, slot_mapping, index_slot_mapping, kv_cache, index_cache, index_q_out, q_out,
                 q_fp8_out, v_cache, nq, nkv, niq, nik, error_flags, fake, x_bf16=None):
    fn = "m3qkv.fused_qkv"
    dev, m, k, xname = _activations(fn, xq, xsf, x_bf16, fake)
    _tensor(fn, "wq", wq, _E4M3, dev, 2)
    n = wq.shape[0]
    if wq.shape[1] != k:
        _fail(fn, f"wq must be [N, K = {k}] (K-major, K as in {xname}), got {_desc(wq)}")
    if x_bf16 is None:
        _scales(fn, "xsf", xsf, m, k, dev, "xq")
    _scales(fn, "wsf", wsf, n, k, dev, "wq")
    heads = _heads(fn, "wq", n, nq, nkv, niq, nik, index_q_out, index_cache)
    kvf, ixf = _check_epilogue(fn, dev, m, heads, positions, cos_sin_cache, q_norm_weight, k_norm_weight,
                               index_q_norm_weight, index_k_norm_weight, slot_mapping, index_slot_mapping, kv_cache,
                               index_cache, index_q_out, q_out, q_fp8_out, v_cache, error_flags, fake)
    return dev, m, k, heads, kvf, ixf


def _check_insert(qkv, positions, cos_sin_cache, q_norm_weight, k_norm_weight, index_q_norm_weight,
                  index_k_norm_weight, slot_mapping, index_slot_mapping, kv_cache, index_cache, index_q_out, q_out,
                  q_fp8_out, v_cache, nq, nkv, niq, nik, error_flags, fake):
    fn = "m3qkv.qknorm_rope_kv_insert"
    if qkv is None:
        _fail(fn, "qkv is required")
    dev = qkv.device
    _tensor(fn, "qkv", qkv, torch.bfloat16, dev, 2)
    m, n = qkv.shape
    heads = _heads(fn, "qkv", n, nq, nkv, niq, nik, index_q_out, index_cache)
    kvf, ixf = _check_epilogue(fn, dev, m, heads, positions, cos_sin_cache, q_norm_weight, k_norm_weight,
                               index_q_norm_weight, index_k_norm_weight, slot_mapping, index_slot_mapping, kv_cache,
                               index_cache, index_q_out, q_out, q_fp8_out, v_cache, error_flags, fake)
    return dev, m, heads, kvf, ixf


def _check_gemm(xq, xsf, wq, wsf, x_bf16=None, fake=False):
    fn = "m3qkv.mxfp8_gemm"
    dev, m, k, xname = _activations(fn, xq, xsf, x_bf16, fake)
    _tensor(fn, "wq", wq, _E4M3, dev, 2)
    if wq.shape[1] != k:
        _fail(fn, f"wq must be [N, K = {k}] (K-major, K as in {xname}), got {_desc(wq)}")
    if x_bf16 is None:
        _scales(fn, "xsf", xsf, m, k, dev, "xq")
    _scales(fn, "wsf", wsf, wq.shape[0], k, dev, "wq")
    return dev, m, wq.shape[0], k


def _check_quantize(x):
    fn = "m3qkv.mxfp8_quantize"
    if x is None:
        _fail(fn, "x is required")
    _tensor(fn, "x", x, torch.bfloat16, x.device, 2)
    m, k = x.shape
    if k % 128:
        _fail(fn, f"x must be [M, K] with K % 128 == 0, got {_desc(x)}")
    return x.device, m, k


# --------------------------------------------------------------- launches
_tls = threading.local()


def _struct(cls):
    """One args struct per thread and type, reused call after call (ctypes
    releases the GIL during the call, so a shared one could be overwritten)."""
    a = _tls.__dict__.get(cls)
    if a is None:
        a = cls()
        _tls.__dict__[cls] = a
    return a


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _stream(dev):
    if _raw_stream is not None:
        return _raw_stream(dev.index)
    return torch.cuda.current_stream(dev).cuda_stream


def _cuda_dev(fn, dev):
    if dev.type != "cuda":
        _fail(fn, f"the tensors must be CUDA tensors, got device {dev}")


def _ptr(t):
    return t.data_ptr() if t is not None else None


def _call(dev, f, args):
    """f(args, current stream of dev) on dev; raises the C error."""
    lib = _capi.library()
    if dev.index != torch.cuda.current_device():
        with torch.cuda.device(dev):
            st = f(ctypes.addressof(args), _stream(dev))
    else:
        st = f(ctypes.addressof(args), _stream(dev))
    if st:
        raise lib.error(st)


def _fill_epilogue(a, lib, heads, m, kvf, ixf, positions, cos_sin_cache, q_norm_weight, k_norm_weight,
                   index_q_norm_weight, index_k_norm_weight, eps, slot_mapping, index_slot_mapping, kv_cache,
                   index_cache, index_q_out, q_out, q_fp8_out, q_fp8_scale, k_scale, v_scale, use_pdl, grid,
                   v_cache, error_flags, struct_size):
    nq, nkv, niq, nik = heads
    a.struct_size = struct_size
    a.m = m
    a.nq, a.nkv, a.niq, a.nik = nq, nkv, niq, nik
    a.positions = positions.data_ptr()
    a.max_position = cos_sin_cache.shape[0]
    a.cos_sin_cache = cos_sin_cache.data_ptr()
    a.q_norm_weight = q_norm_weight.data_ptr()
    a.k_norm_weight = k_norm_weight.data_ptr()
    a.index_q_norm_weight = index_q_norm_weight.data_ptr() if niq else None
    a.index_k_norm_weight = index_k_norm_weight.data_ptr() if nik else None
    a.eps = eps
    a.slot_mapping = slot_mapping.data_ptr()
    a.index_slot_mapping = index_slot_mapping.data_ptr() if nik else None
    fmt, nb, bs, page, tok, head, voff = kvf
    base = kv_cache.data_ptr()
    a.kv_cache, a.kv_page_stride, a.num_blocks, a.block_size = base, page, nb, bs
    if nik:
        a.index_cache, a.index_page_stride, a.num_index_blocks = index_cache.data_ptr(), ixf[2], ixf[1]
    else:
        a.index_cache, a.index_page_stride, a.num_index_blocks = None, 0, 0
    a.q_out = _ptr(q_out)
    a.q_fp8_out = _ptr(q_fp8_out)
    a.index_q_out = index_q_out.data_ptr() if niq else None
    a.q_fp8_scale, a.k_scale, a.v_scale = q_fp8_scale, k_scale, v_scale
    a.use_pdl = 1 if use_pdl else 0
    a.grid = 0 if grid is None else grid
    a.error_flags = _ptr(error_flags)
    if lib.cache_formats:
        a.kv_cache_dtype, a.index_cache_dtype = fmt, ixf[0]
        a.v_cache = None if fmt == _capi.CACHE_NVFP4 else (v_cache.data_ptr() if voff is None else base + voff)
        a.kv_token_stride, a.kv_head_stride = tok, head


def fused_qkv_args(xq, xsf, wq, wsf, positions, cos_sin_cache, q_norm_weight, k_norm_weight, index_q_norm_weight,
                   index_k_norm_weight, eps, *, slot_mapping, index_slot_mapping, kv_cache, index_cache, index_q_out,
                   q_out=None, q_fp8_out=None, q_fp8_scale=1.0, k_scale=1.0, v_scale=1.0, cta_group=None,
                   use_pdl=True, grid=None, v_cache=None, nq=None, nkv=None, niq=None, nik=None, error_flags=None,
                   x_bf16=None):
    """Checks the arguments and fills this thread's m3qkv_fused_args: -> (device, struct).
    (Any device: the CUDA kernel refuses other devices; tools/measure_overhead.py
    times this part alone on CPU tensors.)"""
    dev, m, k, heads, kvf, ixf = _check_fused(
        xq, xsf, wq, wsf, positions, cos_sin_cache, q_norm_weight, k_norm_weight, index_q_norm_weight,
        index_k_norm_weight, slot_mapping, index_slot_mapping, kv_cache, index_cache, index_q_out, q_out, q_fp8_out,
        v_cache, nq, nkv, niq, nik, error_flags, False, x_bf16)
    lib = _capi.library()
    a = _struct(_capi.FusedArgs)
    _fill_epilogue(a, lib, heads, m, kvf, ixf, positions, cos_sin_cache, q_norm_weight, k_norm_weight,
                   index_q_norm_weight, index_k_norm_weight, eps, slot_mapping, index_slot_mapping, kv_cache,
                   index_cache, index_q_out, q_out, q_fp8_out, q_fp8_scale, k_scale, v_scale, use_pdl, grid,
                   v_cache, error_flags, lib.fused_struct_size)
    a.k = k
    a.xq, a.xsf, a.wq, a.wsf = _ptr(xq), _ptr(xsf), wq.data_ptr(), wsf.data_ptr()
    a.cta_group = 0 if cta_group is None else cta_group
    a.x_bf16 = _ptr(x_bf16)  # past struct_size (not read) in a library before 0.3: then x_bf16 is None here
    return dev, a


def fused_qkv_impl(*args, **kwargs):
    dev, a = fused_qkv_args(*args, **kwargs)
    _cuda_dev("m3qkv.fused_qkv", dev)
    _call(dev, _capi.library().fused_qkv, a)


# ---------------------------------------------------- eager fast path (fused)
# The checks above call one helper per rule and set the struct field by field:
# clear, but tens of microseconds per call in Python. The common eager case
# (CUDA tensors, NVFP4 caches, no v_cache) is checked here in one flat pass
# and the whole struct is written with one struct.pack_into. It accepts a
# subset of what _check_fused accepts (python/tests/test_fast_path.py checks
# that it rejects every case _check_fused rejects and writes the same bytes);
# anything else falls back to fused_qkv_impl, which raises the precise error.
_FAST_ORDER = ["struct_size", "m", "k", "nq", "nkv", "niq", "nik", "xq", "xsf", "wq", "wsf", "positions",
               "max_position", "cos_sin_cache", "q_norm_weight", "k_norm_weight", "index_q_norm_weight",
               "index_k_norm_weight", "eps", "slot_mapping", "index_slot_mapping", "kv_cache", "kv_page_stride",
               "num_blocks", "index_cache", "index_page_stride", "num_index_blocks", "block_size", "q_out",
               "q_fp8_out", "index_q_out", "q_fp8_scale", "k_scale", "v_scale", "cta_group", "use_pdl", "grid",
               "error_flags"]
_FAST_EXT = ["kv_cache_dtype", "index_cache_dtype", "v_cache", "kv_token_stride", "kv_head_stride"]
_FAST_X_BF16 = ["x_bf16", "batch_invariant", "precision"]  # the 0.3 fields
_U8, _I64, _I32, _BF16 = torch.uint8, torch.int64, torch.int32, torch.bfloat16
_fast_packer = None


def _packer():
    """struct.Struct for the library's m3qkv_fused_args, derived from the ctypes mirror."""
    global _fast_packer
    if _fast_packer is None:
        lib = _capi.library()
        cls = next(c for c in _capi.STRUCTS["fused"][1] if ctypes.sizeof(c) == lib.fused_struct_size)
        names = [f for f, _ in cls._fields_]
        assert names == (_FAST_ORDER + (_FAST_EXT if lib.cache_formats else []) +
                         (_FAST_X_BF16 if lib.x_bf16 else [])), "fast path field order"
        _fast_packer = (_capi.packer(cls), lib.fused_struct_size, lib.cache_formats, lib.x_bf16)
    return _fast_packer


def fused_fast_args(xq, xsf, wq, wsf, positions, cos_sin_cache, q_norm_weight, k_norm_weight, index_q_norm_weight,
                    index_k_norm_weight, eps, slot_mapping, index_slot_mapping, kv_cache, index_cache, index_q_out,
                    q_out, q_fp8_out, q_fp8_scale, k_scale, v_scale, cta_group, use_pdl, grid, v_cache, nq, nkv, niq,
                    nik, error_flags, x_bf16=None):
    """-> (device index, the struct's field values) when the flat checks pass, else None.
    (MXFP8 activations only: a call with x_bf16 takes the full checks.)"""
    if (x_bf16 is not None or v_cache is not None or xq is None or wq is None or xq.dtype is not _E4M3 or
            wq.dtype is not _E4M3):
        return None
    dev = xq.get_device()
    if xq.dim() != 2 or wq.dim() != 2 or not xq.is_contiguous() or not wq.is_contiguous() or wq.get_device() != dev:
        return None
    m, k = xq.shape
    n, k2 = wq.shape
    if k2 != k or k % 128:
        return None
    if nq is None and nkv is None and niq is None and nik is None:
        h = n // 128
        if n % 128 or h < 20 or (h - 1) % 19:
            return None
        nkv = (h - 1) // 19
        nq, niq, nik = 16 * nkv, nkv, 1
    else:
        if nq is None or nkv is None or niq is None or nik is None or (nq + 2 * nkv + niq + nik) * 128 != n:
            return None
    kt = (k // 32 + 3) // 4 * 4
    for t, want in ((xsf, (m + 127) // 128 * 128 * kt), (wsf, (n + 127) // 128 * 128 * kt)):
        if t is None or t.dtype is not _U8 or t.get_device() != dev or not t.is_contiguous() or t.numel() != want:
            return None
    for t, dt, shape in ((positions, _I64, (m,)), (slot_mapping, _I64, (m,)), (q_norm_weight, _BF16, (128,)),
                         (k_norm_weight, _BF16, (128,))):
        if t is None or t.dtype is not dt or t.shape != shape or t.get_device() != dev or not t.is_contiguous():
            return None
    if (cos_sin_cache is None or cos_sin_cache.dtype is not _BF16 or cos_sin_cache.dim() != 2 or
            cos_sin_cache.shape[1] != 64 or cos_sin_cache.get_device() != dev or not cos_sin_cache.is_contiguous()):
        return None
    if q_out is None and q_fp8_out is None:
        return None
    width = nq * 128
    for t, dt in ((q_out, _BF16), (q_fp8_out, _E4M3)):
        if t is not None and (t.dtype is not dt or t.dim() < 1 or t.shape[0] != m or t.numel() != m * width or
                              t.get_device() != dev or not t.is_contiguous()):
            return None
    if (kv_cache is None or kv_cache.dtype is not _U8 or kv_cache.dim() != 4 or kv_cache.get_device() != dev):
        return None
    nb, two_nkv, bs, tb = kv_cache.shape
    ps, s1, s2, s3 = kv_cache.stride()
    if two_nkv != 2 * nkv or tb != 72 or s1 != bs * 72 or s2 != 72 or s3 != 1:
        return None
    iqw = iq = ikw = isl = ix = 0
    ips = inb = 0
    if niq:
        if (index_q_norm_weight is None or index_q_norm_weight.dtype is not _BF16 or
                index_q_norm_weight.shape != (128,) or index_q_norm_weight.get_device() != dev or
                not index_q_norm_weight.is_contiguous()):
            return None
        if (index_q_out is None or index_q_out.dtype is not _E4M3 or index_q_out.dim() < 1 or
                index_q_out.shape[0] != m or index_q_out.numel() != m * niq * 128 or
                index_q_out.get_device() != dev or not index_q_out.is_contiguous()):
            return None
        iqw, iq = index_q_norm_weight.data_ptr(), index_q_out.data_ptr()
    if nik:
        for t, dt, shape in ((index_k_norm_weight, _BF16, (128,)), (index_slot_mapping, _I64, (m,))):
            if t is None or t.dtype is not dt or t.shape != shape or t.get_device() != dev or not t.is_contiguous():
                return None
        if (index_cache is None or index_cache.dtype is not _U8 or index_cache.dim() != 3 or
                index_cache.get_device() != dev):
            return None
        inb, ibs, itb = index_cache.shape
        ips, i1, i2 = index_cache.stride()
        if ibs != bs or itb != 72 or i1 != 72 or i2 != 1:
            return None
        ikw, isl, ix = index_k_norm_weight.data_ptr(), index_slot_mapping.data_ptr(), index_cache.data_ptr()
    ef = 0
    if error_flags is not None:
        if (error_flags.dtype not in _FLAG_DTYPES or error_flags.numel() < 1 or error_flags.get_device() != dev or
                not error_flags.is_contiguous()):
            return None
        ef = error_flags.data_ptr()
    packer, size, ext, xb = _packer()
    vals = (size, m, k, nq, nkv, niq, nik, xq.data_ptr(), xsf.data_ptr(), wq.data_ptr(), wsf.data_ptr(),
            positions.data_ptr(), cos_sin_cache.shape[0], cos_sin_cache.data_ptr(), q_norm_weight.data_ptr(),
            k_norm_weight.data_ptr(), iqw, ikw, eps, slot_mapping.data_ptr(), isl, kv_cache.data_ptr(), ps, nb, ix,
            ips, inb, bs, q_out.data_ptr() if q_out is not None else 0,
            q_fp8_out.data_ptr() if q_fp8_out is not None else 0, iq, q_fp8_scale, k_scale, v_scale,
            0 if cta_group is None else cta_group, 1 if use_pdl else 0, 0 if grid is None else grid, ef)
    if ext:
        vals += (_capi.CACHE_NVFP4, _capi.CACHE_NVFP4, 0, 0, 0)
    if xb:
        vals += (0, 0, 0)  # x_bf16 = NULL (the MXFP8 activations above), batch_invariant = 0, precision = 0 (exact)
    return dev, vals


def fused_qkv_fast(xq, xsf, wq, wsf, positions, cos_sin_cache, q_norm_weight, k_norm_weight, index_q_norm_weight,
                   index_k_norm_weight, eps, *, slot_mapping, index_slot_mapping, kv_cache, index_cache, index_q_out,
                   q_out=None, q_fp8_out=None, q_fp8_scale=1.0, k_scale=1.0, v_scale=1.0, cta_group=None,
                   use_pdl=True, grid=None, v_cache=None, nq=None, nkv=None, niq=None, nik=None, error_flags=None,
                   x_bf16=None):
    """fused_qkv_impl with the flat checks first (the eager entry point)."""
    r = fused_fast_args(xq, xsf, wq, wsf, positions, cos_sin_cache, q_norm_weight, k_norm_weight,
                        index_q_norm_weight, index_k_norm_weight, eps, slot_mapping, index_slot_mapping, kv_cache,
                        index_cache, index_q_out, q_out, q_fp8_out, q_fp8_scale, k_scale, v_scale, cta_group,
                        use_pdl, grid, v_cache, nq, nkv, niq, nik, error_flags, x_bf16)
    if r is None or r[0] < 0 or r[0] != _current_device():
        return fused_qkv_impl(xq, xsf, wq, wsf, positions, cos_sin_cache, q_norm_weight, k_norm_weight,
                              index_q_norm_weight, index_k_norm_weight, eps, slot_mapping=slot_mapping,
                              index_slot_mapping=index_slot_mapping, kv_cache=kv_cache, index_cache=index_cache,
                              index_q_out=index_q_out, q_out=q_out, q_fp8_out=q_fp8_out, q_fp8_scale=q_fp8_scale,
                              k_scale=k_scale, v_scale=v_scale, cta_group=cta_group, use_pdl=use_pdl, grid=grid,
                              v_cache=v_cache, nq=nq, nkv=nkv, niq=niq, nik=nik, error_flags=error_flags,
                              x_bf16=x_bf16)
    dev, vals = r
    a = _struct(_capi.FusedArgs)
    _packer()[0].pack_into(a, 0, *vals)
    lib = _capi.library()
    st = lib.fused_qkv(ctypes.addressof(a), _stream(torch.device("cuda", dev)) if _raw_stream is None else
                       _raw_stream(dev))
    if st:
        raise lib.error(st)


_current_device = torch.cuda.current_device


def qknorm_rope_kv_insert_impl(qkv, positions, cos_sin_cache, q_norm_weight, k_norm_weight, index_q_norm_weight,
                               index_k_norm_weight, eps, *, slot_mapping, index_slot_mapping, kv_cache, index_cache,
                               index_q_out, q_out=None, q_fp8_out=None, q_fp8_scale=1.0, k_scale=1.0, v_scale=1.0,
                               use_pdl=True, grid=None, v_cache=None, nq=None, nkv=None, niq=None, nik=None,
                               error_flags=None):
    dev, m, heads, kvf, ixf = _check_insert(
        qkv, positions, cos_sin_cache, q_norm_weight, k_norm_weight, index_q_norm_weight, index_k_norm_weight,
        slot_mapping, index_slot_mapping, kv_cache, index_cache, index_q_out, q_out, q_fp8_out, v_cache, nq, nkv,
        niq, nik, error_flags, False)
    _cuda_dev("m3qkv.qknorm_rope_kv_insert", dev)
    lib = _capi.library()
    a = _struct(_capi.InsertArgs)
    _fill_epilogue(a, lib, heads, m, kvf, ixf, positions, cos_sin_cache, q_norm_weight, k_norm_weight,
                   index_q_norm_weight, index_k_norm_weight, eps, slot_mapping, index_slot_mapping, kv_cache,
                   index_cache, index_q_out, q_out, q_fp8_out, q_fp8_scale, k_scale, v_scale, use_pdl, grid,
                   v_cache, error_flags, lib.insert_struct_size)
    a.qkv = qkv.data_ptr()
    _call(dev, lib.qknorm_rope_kv_insert, a)


def mxfp8_gemm_impl(xq, xsf, wq, wsf, *, use_pdl=True, grid=None, x_bf16=None):
    dev, m, n, k = _check_gemm(xq, xsf, wq, wsf, x_bf16)
    _cuda_dev("m3qkv.mxfp8_gemm", dev)
    lib = _capi.library()
    out = torch.empty((m, n), dtype=torch.bfloat16, device=dev)
    a = _struct(_capi.GemmArgs)
    a.struct_size = lib.gemm_struct_size
    a.m, a.n, a.k = m, n, k
    a.xq, a.xsf, a.wq, a.wsf = _ptr(xq), _ptr(xsf), wq.data_ptr(), wsf.data_ptr()
    a.x_bf16 = _ptr(x_bf16)
    a.out = out.data_ptr()
    a.use_pdl = 1 if use_pdl else 0
    a.grid = 0 if grid is None else grid
    _call(dev, lib.mxfp8_gemm, a)
    return out


def mxfp8_quantize_impl(x, *, use_pdl=True):
    dev, m, k = _check_quantize(x)
    _cuda_dev("m3qkv.mxfp8_quantize", dev)
    xq = torch.empty((m, k), dtype=_E4M3, device=dev)
    xsf = torch.empty((f8_128x4_bytes(m, k),), dtype=torch.uint8, device=dev)
    lib = _capi.library()
    a = _struct(_capi.QuantizeArgs)
    a.struct_size = ctypes.sizeof(a)
    a.m, a.k = m, k
    a.x, a.xq, a.xsf = x.data_ptr(), xq.data_ptr(), xsf.data_ptr()
    a.use_pdl = 1 if use_pdl else 0
    _call(dev, lib.mxfp8_quantize, a)
    return xq, xsf


def prepare_weights_impl(wq, wsf, *, mode="fp8", stats=False):
    fn = "m3qkv.prepare_weights"
    if mode != "fp8":
        _fail(fn, f'mode must be "fp8" (the fp8 fast mode\'s fold), got {mode!r}')
    if wq is None or wsf is None:
        _fail(fn, "wq and wsf are required")
    dev = wq.device
    _tensor(fn, "wq", wq, _E4M3, dev, 2)
    n, k = wq.shape
    if n % 128 or k % 128:
        _fail(fn, f"wq must be [N, K] with N % 128 == 0 and K % 128 == 0, got {_desc(wq)}")
    _scales(fn, "wsf", wsf, n, k, dev, "wq")
    _cuda_dev(fn, dev)
    lib = _capi.library()
    if lib.prepare_weights_fp8 is None:
        _fail(fn, f"the loaded library ({lib.path}) predates m3qkv_prepare_weights_fp8")
    wq_out = torch.empty_like(wq)
    wsf_out = torch.empty_like(wsf)
    a = _struct(_capi.PrepareArgs)
    a.struct_size = ctypes.sizeof(a)
    a.n, a.k = n, k
    a.wq, a.wsf, a.wq_out, a.wsf_out = wq.data_ptr(), wsf.data_ptr(), wq_out.data_ptr(), wsf_out.data_ptr()
    st = _capi.FoldStats()
    a.stats = ctypes.addressof(st) if stats else None
    _call(dev, lib.prepare_weights_fp8, a)
    if stats:
        return wq_out, wsf_out, {"changed": int(st.changed), "max_rel_change": float(st.max_rel_change)}
    return wq_out, wsf_out


def backend_impl(device=-1):
    lib = _capi.library()
    if device < 0:
        device = torch.cuda.current_device() if torch.cuda.is_available() else 0
    return lib.backend_of(device)


# ------------------------------------------------------------ fake kernels
def _fused_fake(xq, xsf, wq, wsf, positions, cos_sin_cache, q_norm_weight, k_norm_weight, index_q_norm_weight,
                index_k_norm_weight, eps, *, slot_mapping, index_slot_mapping, kv_cache, index_cache, index_q_out,
                q_out=None, q_fp8_out=None, q_fp8_scale=1.0, k_scale=1.0, v_scale=1.0, cta_group=None,
                use_pdl=True, grid=None, v_cache=None, nq=None, nkv=None, niq=None, nik=None, error_flags=None,
                x_bf16=None):
    _check_fused(xq, xsf, wq, wsf, positions, cos_sin_cache, q_norm_weight, k_norm_weight, index_q_norm_weight,
                 index_k_norm_weight, slot_mapping, index_slot_mapping, kv_cache, index_cache, index_q_out, q_out,
                 q_fp8_out, v_cache, nq, nkv, niq, nik, error_flags, True, x_bf16)


def _insert_fake(qkv, positions, cos_sin_cache, q_norm_weight, k_norm_weight, index_q_norm_weight,
                 index_k_norm_weight, eps, *, slot_mapping, index_slot_mapping, kv_cache, index_cache, index_q_out,
                 q_out=None, q_fp8_out=None, q_fp8_scale=1.0, k_scale=1.0, v_scale=1.0, use_pdl=True, grid=None,
                 v_cache=None, nq=None, nkv=None, niq=None, nik=None, error_flags=None):
    _check_insert(qkv, positions, cos_sin_cache, q_norm_weight, k_norm_weight, index_q_norm_weight,
                  index_k_norm_weight, slot_mapping, index_slot_mapping, kv_cache, index_cache, index_q_out, q_out,
                  q_fp8_out, v_cache, nq, nkv, niq, nik, error_flags, True)


def _gemm_fake(xq, xsf, wq, wsf, *, use_pdl=True, grid=None, x_bf16=None):
    dev, m, n, _ = _check_gemm(xq, xsf, wq, wsf, x_bf16, True)
    return wq.new_empty((m, n), dtype=torch.bfloat16)


def _quantize_fake(x, *, use_pdl=True):
    dev, m, k = _check_quantize(x)
    return x.new_empty((m, k), dtype=_E4M3), x.new_empty((f8_128x4_bytes(m, k),), dtype=torch.uint8)


for _name, _impl, _fake in [("fused_qkv", fused_qkv_fast, _fused_fake),
                            ("qknorm_rope_kv_insert", qknorm_rope_kv_insert_impl, _insert_fake),
                            ("mxfp8_gemm", mxfp8_gemm_impl, _gemm_fake),
                            ("mxfp8_quantize", mxfp8_quantize_impl, _quantize_fake)]:
    # The ctypes kernels, unless the C++ library has registered its own: CUDA
    # runs the library (fused_qkv through the fast path, as compiled graphs
    # call it every step); CPU runs the full checks and then says that the
    # tensors must be CUDA tensors (instead of torch's "no kernel for CPU").
    if _name not in TORCH_OPS["ops"]:
        LIBRARY.impl(_name, _impl, "CUDA")
        LIBRARY.impl(_name, fused_qkv_impl if _name == "fused_qkv" else _impl, "CPU")
    torch.library.register_fake(f"m3qkv::{_name}", _fake, lib=LIBRARY)
LIBRARY.impl("backend", backend_impl, "CompositeExplicitAutograd")
