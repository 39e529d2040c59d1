#!/usr/bin/env python3
"""Tables and a plot from the m3qkv benchmark's Google Benchmark JSON.

Usage (from anywhere; paths default to the repository's):
  python3 tools/bench_table.py [--json bench/results/h200.json]   # rewrite the tables and the plot
  python3 tools/bench_table.py --check                             # exit 1 if the tables are stale

Reads the JSON that `build/bench/m3qkv_bench --benchmark_out=... --benchmark_out_format=json`
writes (bash tools/bench_sweep.sh on an H200 writes bench/results/h200.json). Entry names
are `<op>/TP:<tp>/M:<m>[/...]`, e.g. `fused_sm90_fp8/TP:4/M:256/manual_time`.

Writes:
  - bench/README.md between `<!-- tables:begin -->` and `<!-- tables:end -->`: per TP, rows M,
    columns fused_sm90 (NVFP4 caches), fused_sm90_fp8 (FP8 caches), cublas_bf16,
    cublas_bf16+insert, cublaslt_fp8, cublaslt_fp8+insert, floor_read, the time ratios
    fused_fp8 / cublas_bf16 and fused_fp8 / (cublas_bf16+insert), then one column per other
    fused_* / gemm_* entry present (fused_sm90_bf16, fused_sm90_xbf16_fp8, ...); then the
    standalone insert (insert_<fmt>, µs and × its bound) and the host cost (host_*) when present;
  - README.md between `<!-- perf:begin -->` and `<!-- perf:end -->`: the TP4 summary;
  - bench/results/h200.png (matplotlib): time vs M, log-log, one panel per TP.
Missing entries print "—". A file cut short (a run that stopped mid-way) is read up to its
last complete entry; entries with an error are skipped. --check compares the marker blocks
with what the JSON generates and rewrites nothing (no plot, no matplotlib needed).

Exit status: 0 done (or --check: up to date), 1 --check found stale tables (or a marker is
missing), 2 the JSON file does not exist or holds no benchmark entries.

Python 3 standard library; matplotlib for the plot only.
"""
import argparse
import difflib
import json
import os
import re
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_JSON = os.path.join("bench", "results", "h200.json")
DEFAULT_BENCH_README = os.path.join("bench", "README.md")
DEFAULT_TOP_README = "README.md"
DEFAULT_PLOT = os.path.join("bench", "results", "h200.png")

TP_ORDER = [4, 2, 1, 8]
HEADS = {4: (16, 1, 1, 1), 2: (32, 2, 2, 1), 1: (64, 4, 4, 1), 8: (8, 1, 1, 1)}  # nq, nkv, niq, nik
PERF_MS = [1, 16, 64, 256, 1024, 4096, 16384]  # rows of the README summary
DASH = "—"
TIME_SCALE_US = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}
MARK_TABLES = ("<!-- tables:begin -->", "<!-- tables:end -->")
MARK_PERF = ("<!-- perf:begin -->", "<!-- perf:end -->")
NAME_RE = re.compile(r"^(?P<op>[^/]+)/TP:(?P<tp>\d+)/M:(?P<m>\d+)(?:/.*)?$")


def base_columns(backend):
    """(op, header) of the fixed columns of the per-TP tables."""
    f = f"fused_{backend}"
    return [
        (f, f"m3qkv {backend} NVFP4 caches"),
        (f + "_fp8", f"m3qkv {backend} FP8 caches"),
        ("cublas_bf16", "cuBLAS bf16"),
        ("cublas_bf16+insert", "cuBLAS bf16 + insert"),
        ("cublaslt_fp8", "cuBLASLt fp8"),
        ("cublaslt_fp8+insert", "cuBLASLt fp8 + insert"),
        ("floor_read", "read floor"),
    ]


# Extra fused / GEMM entries that are known get this order; any other fused_* / gemm_*
# entry follows alphabetically. fused_portable (a slow correctness reference at four
# TP4 points) is left out.
EXTRA_ORDER = ["fused_{b}_bf16", "fused_{b}_xbf16_fp8", "fused_{b}_invariant_fp8", "fused_{b}_fast_fp8",
               "gemm_{b}_fast"]
EXTRA_SKIP = {"fused_portable"}
INSERT_FORMATS = ["nvfp4", "fp8", "bf16"]
HOST_OPS = ["host_fused_qkv", "host_insert", "host_gemm", "host_quantize", "host_cublas_bf16",
            "host_cublaslt_fp8", "host_launch_empty"]


# ------------------------------------------------------------------ reading
def load_json(path):
    """The parsed file; for a file cut short, its context and every complete entry."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    dec = json.JSONDecoder()
    out = {"context": {}, "benchmarks": []}
    i = text.find('"context"')
    if i >= 0:
        j = text.find("{", i)
        try:
            out["context"], _ = dec.raw_decode(text, j)
        except (json.JSONDecodeError, ValueError):
            pass
    i = text.find('"benchmarks"')
    if i < 0:
        return out
    pos = text.find("[", i) + 1
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] != "{":
            break
        try:
            obj, pos = dec.raw_decode(text, pos)
        except json.JSONDecodeError:
            break  # the entry the run was writing when it stopped
        out["benchmarks"].append(obj)
    out["truncated"] = True
    return out


def time_us(b):
    if "us" in b and isinstance(b["us"], (int, float)):
        return float(b["us"])
    t = b.get("real_time")
    if not isinstance(t, (int, float)):
        return None
    return float(t) * TIME_SCALE_US.get(b.get("time_unit", "ns"), 1e-3)


def collect(doc):
    """{(op, tp, m): entry} with entry = {"us": median µs, "counters": dict of the first run}."""
    runs = {}
    medians = {}
    for b in doc.get("benchmarks", []):
        if not isinstance(b, dict) or b.get("error_occurred"):
            continue
        mt = NAME_RE.match(str(b.get("run_name") or b.get("name", "")))
        if not mt:
            continue
        key = (mt.group("op"), int(mt.group("tp")), int(mt.group("m")))
        t = time_us(b)
        if t is None:
            continue
        if b.get("run_type") == "aggregate":
            if b.get("aggregate_name") == "median":
                medians[key] = {"us": t, "counters": b}
            continue
        runs.setdefault(key, []).append((t, b))
    out = {}
    for key, rs in runs.items():
        out[key] = {"us": statistics.median(t for t, _ in rs), "counters": rs[0][1]}
    out.update(medians)
    return out


# ------------------------------------------------------------------ formatting
def fmt_us(v):
    if v is None:
        return DASH
    if v >= 1000:
        return f"{v:.0f}"
    if v >= 100:
        return f"{v:.1f}"
    return f"{v:.2f}"


def fmt_ratio(a, b):
    if a is None or b is None or b <= 0:
        return DASH
    return f"{a / b:.2f}"


def md_table(head, rows):
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def tps_present(data):
    present = {tp for (_, tp, _) in data}
    return [tp for tp in TP_ORDER if tp in present] + sorted(present - set(TP_ORDER))


def ms_of(data, tp, ops):
    return sorted({m for (op, t, m) in data if t == tp and op in ops and m > 0})


def extra_ops(data, backend, tp):
    base = {op for op, _ in base_columns(backend)}
    present = {op for (op, t, _) in data if t == tp}
    cand = {op for op in present if (op.startswith("fused_") or op.startswith("gemm_"))
            and op not in base and op not in EXTRA_SKIP}
    known = [o.format(b=backend) for o in EXTRA_ORDER]
    return [o for o in known if o in cand] + sorted(cand - set(known))


def get(data, op, tp, m):
    e = data.get((op, tp, m))
    return e["us"] if e else None


def main_tables(data, backend):
    out = []
    cols = base_columns(backend)
    f8 = f"fused_{backend}_fp8"
    for tp in tps_present(data):
        extras = extra_ops(data, backend, tp)
        ops = {op for op, _ in cols} | set(extras)
        ms = ms_of(data, tp, ops)
        if not ms:
            continue
        nq, nkv, niq, nik = HEADS.get(tp, (0, 0, 0, 0))
        n = (nq + 2 * nkv + niq + nik) * 128
        what = f"nq {nq}, nkv {nkv}, niq {niq}, nik {nik}, N = {n}" if tp in HEADS else "heads unknown"
        out += [f"### TP{tp} ({what}), K = 6144, µs per call", ""]
        head = ["M"] + [h for _, h in cols] + ["fused fp8 / cuBLAS bf16", "fused fp8 / (cuBLAS bf16 + insert)"]
        head += [f"`{op}`" for op in extras]
        rows = []
        floor = get(data, "floor_read", tp, 0)
        for m in ms:
            r = [str(m)]
            for op, _ in cols:
                r.append(fmt_us(floor if op == "floor_read" else get(data, op, tp, m)))
            t8 = get(data, f8, tp, m)
            r.append(fmt_ratio(t8, get(data, "cublas_bf16", tp, m)))
            r.append(fmt_ratio(t8, get(data, "cublas_bf16+insert", tp, m)))
            r += [fmt_us(get(data, op, tp, m)) for op in extras]
            rows.append(r)
        out += md_table(head, rows) + [""]
    return out


def insert_tables(data):
    out = []
    ops = {f"insert_{f}" for f in INSERT_FORMATS}
    tps = [tp for tp in tps_present(data) if ms_of(data, tp, ops)]
    if not tps:
        return out
    out += ["### Standalone insert (`m3qkv_qknorm_rope_kv_insert`), µs per call (× its bound)", ""]
    for tp in tps:
        head = ["M"] + [f"TP{tp} {f.upper()}" for f in INSERT_FORMATS]
        rows = []
        for m in ms_of(data, tp, ops):
            r = [str(m)]
            for f in INSERT_FORMATS:
                e = data.get((f"insert_{f}", tp, m))
                if not e:
                    r.append(DASH)
                    continue
                xb = e["counters"].get("x_bound")
                r.append(fmt_us(e["us"]) + (f" ({xb:.2f})" if isinstance(xb, (int, float)) else ""))
            rows.append(r)
        out += md_table(head, rows) + [""]
    return out


def host_table(data):
    keys = sorted((k for k in data if k[0] in HOST_OPS),
                  key=lambda k: (HOST_OPS.index(k[0]), TP_ORDER.index(k[1]) if k[1] in TP_ORDER else 9, k[2]))
    if not keys:
        return []
    out = ["### Host cost per call (CPU µs, GPU idle)", ""]
    rows = []
    for k in keys:
        c = data[k]["counters"]
        cell = lambda name: fmt_us(c[name]) if isinstance(c.get(name), (int, float)) else DASH
        rows.append([f"`{k[0]}/TP:{k[1]}/M:{k[2]}`", cell("host_us"), cell("host_p90_us"), cell("kernel_us")])
    return out + md_table(["entry", "median", "p90", "kernel"], rows) + [""]


def context_line(doc):
    c = doc.get("context", {}) if isinstance(doc.get("context"), dict) else {}
    dev = c.get("device", "unknown device")
    line = f"Device: {dev}. Times are µs per call (cold L2, CUDA-graph replay); ratios are time ratios (< 1: m3qkv faster)."
    if doc.get("truncated"):
        line += " The JSON was cut short: entries after the last complete one are missing."
    return line


def tables_block(doc, data, backend):
    lines = ["(generated by tools/bench_table.py from bench/results/h200.json)", "", context_line(doc), ""]
    lines += main_tables(data, backend) + insert_tables(data) + host_table(data)
    while lines and lines[-1] == "":
        lines.pop()
    return "\n".join(lines)


def perf_block(doc, data, backend, tp=4):
    f8 = f"fused_{backend}_fp8"
    floor = get(data, "floor_read", tp, 0)
    present = set(ms_of(data, tp, {f8, "cublas_bf16", "cublas_bf16+insert"}))
    ms = [m for m in PERF_MS if m in present]
    c = doc.get("context", {}) if isinstance(doc.get("context"), dict) else {}
    dev = c.get("device", "the benchmark's GPU")
    lines = [f"MiniMax-M3 TP{tp} (K = 6144, N = 2560) on {dev}, µs per call (cold L2, CUDA-graph replay; "
             "generated by tools/bench_table.py, all TPs and entries in bench/README.md):", ""]
    if not ms:
        lines.append("(no TP4 entries in bench/results/h200.json)")
        return "\n".join(lines)
    head = ["M", "m3qkv fused (FP8 caches)", "cuBLAS bf16 GEMM alone", "cuBLAS bf16 + m3qkv insert",
            "weights' read floor", "fused / cuBLAS", "fused / pair"]
    rows = []
    for m in ms:
        t8, tb, tp_ = get(data, f8, tp, m), get(data, "cublas_bf16", tp, m), get(data, "cublas_bf16+insert", tp, m)
        rows.append([str(m), fmt_us(t8), fmt_us(tb), fmt_us(tp_), fmt_us(floor), fmt_ratio(t8, tb), fmt_ratio(t8, tp_)])
    return "\n".join(lines + md_table(head, rows))


# ------------------------------------------------------------------ markers
def split_markers(text, marks, path):
    a, b = marks
    i, j = text.find(a), text.find(b)
    if i < 0 or j < 0 or j < i:
        raise ValueError(f"{path}: markers {a} ... {b} not found")
    return text[: i + len(a)], text[i + len(a): j], text[j:]


def with_block(text, marks, block, path):
    pre, _, post = split_markers(text, marks, path)
    return pre + "\n" + block + "\n" + post


# ------------------------------------------------------------------ plot
def plot(data, backend, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("bench_table.py: matplotlib is not installed: no plot (pip install matplotlib)", file=sys.stderr)
        return False
    tps = tps_present(data)[:4] or TP_ORDER
    fig, axes = plt.subplots(2, 2, figsize=(12, 9), squeeze=False)
    # One color per series in every panel: the fused / GEMM entries in a fixed order,
    # each baseline pair in one color (dashed alone, dotted with the insert).
    f = f"fused_{backend}"
    known = [f, f + "_fp8"] + [o.format(b=backend) for o in EXTRA_ORDER]
    present = {op for (op, _, _) in data if (op.startswith(f) or op.startswith(f"gemm_{backend}"))}
    fused = [o for o in known if o in present] + sorted(present - set(known))
    palette = ["tab:blue", "tab:green", "tab:orange", "tab:red", "tab:purple", "tab:brown", "tab:pink",
               "tab:olive", "tab:cyan"]
    series = [(op, dict(lw=2.2, marker="o", ms=3.5, color=palette[i % len(palette)])) for i, op in enumerate(fused)]
    series += [("cublas_bf16", dict(lw=1.4, ls="--", marker="s", ms=3, color="black")),
               ("cublas_bf16+insert", dict(lw=1.2, ls=":", marker="s", ms=3, color="black")),
               ("cublaslt_fp8", dict(lw=1.4, ls="--", marker="^", ms=3, color="dimgrey")),
               ("cublaslt_fp8+insert", dict(lw=1.2, ls=":", marker="^", ms=3, color="dimgrey"))]
    for ax, tp in zip(axes.flat, tps):
        drawn = False
        for op, style in series:
            pts = sorted((m, e["us"]) for (o, t, m), e in data.items() if o == op and t == tp and m > 0)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], label=op, **style)
                drawn = True
        floor = get(data, "floor_read", tp, 0)
        if floor:
            ax.axhline(floor, color="grey", lw=1, ls="-.", label="floor_read (weights read once)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"TP{tp}, K = 6144")
        ax.set_xlabel("M (tokens)")
        ax.set_ylabel("µs per call")
        ax.grid(True, which="both", alpha=0.3)
        if drawn or floor:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(tps):]:
        ax.set_visible(False)
    fig.suptitle("m3qkv on an H200: time per call vs M (cold L2, CUDA-graph replay)")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# ------------------------------------------------------------------ main
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=os.path.join(ROOT, DEFAULT_JSON), help="Google Benchmark JSON")
    ap.add_argument("--bench-readme", default=os.path.join(ROOT, DEFAULT_BENCH_README))
    ap.add_argument("--readme", default=os.path.join(ROOT, DEFAULT_TOP_README), help="the README with the perf block")
    ap.add_argument("--plot", default=os.path.join(ROOT, DEFAULT_PLOT), help="PNG to write")
    ap.add_argument("--backend", default="sm90", help="backend tag of the fused entries (fused_<backend>)")
    ap.add_argument("--check", action="store_true", help="compare the marker blocks, write nothing")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)

    if not os.path.exists(args.json):
        print(f"bench_table.py: {args.json} does not exist: run `bash tools/bench_sweep.sh` on an H200 "
              "to produce it", file=sys.stderr)
        return 2
    doc = load_json(args.json)
    if not isinstance(doc, dict):
        print(f"bench_table.py: {args.json} is not Google Benchmark JSON", file=sys.stderr)
        return 2
    data = collect(doc)
    if not data:
        print(f"bench_table.py: {args.json} holds no benchmark entries named <op>/TP:<tp>/M:<m>", file=sys.stderr)
        return 2
    blocks = [(args.bench_readme, MARK_TABLES, tables_block(doc, data, args.backend)),
              (args.readme, MARK_PERF, perf_block(doc, data, args.backend))]
    status = 0
    for path, marks, block in blocks:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
            new = with_block(text, marks, block, path)
        except (OSError, ValueError) as e:
            print(f"bench_table.py: {e}", file=sys.stderr)
            status = 1
            continue
        if args.check:
            if new != text:
                old_block = split_markers(text, marks, path)[1].strip("\n").splitlines()
                diff = difflib.unified_diff(old_block, block.splitlines(), f"{path} (now)", "generated", lineterm="")
                print(f"bench_table.py: {path} is stale; run python3 tools/bench_table.py", file=sys.stderr)
                print("\n".join(list(diff)[:40]), file=sys.stderr)
                status = 1
            continue
        if new != text:
            with open(path, "w", encoding="utf-8") as f:
                f.write(new)
        print(f"bench_table.py: {path}: tables written")
    if not args.check and not args.no_plot and plot(data, args.backend, args.plot):
        print(f"bench_table.py: {args.plot}: plot written")
    return status


if __name__ == "__main__":
    sys.exit(main())
