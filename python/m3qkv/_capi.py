"""ctypes binding of the m3qkv C API (include/m3qkv/m3qkv.h). No torch in here.

The argument structs are mirrored field by field below, in header order.
python/tests/test_layout.py compiles a C program from the header that prints
offsetof/sizeof of every field and checks this mirror against it (and that the
header has no field missing here), so the two cannot drift apart.
"""
from __future__ import annotations

import ctypes
import os
import struct
import threading
from ctypes import c_float, c_int32, c_int64, c_size_t, c_void_p

# ----------------------------------------------------------------- statuses
SUCCESS = 0
ERROR_INVALID_ARGUMENT = 1
ERROR_MISALIGNED = 2
ERROR_UNSUPPORTED_DEVICE = 3
ERROR_CUDA_ERROR = 4
ERROR_NULL_POINTER = 5
ERROR_STRUCT_SIZE = 6
ERROR_INVALID_SHAPE = 7
ERROR_TOO_LARGE = 8
ERROR_INTERNAL = 9
ERROR_SELFTEST_FAILED = 10
WARNING_BACKEND_FALLBACK = 11

STATUS_NAMES = {
    0: "M3QKV_SUCCESS",
    1: "M3QKV_ERROR_INVALID_ARGUMENT",
    2: "M3QKV_ERROR_MISALIGNED",
    3: "M3QKV_ERROR_UNSUPPORTED_DEVICE",
    4: "M3QKV_ERROR_CUDA_ERROR",
    5: "M3QKV_ERROR_NULL_POINTER",
    6: "M3QKV_ERROR_STRUCT_SIZE",
    7: "M3QKV_ERROR_INVALID_SHAPE",
    8: "M3QKV_ERROR_TOO_LARGE",
    9: "M3QKV_ERROR_INTERNAL",
    10: "M3QKV_ERROR_SELFTEST_FAILED",
    11: "M3QKV_WARNING_BACKEND_FALLBACK",
}
# Bad arguments are the caller's to fix (ValueError); the rest come from the
# device, the driver or m3qkv itself (RuntimeError).
VALUE_ERRORS = frozenset({ERROR_INVALID_ARGUMENT, ERROR_INVALID_SHAPE, ERROR_MISALIGNED, ERROR_NULL_POINTER,
                          ERROR_STRUCT_SIZE, ERROR_TOO_LARGE})

BACKEND_NAMES = {0: "none", 1: "portable", 2: "sm90", 3: "sm100"}

# Device-side guard bits (M3QKV_FLAG_*).
FLAG_SLOT_OUT_OF_RANGE = 0x1
FLAG_INDEX_SLOT_OUT_OF_RANGE = 0x2
FLAG_POSITION_OUT_OF_RANGE = 0x4

# Cache formats (docs/contract.md §4.3: kv_cache_dtype / index_cache_dtype).
CACHE_NVFP4 = 0
CACHE_FP8 = 1
CACHE_BF16 = 2


class M3qkvError(Exception):
    """An m3qkv C call failed. `status` is the m3qkv_status code, `status_name`
    its enum name; the message is m3qkv_last_error() of that call."""

    def __init__(self, status: int, message: str):
        self.status = status
        self.status_name = STATUS_NAMES.get(status, f"status {status}")
        super().__init__(f"{self.status_name}: {message}")


class M3qkvValueError(M3qkvError, ValueError):
    """INVALID_ARGUMENT, INVALID_SHAPE, MISALIGNED, NULL_POINTER, STRUCT_SIZE, TOO_LARGE."""


class M3qkvRuntimeError(M3qkvError, RuntimeError):
    """CUDA_ERROR, UNSUPPORTED_DEVICE, INTERNAL, SELFTEST_FAILED."""


_STATUS_CODES = {name: code for code, name in STATUS_NAMES.items()}


def from_native(e: Exception) -> Exception:
    """The M3qkvError of a C++ torch op's C-call error ("M3QKV_ERROR_<NAME>:
    message", raised as ValueError / RuntimeError), with the same text; any
    other exception (an argument check's ValueError, torch's own) as it is."""
    name, sep, message = str(e).partition(": ")
    status = _STATUS_CODES.get(name) if sep else None
    if status is None or isinstance(e, M3qkvError):
        return e
    return (M3qkvValueError if status in VALUE_ERRORS else M3qkvRuntimeError)(status, message)


class M3qkvFallbackWarning(UserWarning):
    """m3qkv.warmup in self-test mode (M3QKV_SELFTEST_ON_WARMUP=1): the automatic
    backend failed its self-test and a slower one that passed is used now
    (M3QKV_WARNING_BACKEND_FALLBACK); the message says which and why."""


# ------------------------------------------------------------------ structs
# The fields of each struct in header order. The *_CACHE_FORMAT_FIELDS are the
# fields docs/contract.md §4.3 describes, appended for the FP8/BF16 cache formats (0.2), and
# X_BF16_FIELDS, the bf16 activations appended in 0.3 to the fused and gemm structs; a library
# built before them has the shorter structs (see Library.cache_formats, Library.x_bf16).
FUSED_FIELDS = [
    ("struct_size", c_size_t),
    ("m", c_int64), ("k", c_int64),
    ("nq", c_int32), ("nkv", c_int32), ("niq", c_int32), ("nik", c_int32),
    ("xq", c_void_p), ("xsf", c_void_p), ("wq", c_void_p), ("wsf", c_void_p),
    ("positions", c_void_p), ("max_position", c_int64), ("cos_sin_cache", c_void_p),
    ("q_norm_weight", c_void_p), ("k_norm_weight", c_void_p),
    ("index_q_norm_weight", c_void_p), ("index_k_norm_weight", c_void_p),
    ("eps", c_float),
    ("slot_mapping", c_void_p), ("index_slot_mapping", c_void_p),
    ("kv_cache", c_void_p), ("kv_page_stride", c_int64), ("num_blocks", c_int64),
    ("index_cache", c_void_p), ("index_page_stride", c_int64), ("num_index_blocks", c_int64),
    ("block_size", c_int32),
    ("q_out", c_void_p), ("q_fp8_out", c_void_p), ("index_q_out", c_void_p),
    ("q_fp8_scale", c_float), ("k_scale", c_float), ("v_scale", c_float),
    ("cta_group", c_int32), ("use_pdl", c_int32), ("grid", c_int32),
    ("error_flags", c_void_p),
]
INSERT_FIELDS = [
    ("struct_size", c_size_t),
    ("m", c_int64),
    ("nq", c_int32), ("nkv", c_int32), ("niq", c_int32), ("nik", c_int32),
    ("qkv", c_void_p),
    ("positions", c_void_p), ("max_position", c_int64), ("cos_sin_cache", c_void_p),
    ("q_norm_weight", c_void_p), ("k_norm_weight", c_void_p),
    ("index_q_norm_weight", c_void_p), ("index_k_norm_weight", c_void_p),
    ("eps", c_float),
    ("slot_mapping", c_void_p), ("index_slot_mapping", c_void_p),
    ("kv_cache", c_void_p), ("kv_page_stride", c_int64), ("num_blocks", c_int64),
    ("index_cache", c_void_p), ("index_page_stride", c_int64), ("num_index_blocks", c_int64),
    ("block_size", c_int32),
    ("q_out", c_void_p), ("q_fp8_out", c_void_p), ("index_q_out", c_void_p),
    ("q_fp8_scale", c_float), ("k_scale", c_float), ("v_scale", c_float),
    ("use_pdl", c_int32), ("grid", c_int32),
    ("error_flags", c_void_p),
]
CACHE_FORMAT_FIELDS = [
    ("kv_cache_dtype", c_int32), ("index_cache_dtype", c_int32),
    ("v_cache", c_void_p), ("kv_token_stride", c_int64), ("kv_head_stride", c_int64),
]
X_BF16_FIELDS = [("x_bf16", c_void_p)]
BATCH_INVARIANT_FIELDS = [("batch_invariant", c_int32), ("precision", c_int32)]  # fused only (0.3)
GEMM_FIELDS = [
    ("struct_size", c_size_t),
    ("m", c_int64), ("n", c_int64), ("k", c_int64),
    ("xq", c_void_p), ("xsf", c_void_p), ("wq", c_void_p), ("wsf", c_void_p),
    ("out", c_void_p),
    ("use_pdl", c_int32), ("grid", c_int32),
]
QUANTIZE_FIELDS = [
    ("struct_size", c_size_t),
    ("m", c_int64), ("k", c_int64),
    ("x", c_void_p), ("xq", c_void_p), ("xsf", c_void_p),
    ("use_pdl", c_int32),
]


# m3qkv_prepare_weights_fp8 (0.3): the fp8 fast mode's weight fold.
PREPARE_FIELDS = [
    ("struct_size", c_size_t),
    ("n", c_int64), ("k", c_int64),
    ("wq", c_void_p), ("wsf", c_void_p), ("wq_out", c_void_p), ("wsf_out", c_void_p),
    ("stats", c_void_p),
]
FOLD_STATS_FIELDS = [("changed", c_int64), ("max_rel_change", ctypes.c_double)]


# The self-test report (m3qkv_selftest_report); read, never packed.
SELFTEST_MAX_ENTRIES = 16
SELFTEST_RESULTS = {0: "not available", 1: "pass", 2: "fail", 3: "error"}
SELFTEST_ENTRY_FIELDS = [
    ("backend", c_int32), ("variant", c_int32), ("result", c_int32), ("problems", c_int32),
    ("time_us", c_int64),
    ("problem", c_int32), ("portable_agrees", c_int32),
    ("offset", c_int64), ("wrong_bytes", c_int64),
    ("expected", c_int32), ("got", c_int32),
    ("name", ctypes.c_char * 32), ("output", ctypes.c_char * 32), ("message", ctypes.c_char * 192),
]


def packer(cls) -> "struct.Struct":
    """A struct.Struct that writes every field of the ctypes mirror `cls` at its
    offset (native byte order, explicit padding): one pack_into call fills a
    whole args struct. Pointers are written as integers (0 = NULL)."""
    assert ctypes.sizeof(c_size_t) == ctypes.sizeof(c_void_p) == 8, "64-bit platforms only"
    codes = {c_size_t: "Q", c_int64: "q", c_int32: "i", c_float: "f", c_void_p: "Q"}
    fmt, pos = "=", 0
    for name, ctype in cls._fields_:
        off = getattr(cls, name).offset
        fmt += "x" * (off - pos) + codes[ctype]
        pos = off + ctypes.sizeof(ctype)
    fmt += "x" * (ctypes.sizeof(cls) - pos)
    s = struct.Struct(fmt)
    assert s.size == ctypes.sizeof(cls), (s.size, ctypes.sizeof(cls))
    return s


def _struct(name, fields):
    return type(name, (ctypes.Structure,), {"_fields_": fields})


# The C struct names each mirror stands for (the layout test uses them).
FusedArgs = _struct("m3qkv_fused_args", FUSED_FIELDS + CACHE_FORMAT_FIELDS + X_BF16_FIELDS + BATCH_INVARIANT_FIELDS)
InsertArgs = _struct("m3qkv_insert_args", INSERT_FIELDS + CACHE_FORMAT_FIELDS)
GemmArgs = _struct("m3qkv_gemm_args", GEMM_FIELDS + X_BF16_FIELDS)
QuantizeArgs = _struct("m3qkv_quantize_args", QUANTIZE_FIELDS)
PrepareArgs = _struct("m3qkv_prepare_args", PREPARE_FIELDS)
FoldStats = _struct("m3qkv_fold_stats", FOLD_STATS_FIELDS)
SelftestEntry = _struct("m3qkv_selftest_entry", SELFTEST_ENTRY_FIELDS)
SelftestReport = _struct("m3qkv_selftest_report", [
    ("struct_size", c_size_t), ("status", c_int32), ("device", c_int32), ("cc_major", c_int32),
    ("cc_minor", c_int32), ("problems", c_int32), ("num_entries", c_int32), ("total_us", c_int64),
    ("message", ctypes.c_char * 256), ("entries", SelftestEntry * SELFTEST_MAX_ENTRIES),
])
# The released older layouts: 0.1 (no cache-format fields, no x_bf16) and
# 0.2 (cache formats, no x_bf16; its insert struct is InsertArgs).
FusedArgsV0 = _struct("m3qkv_fused_args_v0", FUSED_FIELDS)
InsertArgsV0 = _struct("m3qkv_insert_args_v0", INSERT_FIELDS)
GemmArgsV0 = _struct("m3qkv_gemm_args_v0", GEMM_FIELDS)
FusedArgsV0_2 = _struct("m3qkv_fused_args_v0_2", FUSED_FIELDS + CACHE_FORMAT_FIELDS)

# Python mirror -> (C struct name, every layout this package can speak, newest first).
STRUCTS = {
    "fused": (FusedArgs, [FusedArgs, FusedArgsV0_2, FusedArgsV0]),
    "insert": (InsertArgs, [InsertArgs, InsertArgsV0]),
    "gemm": (GemmArgs, [GemmArgs, GemmArgsV0]),
    "quantize": (QuantizeArgs, [QuantizeArgs]),
    "prepare": (PrepareArgs, [PrepareArgs]),
    "selftest_entry": (SelftestEntry, [SelftestEntry]),
    "selftest_report": (SelftestReport, [SelftestReport]),
}


# ------------------------------------------------------------------ library
def _candidates():
    env = os.environ.get("M3QKV_LIBRARY")
    if env:
        return [env], True
    here = os.path.dirname(os.path.abspath(__file__))
    return [os.path.join(here, "libm3qkv.so")], False


class Library:
    """One loaded libm3qkv.so. `fused_struct_size` / `insert_struct_size` /
    `gemm_struct_size` are the struct sizes it accepts (found by asking it
    once, see _probe_size); `cache_formats` is True when it knows the FP8/BF16
    cache fields, `x_bf16` when its fused and gemm structs have x_bf16 (bf16
    activations, 0.3)."""

    def __init__(self, path: str):
        self.path = path
        dll = ctypes.CDLL(path)
        self._dll = dll
        c_int = ctypes.c_int

        def fn(name, *argtypes, restype=c_int):
            f = getattr(dll, name)
            f.argtypes = list(argtypes)
            f.restype = restype
            return f

        self.fused_qkv = fn("m3qkv_fused_qkv", c_void_p, c_void_p)
        self.qknorm_rope_kv_insert = fn("m3qkv_qknorm_rope_kv_insert", c_void_p, c_void_p)
        self.mxfp8_gemm = fn("m3qkv_mxfp8_gemm", c_void_p, c_void_p)
        self.mxfp8_quantize = fn("m3qkv_mxfp8_quantize", c_void_p, c_void_p)
        self.warmup = fn("m3qkv_warmup", c_int)
        self.backend = fn("m3qkv_backend", c_int, ctypes.POINTER(c_int))
        self.status_string = fn("m3qkv_status_string", c_int, restype=ctypes.c_char_p)
        self.last_error = fn("m3qkv_last_error", restype=ctypes.c_char_p)
        self.backend_name = fn("m3qkv_backend_name", c_int, restype=ctypes.c_char_p)
        # Newer entry points: None in a library built before them.
        self.selftest = getattr(dll, "m3qkv_selftest", None)
        if self.selftest is not None:
            self.selftest.argtypes = [c_int, ctypes.POINTER(SelftestReport)]
            self.selftest.restype = c_int
        self.release_stream = getattr(dll, "m3qkv_release_stream", None)
        if self.release_stream is not None:
            self.release_stream.argtypes = [c_void_p]
            self.release_stream.restype = c_int
        self.prepare_weights_fp8 = getattr(dll, "m3qkv_prepare_weights_fp8", None)
        if self.prepare_weights_fp8 is not None:
            self.prepare_weights_fp8.argtypes = [c_void_p, c_void_p]
            self.prepare_weights_fp8.restype = c_int
        self.set_backend = getattr(dll, "m3qkv_set_backend", None)
        if self.set_backend is not None:
            self.set_backend.argtypes = [c_int, c_int]
            self.set_backend.restype = c_int

        self.fused_struct_size = self._probe_size(self.fused_qkv, STRUCTS["fused"][1])
        self.insert_struct_size = self._probe_size(self.qknorm_rope_kv_insert, STRUCTS["insert"][1])
        self.gemm_struct_size = self._probe_size(self.mxfp8_gemm, STRUCTS["gemm"][1])
        self.cache_formats = (self.fused_struct_size >= ctypes.sizeof(FusedArgsV0_2) and
                              self.insert_struct_size == ctypes.sizeof(InsertArgs))
        self.x_bf16 = (self.fused_struct_size == ctypes.sizeof(FusedArgs) and
                       self.gemm_struct_size == ctypes.sizeof(GemmArgs))

    @staticmethod
    def _probe_size(f, layouts):
        # An all-zero struct of each layout, newest first: the library answers
        # M3QKV_ERROR_STRUCT_SIZE for a size it does not know, and a later
        # validation error (k = 0, n = 0, block_size = 0, ...) for one it does.
        # Host-only: validation runs before any device query, nothing launches.
        for cls in layouts:
            a = cls()
            a.struct_size = ctypes.sizeof(cls)
            if f(ctypes.addressof(a), None) != ERROR_STRUCT_SIZE:
                return ctypes.sizeof(cls)
        raise ImportError(f"m3qkv: the library accepts none of the struct sizes "
                          f"{[ctypes.sizeof(c) for c in layouts]} this package knows")

    def error(self, status: int) -> M3qkvError:
        msg = (self.last_error() or b"").decode("utf-8", "replace") or \
            (self.status_string(status) or b"").decode("utf-8", "replace")
        cls = M3qkvValueError if status in VALUE_ERRORS else M3qkvRuntimeError
        return cls(status, msg)

    def check(self, status: int) -> None:
        if status:
            raise self.error(status)

    def selftest_of(self, device: int) -> dict:
        """m3qkv_selftest(device) as a dict (see m3qkv.selftest)."""
        if self.selftest is None:
            raise ImportError(f"m3qkv: {self.path} has no m3qkv_selftest (built before it existed)")
        r = SelftestReport()
        r.struct_size = ctypes.sizeof(SelftestReport)
        status = self.selftest(device, ctypes.byref(r))
        if status not in (SUCCESS, ERROR_SELFTEST_FAILED):
            raise self.error(status)
        text = lambda b: b.decode("utf-8", "replace")  # noqa: E731
        kernels = []
        for e in r.entries[:r.num_entries]:
            kernels.append({
                "name": text(e.name), "backend": BACKEND_NAMES.get(e.backend, f"kind {e.backend}"),
                "variant": e.variant, "result": SELFTEST_RESULTS.get(e.result, f"result {e.result}"),
                "problems": e.problems, "time_us": e.time_us,
                "portable_agrees": None if e.portable_agrees < 0 else bool(e.portable_agrees),
                "first_wrong_byte": None if e.result != 2 else {
                    "problem": e.problem, "output": text(e.output), "offset": e.offset, "expected": e.expected,
                    "got": e.got, "wrong_bytes": e.wrong_bytes},
                "message": text(e.message),
            })
        return {"passed": status == SUCCESS, "status": STATUS_NAMES.get(status, f"status {status}"),
                "device": r.device, "compute_capability": (r.cc_major, r.cc_minor), "problems": r.problems,
                "total_us": r.total_us, "message": text(r.message), "kernels": kernels}

    def backend_of(self, device: int) -> str:
        out = ctypes.c_int(0)
        self.check(self.backend(device, ctypes.byref(out)))
        return BACKEND_NAMES.get(out.value, f"kind {out.value}")


_lock = threading.Lock()
_library: Library | None = None


def library() -> Library:
    """The loaded libm3qkv.so: $M3QKV_LIBRARY if set, else the one installed
    next to this module. Loaded on first use."""
    global _library
    lib = _library
    if lib is not None:
        return lib
    with _lock:
        if _library is None:
            paths, from_env = _candidates()
            for p in paths:
                if os.path.exists(p):
                    _library = Library(p)
                    break
            else:
                how = ("M3QKV_LIBRARY points to it" if from_env else
                       "install the package with `pip install ./python` (it builds the library) "
                       "or set M3QKV_LIBRARY to a libm3qkv.so")
                raise ImportError(f"m3qkv: libm3qkv.so not found (looked at {', '.join(paths)}); {how}")
        return _library
