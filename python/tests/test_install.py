"""The package as installed by pip (CI sets M3QKV_EXPECT_INSTALLED=1 after
`pip install ./python` from a clean clone): imported from site-packages, not
from the source tree, with the libm3qkv.so that the build put next to it."""
import os
import pathlib

import pytest

import m3qkv

INSTALLED = os.environ.get("M3QKV_EXPECT_INSTALLED") == "1"


@pytest.mark.skipif(not INSTALLED, reason="M3QKV_EXPECT_INSTALLED=1 not set (a source-tree run)")
def test_imported_from_the_installed_copy(repo_root):
    pkg = pathlib.Path(m3qkv.__file__).resolve().parent
    assert not str(pkg).startswith(str((repo_root / "python").resolve())), f"m3qkv imported from the tree: {pkg}"
    assert "M3QKV_LIBRARY" not in os.environ, "the installed library must be found without M3QKV_LIBRARY"
    lib = m3qkv.library()
    assert pathlib.Path(lib.path).resolve().parent == pkg, lib.path
    assert (pkg / "libm3qkv.so").stat().st_size > 1_000_000
    for module in ("_capi.py", "_ops.py", "reference.py", "demo.py"):
        assert (pkg / module).exists(), module


def test_library_exports_the_c_api():
    lib = m3qkv.library()
    for name in ("m3qkv_fused_qkv", "m3qkv_qknorm_rope_kv_insert", "m3qkv_mxfp8_gemm", "m3qkv_mxfp8_quantize",
                 "m3qkv_warmup", "m3qkv_backend", "m3qkv_status_string", "m3qkv_last_error", "m3qkv_backend_name",
                 "m3qkv_selftest", "m3qkv_set_backend"):
        assert hasattr(lib._dll, name), name
    assert lib.status_string(7).decode().startswith("M3QKV_ERROR_INVALID_SHAPE")
    assert lib.backend_name(2).decode() == "sm90"


def test_demo_without_gpu_says_so(capsys):
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the demo runs for real in the GPU instructions")
    from m3qkv import demo
    assert demo.main(["--m", "4"]) == 3  # the docstring's "no usable GPU"
    out = capsys.readouterr().out
    assert "m3qkv: M3QKV_ERROR_UNSUPPORTED_DEVICE: " in out, out  # the library's reason
    assert "no CUDA driver / no GPU" in out and "verdict: NOT RUN" in out, out
    assert demo.main(["--selftest"]) == 3
    out = capsys.readouterr().out
    assert "M3QKV_ERROR_UNSUPPORTED_DEVICE: " in out and "nothing to test" in out, out


def test_demo_process_exit_code_without_gpu():
    # `python -m m3qkv.demo` as a user runs it: the exit status is main()'s.
    import subprocess
    import sys
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the demo runs for real in the GPU instructions")
    r = subprocess.run([sys.executable, "-m", "m3qkv.demo", "--m", "4"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "verdict: NOT RUN" in r.stdout, r.stdout
