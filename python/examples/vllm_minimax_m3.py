"""MiniMax-M3's attention prologue on vLLM's cache tensors, in one m3qkv call.

    python python/examples/vllm_minimax_m3.py [--tp 2] [--m 20] [--pad 4] [--k 6144]
        [--block-size 16] [--layout one|two] [--index-cache fp8|bf16] [--seed 1]

vLLM runs two steps per M3 attention layer: the MXFP8 GEMM writes a bf16
projection [M, (nq + 2·nkv + niq + nik)·128] = [q | k | v | index_q | index_k],
then its fused_minimax_m3_qknorm_rope_kv_insert op norms and ropes q, k,
index_q and index_k, writes q and index_q out, inserts k and v into the paged
KV cache by slot_mapping and index_k into the indexer's cache by the
indexer's own slot mapping. m3qkv.fused_qkv does all of it from the MXFP8
operands, without writing the projection to memory.

Cache tensors as vLLM allocates them, and how they reach m3qkv (zero-copy views):
  --layout one  the KV cache [num_blocks, 2, block_size, nkv, 128] of FP8 bytes
                (vLLM stores them as uint8): viewed as float8_e4m3fn, passed as
                kv_cache with v_cache=None (a uint8 kv_cache means NVFP4 to m3qkv);
  --layout two  the same allocation as K and V tensors kv[:, 0], kv[:, 1]
                ([num_blocks, block_size, nkv, 128], page stride 2·block_size·nkv·128):
                kv_cache=K, v_cache=V (any strides, inner 128 packed);
  index cache   [num_blocks, block_size, 128], FP8 (viewed as e4m3) or bf16.
Not expressible: m3qkv writes index_q as e4m3 (unit scale, docs/contract.md §3.4)
only, so with vLLM's bf16 indexer index_q is an e4m3 tensor (exact when cast
to bf16, but rounded to e4m3, unlike vLLM's bf16 one); both caches share one
block_size; k_scale / v_scale are host floats (fixed in a captured graph).
Padding tokens have slot -1 in both slot mappings: their caches are not written
(their q / index_q rows are). The data is the exact-data construction
(m3qkv.reference.make_exact_operands), on which every output byte must equal the
torch port of the golden model, as the package's GPU tests check; then the
same call is captured in a CUDA graph and replayed.
Exit code 0 = every byte equal on the GPU (eager and graph replay), 1 = a
mismatch, 3 = no GPU: m3qkv has no CPU kernel, so only the CPU parts ran (the
arguments through the op's fake kernel, the reference outputs).
"""
from __future__ import annotations

import argparse
import sys

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import m3qkv
from m3qkv import reference as ref

E4M3 = torch.float8_e4m3fn
HEADS = {1: (64, 4, 4, 1), 2: (32, 2, 2, 1), 4: (16, 1, 1, 1), 8: (8, 1, 1, 1)}  # TP -> nq, nkv, niq, nik
POISON = 0xA5  # every output byte starts as this, so unwritten and wrongly written bytes both show


def vllm_caches(num_blocks, block_size, nkv, index_cache, device="cpu"):
    """The two cache tensors as vLLM allocates them (FP8 as uint8 storage), poisoned."""
    kv = torch.full((num_blocks, 2, block_size, nkv, 128), POISON, dtype=torch.uint8, device=device)
    if index_cache == "fp8":
        ix = torch.full((num_blocks, block_size, 128), POISON, dtype=torch.uint8, device=device)
    else:
        ix = torch.full((num_blocks, block_size, 128 * 2), POISON, dtype=torch.uint8, device=device)
        ix = ix.view(torch.bfloat16)
    return kv, ix


def m3qkv_cache_args(kv, ix, layout):
    """vLLM's cache tensors -> fused_qkv's kv_cache / v_cache / index_cache: views
    of the same memory (m3qkv writes in place, so nothing may be copied)."""
    kv8 = kv.view(E4M3) if kv.dtype == torch.uint8 else kv  # uint8 would mean NVFP4 pages
    ix8 = ix.view(E4M3) if ix.dtype == torch.uint8 else ix
    if layout == "one":
        return dict(kv_cache=kv8, v_cache=None, index_cache=ix8)
    return dict(kv_cache=kv8[:, 0], v_cache=kv8[:, 1], index_cache=ix8)


def rope_cache(max_position, theta=5e6):
    """bf16 [max_position, 64] = [cos | sin] of 32 NeoX frequencies (64 of 128 dims rotate)."""
    inv = theta ** (-torch.arange(32, dtype=torch.float64) / 32)
    ang = torch.arange(max_position, dtype=torch.float64)[:, None] * inv
    return torch.cat([ang.cos(), ang.sin()], 1).to(torch.bfloat16)


def problem(tp, m, pad, k, block_size, seed):
    """One step's inputs on the CPU: M tokens, the last `pad` of them padding."""
    nq, nkv, niq, nik = HEADS[tp]
    g = torch.Generator().manual_seed(seed)
    n = (nq + 2 * nkv + niq + nik) * 128
    # In a model: xq, xsf = m3qkv.mxfp8_quantize(hidden_states); wq / wsf the
    # checkpoint's MXFP8 qkv_proj weight with its scales swizzled once at load.
    xq, xsf, wq, wsf = ref.make_exact_operands(m, k, n, g)
    num_blocks = 2 * m // block_size + 2  # spare pages: a write to a wrong page would show
    w = lambda: (torch.randn(128, generator=g) * 0.1).to(torch.bfloat16)  # noqa: E731
    slots = torch.randperm(num_blocks * block_size, generator=g)[:m]
    islots = torch.randperm(num_blocks * block_size, generator=g)[:m]  # the indexer's own mapping
    pos = torch.randint(0, 4096, (m,), generator=g)
    if pad:
        slots[m - pad:], islots[m - pad:], pos[m - pad:] = -1, -1, 0  # vLLM's padding tokens
    return dict(tp=tp, nq=nq, nkv=nkv, niq=niq, nik=nik, m=m, pad=pad, block_size=block_size,
                num_blocks=num_blocks, xq=xq.view(E4M3), xsf=xsf, wq=wq.view(E4M3), wsf=wsf, positions=pos,
                cos_sin_cache=rope_cache(4096), q_norm_weight=w(), k_norm_weight=w(), index_q_norm_weight=w(),
                index_k_norm_weight=w(), eps=1e-6, slot_mapping=slots, index_slot_mapping=islots,
                k_scale=1.0, v_scale=1.0)


def outputs(p, layout, index_cache, device="cpu"):
    """The buffers the call writes: vLLM's two caches (also as m3qkv views), q and index_q."""
    kv, ix = vllm_caches(p["num_blocks"], p["block_size"], p["nkv"], index_cache, device)
    full = lambda w: torch.full((p["m"], w), POISON, dtype=torch.uint8, device=device)  # noqa: E731
    return dict(kv=kv, ix=ix, q_out=full(p["nq"] * 256).view(torch.bfloat16),
                index_q_out=full(p["niq"] * 128).view(E4M3), **m3qkv_cache_args(kv, ix, layout))


def call_args(p, o, device=None):
    """(positional, keyword) arguments of m3qkv.fused_qkv / torch.ops.m3qkv.fused_qkv."""
    t = lambda name: p[name].to(device) if device is not None else p[name]  # noqa: E731
    args = tuple(t(n) for n in ("xq", "xsf", "wq", "wsf", "positions", "cos_sin_cache", "q_norm_weight",
                                "k_norm_weight", "index_q_norm_weight", "index_k_norm_weight")) + (p["eps"],)
    kw = dict(slot_mapping=t("slot_mapping"), index_slot_mapping=t("index_slot_mapping"), kv_cache=o["kv_cache"],
              v_cache=o["v_cache"], index_cache=o["index_cache"], q_out=o["q_out"], index_q_out=o["index_q_out"],
              k_scale=p["k_scale"], v_scale=p["v_scale"], nq=p["nq"], nkv=p["nkv"], niq=p["niq"], nik=p["nik"])
    return args, kw


def reference(p, o):
    """The torch port of the golden model writes the expected bytes into o (CPU)."""
    acc = ref.mxfp8_acc(p["xq"].view(torch.uint8), p["xsf"], p["wq"].view(torch.uint8), p["wsf"])
    ref.epilogue(acc, nq=p["nq"], nkv=p["nkv"], niq=p["niq"], nik=p["nik"], positions=p["positions"],
                 cos_sin_cache=p["cos_sin_cache"], q_norm_weight=p["q_norm_weight"],
                 k_norm_weight=p["k_norm_weight"], index_q_norm_weight=p["index_q_norm_weight"],
                 index_k_norm_weight=p["index_k_norm_weight"], eps=p["eps"], slot_mapping=p["slot_mapping"],
                 index_slot_mapping=p["index_slot_mapping"], kv_cache=o["kv_cache"], v_cache=o["v_cache"],
                 index_cache=o["index_cache"], q_out=o["q_out"], index_q_out=o["index_q_out"],
                 k_scale=p["k_scale"], v_scale=p["v_scale"])
    return acc


def check_on_fake(args, kw):
    """The op's fake kernel applies the CUDA kernel's argument checks (shapes,
    dtypes, strides of every cache layout) to fake copies: raises ValueError if
    m3qkv would refuse these tensors. Views stay views, so the strides are vLLM's."""
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        fake = lambda x: mode.from_tensor(x) if isinstance(x, torch.Tensor) else x  # noqa: E731
        torch.ops.m3qkv.fused_qkv(*[fake(a) for a in args], **{k: fake(v) for k, v in kw.items()})


def compare(want, got):
    """Names of the outputs whose bytes differ (the caches: vLLM's whole tensors)."""
    raw = lambda t: t.contiguous().view(torch.uint8).reshape(-1).cpu()  # noqa: E731
    return [n for n in ("q_out", "index_q_out", "kv", "ix") if not torch.equal(raw(want[n]), raw(got[n]))]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tp", type=int, choices=sorted(HEADS), default=2)
    ap.add_argument("--m", type=int, default=20, help="tokens, padding included")
    ap.add_argument("--pad", type=int, default=4, help="padding tokens (slot -1) at the end")
    ap.add_argument("--k", type=int, default=6144, help="hidden size (M3: 6144; a multiple of 128)")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--layout", choices=["one", "two"], default="one")
    ap.add_argument("--index-cache", choices=["fp8", "bf16"], default="fp8")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    if not 0 <= a.pad < a.m or a.k % 128 or a.block_size % 4:
        ap.error("need 0 <= --pad < --m, --k % 128 == 0, --block-size % 4 == 0")
    p = problem(a.tp, a.m, a.pad, a.k, a.block_size, a.seed)
    print(f"MiniMax-M3 TP{a.tp} (nq {p['nq']}, nkv {p['nkv']}, niq {p['niq']}, nik {p['nik']}), K {a.k}, "
          f"M {a.m} ({a.pad} padding), block {a.block_size}, KV cache '{a.layout}', index cache {a.index_cache}")
    want = outputs(p, a.layout, a.index_cache)
    reference(p, want)
    check_on_fake(*call_args(p, outputs(p, a.layout, a.index_cache)))
    print("CPU: the vLLM-layout arguments pass the op's checks (fake kernel); reference outputs built")
    if not torch.cuda.is_available():
        print("no CUDA device: m3qkv.fused_qkv has no CPU kernel, so the fused call did not run (exit 3)")
        return 3
    dev = torch.device("cuda", torch.cuda.current_device())
    got = outputs(p, a.layout, a.index_cache, dev)
    args, kw = call_args(p, got, dev)
    m3qkv.fused_qkv(*args, **kw)
    torch.cuda.synchronize()
    bad = compare(want, got)
    print(f"GPU ({m3qkv.backend()}), eager: {'every byte equals the reference' if not bad else f'MISMATCH in {bad}'}")
    # A serving engine replays captured graphs: warm up on a side stream,
    # capture, re-poison every output, replay, compare again.
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        m3qkv.fused_qkv(*args, **kw)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        m3qkv.fused_qkv(*args, **kw)
    for n in ("q_out", "index_q_out", "kv", "ix"):
        got[n].view(torch.uint8).fill_(POISON)
    graph.replay()
    torch.cuda.synchronize()
    bad_graph = compare(want, got)
    print(f"GPU, CUDA graph replay: "
          f"{'every byte equals the reference' if not bad_graph else f'MISMATCH in {bad_graph}'}")
    return 1 if bad or bad_graph else 0


if __name__ == "__main__":
    sys.exit(main())
