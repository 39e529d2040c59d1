"""m3qkv.prepare_weights (the fp8 fast mode's weight fold, docs/contract.md §3.9).

CPU: the torch reference fold (m3qkv.reference.fold_fp8) on weights whose block
exponents spread over 0..24 binades (the shifts that stay exact, round and
flush): group scales, unchanged single-exponent groups, NaN codes, the error
bound; the module function's argument errors.
GPU (marked gpu): the library's fold equals the reference byte for byte, with
and without statistics.
"""
import pytest
import torch

import m3qkv
from m3qkv import reference as ref


def spread_weights(n, k, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 256, (n, k), generator=g, dtype=torch.int64)
    q = torch.where((q & 0x7F) == 0x7F, q ^ 1, q).to(torch.uint8)  # no NaN codes but a few below
    q[0, :3] = torch.tensor([0x7F, 0xFF, 0x80], dtype=torch.uint8)
    spread = torch.randint(0, 25, (n, k // 32), generator=g)
    coin = torch.randint(0, 4, (n, k // 32), generator=g)
    sf = (130 - torch.where(coin == 0, spread, coin)).to(torch.uint8)
    return q.to(device), ref.swizzle_scales(sf).to(device)


def test_reference_fold_keeps_exact_groups_and_nan_codes():
    n, k = 128, 256
    q, sf = spread_weights(n, k, 29)
    fq, fsf = ref.fold_fp8(q, sf, n, k)
    s = ref.unswizzle_scales(sf, n, k // 32).view(n, k // 128, 4).long()
    fs = ref.unswizzle_scales(fsf, n, k // 32).view(n, k // 128, 4).long()
    assert torch.equal(fs, s.amax(-1, keepdim=True).expand_as(s))
    same = (s == s[..., :1]).all(-1)  # groups whose blocks share one exponent: unchanged
    rows, groups = same.nonzero(as_tuple=True)
    for r, gi in zip(rows.tolist()[:50], groups.tolist()[:50]):
        assert torch.equal(fq[r, 128 * gi:128 * gi + 128], q[r, 128 * gi:128 * gi + 128])
    assert fq[0, 0] == 0x7F and fq[0, 1] == 0xFF, "NaN codes stay"
    # The folded value never moves by more than half an e4m3 ulp of its own grid.
    v = ref.mxfp8_decode(q, sf, n, k)
    w = ref.mxfp8_decode(fq, fsf, n, k)
    ok = torch.isfinite(v) & torch.isfinite(w)
    assert ((w - v).abs()[ok] <= v.abs()[ok] * 2.0 ** -4 + 2.0 ** -10 * 2.0 ** (fs.max().item() - 127)).all()


def test_prepare_weights_argument_errors():
    q = torch.zeros(128, 256, dtype=torch.float8_e4m3fn)
    sf = torch.zeros(ref.f8_128x4_bytes(128, 8), dtype=torch.uint8)
    with pytest.raises(ValueError, match="mode"):
        m3qkv.prepare_weights(q, sf, mode="int4")
    with pytest.raises(ValueError, match="K % 128|N % 128"):
        m3qkv.prepare_weights(torch.zeros(128, 200, dtype=torch.float8_e4m3fn), sf)
    with pytest.raises(ValueError, match="wsf"):
        m3qkv.prepare_weights(q, sf[:-16])
    with pytest.raises(ValueError, match="CUDA"):
        m3qkv.prepare_weights(q, sf)


@pytest.mark.gpu
def test_prepare_weights_equals_the_reference_fold():
    n, k = 256, 1024
    q, sf = spread_weights(n, k, 7, "cuda")
    wq, wsf, st = m3qkv.prepare_weights(q.view(torch.float8_e4m3fn), sf, stats=True)
    fq, fsf = ref.fold_fp8(q, sf, n, k)
    assert torch.equal(wq.view(torch.uint8), fq)
    assert torch.equal(wsf, fsf)
    assert st["changed"] > 0 and 0.0 < st["max_rel_change"] < 1.0
    wq2, wsf2 = m3qkv.prepare_weights(q.view(torch.float8_e4m3fn), sf)
    assert torch.equal(wq2, wq) and torch.equal(wsf2, wsf)
