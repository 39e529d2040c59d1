#!/usr/bin/env python3
"""Top SASS instructions by warp-stall samples from `ncu --page source --csv
--print-source sass` output (one kernel), with the stall reasons of each.

  python3 tools/device/ncu_top.py source.csv [N]

Prints the N (default 40) instructions with the most samples, their share of
all samples, and the instruction text; then the totals per stall reason."""
import csv
import sys


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f)]
    # The header row is the first one naming a "Source" column.
    hi = next((i for i, r in enumerate(rows) if any(c.strip() == "Source" for c in r)), None)
    if hi is None:
        print("no 'Source' column; first rows:")
        for r in rows[:5]:
            print(r[:20])
        return
    head = [c.strip() for c in rows[hi]]
    body = [r for r in rows[hi + 1:] if len(r) == len(head)]
    src = head.index("Source")
    samp = next((i for i, c in enumerate(head) if c.startswith("Warp Stall Sampling (All")), None)
    if samp is None:
        print("no 'Warp Stall Sampling (All ...)' column; columns:", head)
        return
    reasons = [i for i, c in enumerate(head) if c.startswith("stall_") or c.startswith("Stall ")]

    def num(x):
        try:
            return float(x.replace(",", ""))
        except ValueError:
            return 0.0

    total = sum(num(r[samp]) for r in body) or 1.0
    print(f"{len(body)} instructions, {total:.0f} samples")
    for r in sorted(body, key=lambda r: -num(r[samp]))[:top]:
        why = sorted(((num(r[i]), head[i]) for i in reasons), reverse=True)[:3]
        why_s = ", ".join(f"{n}:{v:.0f}" for v, n in why if v > 0)
        print(f"{num(r[samp]):7.0f} {100 * num(r[samp]) / total:5.1f}%  {r[src].strip()[:70]:70}  {why_s}")
    if reasons:
        print("per reason:")
        for v, n in sorted(((sum(num(r[i]) for r in body), head[i]) for i in reasons), reverse=True)[:15]:
            print(f"  {n:40} {v:9.0f} {100 * v / total:5.1f}%")


if __name__ == "__main__":
    main()
