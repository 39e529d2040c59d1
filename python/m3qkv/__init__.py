"""m3qkv: MiniMax-M3's fused MXFP8 QKV projection + RMSNorm/RoPE/cache-insert
epilogue, as torch custom ops over the m3qkv C library: in C++ through
libtorch's stable ABI (libm3qkv_torch_ops.so, built when torch is importable
at build time, for the stable ABI of torch 2.10 and later) or, without it,
through ctypes (m3qkv.torch_ops() says which, and why).

Ops (namespace m3qkv; each is also a function of this module with the same
signature):
  torch.ops.m3qkv.fused_qkv(xq, xsf, wq, wsf, positions, cos_sin_cache,
      q_norm_weight, k_norm_weight, index_q_norm_weight, index_k_norm_weight, eps, *,
      slot_mapping, index_slot_mapping, kv_cache, index_cache, index_q_out,
      q_out=None, q_fp8_out=None, q_fp8_scale=1.0, k_scale=1.0, v_scale=1.0,
      cta_group=None, use_pdl=True, grid=None, v_cache=None,
      nq=None, nkv=None, niq=None, nik=None, error_flags=None, x_bf16=None) -> None
      (bf16 activations, W8A16: xq=None, xsf=None, x_bf16=bf16 [M, K]; not on sm100)
  torch.ops.m3qkv.qknorm_rope_kv_insert(qkv, positions, ...same epilogue args...) -> None
  torch.ops.m3qkv.mxfp8_gemm(xq, xsf, wq, wsf, *, use_pdl=True, grid=None, x_bf16=None) -> bf16 [M, N]
  torch.ops.m3qkv.mxfp8_quantize(x, *, use_pdl=True) -> (xq e4m3 [M, K], xsf uint8 swizzled scales)
  torch.ops.m3qkv.backend(device=-1) -> "sm100" | "sm90" | "portable" | "none"
Also m3qkv.selftest(device=0) -> dict (run it first on a new kind of GPU),
m3qkv.warmup(device) and m3qkv.torch_ops() -> dict (C++ or ctypes ops).

The module functions call the library directly in eager mode (no dispatcher
round trip: the lowest per-call overhead) and go through torch.ops.m3qkv.*
when torch.compile, torch.export or a dispatch mode (fake tensors, ...) is
active. docs/contract.md in the repository describes shapes, layouts, numerics.
"""
from __future__ import annotations

import ctypes
import functools

import torch

from . import _capi, _ops
from ._native import M3qkvTorchOpsFallbackWarning
from ._capi import (CACHE_BF16, CACHE_FP8, CACHE_NVFP4, FLAG_INDEX_SLOT_OUT_OF_RANGE, FLAG_POSITION_OUT_OF_RANGE,
                    FLAG_SLOT_OUT_OF_RANGE, M3qkvError, M3qkvFallbackWarning, M3qkvRuntimeError, M3qkvValueError,
                    library)

__version__ = "0.1.0"
__all__ = ["fused_qkv", "qknorm_rope_kv_insert", "mxfp8_gemm", "mxfp8_quantize", "prepare_weights", "backend", "warmup",
           "selftest", "release_stream",
           "library", "torch_ops", "M3qkvError", "M3qkvValueError", "M3qkvRuntimeError", "M3qkvFallbackWarning",
           "M3qkvTorchOpsFallbackWarning",
           "FLAG_SLOT_OUT_OF_RANGE",
           "FLAG_INDEX_SLOT_OUT_OF_RANGE", "FLAG_POSITION_OUT_OF_RANGE", "CACHE_NVFP4", "CACHE_FP8", "CACHE_BF16"]

_dispatch_stack_len = getattr(torch._C, "_len_torch_dispatch_stack", lambda: 0)
_tf_mode_enabled = getattr(torch._C, "_is_torch_function_mode_enabled", lambda: False)
_is_compiling = torch.compiler.is_compiling


# With the C++ ops the module functions call them (the dispatcher and no
# Python kernel: the cheaper path); with the ctypes kernels they skip the
# dispatcher in plain eager calls. Either way a failed C call raises the
# M3qkvError subclasses (_capi.from_native maps the C++ ops' errors).
_CPP_OPS = _ops.TORCH_OPS["impl"] == "c++"


def _direct(t) -> bool:
    """The ctypes fast path: ctypes kernels, and a plain eager call on a plain
    CUDA tensor (no compiler, no dispatch or torch-function mode; meta, fake
    and CPU tensors take the dispatcher)."""
    return (not _CPP_OPS and not _is_compiling() and type(t) is torch.Tensor and t.is_cuda
            and not _dispatch_stack_len() and not _tf_mode_enabled())


def fused_qkv(xq, xsf, wq, wsf, positions, cos_sin_cache, q_norm_weight, k_norm_weight, index_q_norm_weight,
              index_k_norm_weight, eps, *, slot_mapping, index_slot_mapping, kv_cache, index_cache, index_q_out,
              q_out=None, q_fp8_out=None, q_fp8_scale=1.0, k_scale=1.0, v_scale=1.0, cta_group=None, use_pdl=True,
              grid=None, v_cache=None, nq=None, nkv=None, niq=None, nik=None, error_flags=None,
              x_bf16=None) -> None:
    """The fused op (torch.ops.m3qkv.fused_qkv): writes q_out / q_fp8_out /
    index_q_out and the K/V/index_k cache entries in place, on the current stream.
    Activations: MXFP8 (xq, xsf), or bf16 x_bf16 [M, K] with xq=None, xsf=None."""
    f = _ops.fused_qkv_fast if _direct(xq if x_bf16 is None else x_bf16) else torch.ops.m3qkv.fused_qkv.default
    try:
        f(xq, xsf, wq, wsf, positions, cos_sin_cache, q_norm_weight, k_norm_weight, index_q_norm_weight,
          index_k_norm_weight, eps, slot_mapping=slot_mapping, index_slot_mapping=index_slot_mapping,
          kv_cache=kv_cache, index_cache=index_cache, index_q_out=index_q_out, q_out=q_out, q_fp8_out=q_fp8_out,
          q_fp8_scale=q_fp8_scale, k_scale=k_scale, v_scale=v_scale, cta_group=cta_group, use_pdl=use_pdl,
          grid=grid, v_cache=v_cache, nq=nq, nkv=nkv, niq=niq, nik=nik, error_flags=error_flags, x_bf16=x_bf16)
    except (ValueError, RuntimeError) as e:
        raise _capi.from_native(e) from None


def qknorm_rope_kv_insert(qkv, positions, cos_sin_cache, q_norm_weight, k_norm_weight, index_q_norm_weight,
                          index_k_norm_weight, eps, *, slot_mapping, index_slot_mapping, kv_cache, index_cache,
                          index_q_out, q_out=None, q_fp8_out=None, q_fp8_scale=1.0, k_scale=1.0, v_scale=1.0,
                          use_pdl=True, grid=None, v_cache=None, nq=None, nkv=None, niq=None, nik=None,
                          error_flags=None) -> None:
    """The epilogue alone on a bf16 projection qkv [M, N] (the unfused path)."""
    f = _ops.qknorm_rope_kv_insert_impl if _direct(qkv) else torch.ops.m3qkv.qknorm_rope_kv_insert.default
    try:
        f(qkv, positions, cos_sin_cache, q_norm_weight, k_norm_weight, index_q_norm_weight, index_k_norm_weight, eps,
          slot_mapping=slot_mapping, index_slot_mapping=index_slot_mapping, kv_cache=kv_cache,
          index_cache=index_cache, index_q_out=index_q_out, q_out=q_out, q_fp8_out=q_fp8_out,
          q_fp8_scale=q_fp8_scale, k_scale=k_scale, v_scale=v_scale, use_pdl=use_pdl, grid=grid, v_cache=v_cache,
          nq=nq, nkv=nkv, niq=niq, nik=nik, error_flags=error_flags)
    except (ValueError, RuntimeError) as e:
        raise _capi.from_native(e) from None


def mxfp8_gemm(xq, xsf, wq, wsf, *, use_pdl=True, grid=None, x_bf16=None) -> torch.Tensor:
    """bf16 out [M, N] = bf16_rn(acc) of the MXFP8 GEMM (activations xq, xsf, or
    bf16 x_bf16 [M, K] with xq=None, xsf=None)."""
    f = _ops.mxfp8_gemm_impl if _direct(xq if x_bf16 is None else x_bf16) else torch.ops.m3qkv.mxfp8_gemm.default
    try:
        return f(xq, xsf, wq, wsf, use_pdl=use_pdl, grid=grid, x_bf16=x_bf16)
    except (ValueError, RuntimeError) as e:
        raise _capi.from_native(e) from None


def mxfp8_quantize(x, *, use_pdl=True):
    """bf16 x [M, K] -> (xq float8_e4m3fn [M, K], xsf uint8 F8_128x4-swizzled e8m0 scales)."""
    f = _ops.mxfp8_quantize_impl if _direct(x) else torch.ops.m3qkv.mxfp8_quantize.default
    try:
        return f(x, use_pdl=use_pdl)
    except (ValueError, RuntimeError) as e:
        raise _capi.from_native(e) from None


def prepare_weights(wq, wsf, *, mode="fp8", stats=False):
    """The fp8 fast mode's one-time weight fold (m3qkv_prepare_weights_fp8): new
    (wq', wsf') of the same shapes, each 128-K group under its largest block scale
    (docs/contract.md "fp8 fast mode"); with stats=True also {"changed": elements
    the fold changed, "max_rel_change": the largest ||w' - w|| / ||w|| of a group},
    which waits for the stream. The C API's precision = 1 reads the result."""
    try:
        return _ops.prepare_weights_impl(wq, wsf, mode=mode, stats=stats)
    except (ValueError, RuntimeError) as e:
        raise _capi.from_native(e) from None


def _cpp_op_function(documented, op):
    """A module function with the C++ ops bound: the op itself, given the
    caller's arguments as they are (torch parses those, not every default
    spelled out: 3.6 us a call of fused_qkv on this repository's CI host),
    its C errors re-raised as the M3qkvError subclasses. Signature and
    docstring: `documented`'s."""
    @functools.wraps(documented)
    def call(*args, **kwargs):
        try:
            return op(*args, **kwargs)
        except (ValueError, RuntimeError) as e:
            raise _capi.from_native(e) from None
    return call


if _CPP_OPS:
    fused_qkv = _cpp_op_function(fused_qkv, torch.ops.m3qkv.fused_qkv.default)
    qknorm_rope_kv_insert = _cpp_op_function(qknorm_rope_kv_insert, torch.ops.m3qkv.qknorm_rope_kv_insert.default)
    mxfp8_gemm = _cpp_op_function(mxfp8_gemm, torch.ops.m3qkv.mxfp8_gemm.default)
    mxfp8_quantize = _cpp_op_function(mxfp8_quantize, torch.ops.m3qkv.mxfp8_quantize.default)


def torch_ops() -> dict:
    """Which implementation torch.ops.m3qkv.* run, as decided at import:
    {"impl": "c++" | "ctypes", "library": the libm3qkv_torch_ops.so in use or
    None, "reason": why the ctypes kernels are used, or None}. The C++ ops
    (fused_qkv, qknorm_rope_kv_insert, mxfp8_gemm, mxfp8_quantize) run no
    Python per call; their errors are ValueError / RuntimeError with the
    messages of the ctypes kernels (not the M3qkvError subclasses). The module
    functions of this package call the C++ ops (their C errors as the
    M3qkvError subclasses), or take the ctypes fast path in eager mode. M3QKV_TORCH_OPS=ctypes | cpp | auto chooses (see m3qkv/_native.py)."""
    return {k: v for k, v in _ops.TORCH_OPS.items() if k != "ops"}


def backend(device: int = -1) -> str:
    """The backend m3qkv_fused_qkv uses on `device` (-1: the current one)."""
    return _ops.backend_impl(device)


def warmup(device: int = -1) -> None:
    """Loads the kernels and sets their shared-memory attributes on `device`
    ahead of the first call (optional; the first call does it otherwise).
    With M3QKV_SELFTEST_ON_WARMUP=1 in the environment it also self-tests the
    backend it would use; when that backend fails and a slower one passes, the
    slower one is used from then on and an M3qkvFallbackWarning says so.
    Without a usable GPU it raises M3qkvRuntimeError with the library's
    message (as backend() does)."""
    lib = library()
    if device < 0:
        # Without CUDA, torch.cuda.current_device() raises torch's own error:
        # ask the library about device 0, so that its message says why.
        device = torch.cuda.current_device() if torch.cuda.is_available() else 0
    status = lib.warmup(device)
    if status == _capi.WARNING_BACKEND_FALLBACK:
        import warnings
        warnings.warn(M3qkvFallbackWarning((lib.last_error() or b"").decode("utf-8", "replace")), stacklevel=2)
        return
    lib.check(status)


def release_stream(stream=None) -> None:
    """m3qkv_release_stream: frees the device memory the library holds for
    `stream` (a torch.cuda.Stream; default the current stream), for servers
    that create and destroy streams: call it once the stream's m3qkv work has
    completed and before the stream goes away. Workspaces of graphs captured
    on it are kept; refused (M3qkvValueError) while the stream captures."""
    lib = library()
    if lib.release_stream is None:
        raise NotImplementedError(f"m3qkv.release_stream: the loaded library ({lib.path}) predates "
                                  "m3qkv_release_stream (0.3)")
    s = stream if stream is not None else torch.cuda.current_stream()
    lib.check(lib.release_stream(ctypes.c_void_p(s.cuda_stream)))


def selftest(device: int = 0) -> dict:
    """m3qkv_selftest: every kernel the library has for `device` runs its
    built-in exact-data problems and every output byte is compared with the
    CPU golden model and the portable kernel (well under a second; nothing is
    left allocated). Returns
      {"passed": bool, "status": "M3QKV_SUCCESS" | "M3QKV_ERROR_SELFTEST_FAILED",
       "device", "compute_capability": (major, minor), "problems", "total_us",
       "message": the verdict in one line,
       "kernels": [{"name": "sm90 decode", "backend", "variant",
                    "result": "pass" | "fail" | "error" | "not available",
                    "problems", "time_us", "portable_agrees": bool | None,
                    "first_wrong_byte": None | {"problem", "output", "offset",
                                                "expected", "got", "wrong_bytes"},
                    "message"}, ...]}
    A kernel that fails does not raise (look at "passed"); no usable GPU, a
    CUDA error or an old library raise M3qkvRuntimeError / ImportError."""
    return library().selftest_of(device)
