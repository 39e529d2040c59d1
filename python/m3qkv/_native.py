"""Who implements the torch ops: the C++ library or the ctypes kernels.

libm3qkv_torch_ops.so (python/csrc/m3qkv_torch_ops.cpp, built by the CMake
project when torch is importable at build time) registers fused_qkv,
qknorm_rope_kv_insert, mxfp8_gemm and mxfp8_quantize with their schemas and
their CUDA and CPU kernels through libtorch's stable ABI: a call through
torch.ops.m3qkv.* (the dispatcher, torch.compile, CUDA graphs) then runs no
Python. _ops.py calls load() before it declares anything and only adds what
the library did not: the fake (meta) kernels, the backend op, and every op
and kernel when the C++ library is not used (the ctypes kernels, which say
so once with an M3qkvTorchOpsFallbackWarning naming the reason).

Environment:
  M3QKV_TORCH_OPS          auto (default, also when unset): the C++ ops when usable,
                           else the ctypes kernels with one warning saying why;
                           cpp: the C++ ops or ImportError; ctypes: never the C++ ops
  M3QKV_TORCH_OPS_LIBRARY  the libm3qkv_torch_ops.so to use (default: the one
                           installed next to this module)
"""
from __future__ import annotations

import ctypes
import os
import warnings

import torch

from . import _capi

LIBRARY_NAME = "libm3qkv_torch_ops.so"
MODES = ("auto", "cpp", "ctypes")


class M3qkvTorchOpsFallbackWarning(UserWarning):
    """The torch ops run through the ctypes kernels (Python per call), not the
    C++ library; the message says why. Issued once, at `import m3qkv`."""


def _mode() -> str:
    mode = os.environ.get("M3QKV_TORCH_OPS", "").strip().lower() or "auto"
    if mode not in MODES:
        raise ImportError(f"m3qkv: M3QKV_TORCH_OPS={os.environ['M3QKV_TORCH_OPS']!r}: use one of {', '.join(MODES)}")
    return mode


def _path() -> tuple[str, bool]:
    env = os.environ.get("M3QKV_TORCH_OPS_LIBRARY")
    if env:
        return env, True
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), LIBRARY_NAME), False


def _fn_ptr(dll, name: str) -> int:
    return ctypes.cast(getattr(dll, name), ctypes.c_void_p).value


def _registered(schemas: dict, ops) -> str | None:
    """None when every op in `ops` has the schema declared in `schemas`, else what differs."""
    for name in ops:
        if not hasattr(torch.ops.m3qkv, name):
            return f"m3qkv::{name} is not registered"
        got = getattr(torch.ops.m3qkv, name).default._schema
        want = torch._C.parse_schema(f"m3qkv::{schemas[name]}")
        if str(got) != str(want):
            return f"m3qkv::{name} is registered as\n  {got}\nbut this package declares\n  {want}"
    return None


def _use_cpp(schemas: dict, ops) -> tuple[str | None, str | None]:
    """-> (path of the bound C++ library, None) or (None, why not)."""
    path, from_env = _path()
    if not os.path.exists(path):
        if from_env:
            return None, f"M3QKV_TORCH_OPS_LIBRARY={path} does not exist"
        return None, (f"no {LIBRARY_NAME} next to the package ({path}): the package was built without torch "
                      f"importable at build time, or from a source tree without it (set M3QKV_TORCH_OPS_LIBRARY "
                      f"to a CMake build's {LIBRARY_NAME})")
    try:
        lib = _capi.library()
    except ImportError as e:
        return None, f"the C library is not loadable: {e}"
    if not (lib.cache_formats and lib.x_bf16):
        return None, (f"{lib.path} is an older libm3qkv (m3qkv_fused_args of {lib.fused_struct_size} bytes, "
                      f"m3qkv_gemm_args of {lib.gemm_struct_size}): the C++ ops speak the current structs only")
    loaded = {os.path.realpath(p) for p in getattr(torch.ops, "loaded_libraries", ())}
    if os.path.realpath(path) not in loaded:
        present = [n for n in ops if hasattr(torch.ops.m3qkv, n)]
        if present:
            return None, (f"m3qkv::{', m3qkv::'.join(present)} are registered already in this process by something "
                          f"else than {path}")
        try:
            torch.ops.load_library(path)
        except OSError as e:
            return None, f"cannot load {path}: {e.__cause__ or e}"
    # Loaded: its schemas are registered now, so any mismatch is final.
    diff = _registered(schemas, ops)
    if diff is not None:
        raise ImportError(f"m3qkv: {path} does not match this package's Python files (rebuild it, or set "
                          f"M3QKV_TORCH_OPS=ctypes): {diff}")
    dll = ctypes.CDLL(path)  # the handle torch.ops.load_library opened
    bind = dll.m3qkv_torch_ops_bind
    bind.restype = ctypes.c_int
    bind.argtypes = [ctypes.c_void_p] * 6 + [ctypes.POINTER(ctypes.c_uint64)] * 2
    sizes = (ctypes.c_uint64 * 4)(lib.fused_struct_size, lib.insert_struct_size, lib.gemm_struct_size,
                                  ctypes.sizeof(_capi.QuantizeArgs))
    built = (ctypes.c_uint64 * 4)()
    c = lib._dll
    rc = bind(_fn_ptr(c, "m3qkv_fused_qkv"), _fn_ptr(c, "m3qkv_qknorm_rope_kv_insert"), _fn_ptr(c, "m3qkv_mxfp8_gemm"),
              _fn_ptr(c, "m3qkv_mxfp8_quantize"), _fn_ptr(c, "m3qkv_last_error"), _fn_ptr(c, "m3qkv_status_string"),
              sizes, built)
    if rc != 0:
        raise ImportError(f"m3qkv: {path} was built for other argument structs (fused, insert, gemm, quantize: "
                          f"{list(built)} bytes) than {lib.path} takes ({list(sizes)}); rebuild it, or set "
                          f"M3QKV_TORCH_OPS=ctypes")
    return path, None


def load(schemas: dict, ops) -> dict:
    """Loads and binds the C++ ops when they can be used (see the module
    docstring). -> {"impl": "c++" | "ctypes", "library": path | None,
    "reason": why ctypes | None, "ops": the op names the C++ library defines}."""
    mode = _mode()
    if mode == "ctypes":
        path, reason = None, "M3QKV_TORCH_OPS=ctypes"
    else:
        path, reason = _use_cpp(schemas, ops)
    if path is not None:
        return {"impl": "c++", "library": path, "reason": None, "ops": tuple(ops)}
    if mode == "cpp":
        raise ImportError(f"m3qkv: M3QKV_TORCH_OPS=cpp, but the C++ torch ops cannot be used: {reason}")
    warnings.warn(f"m3qkv: torch.ops.m3qkv.* run the ctypes kernels (Python on every call), not the C++ ops: "
                  f"{reason}", M3qkvTorchOpsFallbackWarning, stacklevel=2)
    return {"impl": "ctypes", "library": None, "reason": reason, "ops": ()}
