"""Shared pytest set-up for the m3qkv Python tests.

Markers: `gpu` tests need a CUDA device and skip cleanly without one.
Environment:
  M3QKV_REPO_ROOT      the repository checkout (default: two levels above this file)
  M3QKV_GOLDEN_LIBRARY libm3qkv_golden_capi.so of a CMake build (default:
                       <root>/build/libm3qkv_golden_capi.so); tests that compare
                       with the C golden model skip without it, unless
  M3QKV_REQUIRE_GOLDEN=1 makes its absence a failure (CI sets it)
  M3QKV_EXPECT_INSTALLED=1 the package must be imported from an installed copy,
                       not from the source tree (CI sets it after pip install)
"""
import os
import pathlib

import pytest
import torch

ROOT = pathlib.Path(os.environ.get("M3QKV_REPO_ROOT", pathlib.Path(__file__).resolve().parents[2]))


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped without one)")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device: torch.cuda.is_available() is False")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_report_header(config):
    import m3qkv
    lines = [f"m3qkv package: {pathlib.Path(m3qkv.__file__).parent}", f"torch {torch.__version__}, "
             f"CUDA available: {torch.cuda.is_available()}"]
    try:
        lib = m3qkv.library()
        lines.append(f"libm3qkv: {lib.path} (fused args {lib.fused_struct_size} B, "
                     f"FP8/BF16 cache formats: {'yes' if lib.cache_formats else 'no'}, "
                     f"bf16 activations (x_bf16): {'yes' if lib.x_bf16 else 'no'})")
    except ImportError as e:
        lines.append(f"libm3qkv: not loadable: {e}")
    return lines


@pytest.fixture(scope="session")
def repo_root():
    return ROOT


@pytest.fixture(scope="session")
def golden():
    """The C golden model (tests/tools/golden_capi.cpp) through ctypes."""
    from golden_capi import Golden
    path = os.environ.get("M3QKV_GOLDEN_LIBRARY", str(ROOT / "build" / "libm3qkv_golden_capi.so"))
    if not os.path.exists(path):
        if os.environ.get("M3QKV_REQUIRE_GOLDEN") == "1":
            pytest.fail(f"M3QKV_REQUIRE_GOLDEN=1 but {path} does not exist (build the CMake tree first)")
        pytest.skip(f"C golden model not built: {path} missing (cmake --build build --target m3qkv_golden_capi)")
    return Golden(path)
