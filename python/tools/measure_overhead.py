"""Per-call host overhead of the Python layer and the torch op over the C call.

    python python/tools/measure_overhead.py [--m 1,64,4096] [--calls 50] [--batches 400] [--json PATH]
    python python/tools/measure_overhead.py --host-only [--json PATH]     # no GPU needed

Method (every path): the median and the 90th percentile over `batches` of
(time to enqueue `calls` calls) / calls, with a synchronize between batches
(the GPU work of one batch is far longer than its enqueue, so the launch queue
never fills and blocks the host).

GPU mode (TP4, K = 6144, NVFP4 caches, block 128), for each M:
  c_call_ctypes  lib.m3qkv_fused_qkv(&args, stream) through ctypes with a struct
                 filled once: validation + launch in C, plus ctypes;
  module_fn      m3qkv.fused_qkv(...): the module function (checks, struct
                 fill, current stream, C call), no dispatcher;
  torch_ops      torch.ops.m3qkv.fused_qkv(...): through the dispatcher, to the
                 C++ kernel when m3qkv.torch_ops() says c++, else the ctypes one;
  compiled       a torch.compile(fullgraph=True, dynamic=False) function calling
                 torch.ops.m3qkv.fused_qkv (warmed first), and how many Python
                 frames of the m3qkv package run per call (sys.setprofile);
  graph_replay   one replay of a CUDA graph holding one call;
  empty_torch_op a custom op with fused_qkv's schema and a kernel that does
                 nothing, called like torch_ops: the floor of the dispatcher with
                 these arguments and a Python kernel (the ctypes op's floor);
  empty_stable_op the same schema registered in C++ through the stable ABI as
                 the C++ ops are (libm3qkv_torch_noop.so, built beside
                 libm3qkv_torch_ops.so; --noop-library), with a kernel that
                 does nothing: the floor of the C++ op (dispatcher, boxing,
                 argument conversion);
  empty_aten_op  torch.ops.aten.alias(xq): a C++ op through the dispatcher.
  c_call         the C API called from C++: copied from the host_fused_qkv
                 entries of the C++ bench (bench/results/h200.json, --bench-json),
                 when that file has them (`source` says where they came from).
The Python layer's eager overhead is module_fn - c_call_ctypes (goal <= 10 us).

--host-only: the same tensors on the CPU with M = 0 (the C library validates
and returns before touching a device): the C call, the eager fast path's
checks + pack + C call, the full checks, and the empty ops, without a GPU.

--json PATH writes {"context": {...}, "paths": {name: {"what", "results":
[{"M", "median_us", "p90_us"}, ...]}}} (bench/results/h200_python.json).
"""
from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import math
import os
import platform
import re
import statistics
import sys
import time

import torch

try:
    import m3qkv
except ImportError:  # run from a source checkout without PYTHONPATH: the package next to this tools/ directory
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import m3qkv
from m3qkv import _capi, _ops

K, NQ, NKV, NIQ, NIK, BS = 6144, 16, 1, 1, 1, 128
N = (NQ + 2 * NKV + NIQ + NIK) * 128
PROBLEM = f"MiniMax-M3 TP4: K {K}, nq {NQ}, nkv {NKV}, niq {NIQ}, nik {NIK}, N {N}, NVFP4 caches, block {BS}"
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BENCH_JSON = os.path.join(REPO, "bench", "results", "h200.json")
# The C++ bench's entry names (Google Benchmark: name/TP:t/M:m/manual_time).
BENCH_NAME = re.compile(r"^(?P<op>[^/]+)/TP:(?P<tp>\d+)/M:(?P<m>\d+)(?:/.*)?$")


def tensors(m, dev):
    e4 = torch.float8_e4m3fn
    pages = max(2, (2 * m + BS - 1) // BS)
    sf = lambda r: (r + 127) // 128 * 128 * (K // 32)  # noqa: E731
    a = [torch.zeros(m, K, dtype=torch.uint8, device=dev).view(e4), torch.full((sf(m),), 127, dtype=torch.uint8, device=dev),
         torch.zeros(N, K, dtype=torch.uint8, device=dev).view(e4), torch.full((sf(N),), 127, dtype=torch.uint8, device=dev),
         torch.zeros(m, dtype=torch.int64, device=dev), torch.zeros(4096, 64, dtype=torch.bfloat16, device=dev)] + \
        [torch.zeros(128, dtype=torch.bfloat16, device=dev) for _ in range(4)] + [1e-6]
    kw = dict(slot_mapping=torch.arange(m, dtype=torch.int64, device=dev),
              index_slot_mapping=torch.arange(m, dtype=torch.int64, device=dev),
              kv_cache=torch.zeros(pages, 2 * NKV, BS, 72, dtype=torch.uint8, device=dev),
              index_cache=torch.zeros(pages, BS, 72, dtype=torch.uint8, device=dev),
              index_q_out=torch.empty(m, NIQ * 128, dtype=torch.uint8, device=dev).view(e4),
              q_out=torch.empty(m, NQ * 128, dtype=torch.bfloat16, device=dev))
    return a, kw


def p90(ts):
    """Nearest-rank 90th percentile."""
    s = sorted(ts)
    return s[max(0, math.ceil(0.9 * len(s)) - 1)]


def per_call(fn, calls, batches, sync):
    """-> (median, p90) in µs of the per-call host time over the batches."""
    for _ in range(3):
        fn()
    sync()
    ts = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        ts.append((time.perf_counter() - t0) / calls)
        sync()
    return statistics.median(ts) * 1e6, p90(ts) * 1e6


def python_frames_per_call(fn, calls, directory):
    """Python frames whose file lies under `directory` that start per call of
    fn (sys.setprofile 'call' events; fn is warm, so nothing compiles here).
    -> (frames under directory per call, all Python frames per call, their function names)."""
    fn()
    directory = os.path.join(os.path.abspath(directory), "")
    mine, total, names = 0, 0, set()

    def prof(frame, event, arg):
        nonlocal mine, total
        if event == "call":
            total += 1
            if os.path.abspath(frame.f_code.co_filename).startswith(directory):
                mine += 1
                names.add(frame.f_code.co_name)

    sys.setprofile(prof)
    try:
        for _ in range(calls):
            fn()
    finally:
        sys.setprofile(None)
    return mine / calls, total / calls, sorted(names)


_empty_lib = None


def empty_op():
    """torch.ops.m3qkv_overhead.fused_qkv_noop: fused_qkv's schema under another
    name, with CPU and CUDA kernels that return at once, so a call costs what the
    dispatcher and the Python kernel call cost with fused_qkv's arguments."""
    global _empty_lib
    if _empty_lib is None:
        _empty_lib = torch.library.Library("m3qkv_overhead", "DEF")
        _empty_lib.define(_ops.SCHEMAS["fused_qkv"].replace("fused_qkv(", "fused_qkv_noop(", 1))
        for key in ("CPU", "CUDA"):
            _empty_lib.impl("fused_qkv_noop", lambda *a, **kw: None, key)
    return torch.ops.m3qkv_overhead.fused_qkv_noop


def empty_stable_op(path):
    """torch.ops.m3qkv_overhead.fused_qkv_noop_stable (python/tools/torch_noop_op.cpp)
    from `path`, or None when that file is absent; its schema must be
    fused_qkv's, renamed."""
    if not path or not os.path.exists(path):
        return None
    torch.ops.load_library(path)
    op = torch.ops.m3qkv_overhead.fused_qkv_noop_stable.default
    want = _ops.SCHEMAS["fused_qkv"].replace("fused_qkv(", "fused_qkv_noop_stable(", 1)
    got = str(op._schema).split("::", 1)[-1]
    assert str(torch._C.parse_schema("m3qkv_overhead::" + want)).split("::", 1)[-1] == got, (want, got)
    return op


def default_noop_library():
    lib = m3qkv.torch_ops()["library"]
    return os.environ.get("M3QKV_TORCH_NOOP_LIBRARY") or (
        os.path.join(os.path.dirname(lib), "libm3qkv_torch_noop.so") if lib else None)


EMPTY_STABLE_WHAT = ("torch.ops.m3qkv_overhead.fused_qkv_noop_stable: fused_qkv's schema registered in C++ through "
                     "the stable ABI as the C++ ops are, with an empty kernel, called with torch_ops's arguments: "
                     "the floor of the C++ op")

EMPTY_OP_WHAT = ("torch.ops.m3qkv_overhead.fused_qkv_noop: a torch.library custom op with fused_qkv's schema whose "
                 "kernel (Python, registered for CPU and CUDA) returns at once, called with torch_ops's arguments")
EMPTY_ATEN_WHAT = "torch.ops.aten.alias(xq): one C++ aten op through the dispatcher (it makes a view)"


def bench_c_call(path, ms, tp=4):
    """The C++ bench's host_fused_qkv figures (host_us, host_p90_us) for TP `tp`
    and each M, from its JSON at `path` (entries with M3QKV_CHECKED off)."""
    src = os.path.relpath(path, REPO) if os.path.abspath(path).startswith(REPO + os.sep) else path
    out = {"what": "m3qkv_fused_qkv called from C++ (bench/bench_fused.cpp, host_fused_qkv): the CPU time of one "
                   "call with the GPU idle, median / p90 over its calls (not this tool's batch method)",
           "results": [{"M": m, "median_us": None, "p90_us": None} for m in ms]}
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        out["source"] = f"not available: {src} could not be read ({e.__class__.__name__})"
        return out
    found = {}
    for b in doc.get("benchmarks", []):
        mt = BENCH_NAME.match(str(b.get("run_name") or b.get("name", "")))
        if (not mt or mt.group("op") != "host_fused_qkv" or int(mt.group("tp")) != tp or b.get("error_occurred") or
                b.get("run_type") == "aggregate" or b.get("checked", 0) or "host_us" not in b):
            continue
        found.setdefault(int(mt.group("m")), []).append(b)
    for r in out["results"]:
        bs = found.get(r["M"])
        if bs:
            r["median_us"] = statistics.median(float(b["host_us"]) for b in bs)
            r["p90_us"] = statistics.median(float(b.get("host_p90_us", b["host_us"])) for b in bs)
            r["entry"] = str(bs[0].get("run_name") or bs[0]["name"])
    have = [r["M"] for r in out["results"] if r["median_us"] is not None]
    ctx = doc.get("context", {})
    if have:
        out["source"] = (f"copied from {src} (host_fused_qkv TP:{tp}, counters host_us / host_p90_us; that run: "
                         f"device {ctx.get('device', '?')}, date {ctx.get('date', '?')}), not measured by this run")
    else:
        out["source"] = (f"not available: {src} has no host_fused_qkv/TP:{tp} entries (run the C++ bench with "
                         f"--benchmark_filter='^host_fused_qkv' to add them)")
    return out


def context(mode, calls, batches, device, backend):
    lib = _capi.library()
    return {"tool": "python/tools/measure_overhead.py", "mode": mode,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": device, "host_name": platform.node(), "python": platform.python_version(),
            "torch_version": torch.__version__, "m3qkv_version": m3qkv.__version__, "library": lib.path,
            "backend": backend, "torch_ops": m3qkv.torch_ops(), "calls": calls, "batches": batches,
            "problem": PROBLEM,
            "method": "per path and M: median and p90 over `batches` of (host time to enqueue `calls` calls) / "
                      "calls, synchronizing between batches"}


def path(what, results, **extra):
    return dict(what=what, results=[{"M": m, "median_us": round(med, 3), "p90_us": round(hi, 3)}
                                    for m, (med, hi) in results], **extra)


def host_only(calls, batches, ms, bench_json, noop_library):
    a, kw = tensors(0, "cpu")
    lib = _capi.library()
    _, args = _ops.fused_qkv_args(*a, **kw)
    addr = ctypes.addressof(args)
    f = lib.fused_qkv

    def c_call():
        f(addr, None)

    def py():
        _, s = _ops.fused_qkv_args(*a, **kw)
        f(ctypes.addressof(s), None)

    def checks_only():
        _ops._check_fused(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], kw["slot_mapping"],
                          kw["index_slot_mapping"], kw["kv_cache"], kw["index_cache"], kw["index_q_out"],
                          kw["q_out"], None, None, None, None, None, None, None, False)

    packer = _ops._packer()[0]
    s = _capi.FusedArgs()
    sa = ctypes.addressof(s)
    d = dict(q_fp8_out=None, q_fp8_scale=1.0, k_scale=1.0, v_scale=1.0, cta_group=None, use_pdl=True, grid=None,
             v_cache=None, nq=None, nkv=None, niq=None, nik=None, error_flags=None)
    d.update(kw)

    def fast():  # what m3qkv.fused_qkv does in eager mode, minus the device/stream queries
        r = _ops.fused_fast_args(*a, d["slot_mapping"], d["index_slot_mapping"], d["kv_cache"], d["index_cache"],
                                 d["index_q_out"], d["q_out"], d["q_fp8_out"], d["q_fp8_scale"], d["k_scale"],
                                 d["v_scale"], d["cta_group"], d["use_pdl"], d["grid"], d["v_cache"], d["nq"],
                                 d["nkv"], d["niq"], d["nik"], d["error_flags"])
        packer.pack_into(s, 0, *r[1])
        f(sa, None)

    noop = empty_op()
    empty = lambda: noop(*a, **kw)  # noqa: E731
    aten = lambda: torch.ops.aten.alias(a[0])  # noqa: E731
    nop = lambda: None  # noqa: E731
    stable = empty_stable_op(noop_library)
    floor = (lambda: stable(*a, **kw)) if stable is not None else nop  # noqa: E731
    c, fp, p, ch, e, al, sf = (per_call(fn, calls, batches, nop)
                               for fn in (c_call, fast, py, checks_only, empty, aten, floor))
    print(f"host-only (CPU tensors, M = 0, {calls} calls x {batches} batches, median per call):")
    print(f"  c_call (C validation + ctypes)            {c[0]:7.2f} us")
    print(f"  eager fast path: flat checks + pack + C   {fp[0]:7.2f} us   -> Python layer adds {fp[0] - c[0]:.2f} us")
    print(f"  full checks + field-wise fill + C         {p[0]:7.2f} us   -> {p[0] - c[0]:.2f} us (fallback path)")
    print(f"    of which the full argument checks       {ch[0]:7.2f} us")
    print(f"  empty custom op, fused_qkv's arguments    {e[0]:7.2f} us   (dispatcher + a Python kernel)")
    print(f"  empty aten op (aten.alias)                {al[0]:7.2f} us")
    if stable is not None:
        print(f"  empty stable-ABI C++ op, same arguments   {sf[0]:7.2f} us   (the C++ op's floor)")
    note = "CPU tensors, M = 0: the C library validates the struct and returns before any device work"
    return {"context": dict(context("host-only", calls, batches, "cpu (host-only: no kernel runs)",
                                    "none (host-only)"), note=note),
            "paths": {
                "c_call_ctypes": path("lib.m3qkv_fused_qkv(&args, NULL) through ctypes, the struct filled once",
                                      [(0, c)]),
                "eager_fast_path": path("what m3qkv.fused_qkv does in eager mode minus the device / stream queries: "
                                        "flat checks, one struct pack, the C call", [(0, fp)]),
                "full_checks": path("the full argument checks + field-wise struct fill + the C call (the fallback "
                                    "path of the eager function and the ctypes op)", [(0, p)]),
                "argument_checks": path("the full argument checks alone (_ops._check_fused)", [(0, ch)]),
                "empty_torch_op": path(EMPTY_OP_WHAT, [(0, e)], op="m3qkv_overhead::fused_qkv_noop"),
                "empty_aten_op": path(EMPTY_ATEN_WHAT, [(0, al)], op="aten::alias"),
                **({"empty_stable_op": path(EMPTY_STABLE_WHAT, [(0, sf)], op="m3qkv_overhead::fused_qkv_noop_stable")}
                   if stable else {}),
                "c_call": bench_c_call(bench_json, ms),
            }}


def gpu(ms, calls, batches, bench_json, noop_library):
    dev = torch.device("cuda", torch.cuda.current_device())
    lib = _capi.library()
    m3qkv.warmup()
    name, backend = torch.cuda.get_device_name(dev), m3qkv.backend()
    print(f"{name}, backend {backend}, torch {torch.__version__}, {calls} calls x {batches} batches, "
          f"median host time per call:")
    ops = m3qkv.torch_ops()
    print(f"torch.ops.m3qkv.*: {ops['impl']} kernels ({ops['library'] or ops['reason']})")
    pkg = os.path.dirname(os.path.abspath(m3qkv.__file__))
    noop = empty_op()
    stable = empty_stable_op(noop_library)
    if stable is None:
        print(f"no {noop_library or 'libm3qkv_torch_noop.so'}: the empty_stable_op row is left out")

    # Flat tensor arguments, as a model's forward passes them; dynamic=False:
    # one static graph per M (what a CUDA-graph size of a serving engine runs).
    @torch.compile(fullgraph=True, dynamic=False)
    def compiled(xq, xsf, wq, wsf, positions, cos_sin, qw, kw_, iqw, ikw, eps, slot_mapping, index_slot_mapping,
                 kv_cache, index_cache, index_q_out, q_out):
        torch.ops.m3qkv.fused_qkv(xq, xsf, wq, wsf, positions, cos_sin, qw, kw_, iqw, ikw, eps,
                                  slot_mapping=slot_mapping, index_slot_mapping=index_slot_mapping,
                                  kv_cache=kv_cache, index_cache=index_cache, index_q_out=index_q_out, q_out=q_out)

    cols = ["c_call_ctypes", "module_fn", "torch_ops", "compiled", "graph_replay", "empty_torch_op", "empty_aten_op",
            "empty_stable_op"]
    res = {c: [] for c in cols}
    frames = []
    print(f"{'M':>6} {'c_call':>8} {'module':>8} {'t.ops':>8} {'compiled':>8} {'graph':>8} {'empty_op':>8} "
          f"{'aten':>8} {'stable':>8} {'mod-c':>7} {'ops-c':>7} {'comp-c':>7}")
    for m in ms:
        a, kw = tensors(m, dev)
        _, args = _ops.fused_qkv_args(*a, **kw)
        fixed = _capi.FusedArgs.from_buffer_copy(args)
        addr, f = ctypes.addressof(fixed), lib.fused_qkv
        stream = torch.cuda.current_stream(dev).cuda_stream

        def c_call():
            st = f(addr, stream)
            if st:
                raise lib.error(st)

        direct = lambda: m3qkv.fused_qkv(*a, **kw)  # noqa: E731
        op = lambda: torch.ops.m3qkv.fused_qkv(*a, **kw)  # noqa: E731
        comp = lambda: compiled(*a, **kw)  # noqa: E731
        empty = lambda: noop(*a, **kw)  # noqa: E731
        aten = lambda: torch.ops.aten.alias(a[0])  # noqa: E731
        floor = (lambda: stable(*a, **kw)) if stable is not None else (lambda: None)  # noqa: E731
        sync = torch.cuda.synchronize
        for _ in range(3):  # compile and warm outside the timed batches
            comp()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            direct()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            direct()
        r = [per_call(fn, calls, batches, sync) for fn in (c_call, direct, op, comp, g.replay, empty, aten, floor)]
        for c, v in zip(cols, r):
            res[c].append((m, v))
        mine, total, names = python_frames_per_call(comp, calls, pkg)
        sync()
        frames.append({"M": m, "python_frames_per_call": mine, "all_python_frames_per_call": total,
                       "functions": names})
        med = [v[0] for v in r]
        print(f"{m:6d} " + " ".join(f"{x:8.2f}" for x in med) +
              f" {med[1] - med[0]:7.2f} {med[2] - med[0]:7.2f} {med[3] - med[0]:7.2f}")
    print("us per call; mod-c is the module function's eager overhead over the ctypes C call (goal <= 10 us), "
          "ops-c the dispatcher path's, comp-c the compiled function's")
    for fr in frames:
        print(f"compiled, M = {fr['M']}: {fr['python_frames_per_call']:g} Python frames of the m3qkv package per call "
              f"({', '.join(fr['functions']) or 'none'}); {fr['all_python_frames_per_call']:g} Python frames in all")
    worst = max(fr["python_frames_per_call"] for fr in frames)
    if ops["impl"] != "c++":
        frame_note = ("the ctypes kernels serve the op: its CUDA kernel is Python (m3qkv/_ops.py fused_qkv_fast), so "
                      "frames of the package run per compiled call")
    elif worst == 0:
        frame_note = "the C++ kernels serve the op: no Python frame of the m3qkv package runs per compiled call"
    else:
        frame_note = "the C++ kernels serve the op, yet frames of the m3qkv package ran per call: see `functions`"
    return {"context": context("gpu", calls, batches, name, backend),
            "paths": {
                "torch_ops": path(f"torch.ops.m3qkv.fused_qkv(...) eager: the dispatcher, then the {ops['impl']} "
                                  f"kernel", res["torch_ops"]),
                "module_fn": path("m3qkv.fused_qkv(...) eager: the module function, which calls the C++ op "
                                  "(torch.ops.m3qkv.fused_qkv.default) when it is bound, else its ctypes fast path",
                                  res["module_fn"]),
                "compiled": path("a torch.compile(fullgraph=True, dynamic=False) function calling "
                                 "torch.ops.m3qkv.fused_qkv, warmed (guards + Inductor's wrapper + the op)",
                                 res["compiled"],
                                 python_frames_per_call=worst, python_frames=frames,
                                 python_frames_note=frame_note + " (sys.setprofile, files under " + pkg + ")"),
                "graph_replay": path("torch.cuda.CUDAGraph.replay() of a graph holding one m3qkv.fused_qkv call",
                                     res["graph_replay"]),
                "c_call_ctypes": path("lib.m3qkv_fused_qkv(&args, stream) through ctypes, the struct filled once "
                                      "(validation + launch in C, plus ctypes)", res["c_call_ctypes"]),
                "empty_torch_op": path(EMPTY_OP_WHAT, res["empty_torch_op"], op="m3qkv_overhead::fused_qkv_noop"),
                "empty_aten_op": path(EMPTY_ATEN_WHAT, res["empty_aten_op"], op="aten::alias"),
                **({"empty_stable_op": path(EMPTY_STABLE_WHAT, res["empty_stable_op"],
                                            op="m3qkv_overhead::fused_qkv_noop_stable")} if stable else {}),
                "c_call": bench_c_call(bench_json, ms),
            }}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--m", default="1,64,4096", help="comma-separated token counts (default 1,64,4096)")
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--batches", type=int, default=400)
    ap.add_argument("--host-only", action="store_true", help="CPU tensors, M = 0: no GPU needed")
    ap.add_argument("--json", metavar="PATH", help="write the figures as JSON (bench/results/h200_python.json)")
    ap.add_argument("--bench-json", metavar="PATH", default=BENCH_JSON,
                    help="the C++ bench's JSON to take the c_call (host_fused_qkv) figures from "
                         "(default bench/results/h200.json)")
    ap.add_argument("--noop-library", metavar="PATH", default=None,
                    help="libm3qkv_torch_noop.so for the empty_stable_op row (default: M3QKV_TORCH_NOOP_LIBRARY, "
                         "else the one beside the bound libm3qkv_torch_ops.so)")
    a = ap.parse_args(argv)
    if a.calls < 1 or a.batches < 1:
        ap.error("--calls and --batches must be >= 1")
    ms = [int(x) for x in a.m.split(",")]
    if a.host_only or not torch.cuda.is_available():
        if not a.host_only:
            print("no CUDA device: measuring the host-only path")
        doc = host_only(a.calls, a.batches, ms, a.bench_json, a.noop_library or default_noop_library())
    else:
        doc = gpu(ms, a.calls, a.batches, a.bench_json, a.noop_library or default_noop_library())
    cc = doc["paths"]["c_call"]
    print(f"c_call (C++): {cc['source']}")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
