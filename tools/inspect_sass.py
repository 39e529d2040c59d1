#!/usr/bin/env python3
"""Inspect the device code in a cubin / .o / .so / .a / executable.

For every function of every SASS arch embedded in the file it lists registers,
static shared memory, stack frame, local memory, local loads/stores (LDL/STL in
the SASS) and counts of chosen SASS opcodes; rules given on the command line
make it exit 1 with a message naming the kernel, the arch and the number.

Tools: `cuobjdump` (resource usage + SASS) from the PyPI wheel
`nvidia-cuda-cuobjdump` (site-packages/nvidia/cu*/bin), falling back to PATH
and /usr/local/cuda/bin; override with $CUOBJDUMP. Names are demangled with
cu++filt or c++filt (the wheel `nvidia-cuda-cuxxfilt` ships only a library).

Rules (repeat --rule; the kind may carry "@arch[,arch]" to restrict it):
  no-local:<glob>                 no stack frame, no LOCAL bytes, no LDL/STL
  min:<glob>:<opcode-regex>:<n>   each matching kernel has >= n such instructions
  max:<glob>:<opcode-regex>:<n>   each matching kernel has <= n such instructions
  max-regs:<glob>:<n>             each matching kernel uses <= n registers
  present:<glob>                  at least one kernel matches, in every arch checked
A glob is matched (fnmatch, case-sensitive) against the demangled name, the
demangled name without its parameter list, and the mangled name. A rule whose
glob matches no kernel in an arch it checks FAILS, so a renamed kernel cannot
pass silently. An opcode regex is full-matched against the base opcode (the
mnemonic before the first '.', e.g. HMMA) or the whole dotted mnemonic
(e.g. HMMA.16816.F32.BF16); use '|' for alternatives, e.g. 'LDL|STL'.
MMA mnemonics seen with CUDA 13: mma.sync bf16 -> HMMA; wgmma bf16 -> HGMMA,
wgmma e4m3 -> QGMMA (so '.GMMA' counts both); tcgen05.mma kind::mxf8f6f4 ->
UTCQMMA (UTCQMMA.2CTA for cta_group::2; 'UTC.*MMA' counts every kind).

Archs checked: those given with --arch (each must exist in the file), else
every SASS arch in the file; a rule's own "@arch" list narrows that further.

Notes on the numbers (as cuobjdump reports them):
  SHARED is static shared memory of the function; on sm_90+ the driver's
    1 KiB reserved block is included (a kernel with 1 KiB of __shared__ shows
    2048 there). Dynamic shared memory is a launch parameter and not visible.
  STACK is the per-thread stack frame; a runtime-indexed local array or a
    register spill shows up here (ptxas spill byte counts are not stored in
    the binary: pass the build log with --ptxas-log to add them; ptxas
    prints them when the build is configured with -DM3QKV_PTXAS_VERBOSE=ON).
  LDL/STL are static instruction counts in the SASS, not executed counts.

Exit status: 0 all rules pass, 1 a rule failed, 2 usage or tool error.
"""

import argparse
import fnmatch
import glob
import json
import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig

LOCAL_OPS = ("LDL", "STL")


class ToolError(Exception):
    pass


# ----------------------------------------------------------------------------
# Tool discovery
# ----------------------------------------------------------------------------
def _site_dirs():
    dirs = []
    try:
        dirs.extend(site.getsitepackages())
    except AttributeError:  # virtualenvs of old Pythons
        pass
    try:
        dirs.append(site.getusersitepackages())
    except AttributeError:
        pass
    for key in ("purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            dirs.append(p)
    dirs.extend(p for p in sys.path if p.endswith("-packages"))
    seen, out = set(), []
    for d in dirs:
        if d and d not in seen and os.path.isdir(d):
            seen.add(d)
            out.append(d)
    return out


def find_tool(name, env_var=None):
    """Path of an NVIDIA tool: $ENV, the PyPI wheels, PATH, /usr/local/cuda/bin."""
    if env_var and os.environ.get(env_var):
        p = os.environ[env_var]
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
        raise ToolError(f"${env_var}={p} is not an executable file")
    for d in _site_dirs():
        # CUDA 13 wheels: nvidia/cu13/bin/<tool>; CUDA 12 wheels:
        # nvidia/cuda_<tool>/bin/<tool>.
        for pattern in (f"nvidia/cu*/bin/{name}", f"nvidia/*/bin/{name}"):
            for p in sorted(glob.glob(os.path.join(d, pattern)), reverse=True):
                if os.access(p, os.X_OK):
                    return p
    p = shutil.which(name)
    if p:
        return p
    for cuda in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if cuda:
            p = os.path.join(cuda, "bin", name)
            if os.access(p, os.X_OK):
                return p
    return None


def run_tool(argv):
    try:
        r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           errors="replace")
    except OSError as e:
        raise ToolError(f"cannot run {argv[0]}: {e}")
    return r.returncode, r.stdout, r.stderr


# ----------------------------------------------------------------------------
# Parsing cuobjdump output
# ----------------------------------------------------------------------------
_ARCH_HDR = re.compile(r"^\s*arch\s*=\s*(sm_\w+)\s*$")
_CODE_FOR = re.compile(r"^\s*code for (sm_\w+)\s*$")
_RES_FUNC = re.compile(r"^\s*Function\s+(\S+?):\s*$")
_RES_VALS = re.compile(r"([A-Z_]+(?:\[\d+\])?):(\d+)")
_SASS_FUNC = re.compile(r"^\s*Function\s*:\s*(\S+)\s*$")
# "/*0290*/   @!P0 STL.128 [R1], R16 ;" -> STL.128
_SASS_INSN = re.compile(r"^\s*/\*[0-9a-fA-F]+\*/\s+(?:@!?U?P(?:T|\d+)\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)*)")


def _new_func(arch, name):
    return {"arch": arch, "mangled": name, "name": name, "regs": None, "shared": None,
            "stack": None, "local": None, "const0": None, "opcodes": {},
            "spill_stores": None, "spill_loads": None}


def parse_res_usage(text, funcs):
    """cuobjdump -res-usage: 'arch = sm_90a' headers, then per function
    ' Function NAME:' and a line 'REG:.. STACK:.. SHARED:.. LOCAL:..'."""
    arch, cur = None, None
    for line in text.splitlines():
        m = _ARCH_HDR.match(line)
        if m:
            arch, cur = m.group(1), None
            continue
        m = _RES_FUNC.match(line)
        if m:
            cur = m.group(1)
            continue
        if cur is not None and "REG:" in line:
            vals = dict(_RES_VALS.findall(line))
            f = funcs.setdefault((arch, cur), _new_func(arch, cur))
            # A bare cubin has no 'arch =' header: arch stays None here and is
            # taken from its SASS by inspect_files().
            # The same kernel can come from several objects (an archive, or a
            # template instantiated in two translation units): keep the worst.
            for key, field in (("REG", "regs"), ("STACK", "stack"), ("SHARED", "shared"),
                               ("LOCAL", "local"), ("CONSTANT[0]", "const0")):
                if key in vals:
                    v = int(vals[key])
                    f[field] = v if f[field] is None else max(f[field], v)
            cur = None


def parse_sass(text, funcs, default_arch=None):
    """cuobjdump -sass: 'arch = sm_100f' headers ('code for sm_100' below them
    loses the family suffix, so the header wins), 'Function : NAME', then one
    instruction per '/*addr*/' line."""
    arch, hdr_arch, cur, counts = default_arch, None, None, None

    def flush():
        if cur is None:
            return
        key = (arch or "sm_unknown", cur)
        f = funcs.setdefault(key, _new_func(key[0], cur))
        for op, n in counts.items():
            f["opcodes"][op] = max(f["opcodes"].get(op, 0), n)

    for line in text.splitlines():
        m = _ARCH_HDR.match(line)
        if m:
            flush()
            cur = None
            hdr_arch = arch = m.group(1)
            continue
        m = _CODE_FOR.match(line)
        if m:
            flush()
            cur = None
            if hdr_arch is None:  # a bare cubin has no fatbin header
                arch = m.group(1)
            continue
        m = _SASS_FUNC.match(line)
        if m:
            flush()
            cur, counts = m.group(1), {}
            continue
        if cur is not None:
            m = _SASS_INSN.match(line)
            if m:
                op = m.group(1)
                counts[op] = counts.get(op, 0) + 1
        if line.startswith("Fatbin "):
            flush()
            cur = None
            hdr_arch = None
    flush()


_PTXAS_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\w+)'")
_PTXAS_PROPS = re.compile(r"Function properties for (\S+)")
_PTXAS_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def parse_ptxas_log(text, funcs):
    """Adds spill byte counts from a build log made with -Xptxas=-v."""
    arch, name, props_for = None, None, None
    for line in text.splitlines():
        m = _PTXAS_ENTRY.search(line)
        if m:
            name, arch = m.group(1), m.group(2)
            continue
        m = _PTXAS_PROPS.search(line)
        if m:
            props_for = m.group(1)
            continue
        m = _PTXAS_SPILL.search(line)
        if m and props_for is not None and props_for == name and arch:
            f = funcs.get((arch, name))
            if f is not None:
                st, ld = int(m.group(2)), int(m.group(3))
                f["spill_stores"] = max(f["spill_stores"] or 0, st)
                f["spill_loads"] = max(f["spill_loads"] or 0, ld)
            props_for = None


def demangle(names):
    tool = shutil.which("cu++filt") or shutil.which("c++filt")
    names = list(names)
    if not tool or not names:
        return {n: n for n in names}
    try:
        r = subprocess.run([tool], input="\n".join(names) + "\n", stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True, errors="replace")
        out = r.stdout.splitlines()
    except OSError:
        out = []
    if r.returncode != 0 or len(out) != len(names):
        return {n: n for n in names}
    return dict(zip(names, out))


def _merge(dst, src):
    """Adds one file's functions; the same (arch, kernel) seen twice (an
    archive, a template instantiated in two translation units) keeps the worst
    of each number."""
    for key, f in src.items():
        g = dst.get(key)
        if g is None:
            dst[key] = f
            continue
        for field in ("regs", "shared", "stack", "local", "const0", "spill_stores", "spill_loads"):
            vals = [v for v in (f[field], g[field]) if v is not None]
            g[field] = max(vals) if vals else None
        for op, n in f["opcodes"].items():
            g["opcodes"][op] = max(g["opcodes"].get(op, 0), n)


def inspect_files(paths, cuobjdump):
    funcs = {}
    for path in paths:
        if not os.path.isfile(path):
            raise ToolError(f"no such file: {path}")
        rc, out, err = run_tool([cuobjdump, "-res-usage", path])
        if rc != 0:
            if "does not contain device code" in err + out:
                print(f"inspect_sass: note: {path} contains no device code", file=sys.stderr)
                continue
            raise ToolError(f"{cuobjdump} -res-usage {path} failed (rc {rc}): {err.strip()}")
        res = {}
        parse_res_usage(out, res)
        rc, out, err = run_tool([cuobjdump, "-sass", path])
        if rc != 0:
            raise ToolError(f"{cuobjdump} -sass {path} failed (rc {rc}): {err.strip()}")
        sass = {}
        parse_sass(out, sass)
        sass_archs = {a for a, _ in sass}
        for (arch, name), f in res.items():
            if arch is None:
                arch = next(iter(sass_archs)) if len(sass_archs) == 1 else "sm_unknown"
                f["arch"] = arch
            s = sass.pop((arch, name), None)
            if s is not None:
                f["opcodes"] = s["opcodes"]
            _merge(funcs, {(arch, name): f})
        for key, f in sass.items():  # SASS without resource usage (should not happen)
            _merge(funcs, {key: f})
    dm = demangle(sorted({f["mangled"] for f in funcs.values()}))
    for f in funcs.values():
        f["name"] = dm.get(f["mangled"], f["mangled"])
    return funcs


# ----------------------------------------------------------------------------
# Queries
# ----------------------------------------------------------------------------
def base_op(op):
    return op.split(".", 1)[0]


def count_ops(func, regex):
    rx = re.compile(regex)
    return sum(n for op, n in func["opcodes"].items()
               if rx.fullmatch(base_op(op)) or rx.fullmatch(op))


def local_ops(func):
    return sum(n for op, n in func["opcodes"].items() if base_op(op) in LOCAL_OPS)


def short_name(demangled):
    """'void ns::(anonymous namespace)::k<3>(float*, int)' -> the same without
    the trailing parameter list and without the return type that template
    functions carry when demangled (a kernel's is always void)."""
    out = demangled
    if out.endswith(")"):
        depth = 0
        for i in range(len(out) - 1, -1, -1):
            if out[i] == ")":
                depth += 1
            elif out[i] == "(":
                depth -= 1
                if depth == 0:
                    if i > 0:
                        out = out[:i]
                    break
    if out.startswith("void ") and len(out) > 5:
        out = out[5:]
    return out


def name_matches(func, pattern):
    cands = (func["name"], short_name(func["name"]), func["mangled"])
    return any(fnmatch.fnmatchcase(c, pattern) for c in cands)


def arch_sort_key(arch):
    m = re.match(r"sm_(\d+)(\w*)", arch)
    return (int(m.group(1)), m.group(2)) if m else (10**9, arch)


# ----------------------------------------------------------------------------
# Rules
# ----------------------------------------------------------------------------
class Rule:
    def __init__(self, text):
        self.text = text
        head, sep, rest = text.partition(":")
        if not sep:
            raise ValueError(f"rule '{text}': expected KIND:...")
        kind, _, archs = head.partition("@")
        self.kind = kind.strip()
        self.archs = [a.strip() for a in archs.split(",") if a.strip()] if archs else None
        # Demangled globs may hold '::', so the glob is whatever is left after
        # the trailing fields (opcode regexes must not contain ':').
        self.glob = None
        self.regex = None
        self.n = None

        def to_int(v):
            try:
                return int(v)
            except ValueError:
                raise ValueError(f"rule '{text}': count '{v}' is not an integer") from None

        try:
            if self.kind in ("no-local", "present"):
                self.glob = rest
            elif self.kind in ("min", "max"):
                g, _, tail = rest.rpartition(":")
                self.n = to_int(tail)
                self.glob, _, self.regex = g.rpartition(":")
                if not self.regex:
                    raise ValueError(f"rule '{text}': expected {self.kind}:<glob>:<opcode-regex>:<n>")
                re.compile(self.regex)
            elif self.kind == "max-regs":
                self.glob, _, tail = rest.rpartition(":")
                self.n = to_int(tail)
            else:
                raise ValueError(f"rule '{text}': unknown kind '{self.kind}' "
                                 "(no-local, min, max, max-regs, present)")
        except re.error as e:
            raise ValueError(f"rule '{text}': bad opcode regex: {e}") from None
        if not self.glob:
            raise ValueError(f"rule '{text}': empty kernel glob")

    def check(self, funcs, archs):
        """Returns a list of failure messages (empty = pass) and a note."""
        fails = []
        if self.archs is not None:
            missing = [a for a in self.archs if a not in archs]
            for a in missing:
                fails.append(f"arch {a} (named by the rule) is not among the archs checked "
                             f"({', '.join(archs) or 'none'})")
            check_archs = [a for a in self.archs if a in archs]
        else:
            check_archs = list(archs)
        if not check_archs and not fails:
            fails.append("no arch to check")
        matched_total = 0
        for arch in check_archs:
            matched = [f for f in funcs if f["arch"] == arch and name_matches(f, self.glob)]
            matched_total += len(matched)
            if not matched:
                fails.append(f"[{arch}] no kernel matches '{self.glob}'")
                continue
            for f in matched:
                who = f"[{arch}] {short_name(f['name'])}"
                if self.kind == "no-local":
                    why = []
                    if f["stack"]:
                        why.append(f"stack frame {f['stack']} B")
                    if f["local"]:
                        why.append(f"LOCAL {f['local']} B")
                    n = local_ops(f)
                    if n:
                        why.append(f"{n} LDL/STL instructions")
                    if f["spill_stores"] or f["spill_loads"]:
                        why.append(f"spills {f['spill_stores']} B stored / {f['spill_loads']} B loaded")
                    if why:
                        fails.append(f"{who}: uses local memory: {', '.join(why)}")
                elif self.kind == "min":
                    c = count_ops(f, self.regex)
                    if c < self.n:
                        fails.append(f"{who}: {c} instructions match /{self.regex}/, need >= {self.n}")
                elif self.kind == "max":
                    c = count_ops(f, self.regex)
                    if c > self.n:
                        fails.append(f"{who}: {c} instructions match /{self.regex}/, allowed <= {self.n}")
                elif self.kind == "max-regs":
                    if f["regs"] is None:
                        fails.append(f"{who}: register count unknown (no resource usage)")
                    elif f["regs"] > self.n:
                        fails.append(f"{who}: {f['regs']} registers, allowed <= {self.n}")
        note = f"{matched_total} kernel(s) in {', '.join(check_archs) or 'no arch'}"
        return fails, note


# ----------------------------------------------------------------------------
# Output
# ----------------------------------------------------------------------------
def print_table(funcs, archs, count_list, width):
    cols = ["regs", "shared", "stack", "local", "LDL", "STL"]
    have_spills = any(f["spill_stores"] is not None for f in funcs)
    if have_spills:
        cols += ["spill_st", "spill_ld"]
    count_list = [c for c in count_list if c not in ("LDL", "STL")]  # already columns
    cols += count_list

    def cells(f):
        row = [f["regs"], f["shared"], f["stack"], f["local"],
               sum(n for op, n in f["opcodes"].items() if base_op(op) == "LDL"),
               sum(n for op, n in f["opcodes"].items() if base_op(op) == "STL")]
        if have_spills:
            row += [f["spill_stores"], f["spill_loads"]]
        row += [count_ops(f, c) for c in count_list]
        return ["-" if v is None else str(v) for v in row]

    for arch in archs:
        rows = sorted((f for f in funcs if f["arch"] == arch), key=lambda f: f["name"])
        print(f"== {arch}: {len(rows)} function(s)")
        if not rows:
            continue
        names = []
        for f in rows:
            n = short_name(f["name"])
            names.append(n if len(n) <= width else n[:width - 3] + "...")
        w = max(len("kernel"), max(len(n) for n in names))
        widths = [max(len(c), 6) for c in cols]
        print("  " + "kernel".ljust(w) + "  " + "  ".join(c.rjust(cw) for c, cw in zip(cols, widths)))
        for n, f in zip(names, rows):
            print("  " + n.ljust(w) + "  " + "  ".join(v.rjust(cw) for v, cw in zip(cells(f), widths)))


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", help="cubin, .o, .so, .a or executable")
    ap.add_argument("--arch", action="append", default=[],
                    help="SASS arch(es) to check, e.g. sm_90a (repeat or comma-separate); "
                         "each must be in the file")
    ap.add_argument("--kernel", action="append", default=[],
                    help="only list functions matching this glob (rules still see all)")
    ap.add_argument("--count", action="append", default=[],
                    help="opcode regexes to count per kernel, comma-separated, e.g. HMMA,HGMMA,LDL")
    ap.add_argument("--rule", action="append", default=[], help="a rule (see module docstring)")
    ap.add_argument("--json", action="store_true", help="print a JSON report instead of the table")
    ap.add_argument("--json-out", metavar="PATH", help="also write the JSON report to PATH")
    ap.add_argument("--load-json", metavar="PATH",
                    help="read a report written by --json/--json-out instead of running cuobjdump")
    ap.add_argument("--ptxas-log", action="append", default=[], metavar="PATH",
                    help="build log with ptxas -v output (cmake -DM3QKV_PTXAS_VERBOSE=ON), adds spill byte counts")
    ap.add_argument("--name-width", type=int, default=70, help="truncate kernel names in the table")
    ap.add_argument("--quiet", action="store_true", help="print only rule results")
    args = ap.parse_args(argv)

    try:
        rules = [Rule(r) for r in args.rule]
    except ValueError as e:
        print(f"inspect_sass: error: {e}", file=sys.stderr)
        return 2
    count_list = [c.strip() for item in args.count for c in item.split(",") if c.strip()]
    for c in count_list:
        try:
            re.compile(c)
        except re.error as e:
            print(f"inspect_sass: error: --count '{c}': {e}", file=sys.stderr)
            return 2

    try:
        if args.load_json:
            if args.files:
                raise ToolError("give either files or --load-json, not both")
            with open(args.load_json) as fh:
                report = json.load(fh)
            funcs = report["functions"]
            sources = report.get("files", [])
        else:
            if not args.files:
                raise ToolError("no input file (or --load-json)")
            cuobjdump = find_tool("cuobjdump", "CUOBJDUMP")
            if not cuobjdump:
                raise ToolError("cuobjdump not found: pip install nvidia-cuda-cuobjdump "
                                "(or put the CUDA toolkit's bin on PATH, or set $CUOBJDUMP)")
            funcs_d = inspect_files(args.files, cuobjdump)
            for log in args.ptxas_log:
                with open(log, errors="replace") as fh:
                    parse_ptxas_log(fh.read(), funcs_d)
            funcs = list(funcs_d.values())
            sources = [os.path.abspath(p) for p in args.files]
    except (ToolError, OSError, KeyError, ValueError) as e:
        print(f"inspect_sass: error: {e}", file=sys.stderr)
        return 2

    all_archs = sorted({f["arch"] for f in funcs}, key=arch_sort_key)
    want = [a.strip() for item in args.arch for a in item.split(",") if a.strip()]
    arch_errors = [a for a in want if a not in all_archs]
    archs = [a for a in all_archs if a in want] if want else all_archs

    results = []
    n_fail = 0
    for a in arch_errors:
        n_fail += 1
        results.append({"rule": f"--arch {a}", "pass": False,
                        "failures": [f"arch {a} is not in the file (has: {', '.join(all_archs) or 'none'})"],
                        "note": ""})
    for r in rules:
        fails, note = r.check(funcs, archs)
        results.append({"rule": r.text, "pass": not fails, "failures": fails, "note": note})
        n_fail += bool(fails)

    listed = [f for f in funcs if f["arch"] in archs and
              (not args.kernel or any(name_matches(f, g) for g in args.kernel))]
    report = {"files": sources, "archs": archs, "functions": funcs,
              "counts": {c: {f"{f['arch']}:{f['mangled']}": count_ops(f, c) for f in listed}
                         for c in count_list},
              "rules": results, "ok": n_fail == 0}
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump(report, fh, indent=1, sort_keys=True)
    if args.json:
        json.dump(report, sys.stdout, indent=1, sort_keys=True)
        print()
    elif not args.quiet:
        print(f"inspect_sass: {', '.join(sources)}")
        print_table(listed, archs, count_list, args.name_width)

    out = sys.stderr if args.json else sys.stdout
    for res in results:
        if res["pass"]:
            print(f"RULE PASS  {res['rule']}  ({res['note']})", file=out)
        else:
            print(f"RULE FAIL  {res['rule']}", file=out)
            for msg in res["failures"]:
                print(f"           - {msg}", file=out)
    if results:
        print(f"inspect_sass: {len(results) - n_fail} rule(s) passed, {n_fail} failed", file=out)
    if not funcs and not rules:
        print("inspect_sass: warning: no device functions found", file=sys.stderr)
    return 1 if n_fail else 0


if __name__ == "__main__":
    sys.exit(main())
