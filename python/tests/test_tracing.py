"""The ops under the tracers, without a GPU: make_fx with fake tensors,
torch.compile(fullgraph=True) on meta tensors (dynamic M included),
torch.export on fake CUDA tensors, and torch.library.opcheck's schema / fake /
AOT-dispatch checks on meta tensors. (opcheck on real CUDA tensors is in
test_gpu.py.)"""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import m3qkv
from test_errors import E4M3, base

OPS = ("fused_qkv", "qknorm_rope_kv_insert", "mxfp8_gemm", "mxfp8_quantize")


def step(a, kw, x):
    """A model step: quantize, GEMM, fused op, insert; returns values that depend on all of them."""
    xq, xsf = m3qkv.mxfp8_quantize(x)
    y = m3qkv.mxfp8_gemm(xq, xsf, a["wq"], a["wsf"])
    args = dict(a, xq=xq, xsf=xsf)
    m3qkv.fused_qkv(*args.values(), **kw)
    rest = {k: v for k, v in a.items() if k not in ("xq", "xsf", "wq", "wsf")}
    m3qkv.qknorm_rope_kv_insert(y, *rest.values(), **kw)
    return kw["q_out"].float().sum(-1) + y.float().sum(-1)


def targets(gm):
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def test_make_fx_fake():
    a, kw = base("meta")
    x = torch.empty(a["xq"].shape, dtype=torch.bfloat16, device="meta")
    names = list(a) + list(kw) + ["x"]
    vals = list(a.values()) + list(kw.values()) + [x]

    def f(*vs):
        d = dict(zip(names, vs))
        return step({k: d[k] for k in a}, {k: d[k] for k in kw}, d["x"])

    gm = make_fx(f, tracing_mode="fake")(*vals)
    t = targets(gm)
    for op in OPS:
        assert f"m3qkv.{op}.default" in t, t


@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_fullgraph_on_meta(dynamic):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    f = torch.compile(step, fullgraph=True, backend=backend, dynamic=dynamic)
    for m in (5, 9, 200) if dynamic else (5,):
        a, kw = base("meta", m=m)
        x = torch.empty(a["xq"].shape, dtype=torch.bfloat16, device="meta")
        out = f(a, kw, x)
        assert out.shape == (m,)
    assert len(graphs) == 1, f"{len(graphs)} graphs (recompiled or broke)"
    t = targets(graphs[0])
    for op in OPS:
        assert any(f"m3qkv.{op}" in s for s in t), t


def test_compile_aot_eager_functionalizes_mutation():
    """Under AOT autograd the mutating ops become auto_functionalized and the
    mutated caches / outputs are written back: the traced program keeps them."""
    from torch._functorch.aot_autograd import aot_module_simplified
    seen = []

    def inner(gm, ex):
        seen.append(gm)
        return gm.forward

    def backend(gm, ex):
        return aot_module_simplified(gm, ex, fw_compiler=inner)

    torch._dynamo.reset()
    a, kw = base("meta")
    x = torch.empty(a["xq"].shape, dtype=torch.bfloat16, device="meta")
    torch.compile(step, fullgraph=True, backend=backend)(a, kw, x)
    code = seen[0].code
    assert "auto_functionalized" in code and "m3qkv.fused_qkv" in code
    assert "copy_" in code  # the functionalized results are copied back into the mutated inputs


def test_export_with_fake_cuda_tensors():
    a, kw = base("meta")
    names = [k for k, v in list(a.items()) + list(kw.items()) if isinstance(v, torch.Tensor)]

    class Step(torch.nn.Module):
        def forward(self, *vs):
            d = dict(zip(names, vs))
            m3qkv.fused_qkv(*[d.get(k) if k != "eps" else 1e-6 for k in a], **{k: d.get(k) for k in kw})
            return d["q_out"] * 2

    with FakeTensorMode():
        vals = tuple(torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="cuda")
                     for k, v in list(a.items()) + list(kw.items()) if k in names)
        ep = torch.export.export(Step(), vals)
    assert any("m3qkv.fused_qkv" in s for s in targets(ep.graph_module)), ep.graph_module.code


def _op_args(op, dev="meta"):
    a, kw = base(dev)
    rest = {k: v for k, v in a.items() if k not in ("xq", "xsf", "wq", "wsf")}
    if op == "fused_qkv":
        return tuple(a.values()), kw
    if op == "qknorm_rope_kv_insert":
        return (torch.empty(a["xq"].shape[0], 2560, dtype=torch.bfloat16, device=dev),) + tuple(rest.values()), kw
    if op == "mxfp8_gemm":
        return (a["xq"], a["xsf"], a["wq"], a["wsf"]), {}
    return (torch.empty(a["xq"].shape, dtype=torch.bfloat16, device=dev),), {}


@pytest.mark.parametrize("op", OPS)
def test_opcheck_on_meta(op):
    """Schema (mutations and aliasing as declared), fake kernel, AOT dispatch
    (static and dynamic shapes). On meta tensors, so no data is compared: the
    same checks on real CUDA tensors are in test_gpu.py."""
    args, kw = _op_args(op)
    torch.library.opcheck(getattr(torch.ops.m3qkv, op).default, args, kw,
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static",
                                      "test_aot_dispatch_dynamic"))
    print(f"opcheck {op}: schema/fake/aot on meta passed; the real-tensor run needs CUDA (test_gpu.py)")


def test_fake_kernel_rejects_bad_args_at_trace_time():
    a, kw = base("meta")
    kw["q_out"] = torch.empty(3, 2048, dtype=torch.bfloat16, device="meta")
    torch._dynamo.reset()
    f = torch.compile(lambda a, kw: m3qkv.fused_qkv(*a.values(), **kw), fullgraph=True, backend="eager")
    with pytest.raises(Exception, match=r"q_out must hold \[5, 2048\] values"):
        f(a, kw)
