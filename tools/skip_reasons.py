#!/usr/bin/env python3
"""Why tests were skipped, each reason once.

    python3 tools/skip_reasons.py <junit.xml> [--max N]

Reads a JUnit XML file, from ctest --output-junit (CMake >= 3.21) or from
pytest --junitxml, and prints one line per distinct skip message, most
frequent first:
    <count> skipped: <message>  (e.g. gpu.Fused.TP4/M1)
For ctest the message is the text GoogleTest prints after
"<file>:<line>: Skipped" (GTEST_SKIP() << ...); ctest's DISABLED_ tests are
not skips and not listed. For pytest it is the skip reason.
At most --max reasons (default 10); the rest are counted in one line.
"""
import argparse
import collections
import re
import sys
import xml.etree.ElementTree as ET

_SKIP_AT = re.compile(r"^.*:\d+: Skipped$")


def skip_message(out: str) -> str:
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if _SKIP_AT.match(line.strip()):
            msg = []
            for m in lines[i + 1:]:
                if m.startswith("[  SKIPPED ]") or m.startswith("[       OK ]") or m.startswith("[  FAILED  ]"):
                    break
                if m.strip():
                    msg.append(m.strip())
            return " ".join(msg) or "(GTEST_SKIP without a message)"
    return "(no skip message in the test output)"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("junit")
    ap.add_argument("--max", type=int, default=10)
    a = ap.parse_args(argv)
    try:
        root = ET.parse(a.junit).getroot()
    except (OSError, ET.ParseError) as e:
        print(f"skip_reasons: cannot read {a.junit}: {e}", file=sys.stderr)
        return 2
    reasons = collections.Counter()
    first = {}
    for tc in root.iter("testcase"):
        sk = tc.find("skipped")
        if sk is None or sk.get("message") == "Disabled":
            continue
        if sk.get("message") == "SKIP_REGULAR_EXPRESSION_MATCHED":  # ctest running a GoogleTest case
            why = skip_message(tc.findtext("system-out") or "")
        else:  # pytest
            why = sk.get("message") or "(no skip reason)"
        name = tc.get("name")
        if tc.get("classname") and tc.get("classname") != name:
            name = f"{tc.get('classname')}.{name}"
        reasons[why] += 1
        first.setdefault(why, name)
    ranked = reasons.most_common()
    for why, n in ranked[:a.max]:
        print(f"{n} skipped: {why}  (e.g. {first[why]})")
    if len(ranked) > a.max:
        rest = sum(n for _, n in ranked[a.max:])
        print(f"{rest} skipped for {len(ranked) - a.max} other reasons (see {a.junit})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
