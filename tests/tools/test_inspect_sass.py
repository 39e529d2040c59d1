#!/usr/bin/env python3
"""Self-test of tools/inspect_sass.py on kernels compiled here with nvcc.

Three kernels for sm_90a, whose properties follow from their source:
  - uses_local: a 64-float array written and read at runtime indices, so it
    cannot live in registers: stack frame > 0 and LDL/STL in the SASS;
  - clean_kernel: shared memory only, no local memory;
  - mma_kernel: one mma.sync m16n8k16 bf16 (HMMA in the SASS), no local memory;
  - anon_kernel: in an anonymous namespace, for the name matching.
Run: python3 tests/tools/test_inspect_sass.py   (needs nvcc and cuobjdump)
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "tools", "inspect_sass.py")

SOURCE = r"""
__global__ void uses_local(float* out, const float* in, const int* idx, int n) {
  float buf[64];
  for (int i = 0; i < 64; ++i) buf[i] = in[threadIdx.x + i * n];
  for (int i = 0; i < 8; ++i) buf[idx[i] & 63] += 1.0f;
  out[threadIdx.x] = buf[idx[8] & 63];
}
namespace demo {
template <int N>
__global__ void clean_kernel(float* out, const float* in) {
  __shared__ float s[256];
  s[threadIdx.x] = in[threadIdx.x] * N;
  __syncthreads();
  out[threadIdx.x] = s[255 - threadIdx.x];
}
template __global__ void clean_kernel<3>(float*, const float*);
}  // namespace demo
__global__ void mma_kernel(float* d, const unsigned* a, const unsigned* b) {
  const int t = threadIdx.x;
  float c0 = 0.f, c1 = 0.f, c2 = 0.f, c3 = 0.f;
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c0), "+f"(c1), "+f"(c2), "+f"(c3)
      : "r"(a[4 * t]), "r"(a[4 * t + 1]), "r"(a[4 * t + 2]), "r"(a[4 * t + 3]),
        "r"(b[2 * t]), "r"(b[2 * t + 1]));
  d[4 * t] = c0; d[4 * t + 1] = c1; d[4 * t + 2] = c2; d[4 * t + 3] = c3;
}
namespace {
__global__ void anon_kernel(float* out) { out[threadIdx.x] = 2.0f; }
}  // namespace
void* anon_kernel_address() { return reinterpret_cast<void*>(&anon_kernel); }
"""


def find_nvcc():
    for p in (shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if p and os.access(p, os.X_OK):
            return p
    return None


class InspectSassTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        nvcc = find_nvcc()
        if nvcc is None:
            raise RuntimeError("nvcc not found: the inspector self-test needs the CUDA toolkit")
        cls.tmp = tempfile.mkdtemp(prefix="inspect_sass_test_")
        src = os.path.join(cls.tmp, "k.cu")
        with open(src, "w") as fh:
            fh.write(SOURCE)
        cls.obj = os.path.join(cls.tmp, "k.o")
        subprocess.run([nvcc, "-c", "-gencode=arch=compute_90a,code=sm_90a", src, "-o", cls.obj],
                       check=True)
        cls.lib = os.path.join(cls.tmp, "libk.a")
        subprocess.run(["ar", "rcs", cls.lib, cls.obj], check=True)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def run_tool(self, *args, target=None):
        argv = [sys.executable, TOOL] + ([target or self.obj] if target != "" else []) + list(args)
        r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        return r.returncode, r.stdout + r.stderr

    def assert_rule(self, rule, expect_pass, *extra, target=None, msg_contains=None):
        rc, out = self.run_tool("--quiet", "--rule", rule, *extra, target=target)
        self.assertEqual(rc, 0 if expect_pass else 1, f"rule {rule!r}:\n{out}")
        self.assertIn(("RULE PASS" if expect_pass else "RULE FAIL") + "  " + rule, out)
        if msg_contains:
            self.assertIn(msg_contains, out)

    def report(self, *args):
        rc, out = self.run_tool("--json", *args)
        self.assertIn(rc, (0, 1), out)
        return json.loads(out[: out.rindex("}") + 1])

    # --- listing -------------------------------------------------------------
    def test_lists_every_kernel_with_resources(self):
        rep = self.report()
        self.assertEqual(rep["archs"], ["sm_90a"])
        by = {f["mangled"]: f for f in rep["functions"]}
        self.assertEqual(len(by), 4, sorted(by))
        loc = next(f for f in by.values() if "uses_local" in f["name"])
        cln = next(f for f in by.values() if "clean_kernel" in f["name"])
        mma = next(f for f in by.values() if "mma_kernel" in f["name"])
        self.assertGreaterEqual(loc["stack"], 64 * 4)  # the whole array lives on the stack
        self.assertGreater(loc["opcodes"].get("STL", 0) + sum(
            n for op, n in loc["opcodes"].items() if op.startswith("STL.")), 0)
        self.assertEqual(cln["stack"], 0)
        self.assertGreaterEqual(cln["shared"], 256 * 4)
        self.assertEqual(cln["name"], "void demo::clean_kernel<3>(float*, float const*)")
        self.assertTrue(cln["mangled"].startswith("_ZN4demo12clean_kernelILi3EEEvPfPKf"))
        self.assertEqual(sum(n for op, n in mma["opcodes"].items() if op.startswith("HMMA")), 1)
        for f in by.values():
            self.assertGreater(f["regs"], 0)

    def test_count_column_and_table(self):
        rc, out = self.run_tool("--count", "HMMA,STS")
        self.assertEqual(rc, 0, out)
        self.assertIn("== sm_90a: 4 function(s)", out)
        self.assertIn("  (anonymous namespace)::anon_kernel ", out)
        self.assertIn("HMMA", out)
        line = next(l for l in out.splitlines() if "mma_kernel" in l)
        self.assertEqual(line.split()[-2:], ["1", "0"])  # HMMA, STS

    # --- rules ---------------------------------------------------------------
    def test_no_local(self):
        self.assert_rule("no-local:*", False, msg_contains="uses_local: uses local memory: stack frame")
        self.assert_rule("no-local:*uses_local*", False)
        self.assert_rule("no-local:demo::clean_kernel*", True)
        self.assert_rule("no-local:*mma_kernel*", True)

    def test_glob_matching_nothing_fails(self):
        for rule in ("no-local:*renamed*", "present:*renamed*", "min:*renamed*:HMMA:0",
                     "max:*renamed*:HMMA:100", "max-regs:*renamed*:255"):
            self.assert_rule(rule, False, msg_contains="no kernel matches '*renamed*'")

    def test_present_matches_demangled_short_and_mangled(self):
        for g in ("demo::clean_kernel<3>", "void demo::clean_kernel<3>(float*, float const*)",
                  "_ZN4demo12clean_kernel*", "mma_kernel", "*local*",
                  "(anonymous namespace)::anon_kernel", "*::anon_kernel"):
            self.assert_rule("present:" + g, True)
        self.assert_rule("present:clean_kernel", False)  # globs are anchored

    def test_min_max_opcodes(self):
        self.assert_rule("min:mma_kernel:HMMA:1", True)
        self.assert_rule("min:mma_kernel:HMMA:2", False, msg_contains="1 instructions match /HMMA/, need >= 2")
        self.assert_rule("min:*:HMMA:1", False)  # every matching kernel must satisfy it
        self.assert_rule("max:*:HMMA:1", True)
        self.assert_rule("max:*:LDL|STL:0", False)
        self.assert_rule("max:demo::*:LDL|STL:0", True)
        self.assert_rule("min:mma_kernel:HMMA\\.16816\\.F32\\.BF16:1", True)  # full mnemonic

    def test_max_regs(self):
        self.assert_rule("max-regs:*:255", True)
        self.assert_rule("max-regs:*:1", False, msg_contains="registers, allowed <= 1")

    def test_arch_filter_and_qualifier(self):
        self.assert_rule("present:mma_kernel", True, "--arch", "sm_90a")
        rc, out = self.run_tool("--quiet", "--arch", "sm_80")
        self.assertEqual(rc, 1, out)
        self.assertIn("arch sm_80 is not in the file", out)
        self.assert_rule("present@sm_90a:mma_kernel", True)
        self.assert_rule("present@sm_90a,sm_100f:mma_kernel", False, msg_contains="arch sm_100f")

    def test_exit_code_is_failure_if_any_rule_fails(self):
        rc, out = self.run_tool("--quiet", "--rule", "present:mma_kernel", "--rule", "no-local:*")
        self.assertEqual(rc, 1, out)
        self.assertIn("1 rule(s) passed, 1 failed", out)

    def test_bad_rules_are_usage_errors(self):
        for rule in ("bogus:*", "min:*:HMMA:x", "min:*:4", "max-regs:*", "nolocal"):
            rc, out = self.run_tool("--rule", rule)
            self.assertEqual(rc, 2, f"{rule}: {out}")
            self.assertIn("error", out)

    def test_archive_and_json_roundtrip(self):
        self.assert_rule("no-local:*", False, target=self.lib)
        self.assert_rule("present:mma_kernel", True, target=self.lib)
        path = os.path.join(self.tmp, "rep.json")
        rc, out = self.run_tool("--quiet", "--json-out", path)
        self.assertEqual(rc, 0, out)
        rc, out = self.run_tool("--quiet", "--load-json", path, "--rule", "no-local:*uses_local*",
                                target="")
        self.assertEqual(rc, 1, out)
        rc, out = self.run_tool("--quiet", "--load-json", path, "--rule", "min:mma_kernel:HMMA:1",
                                target="")
        self.assertEqual(rc, 0, out)

    def test_missing_file_is_a_tool_error(self):
        rc, out = self.run_tool(target=os.path.join(self.tmp, "nope.o"))
        self.assertEqual(rc, 2, out)
        self.assertIn("no such file", out)


if __name__ == "__main__":
    unittest.main(verbosity=2)
