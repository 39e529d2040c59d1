"""The C++ torch ops (libm3qkv_torch_ops.so, python/csrc/m3qkv_torch_ops.cpp)
and who implements torch.ops.m3qkv.* (m3qkv/_native.py).

CPU: the schemas the process has are the ones _ops.py declares, and so are
the ones the C++ library defines in a fresh process; the C++ library owns the
CUDA and CPU kernels, Python the fake (Meta) kernels; the fake kernels give
the right shapes under FakeTensorMode for CPU and CUDA fake tensors; the C++
checks raise what the Python checks raise (type and message), on every error
case of test_errors / test_x_bf16 and more, for all four ops (CPU tensors: the
C++ CPU kernel runs the checks, then refuses CPU tensors by name, as Python
does); the binding refuses other struct sizes; the ctypes fallback is
reported once (M3QKV_TORCH_OPS=ctypes, a missing library), M3QKV_TORCH_OPS=cpp
insists. Tests that need the C++ library skip when the run does not use it
(m3qkv.torch_ops() says why).
GPU (marked gpu): every op through the C++ kernels writes the bytes of the
ctypes kernels (NVFP4 / FP8 / BF16 caches, bf16 activations, the unfused
ops), in a CUDA graph, on the current stream, on a device other than the
current one; C errors and device mixes carry the ctypes path's messages.
opcheck on real CUDA tensors is test_gpu.py's test_opcheck_on_cuda (the C++
kernels when they are in use).
"""
import ctypes
import json
import os
import subprocess
import sys

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import m3qkv
from m3qkv import _capi, _native, _ops
from problems import make_outputs, make_problem, raw_bytes
from test_errors import CASES as FUSED_CASES
from test_errors import K, M, base
from test_x_bf16 import CASES as BF16_CASES
from test_x_bf16 import bf16_base

E4M3 = torch.float8_e4m3fn
INFO = m3qkv.torch_ops()
CPP = INFO["impl"] == "c++"
needs_cpp = pytest.mark.skipif(not CPP, reason=f"the C++ torch ops are not in use: {INFO['reason']}")


def cpp_library_file():
    """The libm3qkv_torch_ops.so this run uses or would use, if it exists."""
    if CPP:
        return INFO["library"]
    p = _native._path()[0]
    return p if os.path.exists(p) else None


needs_cpp_file = pytest.mark.skipif(cpp_library_file() is None,
                                    reason=f"no libm3qkv_torch_ops.so (looked at {_native._path()[0]})")


def python(code, **env):
    """`code` in a fresh interpreter with this run's environment (+ env; None removes)."""
    e = dict(os.environ)
    for k, v in env.items():
        if v is None:
            e.pop(k, None)
        else:
            e[k] = v
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=e)


# ------------------------------------------------------------ ownership
def test_torch_ops_reports_the_implementation():
    assert set(INFO) == {"impl", "library", "reason"}
    if CPP:
        assert INFO["reason"] is None and os.path.exists(INFO["library"])
    else:
        assert INFO["impl"] == "ctypes" and INFO["library"] is None and INFO["reason"]
    print(f"torch ops: {INFO}")


def test_schemas_are_the_python_declared_ones():
    for name, decl in _ops.SCHEMAS.items():
        got = getattr(torch.ops.m3qkv, name).default._schema
        assert str(got) == str(torch._C.parse_schema(f"m3qkv::{decl}")), name


@needs_cpp_file
def test_cpp_library_alone_defines_the_python_schemas():
    """A fresh process that loads only the C++ library (no m3qkv import): its
    four ops, with the schemas _ops.py declares, CUDA and CPU kernels, no Meta."""
    code = f"""
import json, torch
torch.ops.load_library({cpp_library_file()!r})
ops = {list(_ops.CPP_OPS)!r}
has = torch._C._dispatch_has_kernel_for_dispatch_key
print(json.dumps({{n: [str(getattr(torch.ops.m3qkv, n).default._schema), has("m3qkv::" + n, "CUDA"),
                      has("m3qkv::" + n, "CPU"), has("m3qkv::" + n, "Meta")] for n in ops}}))
"""
    r = python(code)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    for name in _ops.CPP_OPS:
        schema, cuda, cpu, meta = got[name]
        assert schema == str(torch._C.parse_schema(f"m3qkv::{_ops.SCHEMAS[name]}")), name
        assert cuda and cpu and not meta, (name, got[name])


@needs_cpp
def test_cpp_kernels_for_cuda_and_cpu_python_fake_kernels():
    for name in _ops.CPP_OPS:
        lines = {ln.split(":")[0]: ln for ln in torch._C._dispatch_dump(f"m3qkv::{name}").splitlines()}
        assert "m3qkv_torch_ops.cpp" in lines["CUDA"] and "m3qkv_torch_ops.cpp" in lines["CPU"], lines
        assert "_ops.py" in lines["Meta"], lines
    assert "_ops.py" in torch._C._dispatch_dump("m3qkv::backend")


@needs_cpp
def test_bind_refuses_other_struct_sizes():
    """The binding checks the library's struct sizes against the C++ header's
    (and reports those: the ctypes mirror's sizes); a refusal binds nothing."""
    dll = ctypes.CDLL(INFO["library"])
    bind = dll.m3qkv_torch_ops_bind
    bind.restype = ctypes.c_int
    bind.argtypes = [ctypes.c_void_p] * 6 + [ctypes.POINTER(ctypes.c_uint64)] * 2
    want = [ctypes.sizeof(c) for c in (_capi.FusedArgs, _capi.InsertArgs, _capi.GemmArgs, _capi.QuantizeArgs)]
    built = (ctypes.c_uint64 * 4)()
    old = (ctypes.c_uint64 * 4)(ctypes.sizeof(_capi.FusedArgsV0_2), *want[1:])
    assert bind(None, None, None, None, None, None, old, built) == 1
    assert list(built) == want
    assert bind(None, None, None, None, None, None, (ctypes.c_uint64 * 4)(*want), built) == 2  # no NULL functions
    with pytest.raises(ValueError, match="must be CUDA tensors"):  # still the bound C++ kernel
        torch.ops.m3qkv.mxfp8_quantize(torch.zeros(4, 128, dtype=torch.bfloat16))


# ------------------------------------------------------------ fake kernels
@pytest.mark.parametrize("dev", ["cpu", "cuda"])
def test_fake_kernels_under_fake_tensor_mode(dev):
    """Fake CPU and CUDA tensors (no GPU needed) take the Python fake kernels,
    not the C++ CPU kernel (which would refuse CPU tensors)."""
    with FakeTensorMode():
        a, kw = base(dev)
        assert torch.ops.m3qkv.fused_qkv(*a.values(), **kw) is None
        rest = {k: v for k, v in a.items() if k not in ("xq", "xsf", "wq", "wsf")}
        qkv = torch.empty(M, 2560, dtype=torch.bfloat16, device=dev)
        assert torch.ops.m3qkv.qknorm_rope_kv_insert(qkv, *rest.values(), **kw) is None
        y = torch.ops.m3qkv.mxfp8_gemm(a["xq"], a["xsf"], a["wq"], a["wsf"])
        y2 = torch.ops.m3qkv.mxfp8_gemm(None, None, a["wq"], a["wsf"],
                                        x_bf16=torch.empty(M, K, dtype=torch.bfloat16, device=dev))
        for t in (y, y2):
            assert t.shape == (M, 2560) and t.dtype == torch.bfloat16 and t.device.type == dev
        xq, xsf = torch.ops.m3qkv.mxfp8_quantize(torch.empty(300, 768, dtype=torch.bfloat16, device=dev))
        assert xq.shape == (300, 768) and xq.dtype == E4M3 and xq.device.type == dev
        assert xsf.shape == (384 * 24,) and xsf.dtype == torch.uint8 and xsf.device.type == dev
        with pytest.raises(ValueError, match=r"m3qkv.mxfp8_quantize: x must be \[M, K\] with K % 128 == 0"):
            torch.ops.m3qkv.mxfp8_quantize(torch.empty(4, 96, dtype=torch.bfloat16, device=dev))


# ------------------------------------------------- C++ checks == Python checks
def cpu(v):
    """A CPU tensor of v's dtype, shape and strides (uninitialized)."""
    if isinstance(v, torch.Tensor) and v.device.type == "meta":
        return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype)
    return v


def outcome(f, *args, **kw):
    try:
        f(*args, **kw)
    except Exception as e:  # noqa: BLE001 - the type is compared
        return type(e), str(e)
    return None, "returned"


def same_outcome(cpp, py, what):
    a, b = outcome(*cpp), outcome(*py)
    assert a == b, f"{what}:\n  C++:    {a}\n  Python: {b}"
    return a


def meta(shape, dtype, strides=None):
    if strides is None:
        return torch.empty(shape, dtype=dtype, device="meta")
    return torch.empty_strided(shape, strides, dtype=dtype, device="meta")


BF16 = torch.bfloat16


def _with(builder, **changes):
    def f():
        a, kw = builder()
        for k, v in changes.items():
            (a if k in a else kw)[k] = v() if callable(v) else v
        return a, kw
    f.changes = changes
    return f


# More fused_qkv calls (valid ones included: both sides then refuse the CPU
# tensors by name), beyond the error cases of test_errors and test_x_bf16.
EXTRA = [
    ("valid", base),
    ("valid x_bf16", bf16_base),
    ("valid m = 0", lambda: base(m=0)),
    ("valid block 128", lambda: base(bs=128)),
    ("valid e8m0 scales", _with(base, xsf=lambda: meta((1024,), torch.float8_e8m0fnu),
                                wsf=lambda: meta((2560 * 8,), torch.float8_e8m0fnu))),
    ("valid uint32 flags", _with(base, error_flags=lambda: meta((1,), torch.uint32))),
    ("valid flags of 4", _with(base, error_flags=lambda: meta((4,), torch.int32))),
    ("valid q_fp8_out only", _with(base, q_out=None)),
    ("valid q_out only, 3-D", _with(base, q_fp8_out=None, q_out=lambda: meta((M, 16, 128), BF16))),
    ("valid explicit counts", _with(base, nq=16, nkv=1, niq=1, nik=1)),
    ("valid niq inferred 0", _with(lambda: base(layout=(8, 1, 0, 1)), nq=8, nkv=1)),
    ("valid dense inferred", _with(lambda: base(layout=(8, 2, 0, 0)), nq=8, nkv=2)),
    ("valid fp8 5-D caches", _with(base, kv_cache=lambda: meta((3, 2, 16, 1, 128), E4M3),
                                   index_cache=lambda: meta((3, 16, 128), E4M3))),
    ("valid fp8 5-D padded pages", _with(base, kv_cache=lambda: meta((3, 2, 16, 1, 128), E4M3,
                                                                     (2 * 16 * 128 + 64, 16 * 128, 128, 128, 1)))),
    ("valid bf16 4-D caches", _with(base, kv_cache=lambda: meta((3, 16, 1, 128), BF16),
                                    v_cache=lambda: meta((3, 16, 1, 128), BF16),
                                    index_cache=lambda: meta((3, 16, 128), BF16))),
    ("valid nvfp4 index padded", _with(base, index_cache=lambda: meta((3, 16, 72), torch.uint8,
                                                                      (16 * 72 + 32, 72, 1)))),
    ("xq 1-D", _with(base, xq=lambda: meta((K,), E4M3))),
    ("wq dtype", _with(base, wq=lambda: meta((2560, K), BF16))),
    ("wq 1-D", _with(base, wq=lambda: meta((2560,), E4M3))),
    ("wq strided", _with(base, wq=lambda: meta((K, 2560), E4M3).t())),
    ("wsf missing", _with(base, wsf=None)),
    ("positions strided", _with(base, positions=lambda: meta((2 * M,), torch.int64)[::2])),
    ("positions 2-D", _with(base, positions=lambda: meta((M, 1), torch.int64))),
    ("cos_sin 3-D", _with(base, cos_sin_cache=lambda: meta((1, 64, 64), BF16))),
    ("index_q_norm_weight shape", _with(base, index_q_norm_weight=lambda: meta((64,), BF16))),
    ("index_k_norm_weight shape", _with(base, index_k_norm_weight=lambda: meta((256,), BF16))),
    ("index_slot_mapping dtype", _with(base, index_slot_mapping=lambda: meta((M,), torch.int32))),
    ("index_q_out dtype", _with(base, index_q_out=lambda: meta((M, 128), BF16))),
    ("q_fp8_out rows", _with(base, q_fp8_out=lambda: meta((M + 1, 2048), E4M3))),
    ("q_out 0-D", _with(base, q_out=lambda: meta((), BF16))),
    ("error_flags strided", _with(base, error_flags=lambda: meta((4,), torch.int32)[::2])),
    ("nvfp4 kv 3-D", _with(base, kv_cache=lambda: meta((3, 2, 16 * 72), torch.uint8))),
    ("nvfp4 kv width", _with(base, kv_cache=lambda: meta((3, 2, 16, 64), torch.uint8))),
    ("fp8 5-D with v_cache", _with(base, kv_cache=lambda: meta((3, 2, 16, 1, 128), E4M3),
                                   v_cache=lambda: meta((3, 2, 16, 1, 128), E4M3))),
    ("fp8 5-D strided last dim", _with(base, kv_cache=lambda: meta((3, 2, 16, 1, 128), E4M3,
                                                                   (8192, 4096, 256, 256, 2)))),
    ("fp8 5-D K/V pair", _with(base, kv_cache=lambda: meta((3, 1, 16, 1, 128), E4M3))),
    ("bf16 4-D heads", _with(base, kv_cache=lambda: meta((3, 16, 2, 128), BF16),
                             v_cache=lambda: meta((3, 16, 2, 128), BF16))),
    ("bf16 4-D strided last dim", _with(base, kv_cache=lambda: meta((3, 16, 1, 128), BF16, (4096, 256, 256, 2)),
                                        v_cache=lambda: meta((3, 16, 1, 128), BF16, (4096, 256, 256, 2)))),
    ("bf16 v_cache strides", _with(base, kv_cache=lambda: meta((3, 16, 1, 128), BF16),
                                   v_cache=lambda: meta((3, 16, 1, 128), BF16, (4096, 256, 128, 1)))),
    ("bf16 v_cache shape", _with(base, kv_cache=lambda: meta((3, 16, 1, 128), BF16),
                                 v_cache=lambda: meta((4, 16, 1, 128), BF16))),
    ("fp8 kv 3-D", _with(base, kv_cache=lambda: meta((3, 16, 128), E4M3))),
    ("fp8 kv 6-D", _with(base, kv_cache=lambda: meta((3, 2, 16, 1, 128, 1), E4M3))),
    ("nvfp4 index 2-D", _with(base, index_cache=lambda: meta((3, 16 * 72), torch.uint8))),
    ("nvfp4 index strided", _with(base, index_cache=lambda: meta((3, 16, 72), torch.uint8, (2000, 80, 1)))),
    ("fp8 index block size", _with(base, index_cache=lambda: meta((3, 32, 128), E4M3))),
    ("bf16 index tokens apart", _with(base, index_cache=lambda: meta((3, 16, 128), BF16, (8192, 256, 1)))),
    ("fp8 index 4-D", _with(base, index_cache=lambda: meta((3, 16, 1, 128), E4M3))),
    ("x_bf16 with old-style counts", _with(bf16_base, nq=16)),
    ("x_bf16 1-D", _with(bf16_base, x_bf16=lambda: meta((K,), BF16))),
]


def fused_cases():
    cases = []
    for desc, mutate, _ in FUSED_CASES:
        def f(mutate=mutate):
            a, kw = base()
            mutate(a, kw)
            return a, kw
        cases.append(("errors: " + desc, f))
    for desc, mutate, _ in BF16_CASES:
        def f(mutate=mutate):
            a, kw = bf16_base()
            mutate(a, kw)
            return a, kw
        cases.append(("x_bf16: " + desc, f))
    return cases + EXTRA


FUSED = fused_cases()


@needs_cpp
@pytest.mark.parametrize("desc,build", FUSED, ids=[c[0] for c in FUSED])
def test_cpp_fused_checks_equal_python(desc, build):
    a, kw = build()
    a = {k: cpu(v) for k, v in a.items()}
    kw = {k: cpu(v) for k, v in kw.items()}
    kind, msg = same_outcome((lambda: torch.ops.m3qkv.fused_qkv(*a.values(), **kw),),
                             (lambda: _ops.fused_qkv_impl(*a.values(), **kw),), desc)
    assert kind is ValueError, (desc, kind, msg)
    assert msg.startswith("m3qkv.fused_qkv: "), msg
    if desc.startswith("valid"):
        assert msg == "m3qkv.fused_qkv: the tensors must be CUDA tensors, got device cpu", msg


INSERT_KEYS = ("xq", "xsf", "wq", "wsf", "x_bf16")


def insert_cases():
    """(desc, build) -> (qkv, rest, kw): the cases of FUSED that change no GEMM
    operand (the epilogue rules, qkv [M, N] in place of the GEMM), and the qkv rules."""
    def insert_args(a, kw):
        qkv = meta((a["xq"].shape[0], a["wq"].shape[0]), BF16)
        return qkv, {k: v for k, v in a.items() if k not in INSERT_KEYS}, kw

    cases = []
    for desc, mutate, _ in FUSED_CASES:
        a, kw = base()
        before = {**a, **kw}
        mutate(a, kw)
        after = {**a, **kw}
        if any(before.get(k) is not after.get(k) for k in INSERT_KEYS):
            continue

        def f(mutate=mutate):
            a, kw = base()
            mutate(a, kw)
            return insert_args(a, kw)
        cases.append(("errors: " + desc, f))
    for desc, build in EXTRA:
        if "x_bf16" in desc or set(getattr(build, "changes", ())) & set(INSERT_KEYS):
            continue
        cases.append((desc, lambda build=build: insert_args(*build())))

    def qkv_case(qkv):
        def f():
            a, kw = base()
            return qkv(), {k: v for k, v in a.items() if k not in INSERT_KEYS}, kw
        return f
    cases += [("qkv dtype", qkv_case(lambda: meta((M, 2560), torch.float16))),
              ("qkv 3-D", qkv_case(lambda: meta((1, M, 2560), BF16))),
              ("qkv strided", qkv_case(lambda: meta((2560, M), BF16).t())),
              ("qkv N 2432", qkv_case(lambda: meta((M, 2432), BF16))),
              ("qkv rows", qkv_case(lambda: meta((M + 2, 2560), BF16)))]
    return cases


INSERT = insert_cases()


@needs_cpp
@pytest.mark.parametrize("desc,build", INSERT, ids=[c[0] for c in INSERT])
def test_cpp_insert_checks_equal_python(desc, build):
    qkv, rest, kw = build()
    qkv, rest, kw = cpu(qkv), {k: cpu(v) for k, v in rest.items()}, {k: cpu(v) for k, v in kw.items()}
    kind, msg = same_outcome((lambda: torch.ops.m3qkv.qknorm_rope_kv_insert(qkv, *rest.values(), **kw),),
                             (lambda: _ops.qknorm_rope_kv_insert_impl(qkv, *rest.values(), **kw),), desc)
    assert kind is ValueError and msg.startswith("m3qkv.qknorm_rope_kv_insert: "), (kind, msg)


GEMM = [  # (desc, xq, xsf, wq, wsf, x_bf16) as builders of meta tensors
    ("valid", lambda: (meta((M, K), E4M3), meta((1024,), torch.uint8), meta((2560, K), E4M3),
                       meta((2560 * 8,), torch.uint8), None)),
    ("valid x_bf16", lambda: (None, None, meta((2560, K), E4M3), meta((2560 * 8,), torch.uint8), meta((M, K), BF16))),
    ("valid e8m0", lambda: (meta((M, K), E4M3), meta((1024,), torch.float8_e8m0fnu), meta((256, K), E4M3),
                            meta((256 * 8,), torch.float8_e8m0fnu), None)),
    ("both", lambda: (meta((M, K), E4M3), meta((1024,), torch.uint8), meta((2560, K), E4M3),
                      meta((2560 * 8,), torch.uint8), meta((M, K), BF16))),
    ("xsf and x_bf16", lambda: (None, meta((1024,), torch.uint8), meta((2560, K), E4M3),
                                meta((2560 * 8,), torch.uint8), meta((M, K), BF16))),
    ("neither", lambda: (None, None, meta((2560, K), E4M3), meta((2560 * 8,), torch.uint8), None)),
    ("xq bf16", lambda: (meta((M, K), BF16), meta((1024,), torch.uint8), meta((2560, K), E4M3),
                         meta((2560 * 8,), torch.uint8), None)),
    ("xsf missing", lambda: (meta((M, K), E4M3), None, meta((2560, K), E4M3), meta((2560 * 8,), torch.uint8), None)),
    ("xsf size", lambda: (meta((M, K), E4M3), meta((1000,), torch.uint8), meta((2560, K), E4M3),
                          meta((2560 * 8,), torch.uint8), None)),
    ("wsf size", lambda: (meta((M, K), E4M3), meta((1024,), torch.uint8), meta((2560, K), E4M3),
                          meta((1024,), torch.uint8), None)),
    ("wq K", lambda: (meta((M, K), E4M3), meta((1024,), torch.uint8), meta((2560, 128), E4M3),
                      meta((2560 * 4,), torch.uint8), None)),
    ("wq K x_bf16", lambda: (None, None, meta((2560, 128), E4M3), meta((2560 * 4,), torch.uint8), meta((M, K), BF16))),
    ("x_bf16 f32", lambda: (None, None, meta((2560, K), E4M3), meta((2560 * 8,), torch.uint8),
                            meta((M, K), torch.float32))),
    ("x_bf16 strided", lambda: (None, None, meta((2560, K), E4M3), meta((2560 * 8,), torch.uint8),
                                meta((K, M), BF16).t())),
    ("wq 3-D", lambda: (meta((M, K), E4M3), meta((1024,), torch.uint8), meta((1, 2560, K), E4M3),
                        meta((2560 * 8,), torch.uint8), None)),
]


@needs_cpp
@pytest.mark.parametrize("desc,build", GEMM, ids=[c[0] for c in GEMM])
def test_cpp_gemm_checks_equal_python(desc, build):
    xq, xsf, wq, wsf, xb = (cpu(t) for t in build())
    kind, msg = same_outcome((lambda: torch.ops.m3qkv.mxfp8_gemm(xq, xsf, wq, wsf, x_bf16=xb),),
                             (lambda: _ops.mxfp8_gemm_impl(xq, xsf, wq, wsf, x_bf16=xb),), desc)
    assert kind is ValueError and msg.startswith("m3qkv.mxfp8_gemm: "), (kind, msg)


QUANTIZE = [("valid", lambda: meta((M, K), BF16)), ("valid m = 0", lambda: meta((0, 128), BF16)),
            ("K 96", lambda: meta((M, 96), BF16)), ("f32", lambda: meta((M, K), torch.float32)),
            ("3-D", lambda: meta((1, M, K), BF16)), ("1-D", lambda: meta((K,), BF16)),
            ("strided", lambda: meta((K, M), BF16).t())]


@needs_cpp
@pytest.mark.parametrize("desc,build", QUANTIZE, ids=[c[0] for c in QUANTIZE])
def test_cpp_quantize_checks_equal_python(desc, build):
    x = cpu(build())
    kind, msg = same_outcome((lambda: torch.ops.m3qkv.mxfp8_quantize(x),), (lambda: _ops.mxfp8_quantize_impl(x),),
                             desc)
    assert kind is ValueError and msg.startswith("m3qkv.mxfp8_quantize: "), (kind, msg)


# ------------------------------------------------------------ the fallback
REPORT = """
import json, warnings
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    import m3qkv
    import m3qkv._ops
    import m3qkv  # a second import: the module is cached, nothing is said again
import torch
ws = [str(x.message) for x in w if issubclass(x.category, m3qkv.M3qkvTorchOpsFallbackWarning)]
try:
    torch.ops.m3qkv.mxfp8_quantize(torch.zeros(4, 128, dtype=torch.bfloat16))
    err = None
except ValueError as e:
    err = str(e)
print(json.dumps({"warnings": ws, "info": m3qkv.torch_ops(), "err": err,
                  "cpu_kernel": [l for l in torch._C._dispatch_dump("m3qkv::mxfp8_quantize").splitlines()
                                 if l.startswith("CPU")]}))
"""


def report(**env):
    r = python(REPORT, **env)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_ctypes_fallback_is_reported_once():
    got = report(M3QKV_TORCH_OPS="ctypes")
    assert len(got["warnings"]) == 1, got
    assert "run the ctypes kernels" in got["warnings"][0] and "M3QKV_TORCH_OPS=ctypes" in got["warnings"][0]
    assert got["info"] == {"impl": "ctypes", "library": None, "reason": "M3QKV_TORCH_OPS=ctypes"}
    assert "_ops.py" in got["cpu_kernel"][0], got  # the Python kernels
    assert got["err"] == "m3qkv.mxfp8_quantize: the tensors must be CUDA tensors, got device cpu"


def test_missing_library_falls_back_and_says_why():
    missing = "/nonexistent/libm3qkv_torch_ops.so"
    got = report(M3QKV_TORCH_OPS="auto", M3QKV_TORCH_OPS_LIBRARY=missing)
    assert len(got["warnings"]) == 1 and f"M3QKV_TORCH_OPS_LIBRARY={missing} does not exist" in got["warnings"][0]
    assert got["info"]["impl"] == "ctypes" and "_ops.py" in got["cpu_kernel"][0]


def test_cpp_mode_insists_and_bad_modes_are_refused():
    r = python("import m3qkv", M3QKV_TORCH_OPS="cpp", M3QKV_TORCH_OPS_LIBRARY="/nonexistent/libm3qkv_torch_ops.so")
    assert r.returncode != 0 and "ImportError: m3qkv: M3QKV_TORCH_OPS=cpp, but the C++ torch ops cannot be used" \
        in r.stderr, r.stderr
    r = python("import m3qkv", M3QKV_TORCH_OPS="fast")
    assert r.returncode != 0 and "M3QKV_TORCH_OPS='fast': use one of auto, cpp, ctypes" in r.stderr, r.stderr


@needs_cpp_file
def test_cpp_ops_load_without_a_warning():
    got = report(M3QKV_TORCH_OPS="cpp", M3QKV_TORCH_OPS_LIBRARY=cpp_library_file())
    assert got["warnings"] == [] and got["info"]["impl"] == "c++", got
    assert "m3qkv_torch_ops.cpp" in got["cpu_kernel"][0], got
    assert got["err"] == "m3qkv.mxfp8_quantize: the tensors must be CUDA tensors, got device cpu"


@needs_cpp_file
def test_library_loaded_before_import_is_bound():
    """torch.ops.load_library(libm3qkv_torch_ops.so) first, `import m3qkv`
    after: the package binds the library that is there (no second load)."""
    p = cpp_library_file()
    r = python(f"import torch; torch.ops.load_library({p!r})\n" + REPORT, M3QKV_TORCH_OPS="cpp",
               M3QKV_TORCH_OPS_LIBRARY=p)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["warnings"] == [] and got["info"]["impl"] == "c++" and "must be CUDA tensors" in got["err"]


# ------------------------------------------------------------ GPU
def cuda(d):
    out = {}
    for k, v in d.items():
        out[k] = v.cuda() if isinstance(v, torch.Tensor) else v
    for k in ("xq", "wq"):
        if out.get(k) is not None:
            out[k] = out[k].view(E4M3)
    return out


POISON = 0xA5


def fused_kwargs(g, out, flags, **kw):
    return dict(slot_mapping=g["slot_mapping"], index_slot_mapping=g["index_slot_mapping"], kv_cache=out["kv_cache"],
                index_cache=out["index_cache"], index_q_out=out["index_q_out"], q_out=out["q_out"],
                q_fp8_out=out["q_fp8_out"], q_fp8_scale=g["q_fp8_scale"], k_scale=g["k_scale"],
                v_scale=g["v_scale"], error_flags=flags, nq=g["nq"], nkv=g["nkv"], niq=g["niq"], nik=g["nik"], **kw)


def epilogue_args(g):
    return (g["positions"], g["cos_sin_cache"], g["q_norm_weight"], g["k_norm_weight"], g["index_q_norm_weight"],
            g["index_k_norm_weight"], g["eps"])


def caches(p, kind):
    """Poisoned caches of `kind` on CUDA: {kv_cache, v_cache, index_cache} (NVFP4 from make_outputs)."""
    if kind == "nvfp4":
        out = make_outputs(p, POISON, device="cuda")
        return {"kv_cache": out["kv_cache"], "v_cache": None, "index_cache": out["index_cache"]}
    nb, bs, nkv = p["pages"], p["block_size"], p["nkv"]
    dt = E4M3 if kind == "fp8" else BF16

    def mk(shape):
        return torch.full(shape, 0x5A if dt == E4M3 else 0x5A5A, dtype=torch.uint8 if dt == E4M3 else torch.int16,
                          device="cuda").view(dt)
    if kind == "fp8":
        return {"kv_cache": mk((nb, 2, bs, nkv, 128)), "v_cache": None, "index_cache": mk((nb, bs, 128))}
    return {"kv_cache": mk((nb, bs, nkv, 128)), "v_cache": mk((nb, bs, nkv, 128)), "index_cache": mk((nb, bs, 128))}


def written(out):
    return [raw_bytes(t).cpu() if t is not None else None for t in out]


def both_paths(run):
    """run(impl) for impl in ("c++", "ctypes") on fresh poisoned outputs -> the written bytes of each."""
    res = {}
    for impl in ("c++", "ctypes"):
        outs = run(impl)
        torch.cuda.synchronize()
        res[impl] = written(outs)
    for i, (a, b) in enumerate(zip(res["c++"], res["ctypes"])):
        assert (a is None) == (b is None) and (a is None or torch.equal(a, b)), f"output {i} differs"
    return res["c++"]


@pytest.mark.gpu
@needs_cpp
@pytest.mark.parametrize("cache", ["nvfp4", "fp8", "bf16"])
@pytest.mark.parametrize("act", ["mxfp8", "x_bf16"])
def test_gpu_cpp_fused_writes_the_bytes_of_the_ctypes_kernel(cache, act):
    if act == "x_bf16" and m3qkv.backend() == "sm100":
        pytest.skip("the sm100 backend refuses x_bf16")
    p = make_problem("TP4", m=37, k=512, block_size=16, exact=True, oor=True)
    g = cuda(p)
    xb = None
    if act == "x_bf16":
        from m3qkv import reference as ref
        xb = ref.dequantize_activations(p["xq"], p["xsf"]).cuda()

    def run(impl):
        out = make_outputs(p, POISON, device="cuda")
        out.update(caches(p, cache))
        flags = torch.zeros(1, dtype=torch.int32, device="cuda")
        f = torch.ops.m3qkv.fused_qkv if impl == "c++" else _ops.fused_qkv_impl
        xq, xsf = (None, None) if xb is not None else (g["xq"], g["xsf"])
        f(xq, xsf, g["wq"], g["wsf"], *epilogue_args(g), **fused_kwargs(g, out, flags, v_cache=out["v_cache"],
                                                                         x_bf16=xb))
        return [out["q_out"], out["q_fp8_out"], out["index_q_out"], out["kv_cache"], out["v_cache"],
                out["index_cache"], flags]
    got = both_paths(run)
    assert int((got[0] != POISON).sum()) > got[0].numel() // 2  # written, not vacuous
    assert int(got[-1].view(torch.int32)[0]) != 0  # the out-of-range slots / positions were flagged


@pytest.mark.gpu
@needs_cpp
def test_gpu_cpp_unfused_ops_write_the_bytes_of_the_ctypes_kernels():
    p = make_problem("TP2", m=77, k=512, exact=True, oor=True)
    g = cuda(p)
    x = (torch.randn(300, 768, generator=torch.Generator().manual_seed(p["seed"])) * 3).to(BF16).cuda()
    qkv = (torch.randn(p["m"], p["n"], generator=torch.Generator().manual_seed(p["seed"])) * 4).to(BF16).cuda()
    xb = (torch.randn(p["m"], 512) * 2).to(BF16).cuda()

    def run(impl):
        ops = torch.ops.m3qkv if impl == "c++" else None
        quant = ops.mxfp8_quantize if ops else _ops.mxfp8_quantize_impl
        gemm = ops.mxfp8_gemm if ops else _ops.mxfp8_gemm_impl
        insert = ops.qknorm_rope_kv_insert if ops else _ops.qknorm_rope_kv_insert_impl
        xq, xsf = quant(x)
        y = gemm(g["xq"], g["xsf"], g["wq"], g["wsf"])
        y2 = gemm(None, None, g["wq"], g["wsf"], x_bf16=xb)  # a portable kernel: every backend has it
        out = make_outputs(p, POISON, device="cuda")
        flags = torch.zeros(1, dtype=torch.int32, device="cuda")
        insert(qkv, *epilogue_args(g), **fused_kwargs(g, out, flags))
        return [xq, xsf, y, y2, out["q_out"], out["q_fp8_out"], out["index_q_out"], out["kv_cache"],
                out["index_cache"], flags]
    got = both_paths(run)
    assert got[2].numel() == 77 * p["n"] * 2


@pytest.mark.gpu
@needs_cpp
def test_gpu_cpp_ops_in_a_cuda_graph():
    """quantize -> gemm -> insert and the fused op, captured through the C++
    kernels: the replay writes what eager calls write, on new inputs too."""
    p = make_problem("TP4", m=37, k=512, block_size=16, exact=True, oor=True)
    g = cuda(p)
    x = (torch.randn(37, 512) * 3).to(BF16).cuda()
    out = make_outputs(p, POISON, device="cuda")
    out2 = make_outputs(p, POISON, device="cuda")
    flags = torch.zeros(2, dtype=torch.int32, device="cuda")

    def step():
        xq, xsf = torch.ops.m3qkv.mxfp8_quantize(x)
        y = torch.ops.m3qkv.mxfp8_gemm(xq, xsf, g["wq"], g["wsf"])
        torch.ops.m3qkv.qknorm_rope_kv_insert(y, *epilogue_args(g), **fused_kwargs(g, out2, flags[1:]))
        torch.ops.m3qkv.fused_qkv(g["xq"], g["xsf"], g["wq"], g["wsf"], *epilogue_args(g),
                                  **fused_kwargs(g, out, flags[:1]))
        return y

    m3qkv.warmup()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    eager = written([out[k] for k in ("q_out", "q_fp8_out", "index_q_out", "kv_cache", "index_cache")] +
                    [out2[k] for k in ("q_out", "kv_cache")] + [flags])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = step()
    for t in list(out.values()) + list(out2.values()):  # poison every output storage again
        if t is not None:
            torch.empty(0, dtype=torch.uint8, device="cuda").set_(t.untyped_storage()).fill_(POISON)
    flags.zero_()
    graph.replay()
    torch.cuda.synchronize()
    replay = written([out[k] for k in ("q_out", "q_fp8_out", "index_q_out", "kv_cache", "index_cache")] +
                     [out2[k] for k in ("q_out", "kv_cache")] + [flags])
    for i, (a, b) in enumerate(zip(eager, replay)):
        assert (a is None and b is None) or torch.equal(a, b), f"output {i}: the replay differs from eager"
    x.copy_((torch.randn(37, 512) * 3).to(BF16))
    graph.replay()
    want = _ops.mxfp8_gemm_impl(*_ops.mxfp8_quantize_impl(x), g["wq"], g["wsf"])
    torch.cuda.synchronize()
    assert torch.equal(y.view(torch.int16), want.view(torch.int16))


@pytest.mark.gpu
@needs_cpp
def test_gpu_cpp_ops_run_on_the_current_stream():
    p = make_problem("TP8", m=64, k=512, block_size=16, exact=True)
    g = cuda(p)
    fresh = g["xq"]
    g["xq"] = torch.zeros_like(fresh.view(torch.uint8)).view(E4M3)
    want = make_outputs(p, POISON, device="cuda")
    _ops.fused_qkv_impl(fresh, g["xsf"], g["wq"], g["wsf"], *epilogue_args(g), **fused_kwargs(g, want, None))
    out = make_outputs(p, POISON, device="cuda")
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(50_000_000)
        g["xq"].copy_(fresh)  # lands late on s: an op on another stream would read zeros
        torch.ops.m3qkv.fused_qkv(g["xq"], g["xsf"], g["wq"], g["wsf"], *epilogue_args(g),
                                  **fused_kwargs(g, out, None))
    torch.cuda.synchronize()
    for k in ("q_out", "q_fp8_out", "kv_cache", "index_cache"):
        assert torch.equal(raw_bytes(out[k]), raw_bytes(want[k])), k


@pytest.mark.gpu
@needs_cpp
def test_gpu_cpp_ops_on_another_device():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    p = make_problem("TP4", m=19, k=256, exact=True)
    g = {k: (v.to("cuda:1") if isinstance(v, torch.Tensor) else v) for k, v in cuda(p).items()}
    res = []
    for f in (torch.ops.m3qkv.fused_qkv, _ops.fused_qkv_impl):
        out = make_outputs(p, POISON, device="cuda:1")
        with torch.cuda.device(0):
            f(g["xq"], g["xsf"], g["wq"], g["wsf"], *epilogue_args(g), **fused_kwargs(g, out, None))
        torch.cuda.synchronize(1)
        res.append(written([out["q_out"], out["kv_cache"]]))
    assert all(torch.equal(a, b) for a, b in zip(*res))


@pytest.mark.gpu
@needs_cpp
def test_gpu_cpp_errors_carry_the_ctypes_messages():
    p = make_problem("TP4", m=8, k=256, exact=True)
    g = cuda(p)
    out = make_outputs(p, POISON, device="cuda")
    before = raw_bytes(out["kv_cache"])
    cases = [("device mix", dict(slot_mapping=g["slot_mapping"].cpu()), "slot_mapping is on cpu, but xq is on cuda:"),
             ("eps", dict(eps=-1.0), "eps"),
             ("grid", dict(grid=-2), "grid"),
             ("k_scale", dict(k_scale=float("inf")), "k_scale")]
    for desc, change, fragment in cases:
        d = dict(g, **{k: v for k, v in change.items() if k in g})
        kw = fused_kwargs(d, out, None)
        kw.update({k: v for k, v in change.items() if k in kw or k == "grid"})
        args = (d["xq"], d["xsf"], d["wq"], d["wsf"], *epilogue_args(d))
        e1 = outcome(lambda: torch.ops.m3qkv.fused_qkv(*args, **kw))
        e2 = outcome(lambda: _ops.fused_qkv_impl(*args, **kw))
        assert e1[1] == e2[1] and fragment in e1[1], (desc, e1, e2)
        # ValueError from C++; ValueError or its subclass M3qkvValueError from ctypes
        assert e1[0] is ValueError and issubclass(e2[0], ValueError), (desc, e1, e2)
    torch.cuda.synchronize()
    assert torch.equal(raw_bytes(out["kv_cache"]), before)  # nothing launched
