"""python -m m3qkv.demo [--m M] [--reps R] [--seed S] [--q bf16|fp8|both] [--selftest]

The Python counterpart of tools/run_demo.sh: one MiniMax-M3 TP4 step
(K = 6144, nq 16, nkv 1, niq 1, nik 1 -> N = 2560, NVFP4 caches with
block_size 128, M tokens, default 256) through the torch ops:
 1. random bf16 activations (N(0, 1) rows scaled by 2^[-2, 2], rare outliers)
    are quantized with m3qkv.mxfp8_quantize, checked byte for byte against the
    torch port of the golden quantizer (m3qkv.reference);
 2. m3qkv.fused_qkv runs on them; its outputs are compared with the torch port
    of the golden epilogue on the f64 accumulator. The kernel's accumulator
    is f32 in a hardware-defined order, so on random data the check is a
    tolerance: q_out within 1 bf16 ulp, q_fp8_out / index_q_out within one
    e4m3 step, and at least 99 % of the cache bytes identical (a value next to
    a rounding boundary of the 4-bit code may land on the neighbour);
 3. the same on the exact-data construction (every partial sum exact, so the
    accumulator is exact on any hardware): every output byte must be equal;
 4. time per call from CUDA events with L2 flushed before each call, and the
    host time of one eager call.
With --selftest it runs only m3qkv.selftest() (every kernel of the library on
the current GPU vs the golden model: the first thing to run on a new GPU) and
prints one line per kernel.
Exit code 0 = pass, 1 = a check failed, 3 = no usable GPU / library error.
Without a GPU nothing runs: it prints the library's reason (m3qkv.backend()'s
message: no driver, an old driver, no GPU) and exits 3. (The C demo,
`bash tools/run_demo.sh`, runs the CPU golden model instead and exits 0 when
its checks pass: 0 always means that checks ran and passed.)
"""
from __future__ import annotations

import argparse
import random
import sys
import time

import torch

K, NQ, NKV, NIQ, NIK, BLOCK, MAX_POS = 6144, 16, 1, 1, 1, 128, 8192
N = (NQ + 2 * NKV + NIQ + NIK) * 128


def build(m: int, exact: bool, g: torch.Generator, dev, q_bf16: bool, q_fp8: bool):
    import m3qkv
    from m3qkv import reference as ref
    if exact:
        xq, xsf, wq, wsf = ref.make_exact_operands(m, K, N, g, dev)
        xq, wq = xq.view(torch.float8_e4m3fn), wq.view(torch.float8_e4m3fn)
        x = None
    else:
        rs = torch.exp2(torch.rand(m, 1, generator=g) * 4 - 2)
        xf = torch.randn(m, K, generator=g) * rs
        xf = torch.where(torch.rand(m, K, generator=g) < 1e-3, xf * 30, xf)
        x = xf.to(torch.bfloat16).to(dev)
        xq, xsf = m3qkv.mxfp8_quantize(x)
        wq, wsf = m3qkv.mxfp8_quantize((torch.randn(N, K, generator=g) * 0.02).to(torch.bfloat16).to(dev))
    pages = max(2, (2 * m + BLOCK - 1) // BLOCK)
    w = lambda: (torch.randn(128, generator=g) * 0.1).to(torch.bfloat16).to(dev)  # noqa: E731
    p = dict(x=x, xq=xq, xsf=xsf, wq=wq, wsf=wsf, positions=torch.randint(0, MAX_POS, (m,), generator=g).to(dev),
             cos_sin_cache=ref.rope_table(MAX_POS, dev), q_norm_weight=w(), k_norm_weight=w(),
             index_q_norm_weight=w(), index_k_norm_weight=w(), eps=1e-6,
             slot_mapping=ref.unique_slots(m, pages * BLOCK, g, 0.05).to(dev),
             index_slot_mapping=ref.unique_slots(m, pages * BLOCK, g, 0.05).to(dev), pages=pages)
    return p


def outputs(p, m, dev, q_bf16, q_fp8, poison=0xA5):
    def full(shape, dtype):
        return torch.full(shape, poison, dtype=torch.uint8, device=dev).view(dtype)
    return dict(q_out=full((m, NQ * 256), torch.uint8).view(torch.bfloat16) if q_bf16 else None,
                q_fp8_out=full((m, NQ * 128), torch.float8_e4m3fn) if q_fp8 else None,
                index_q_out=full((m, NIQ * 128), torch.float8_e4m3fn),
                kv_cache=full((p["pages"], 2 * NKV, BLOCK, 72), torch.uint8),
                index_cache=full((p["pages"], BLOCK, 72), torch.uint8))


def run(p, o, flags):
    import m3qkv
    m3qkv.fused_qkv(p["xq"], p["xsf"], p["wq"], p["wsf"], p["positions"], p["cos_sin_cache"], p["q_norm_weight"],
                    p["k_norm_weight"], p["index_q_norm_weight"], p["index_k_norm_weight"], p["eps"],
                    slot_mapping=p["slot_mapping"], index_slot_mapping=p["index_slot_mapping"],
                    kv_cache=o["kv_cache"], index_cache=o["index_cache"], index_q_out=o["index_q_out"],
                    q_out=o["q_out"], q_fp8_out=o["q_fp8_out"], error_flags=flags)


def reference(p, m, dev, q_bf16, q_fp8):
    from m3qkv import reference as ref
    acc = ref.mxfp8_acc(p["xq"].view(torch.uint8), p["xsf"], p["wq"].view(torch.uint8), p["wsf"])
    o = outputs(p, m, dev, q_bf16, q_fp8)
    flags = ref.epilogue(acc, nq=NQ, nkv=NKV, niq=NIQ, nik=NIK, positions=p["positions"],
                         cos_sin_cache=p["cos_sin_cache"], q_norm_weight=p["q_norm_weight"],
                         k_norm_weight=p["k_norm_weight"], index_q_norm_weight=p["index_q_norm_weight"],
                         index_k_norm_weight=p["index_k_norm_weight"], eps=p["eps"], slot_mapping=p["slot_mapping"],
                         index_slot_mapping=p["index_slot_mapping"], kv_cache=o["kv_cache"],
                         index_cache=o["index_cache"], q_out=o["q_out"], q_fp8_out=o["q_fp8_out"],
                         index_q_out=o["index_q_out"])
    return o, flags


def e4m3_steps(a, b):
    """|difference| of two e4m3 tensors in code steps (sign-magnitude order)."""
    def ordinal(t):
        u = t.view(torch.uint8).to(torch.int32)
        mag = u & 0x7F
        return torch.where(u & 0x80 != 0, -mag, mag)
    return (ordinal(a) - ordinal(b)).abs()


def compare(want, got, exact: bool):
    """-> (ok, list of report lines)."""
    lines, ok = [], True
    for name in ("q_out", "q_fp8_out", "index_q_out", "kv_cache", "index_cache"):
        a, b = want[name], got[name]
        if a is None:
            continue
        ab, bb = a.contiguous().view(torch.uint8).reshape(-1), b.contiguous().view(torch.uint8).reshape(-1)
        same = (ab == bb).float().mean().item()
        if exact:
            good = same == 1.0
            lines.append(f"  {name:12s} {'bit-exact' if good else f'MISMATCH: {100 * (1 - same):.4f} % of bytes differ'}")
        elif name == "q_out":
            from m3qkv import reference as ref
            worst = ref.bf16_ulps_at_head_scale(a, b.to(a.device)).max().item()
            good = worst <= 1.0
            lines.append(f"  {name:12s} {100 * same:8.4f} % identical, max |diff| {worst:.0f} bf16 ulp at the head "
                         f"row's scale (limit 1)")
        elif name in ("q_fp8_out", "index_q_out"):
            worst = e4m3_steps(a, b).max().item()
            good = worst <= 1
            lines.append(f"  {name:12s} {100 * same:8.4f} % identical, max |diff| {worst} e4m3 step (limit 1)")
        else:  # over the bytes either side wrote (the rest is poison on both)
            written = (ab != 0xA5) | (bb != 0xA5)
            same = (ab[written] == bb[written]).float().mean().item() if written.any() else 0.0
            good = same >= 0.99
            lines.append(f"  {name:12s} {100 * same:8.4f} % of the written bytes identical (limit 99 %)")
        ok &= good
    return ok, lines


def print_selftest(r) -> None:
    cc = "%d.%d" % r["compute_capability"]
    print(f"self-test (m3qkv.selftest) on device {r['device']}, CC {cc}: {r['problems']} built-in exact-data "
          f"problems, {r['total_us'] / 1000:.1f} ms")
    for k in r["kernels"]:
        detail = k["message"]
        if k["result"] == "pass":
            detail = "every byte = golden" + (" = portable" if k["portable_agrees"] else "") + \
                (f"; {detail}" if detail else "")
        time = "-" if k["result"] == "not available" else f"{k['time_us'] / 1000:.2f} ms"
        print(f"  {k['name']:<18} {k['result'].upper() if k['result'] != 'not available' else k['result']:<13} "
              f"{k['problems'] if k['result'] != 'not available' else '-':>8} {time:>10}  {detail}")
    print(f"  => {r['status']}: {r['message']}")


def no_gpu_reason() -> str:
    """Why there is no usable GPU, in the library's words when it can say."""
    import m3qkv
    try:
        m3qkv.backend(0)
    except m3qkv.M3qkvError as e:
        return str(e)
    except ImportError as e:  # no libm3qkv.so to ask
        return f"{e}; torch.cuda.is_available() is False"
    return "torch.cuda.is_available() is False (torch without CUDA support?)"


def run_selftest() -> int:
    import m3qkv
    if not torch.cuda.is_available():
        print(f"m3qkv self-test: {no_gpu_reason()}")
        print("m3qkv self-test: no CUDA driver / no GPU: nothing to test")
        return 3
    try:
        r = m3qkv.selftest(torch.cuda.current_device())
    except (m3qkv.M3qkvError, ImportError) as e:
        print(f"m3qkv self-test: {e}")
        return 3
    print_selftest(r)
    return 0 if r["passed"] else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m m3qkv.demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--m", type=int, default=256, help="tokens (default 256)")
    ap.add_argument("--reps", type=int, default=20, help="timed calls (default 20)")
    ap.add_argument("--seed", type=int, default=0, help="data seed (default: random, printed)")
    ap.add_argument("--q", choices=["bf16", "fp8", "both"], default="both", help="q outputs to write (default both)")
    ap.add_argument("--selftest", action="store_true",
                    help="run only m3qkv.selftest() on the current GPU and print its report")
    a = ap.parse_args(argv)
    if a.selftest:
        return run_selftest()
    if a.m < 1 or a.reps < 1:
        ap.error("--m and --reps must be >= 1")
    seed = a.seed or random.SystemRandom().randrange(1, 2**31)
    q_bf16, q_fp8 = a.q in ("bf16", "both"), a.q in ("fp8", "both")
    print(f"m3qkv demo (Python) — MiniMax-M3 TP4 (K {K}, N {N}, nq {NQ}, nkv {NKV}, niq {NIQ}, nik {NIK}, "
          f"block {BLOCK}), M = {a.m}, seed {seed}")
    if not torch.cuda.is_available():
        print(f"m3qkv: {no_gpu_reason()}")
        print("NOTE: no CUDA driver / no GPU: nothing ran (the Python demo checks GPU results only; "
              "`bash tools/run_demo.sh` runs the CPU golden model alone).")
        print("verdict: NOT RUN")
        return 3
    import m3qkv
    from m3qkv import reference as ref
    dev = torch.device("cuda", torch.cuda.current_device())
    try:
        r = m3qkv.selftest(torch.cuda.current_device())
        print_selftest(r)
        backend = m3qkv.backend()
        m3qkv.warmup()
    except m3qkv.M3qkvError as e:
        print(f"m3qkv error: {e}")
        return 3
    prop = torch.cuda.get_device_properties(dev)
    print(f"device {dev.index}: {prop.name} (CC {prop.major}.{prop.minor}, {prop.multi_processor_count} SMs), "
          f"backend: {backend}, library {m3qkv.library().path}")
    g = torch.Generator().manual_seed(seed)
    ok = r["passed"]

    # 1 + 2: random activations
    p = build(a.m, False, g, dev, q_bf16, q_fp8)
    rq, rsf = ref.mxfp8_quantize(p["x"])
    qok = torch.equal(rq, p["xq"].view(torch.uint8)) and torch.equal(rsf, p["xsf"])
    print(f"check 1  m3qkv.mxfp8_quantize vs the reference quantizer: {'bit-exact' if qok else 'MISMATCH'}")
    ok &= qok
    got = outputs(p, a.m, dev, q_bf16, q_fp8)
    flags = torch.zeros(1, dtype=torch.int32, device=dev)
    run(p, got, flags)
    want, wflags = reference(p, a.m, dev, q_bf16, q_fp8)
    rok, lines = compare(want, got, exact=False)
    fok = flags.item() == wflags
    print(f"check 2  fused_qkv on random data vs the reference on the f64 accumulator: "
          f"{'within tolerance' if rok and fok else 'OUT OF TOLERANCE'}")
    print("\n".join(lines))
    ok &= rok and fok

    # 3: exact data
    pe = build(a.m, True, g, dev, q_bf16, q_fp8)
    gote = outputs(pe, a.m, dev, q_bf16, q_fp8)
    fe = torch.zeros(1, dtype=torch.int32, device=dev)
    run(pe, gote, fe)
    wante, wfe = reference(pe, a.m, dev, q_bf16, q_fp8)
    eok, lines = compare(wante, gote, exact=True)
    eok &= fe.item() == wfe
    print(f"check 3  fused_qkv on exact data vs the reference (every byte): {'bit-exact' if eok else 'MISMATCH'}")
    print("\n".join(lines))
    ok &= eok

    # 4: timing (L2 flushed before each call) and host overhead of one call
    flush = torch.empty(2 * max(prop.L2_cache_size, 1 << 20), dtype=torch.uint8, device=dev)
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(a.reps)]
    for _ in range(3):
        run(p, got, flags)
    for i, (e0, e1) in enumerate(ev):
        flush.fill_(i & 0xFF)
        e0.record()
        run(p, got, flags)
        e1.record()
    torch.cuda.synchronize()
    ms = [e0.elapsed_time(e1) for e0, e1 in ev]
    t = sum(ms) / len(ms) * 1e-3
    host = []
    for _ in range(50):
        t0 = time.perf_counter()
        run(p, got, flags)
        host.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
    mb = (N * K + a.m * K + a.m * (NQ * 128 * (2 * q_bf16 + q_fp8) + NIQ * 128 + (2 * NKV + NIK) * 72)) * 1e-6
    print(f"time per call (L2 flushed, {a.reps} reps): mean {t * 1e6:.2f} us, best {min(ms) * 1e3:.2f} us; "
          f"host time of one eager call {sorted(host)[len(host) // 2] * 1e6:.1f} us (median)")
    print(f"achieved: {mb / 1e3 / t:.1f} GB/s ({mb:.2f} MB moved at least once), "
          f"{2.0 * a.m * N * K / t * 1e-12:.1f} TFLOP/s")
    print(f"verdict: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
