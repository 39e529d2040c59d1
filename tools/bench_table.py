#!/usr/bin/env python3
"""Markdown tables from the m3qkv benchmark's JSON (issue 4's side-by-side view).

Usage:
  build/bench/m3qkv_bench --benchmark_out=run.json --benchmark_out_format=json
  tools/bench_table.py run.json [more.json ...] [--mem-bw 4.27] [--peak-bf16 T]

One table per head configuration (TP4, TP2, TP1, TP8): rows M; columns the
fused kernel (µs, TFLOP/s, GB/s), m3qkv's unfused pair, cuBLAS bf16 and
cuBLASLt fp8 each alone and each followed by m3qkv's insert, the memory floor
(bytes / measured copy bandwidth) and the compute floor (2·M·N·K / the
peak_bf16 TFLOP/s of the same run), then issue 4's three targets, each marked
✓ (met) or ✗ (not met):
  fused vs unfused pair   t_unfused / t_fused  ≥ 1.3×
  fused vs cuBLAS bf16    t_fused / t_cublas   < 1 (the fused op is faster)
  fused % of bf16 peak    TFLOP/s / peak_bf16  ≥ 75 % (target at M ≥ 4096 only)
Entries that are missing or failed print "—". A JSON file cut short (a run
that hit its time limit) is read up to its last complete entry. Old names
without TP ("fused_sm90/M:512/manual_time", runs v1-v3) count as TP4. With
several files, later files override earlier entries of the same name.
The slow TP4-only entries (forced portable, SM90 mainloop variants) get a
second table per TP when present.

Python 3 standard library only.
"""
import argparse
import json
import statistics
import sys

K = 6144
# (nq, nkv, niq, nik) per TP, as bench/bench_fused.cpp and tests/gpu/harness.h.
HEADS = {4: (16, 1, 1, 1), 2: (32, 2, 2, 1), 1: (64, 4, 4, 1), 8: (8, 1, 1, 1)}
TP_ORDER = [4, 2, 1, 8]
BASELINES = [
    ("unfused_gemm+insert", "unfused pair µs"),
    ("cublas_bf16", "cuBLAS bf16 µs"),
    ("cublas_bf16+insert", "cuBLAS bf16 + insert µs"),
    ("cublaslt_fp8", "cuBLASLt fp8 µs"),
    ("cublaslt_fp8+insert", "cuBLASLt fp8 + insert µs"),
]
TARGET_UNFUSED = 1.3     # fused at least this much faster than the unfused pair
TARGET_PEAK = 0.75       # fraction of the bf16 peak ...
TARGET_PEAK_MIN_M = 4096  # ... at M >= this
DASH = "—"
TIME_SCALE_US = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}


def n_of(tp):
    nq, nkv, niq, nik = HEADS[tp]
    return (nq + 2 * nkv + niq + nik) * 128


def f8_128x4_bytes(rows, cols):
    return (rows + 127) // 128 * 128 * ((cols + 3) // 4 * 4)


def fused_bytes(tp, m):
    """Bytes one fused call must move at least once (bench/RESULTS.md "Floors")."""
    nq, nkv, niq, nik = HEADS[tp]
    n = n_of(tp)
    b = n * K + f8_128x4_bytes(n, K // 32) + m * K + f8_128x4_bytes(m, K // 32)
    b += m * (8 + 8 + 8 + 128) + 4 * 256
    b += m * nq * 128 * 2 + m * niq * 128 + m * (2 * nkv + nik) * 72
    return b


def flops(tp, m):
    return 2.0 * m * n_of(tp) * K


# ------------------------------------------------------------------ reading
def load_json(path):
    """The parsed file, or what can be recovered from a truncated one."""
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
        try:
            out["context"], _ = dec.raw_decode(text, text.index("{", i))
        except (ValueError, json.JSONDecodeError):
            pass
    i = text.find('"benchmarks"')
    if i >= 0 and text.find("[", i) >= 0:
        j = text.index("[", i) + 1
        while True:
            while j < len(text) and text[j] in " \t\r\n,":
                j += 1
            if j >= len(text) or text[j] != "{":
                break
            try:
                obj, j = dec.raw_decode(text, j)
            except json.JSONDecodeError:
                break
            out["benchmarks"].append(obj)
    print(f"note: {path} is not complete JSON; read {len(out['benchmarks'])} entries", file=sys.stderr)
    return out


def parse_name(name):
    """(op, tp, m) from 'op/TP:4/M:512/…'; tp None for the peaks; old names -> TP4."""
    parts = name.split("/")
    op, tp, m = parts[0], None, None
    for p in parts[1:]:
        if p.startswith("TP:"):
            tp = int(p[3:])
        elif p.startswith("M:"):
            m = int(p[2:])
    if m is not None and tp is None:
        tp = 4  # runs before the TP sweep were TP4 only
    return op, tp, m


def entry_us(b):
    if "us" in b:
        return float(b["us"])
    if "real_time" in b:
        return float(b["real_time"]) * TIME_SCALE_US.get(b.get("time_unit", "ns"), 1e-3)
    return None


class Results:
    """Per (op, tp, m): time per call in µs and counters of the chosen entry."""

    def __init__(self):
        self.iters = {}   # key -> list of entries (repetitions)
        self.median = {}  # key -> aggregate 'median' entry, when written
        self.context = {}

    def add_file(self, data):
        self.context.update(data.get("context", {}))
        fresh_iters, fresh_median = {}, {}
        for b in data.get("benchmarks", []):
            name = b.get("run_name") or b.get("name", "")
            op, tp, m = parse_name(name)
            key = (op, tp, m)
            if b.get("error_occurred") or b.get("skipped"):  # "skipped": Google Benchmark >= 1.8
                fresh_iters.setdefault(key, [])
                continue
            if b.get("run_type") == "aggregate":
                if b.get("aggregate_name") == "median":
                    fresh_median[key] = b
                continue
            fresh_iters.setdefault(key, []).append(b)
        # A later file replaces the entries it has (a re-run of a subset).
        for key, v in fresh_iters.items():
            self.iters[key] = v
            self.median.pop(key, None)
        self.median.update(fresh_median)

    def get(self, op, tp, m):
        """(µs, entry) or (None, None)."""
        key = (op, tp, m)
        if key in self.median:
            b = self.median[key]
            return entry_us(b), b
        runs = [b for b in self.iters.get(key, []) if entry_us(b) is not None]
        if not runs:
            return None, None
        if len(runs) == 1:
            return entry_us(runs[0]), runs[0]
        us = statistics.median(entry_us(b) for b in runs)
        return us, min(runs, key=lambda b: abs(entry_us(b) - us))

    def ops(self):
        return {op for (op, _, _) in self.iters} | {op for (op, _, _) in self.median}

    def ms_of(self, tp):
        keys = list(self.iters) + list(self.median)
        return sorted({m for (_, t, m) in keys if t == tp and m is not None})

    def peak(self, op):
        us, b = self.get(op, None, None)
        if us is None or b is None:
            return None
        return float(b["TFLOP/s"]) if "TFLOP/s" in b else None


# ------------------------------------------------------------------ format
def fmt_us(v):
    if v is None:
        return DASH
    return f"{v:.2f}" if v < 100 else f"{v:.1f}"


def fmt_tf(v):
    return f"{v:.1f}" if v < 10 else f"{v:.0f}"


def mark(ok):
    return "✓" if ok else "✗"


def fused_op_for(res, tp):
    """The automatic backend's fused entry: any fused_<backend> but the forced portable one, if present."""
    ms = res.ms_of(tp)
    have = sorted(op for op in res.ops()
                  if op.startswith("fused_") and any(res.get(op, tp, m)[0] is not None for m in ms))
    auto = [op for op in have if op != "fused_portable"]
    if auto:
        return auto[0]
    return "fused_portable" if "fused_portable" in have else None


def table(res, tp, mem_bw, peak_bf16, out):
    ms = res.ms_of(tp)
    if not ms:
        return
    fused = fused_op_for(res, tp)
    fused_label = fused[len("fused_"):] if fused else "auto"
    nq, nkv, niq, nik = HEADS[tp]
    out.append(f"### TP{tp} (nq {nq}, nkv {nkv}, niq {niq}, nik {nik} → N = {n_of(tp)}), K = {K}")
    out.append("")
    head = ["M", f"fused {fused_label} µs (TFLOP/s, GB/s)"] + [label for _, label in BASELINES]
    head += ["memory floor µs", "compute floor µs",
             f"fused vs unfused (≥ {TARGET_UNFUSED}×)", "fused / cuBLAS bf16 (< 1)",
             f"fused % of bf16 peak (≥ {TARGET_PEAK * 100:.0f} % at M ≥ {TARGET_PEAK_MIN_M})"]
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "---|" * len(head))
    tally = {"unfused": [0, 0], "cublas": [0, 0], "peak": [0, 0]}
    for m in ms:
        tf_us, fb = res.get(fused, tp, m) if fused else (None, None)
        if tf_us is not None:
            tfs = float(fb["TFLOP/s"]) if "TFLOP/s" in fb else flops(tp, m) / (tf_us * 1e-6) * 1e-12
            gbs = (f", {float(fb['GB/s']):.0f} GB/s") if "GB/s" in fb else ""
            cell = f"{fmt_us(tf_us)} ({fmt_tf(tfs)} TF{gbs})"
        else:
            tfs, cell = None, DASH
        row = [str(m), cell]
        base = {}
        for op, _ in BASELINES:
            base[op] = res.get(op, tp, m)[0]
            row.append(fmt_us(base[op]))
        nbytes = float(fb["bytes_MB"]) * 1e6 if (fb and "bytes_MB" in fb) else fused_bytes(tp, m)
        row.append(f"{nbytes / (mem_bw * 1e12) * 1e6:.2f}")
        row.append(f"{flops(tp, m) / (peak_bf16 * 1e12) * 1e6:.2f}" if peak_bf16 else DASH)
        # Targets.
        if tf_us is not None and base["unfused_gemm+insert"] is not None:
            r = base["unfused_gemm+insert"] / tf_us
            ok = r >= TARGET_UNFUSED
            tally["unfused"][0] += ok
            tally["unfused"][1] += 1
            row.append(f"{r:.2f}× {mark(ok)}")
        else:
            row.append(DASH)
        if tf_us is not None and base["cublas_bf16"] is not None:
            r = tf_us / base["cublas_bf16"]
            ok = r < 1.0
            tally["cublas"][0] += ok
            tally["cublas"][1] += 1
            row.append(f"{r:.2f} {mark(ok)}")
        else:
            row.append(DASH)
        if tfs is not None and peak_bf16:
            frac = tfs / peak_bf16
            if m >= TARGET_PEAK_MIN_M:
                ok = frac >= TARGET_PEAK
                tally["peak"][0] += ok
                tally["peak"][1] += 1
                row.append(f"{frac * 100:.0f} % {mark(ok)}")
            else:
                row.append(f"{frac * 100:.0f} %")
        else:
            row.append(DASH)
        out.append("| " + " | ".join(row) + " |")
    out.append("")

    def said(key):
        met, n = tally[key]
        return f"{met}/{n}" if n else "not measured"

    out.append(f"Targets met at TP{tp}: ≥ {TARGET_UNFUSED}× over the unfused pair {said('unfused')}; "
               f"faster than cuBLAS bf16 {said('cublas')}; "
               f"≥ {TARGET_PEAK * 100:.0f} % of the bf16 peak at M ≥ {TARGET_PEAK_MIN_M} {said('peak')}.")
    out.append("")

    # The slow extra entries (forced portable, SM90 variants), where present.
    known = {fused} | {op for op, _ in BASELINES}
    extra = sorted(op for op in res.ops()
                   if op not in known and not op.startswith("peak_")
                   and any(res.get(op, tp, m)[0] is not None for m in ms))
    if extra:
        rows = [m for m in ms if any(res.get(op, tp, m)[0] is not None for op in extra)]
        out.append(f"Other fused entries at TP{tp}, µs per call (in brackets: × the {fused_label} time):")
        out.append("")
        out.append("| M | " + " | ".join(extra) + " |")
        out.append("|" + "---|" * (len(extra) + 1))
        for m in rows:
            ref = res.get(fused, tp, m)[0] if fused else None
            cells = []
            for op in extra:
                v = res.get(op, tp, m)[0]
                if v is None:
                    cells.append(DASH)
                elif ref:
                    cells.append(f"{fmt_us(v)} ({v / ref:.2f}×)")
                else:
                    cells.append(fmt_us(v))
            out.append(f"| {m} | " + " | ".join(cells) + " |")
        out.append("")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", nargs="+", help="Google Benchmark JSON output(s) of m3qkv_bench")
    ap.add_argument("--mem-bw", type=float, default=4.27,
                    help="memory bandwidth for the memory floor, TB/s (default: 4.27, measured H200 copy)")
    ap.add_argument("--peak-bf16", type=float, default=None,
                    help="bf16 peak TFLOP/s when the JSON has no peak_bf16 entry (default: none → '—')")
    ap.add_argument("--tp", type=int, action="append", choices=sorted(HEADS),
                    help="only these TPs (repeatable; default: all present)")
    args = ap.parse_args(argv)

    res = Results()
    for path in args.json:
        try:
            res.add_file(load_json(path))
        except OSError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    peak_bf16 = res.peak("peak_bf16")
    peak_src = "peak_bf16 of this run"
    if peak_bf16 is None and args.peak_bf16:
        peak_bf16, peak_src = args.peak_bf16, "--peak-bf16"
    peak_fp8 = res.peak("peak_fp8")

    out = []
    ctx = res.context
    out.append(f"Device: {ctx.get('device', 'unknown')}; date {ctx.get('date', '?')}; "
               f"executable {ctx.get('executable', '?')}.")
    out.append(f"bf16 peak: {fmt_tf(peak_bf16) + ' TFLOP/s (' + peak_src + ')' if peak_bf16 else DASH}; "
               f"fp8 peak: {fmt_tf(peak_fp8) + ' TFLOP/s' if peak_fp8 else DASH}; "
               f"memory floor at {args.mem_bw} TB/s. Times are µs per call (cold L2, CUDA-graph replay).")
    out.append("")
    tps = args.tp or TP_ORDER
    shown = 0
    for tp in tps:
        before = len(out)
        table(res, tp, args.mem_bw, peak_bf16, out)
        shown += len(out) > before
    if not shown:
        out.append("No (TP, M) entries found.")
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
