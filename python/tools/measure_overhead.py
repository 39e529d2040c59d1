"""Eager per-call host overhead of the Python layer over the C call.

    python python/tools/measure_overhead.py [--m 1,64] [--calls 50] [--batches 400]
    python python/tools/measure_overhead.py --host-only     # no GPU needed

GPU mode (TP4, K = 6144, NVFP4 caches, block 128): for each M it times the
host side of one fused call in four ways, each as the median over `batches`
of (time to enqueue `calls` calls) / calls, with a synchronize between
batches (the GPU work of one batch is far longer than its enqueue, so the
launch queue never fills and blocks the host):
  c_call      lib.m3qkv_fused_qkv(&args, stream) through ctypes with a struct
              filled once: the floor (validation + launch in C, plus ctypes);
  direct      m3qkv.fused_qkv(...): the module function (checks, struct fill,
              current stream, C call), no dispatcher;
  torch.ops   torch.ops.m3qkv.fused_qkv(...): through the dispatcher, to the C++
              kernel when m3qkv.torch_ops() says c++, else the ctypes one
              (M3QKV_TORCH_OPS=ctypes times that one);
  graph       one replay of a CUDA graph holding one call (for comparison).
The overhead of the Python layer is direct - c_call (goal <= 10 us) and
torch.ops - c_call.

--host-only: the same tensors on the CPU with M = 0 (the C library validates
and returns before touching a device): times the checks + struct fill + C
validation, and the C call alone, without a GPU.
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import time

import torch

import m3qkv
from m3qkv import _capi, _ops

K, NQ, NKV, NIQ, NIK, BS = 6144, 16, 1, 1, 1, 128
N = (NQ + 2 * NKV + NIQ + NIK) * 128


def tensors(m, dev):
    e4 = torch.float8_e4m3fn
    pages = max(2, (2 * m + BS - 1) // BS)
    sf = lambda r: (r + 127) // 128 * 128 * (K // 32)  # noqa: E731
    a = [torch.zeros(m, K, dtype=torch.uint8, device=dev).view(e4), torch.full((sf(m),), 127, dtype=torch.uint8, device=dev),
         torch.zeros(N, K, dtype=torch.uint8, device=dev).view(e4), torch.full((sf(N),), 127, dtype=torch.uint8, device=dev),
         torch.zeros(m, dtype=torch.int64, device=dev), torch.zeros(4096, 64, dtype=torch.bfloat16, device=dev)] + \
        [torch.zeros(128, dtype=torch.bfloat16, device=dev) for _ in range(4)] + [1e-6]
    kw = dict(slot_mapping=torch.arange(m, dtype=torch.int64, device=dev),
              index_slot_mapping=torch.arange(m, dtype=torch.int64, device=dev),
              kv_cache=torch.zeros(pages, 2 * NKV, BS, 72, dtype=torch.uint8, device=dev),
              index_cache=torch.zeros(pages, BS, 72, dtype=torch.uint8, device=dev),
              index_q_out=torch.empty(m, NIQ * 128, dtype=torch.uint8, device=dev).view(e4),
              q_out=torch.empty(m, NQ * 128, dtype=torch.bfloat16, device=dev))
    return a, kw


def per_call(fn, calls, batches, sync):
    for _ in range(3):
        fn()
    sync()
    ts = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        ts.append((time.perf_counter() - t0) / calls)
        sync()
    return statistics.median(ts) * 1e6


def host_only(calls, batches):
    a, kw = tensors(0, "cpu")
    lib = _capi.library()
    _, args = _ops.fused_qkv_args(*a, **kw)
    addr = ctypes.addressof(args)
    f = lib.fused_qkv

    def c_call():
        f(addr, None)

    def py():
        _, s = _ops.fused_qkv_args(*a, **kw)
        f(ctypes.addressof(s), None)

    def checks_only():
        _ops._check_fused(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], kw["slot_mapping"],
                          kw["index_slot_mapping"], kw["kv_cache"], kw["index_cache"], kw["index_q_out"],
                          kw["q_out"], None, None, None, None, None, None, None, False)

    packer = _ops._packer()[0]
    s = _capi.FusedArgs()
    sa = ctypes.addressof(s)
    d = dict(q_fp8_out=None, q_fp8_scale=1.0, k_scale=1.0, v_scale=1.0, cta_group=None, use_pdl=True, grid=None,
             v_cache=None, nq=None, nkv=None, niq=None, nik=None, error_flags=None)
    d.update(kw)

    def fast():  # what m3qkv.fused_qkv does in eager mode, minus the device/stream queries
        r = _ops.fused_fast_args(*a, d["slot_mapping"], d["index_slot_mapping"], d["kv_cache"], d["index_cache"],
                                 d["index_q_out"], d["q_out"], d["q_fp8_out"], d["q_fp8_scale"], d["k_scale"],
                                 d["v_scale"], d["cta_group"], d["use_pdl"], d["grid"], d["v_cache"], d["nq"],
                                 d["nkv"], d["niq"], d["nik"], d["error_flags"])
        packer.pack_into(s, 0, *r[1])
        f(sa, None)

    nop = lambda: None  # noqa: E731
    c = per_call(c_call, calls, batches, nop)
    fp = per_call(fast, calls, batches, nop)
    p = per_call(py, calls, batches, nop)
    ch = per_call(checks_only, calls, batches, nop)
    print(f"host-only (CPU tensors, M = 0, {calls} calls x {batches} batches, median per call):")
    print(f"  c_call (C validation + ctypes)            {c:7.2f} us")
    print(f"  eager fast path: flat checks + pack + C   {fp:7.2f} us   -> Python layer adds {fp - c:.2f} us")
    print(f"  full checks + field-wise fill + C         {p:7.2f} us   -> {p - c:.2f} us (fallback path)")
    print(f"    of which the full argument checks       {ch:7.2f} us")


def gpu(ms, calls, batches):
    dev = torch.device("cuda", torch.cuda.current_device())
    lib = _capi.library()
    m3qkv.warmup()
    print(f"{torch.cuda.get_device_name(dev)}, backend {m3qkv.backend()}, torch {torch.__version__}, "
          f"{calls} calls x {batches} batches, median host time per call:")
    ops = m3qkv.torch_ops()
    print(f"torch.ops.m3qkv.*: {ops['impl']} kernels ({ops['library'] or ops['reason']})")
    print(f"{'M':>6} {'c_call':>9} {'direct':>9} {'torch.ops':>10} {'graph':>9} {'direct-c':>9} {'ops-c':>9}")
    for m in ms:
        a, kw = tensors(m, dev)
        _, args = _ops.fused_qkv_args(*a, **kw)
        fixed = _capi.FusedArgs.from_buffer_copy(args)
        addr, f = ctypes.addressof(fixed), lib.fused_qkv
        stream = torch.cuda.current_stream(dev).cuda_stream

        def c_call():
            st = f(addr, stream)
            if st:
                raise lib.error(st)

        direct = lambda: m3qkv.fused_qkv(*a, **kw)  # noqa: E731
        op = lambda: torch.ops.m3qkv.fused_qkv(*a, **kw)  # noqa: E731
        sync = torch.cuda.synchronize
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            direct()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            direct()
        r = [per_call(fn, calls, batches, sync) for fn in (c_call, direct, op, g.replay)]
        print(f"{m:6d} {r[0]:9.2f} {r[1]:9.2f} {r[2]:10.2f} {r[3]:9.2f} {r[1] - r[0]:9.2f} {r[2] - r[0]:9.2f}")
    print("us per call; direct-c is the Python layer's eager overhead (goal <= 10 us), ops-c with the dispatcher")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--m", default="1,64", help="comma-separated token counts (default 1,64)")
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--batches", type=int, default=400)
    ap.add_argument("--host-only", action="store_true", help="CPU tensors, M = 0: no GPU needed")
    a = ap.parse_args()
    if a.host_only or not torch.cuda.is_available():
        if not a.host_only:
            print("no CUDA device: measuring the host-only path")
        host_only(a.calls, a.batches)
    else:
        gpu([int(x) for x in a.m.split(",")], a.calls, a.batches)


if __name__ == "__main__":
    main()
