"""m3qkv.selftest and the new statuses. Without a GPU the self-test raises
M3qkvRuntimeError (UNSUPPORTED_DEVICE) with the C message; with one (marked
gpu) every kernel the library has for the device passes, each byte compared
with the golden model, and the dict has the documented shape."""
import pytest
import torch

import m3qkv
from m3qkv import _capi


def test_status_names_of_the_new_statuses():
    lib = m3qkv.library()
    for code, name in [(_capi.ERROR_SELFTEST_FAILED, "M3QKV_ERROR_SELFTEST_FAILED"),
                       (_capi.WARNING_BACKEND_FALLBACK, "M3QKV_WARNING_BACKEND_FALLBACK")]:
        assert _capi.STATUS_NAMES[code] == name
        assert lib.status_string(code).decode().startswith(name + ":")


def test_selftest_without_gpu_raises_unsupported_device():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: test_selftest_passes runs instead")
    with pytest.raises(m3qkv.M3qkvRuntimeError) as ei:
        m3qkv.selftest(0)
    assert ei.value.status == _capi.ERROR_UNSUPPORTED_DEVICE
    assert "m3qkv_selftest: " in str(ei.value)


@pytest.mark.gpu
def test_selftest_passes():
    dev = torch.cuda.current_device()
    r = m3qkv.selftest(dev)
    assert r["passed"], r
    assert r["status"] == "M3QKV_SUCCESS"
    assert r["device"] == dev
    assert r["compute_capability"] == torch.cuda.get_device_capability(dev)
    assert r["problems"] >= 6 and r["total_us"] > 0
    assert "PASS" in r["message"]
    names = [k["name"] for k in r["kernels"]]
    assert names[0] == "portable" and len(names) == len(set(names))
    ran = [k for k in r["kernels"] if k["result"] != "not available"]
    assert ran and all(k["result"] == "pass" and k["first_wrong_byte"] is None for k in ran), ran
    assert all(k["portable_agrees"] is (None if k["name"] == "portable" else True) for k in ran), ran
    if torch.cuda.get_device_capability(dev) == (9, 0) and m3qkv.backend(dev) == "sm90":
        assert {"sm90 tile", "sm90 decode"} <= {k["name"] for k in ran}
    for k in r["kernels"]:
        if k["result"] == "not available":
            assert k["message"].startswith("not available"), k
