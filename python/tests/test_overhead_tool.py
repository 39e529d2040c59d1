"""python/tools/measure_overhead.py on the CPU: --host-only --json writes the
schema bench/results/h200_python.json uses (context, one object per path, per
M median / p90), copies the C++ bench's host_fused_qkv figures from the file
it is given (values planted here, other TPs and checked-mode runs ignored),
says so when that file has none; the frame counter behind
compiled.python_frames_per_call sees a kernel's Python frames under
torch.compile and none where there are none."""
import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import m3qkv  # noqa: E402

TOOL = pathlib.Path(__file__).resolve().parents[1] / "tools" / "measure_overhead.py"
HOST_PATHS = {"c_call_ctypes", "eager_fast_path", "full_checks", "argument_checks", "empty_torch_op",
              "empty_aten_op", "c_call"}


def run_tool(tmp_path, *extra):
    out = tmp_path / "h200_python.json"
    env = dict(os.environ)
    # the m3qkv this test imported, also in the tool's process
    env["PYTHONPATH"] = os.pathsep.join([str(pathlib.Path(m3qkv.__file__).resolve().parents[1])] +
                                        ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    r = subprocess.run([sys.executable, str(TOOL), "--host-only", "--calls", "3", "--batches", "4", "--json",
                        str(out), *extra], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(out.read_text()), r.stdout


def bench_entry(name, host_us, p90, **kw):
    return dict(name=name, run_name=name, run_type="iteration", host_us=host_us, host_p90_us=p90, **kw)


def test_host_only_json_schema_and_copied_c_call(tmp_path):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"context": {"device": "NVIDIA H200", "date": "d0"}, "benchmarks": [
        bench_entry("host_fused_qkv/TP:4/M:1/manual_time", 4.25, 5.5, checked=0),
        bench_entry("host_fused_qkv/TP:4/M:1/manual_time", 9.0, 11.0, checked=1),  # checked mode: not the floor
        bench_entry("host_fused_qkv/TP:2/M:64/manual_time", 7.0, 8.0),  # another TP
        bench_entry("host_fused_qkv/TP:4/M:64/manual_time", 4.75, 6.0),
        bench_entry("host_gemm/TP:4/M:4096/manual_time", 3.0, 3.5),  # another op
    ]}))
    doc, stdout = run_tool(tmp_path, "--bench-json", str(bench), "--m", "1,64,4096")
    ctx = doc["context"]
    for k in ("device", "torch_version", "backend", "torch_ops", "calls", "batches", "date", "mode", "method"):
        assert k in ctx, k
    assert ctx["mode"] == "host-only" and ctx["calls"] == 3 and ctx["batches"] == 4
    assert ctx["torch_version"] == torch.__version__
    assert ctx["torch_ops"] == m3qkv.torch_ops()  # same environment, same implementation
    # the C++ op's floor where libm3qkv_torch_noop.so sits beside the bound C++ ops
    lib = m3qkv.torch_ops()["library"]
    noop = os.environ.get("M3QKV_TORCH_NOOP_LIBRARY") or (
        os.path.join(os.path.dirname(lib), "libm3qkv_torch_noop.so") if lib else None)
    stable = {"empty_stable_op"} if noop and os.path.exists(noop) else set()
    assert set(doc["paths"]) == HOST_PATHS | stable
    for name, p in doc["paths"].items():
        assert isinstance(p["what"], str) and p["what"]
        if name == "c_call":
            continue
        assert [r["M"] for r in p["results"]] == [0], name
        r = p["results"][0]
        assert 0 < r["median_us"] <= r["p90_us"] < 1e6, (name, r)
    assert doc["paths"]["empty_torch_op"]["op"] == "m3qkv_overhead::fused_qkv_noop"
    assert doc["paths"]["empty_aten_op"]["op"] == "aten::alias"
    cc = doc["paths"]["c_call"]
    got = {r["M"]: (r["median_us"], r["p90_us"]) for r in cc["results"]}
    assert got == {1: (4.25, 5.5), 64: (4.75, 6.0), 4096: (None, None)}
    assert str(bench) in cc["source"] and "copied" in cc["source"] and "NVIDIA H200" in cc["source"]
    assert "c_call (C validation + ctypes)" in stdout  # the printed table stays


def test_c_call_source_says_when_the_bench_has_no_entries(tmp_path):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"context": {}, "benchmarks": [bench_entry("host_gemm/TP:4/M:1", 1.0, 1.0)]}))
    doc, _ = run_tool(tmp_path, "--bench-json", str(bench), "--m", "1")
    cc = doc["paths"]["c_call"]
    assert cc["source"].startswith("not available") and cc["results"] == [{"M": 1, "median_us": None,
                                                                            "p90_us": None}]
    doc, _ = run_tool(tmp_path, "--bench-json", str(tmp_path / "missing.json"), "--m", "1")
    assert doc["paths"]["c_call"]["source"].startswith("not available")


def load_tool():
    spec = importlib.util.spec_from_file_location("measure_overhead", TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_p90_is_the_nearest_rank():
    tool = load_tool()
    assert tool.p90([float(i) for i in range(10, 0, -1)]) == 9.0
    assert tool.p90([5.0]) == 5.0
    assert tool.p90([1.0, 2.0, 3.0]) == 3.0


def test_frame_counter_sees_a_python_kernel_under_compile(tmp_path, monkeypatch):
    tool = load_tool()
    pkg = tmp_path / "framepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "import torch\n"
        "LIB = torch.library.Library('m3qkv_test_frames', 'DEF')\n"
        "LIB.define('touch(Tensor(a!) x) -> ()')\n"
        "def python_kernel(x):\n"
        "    return None\n"
        "LIB.impl('touch', python_kernel, 'CPU')\n"
        "torch.library.register_fake('m3qkv_test_frames::touch', lambda x: None, lib=LIB)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("framepkg")
    x = torch.zeros(8)
    with_op = torch.compile(lambda: torch.ops.m3qkv_test_frames.touch(x), fullgraph=True, backend="eager")
    without = torch.compile(lambda: x.add_(1), fullgraph=True, backend="eager")
    for f in (with_op, without):
        f()
    mine, total, names = tool.python_frames_per_call(with_op, 5, str(pkg))
    assert mine == 1.0 and names == ["python_kernel"] and total >= mine
    mine, _, names = tool.python_frames_per_call(without, 5, str(pkg))
    assert mine == 0 and names == []
