"""Test problems for the Python tests: every input of the fused op as torch
tensors (CPU), built from a seed, and poisoned output sets. Exact data uses
m3qkv.reference.make_exact_operands (the recipe of tests/common/problem.cpp)."""
import os
import random

import torch

from m3qkv import reference as ref

# name -> (nq, nkv, niq, nik): the MiniMax-M3 ranks and a dense layer
LAYOUTS = {
    "TP1": (64, 4, 4, 1),
    "TP2": (32, 2, 2, 1),
    "TP4": (16, 1, 1, 1),
    "TP8": (8, 1, 1, 1),
    "dense": (8, 2, 0, 0),
}


def fresh_seed():
    """M3QKV_TEST_SEED, else fresh; printed by the tests that use it."""
    s = os.environ.get("M3QKV_TEST_SEED")
    return int(s, 0) if s else random.SystemRandom().randrange(1, 2**31)


def make_problem(layout="TP4", m=37, k=512, block_size=16, exact=True, seed=None, pad_page=64,
                 q_fp8_scale=0.0625, k_scale=0.5, v_scale=2.0, eps=1e-6, oor=False, max_position=4096):
    nq, nkv, niq, nik = LAYOUTS[layout] if isinstance(layout, str) else layout
    seed = fresh_seed() if seed is None else seed
    g = torch.Generator().manual_seed(seed)
    n = (nq + 2 * nkv + niq + nik) * 128
    if exact:
        xq, xsf, wq, wsf = ref.make_exact_operands(m, k, n, g)
    else:
        rs = torch.exp2(torch.rand(m, 1, generator=g) * 6 - 3)
        x = (torch.randn(m, k, generator=g) * rs).to(torch.bfloat16)
        xq, xsf = ref.mxfp8_quantize(x)
        w = (torch.randn(n, k, generator=g) * 0.02).to(torch.bfloat16)
        wq, wsf = ref.mxfp8_quantize(w)
    pages = max(3, (2 * m + block_size - 1) // block_size)
    p = dict(m=m, nq=nq, nkv=nkv, niq=niq, nik=nik, seed=seed, n=n, block_size=block_size, pages=pages,
             pad_page=pad_page, xq=xq, xsf=xsf, wq=wq, wsf=wsf, eps=eps,
             q_fp8_scale=q_fp8_scale, k_scale=k_scale, v_scale=v_scale,
             cos_sin_cache=ref.rope_table(max_position),
             q_norm_weight=(torch.randn(128, generator=g) * 0.1).to(torch.bfloat16),
             k_norm_weight=(torch.randn(128, generator=g) * 0.1).to(torch.bfloat16),
             index_q_norm_weight=(torch.randn(128, generator=g) * 0.1).to(torch.bfloat16) if niq else None,
             index_k_norm_weight=(torch.randn(128, generator=g) * 0.1).to(torch.bfloat16) if nik else None)
    pos = torch.randint(0, max_position, (m,), generator=g)
    slots = ref.unique_slots(m, pages * block_size, g)
    islots = ref.unique_slots(m, pages * block_size, g) if nik else None
    if oor and m:
        bad = torch.tensor([-1, max_position, max_position + 7, -(2**40)])
        pos[torch.randint(0, m, (3,), generator=g)] = bad[torch.randint(0, 4, (3,), generator=g)]
        slots[int(torch.randint(0, m, (1,), generator=g))] = pages * block_size
        if nik:
            islots[int(torch.randint(0, m, (1,), generator=g))] = pages * block_size + 3
    p["positions"], p["slot_mapping"], p["index_slot_mapping"] = pos, slots, islots
    return p


def make_outputs(p, poison=0xA5, device="cpu", q_bf16=True, q_fp8=True):
    """Poisoned outputs: q_out bf16 [m, nq·128], q_fp8_out / index_q_out e4m3,
    kv_cache uint8 [pages, 2·nkv, bs, 72] and index_cache [pages, bs, 72] as
    views of larger buffers with `pad_page` extra bytes per page (any page stride)."""
    m, nq, nkv, niq, nik, bs = p["m"], p["nq"], p["nkv"], p["niq"], p["nik"], p["block_size"]

    def full(shape, dtype):
        return torch.full(shape, poison, dtype=torch.uint8, device=device).view(dtype)

    def paged(slots):
        page = slots * bs * 72
        buf = torch.full((p["pages"], page + p["pad_page"]), poison, dtype=torch.uint8, device=device)
        return torch.as_strided(buf, (p["pages"], slots, bs, 72), (page + p["pad_page"], bs * 72, 72, 1))

    out = {"q_out": full((m, nq * 256), torch.uint8).view(torch.bfloat16) if q_bf16 else None,
           "q_fp8_out": full((m, nq * 128), torch.float8_e4m3fn) if q_fp8 else None,
           "index_q_out": full((m, niq * 128), torch.float8_e4m3fn) if niq else None,
           "kv_cache": paged(2 * nkv)}
    if nik:
        page = bs * 72
        buf = torch.full((p["pages"], page + p["pad_page"]), poison, dtype=torch.uint8, device=device)
        out["index_cache"] = torch.as_strided(buf, (p["pages"], bs, 72), (page + p["pad_page"], 72, 1))
    else:
        out["index_cache"] = None
    return out


def raw_bytes(t):
    """A copy of every byte of the storage behind t (page padding included)."""
    if t is None:
        return None
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage()).clone()


def diff(name, want, got, max_report=5):
    """'' when equal, else the first differing bytes."""
    if want is None and got is None:
        return ""
    a, b = raw_bytes(want).cpu(), raw_bytes(got).cpu()
    if a.shape != b.shape:
        return f"{name}: {a.numel()} vs {b.numel()} bytes\n"
    bad = torch.nonzero(a != b).view(-1)
    if bad.numel() == 0:
        return ""
    s = f"{name}: {bad.numel()} of {a.numel()} bytes differ;"
    for i in bad[:max_report].tolist():
        s += f" [{i}] want 0x{int(a[i]):02x} got 0x{int(b[i]):02x};"
    return s + "\n"


def diff_outputs(want, got):
    return "".join(diff(k, want[k], got[k]) for k in ("q_out", "q_fp8_out", "index_q_out", "kv_cache",
                                                        "index_cache"))
