"""The eager fast path of fused_qkv (m3qkv._ops.fused_fast_args) accepts only
what the full checks accept, and writes the same struct bytes."""
import ctypes

import pytest
import torch

from m3qkv import _capi, _ops
from test_errors import CASES, base

ORDER = ("xq", "xsf", "wq", "wsf", "positions", "cos_sin_cache", "q_norm_weight", "k_norm_weight",
         "index_q_norm_weight", "index_k_norm_weight", "eps", "slot_mapping", "index_slot_mapping", "kv_cache",
         "index_cache", "index_q_out", "q_out", "q_fp8_out", "q_fp8_scale", "k_scale", "v_scale", "cta_group",
         "use_pdl", "grid", "v_cache", "nq", "nkv", "niq", "nik", "error_flags")
DEFAULTS = dict(q_fp8_scale=1.0, k_scale=1.0, v_scale=1.0, cta_group=None, use_pdl=True, grid=None, v_cache=None,
                nq=None, nkv=None, niq=None, nik=None, error_flags=None, q_out=None, q_fp8_out=None)


def fast(a, kw):
    d = dict(DEFAULTS, **a, **kw)
    return _ops.fused_fast_args(*(d[k] for k in ORDER))


def slow_bytes(a, kw):
    _, s = _ops.fused_qkv_args(*a.values(), **kw)
    return bytes(s)[:_capi.library().fused_struct_size]


def fast_bytes(a, kw):
    r = fast(a, kw)
    assert r is not None
    s = _capi.FusedArgs()
    _ops._packer()[0].pack_into(s, 0, *r[1])
    return bytes(s)[:_capi.library().fused_struct_size]


def variants():
    a, kw = base("cpu", m=7)
    yield "TP4 inferred", a, kw
    yield "TP4 scalars", a, dict(kw, q_fp8_scale=0.25, k_scale=0.5, v_scale=3.0, cta_group=2, use_pdl=False, grid=5,
                                 error_flags=torch.zeros(1, dtype=torch.int32))
    yield "q_fp8 only", a, dict(kw, q_out=None)
    a8, kw8 = base("cpu", layout=(8, 1, 1, 1), m=3)
    yield "TP8 explicit", a8, dict(kw8, nq=8, nkv=1, niq=1, nik=1)
    ad, kwd = base("cpu", layout=(8, 2, 0, 0), m=3)
    yield "dense explicit", ad, dict(kwd, nq=8, nkv=2, niq=0, nik=0)
    a2, kw2 = base("cpu", layout=(32, 2, 2, 1), m=300, bs=64, pages=12)
    buf = torch.zeros(12, 4 * 64 * 72 + 96, dtype=torch.uint8)
    kv = torch.as_strided(buf, (12, 4, 64, 72), (4 * 64 * 72 + 96, 64 * 72, 72, 1))
    yield "TP2 padded pages", a2, dict(kw2, kv_cache=kv)


@pytest.mark.parametrize("name,a,kw", list(variants()), ids=[v[0] for v in variants()])
def test_fast_path_writes_the_same_struct(name, a, kw):
    assert fast_bytes(a, kw) == slow_bytes(a, kw)
    # and the values land where the C struct has them (spot checks through the ctypes mirror)
    s = _capi.FusedArgs.from_buffer_copy(fast_bytes(a, kw) + bytes(ctypes.sizeof(_capi.FusedArgs)))
    assert s.m == a["xq"].shape[0] and s.kv_cache == kw["kv_cache"].data_ptr()
    assert s.kv_page_stride == kw["kv_cache"].stride(0) and s.block_size == kw["kv_cache"].shape[2]


@pytest.mark.parametrize("desc,mutate,message", [c for c in CASES if c[0] != "device mix"],
                         ids=[c[0] for c in CASES if c[0] != "device mix"])
def test_fast_path_rejects_every_invalid_case(desc, mutate, message):
    a, kw = base("cpu")
    assert fast(a, kw) is not None
    mutate(a, kw)
    try:
        r = fast(a, kw)
    except ValueError as e:  # the head-count helper may raise the precise message itself
        assert message in str(e)
        return
    assert r is None, f"{desc}: the fast path accepted what the full check rejects ({message})"


def test_fast_path_falls_back_for_other_formats():
    a, kw = base("cpu")
    kw["kv_cache"] = torch.zeros(3, 2, 16, 1, 128, dtype=torch.bfloat16)
    assert fast(a, kw) is None
