"""ctypes access to the C golden model (tests/tools/golden_capi.cpp): runs it on
CPU torch tensors (host pointers) with the package's own struct mirrors."""
import ctypes

import torch

from m3qkv import _capi


def _ptr(t):
    return None if t is None else t.data_ptr()


class Golden:
    def __init__(self, path):
        self.dll = ctypes.CDLL(path)
        d = self.dll
        for name in ("m3qkv_golden_sizeof_fused", "m3qkv_golden_sizeof_insert", "m3qkv_golden_sizeof_gemm"):
            getattr(d, name).restype = ctypes.c_size_t
        vp = ctypes.c_void_p
        d.m3qkv_golden_epilogue.argtypes = [vp, vp, vp]
        d.m3qkv_golden_acc.argtypes = [vp, ctypes.c_int64, vp]
        d.m3qkv_golden_fused.argtypes = [vp, vp]
        d.m3qkv_golden_insert.argtypes = [vp, vp]
        d.m3qkv_golden_gemm.argtypes = [vp]
        d.m3qkv_golden_quantize.argtypes = [vp, ctypes.c_int64, ctypes.c_int64, vp, vp]
        self.fused_cls = self._cls(d.m3qkv_golden_sizeof_fused(), _capi.STRUCTS["fused"][1])
        self.insert_cls = self._cls(d.m3qkv_golden_sizeof_insert(), _capi.STRUCTS["insert"][1])
        assert d.m3qkv_golden_sizeof_gemm() == ctypes.sizeof(_capi.GemmArgs)

    @staticmethod
    def _cls(size, layouts):
        for c in layouts:
            if ctypes.sizeof(c) == size:
                return c
        raise AssertionError(f"golden model struct of {size} bytes matches no ctypes mirror")

    def _fill(self, a, p, out):
        a.struct_size = ctypes.sizeof(a)
        a.m = p["m"]
        a.nq, a.nkv, a.niq, a.nik = p["nq"], p["nkv"], p["niq"], p["nik"]
        a.positions = _ptr(p["positions"])
        a.max_position = p["cos_sin_cache"].shape[0]
        a.cos_sin_cache = _ptr(p["cos_sin_cache"])
        a.q_norm_weight, a.k_norm_weight = _ptr(p["q_norm_weight"]), _ptr(p["k_norm_weight"])
        a.index_q_norm_weight = _ptr(p.get("index_q_norm_weight"))
        a.index_k_norm_weight = _ptr(p.get("index_k_norm_weight"))
        a.eps = p["eps"]
        a.slot_mapping, a.index_slot_mapping = _ptr(p["slot_mapping"]), _ptr(p.get("index_slot_mapping"))
        kv, ix = out["kv_cache"], out.get("index_cache")
        a.kv_cache, a.kv_page_stride, a.num_blocks = kv.data_ptr(), kv.stride(0), kv.shape[0]
        if ix is not None:
            a.index_cache, a.index_page_stride, a.num_index_blocks = ix.data_ptr(), ix.stride(0), ix.shape[0]
        a.block_size = kv.shape[2]
        a.q_out, a.q_fp8_out, a.index_q_out = _ptr(out.get("q_out")), _ptr(out.get("q_fp8_out")), \
            _ptr(out.get("index_q_out"))
        a.q_fp8_scale, a.k_scale, a.v_scale = p["q_fp8_scale"], p["k_scale"], p["v_scale"]

    def fused_args(self, p, out):
        """p["x_bf16"] (bf16 [M, K]), when present and not None, replaces xq / xsf."""
        a = self.fused_cls()
        self._fill(a, p, out)
        xb = p.get("x_bf16")
        a.k = (p["xq"] if xb is None else xb).shape[1]
        a.wq, a.wsf = _ptr(p["wq"]), _ptr(p["wsf"])
        if xb is None:
            a.xq, a.xsf = _ptr(p["xq"]), _ptr(p["xsf"])
        else:
            assert hasattr(a, "x_bf16"), "the golden model predates x_bf16"
            a.xq, a.xsf, a.x_bf16 = None, None, _ptr(xb)
        return a

    def epilogue(self, p, acc, out):
        """Golden epilogue on acc (f32 CPU [m, N]) into the CPU tensors of `out`; returns flags."""
        a = self.fused_args(p, out)
        flags = ctypes.c_uint32(0)
        self.dll.m3qkv_golden_epilogue(ctypes.addressof(a), acc.contiguous().data_ptr(), ctypes.addressof(flags))
        return flags.value

    def fused(self, p, out):
        a = self.fused_args(p, out)
        flags = ctypes.c_uint32(0)
        self.dll.m3qkv_golden_fused(ctypes.addressof(a), ctypes.addressof(flags))
        return flags.value

    def acc(self, p):
        n = p["wq"].shape[0]
        acc = torch.empty(p["m"], n, dtype=torch.float32)
        a = self.fused_args(p, {"kv_cache": torch.empty(1, 1, 4, 72, dtype=torch.uint8)})
        self.dll.m3qkv_golden_acc(ctypes.addressof(a), n, acc.data_ptr())
        return acc

    def insert(self, p, qkv, out):
        a = self.insert_cls()
        self._fill(a, p, out)
        a.qkv = qkv.data_ptr()
        flags = ctypes.c_uint32(0)
        self.dll.m3qkv_golden_insert(ctypes.addressof(a), ctypes.addressof(flags))
        return flags.value

    def quantize(self, x):
        m, k = x.shape
        from m3qkv.reference import f8_128x4_bytes
        xq = torch.empty(m, k, dtype=torch.uint8)
        xsf = torch.empty(f8_128x4_bytes(m, k // 32), dtype=torch.uint8)
        self.dll.m3qkv_golden_quantize(x.contiguous().data_ptr(), m, k, xq.data_ptr(), xsf.data_ptr())
        return xq, xsf

    def gemm(self, p):
        xb = p.get("x_bf16")
        m, k = (p["xq"] if xb is None else xb).shape
        n = p["wq"].shape[0]
        out = torch.empty(m, n, dtype=torch.bfloat16)
        a = _capi.GemmArgs()
        a.struct_size = ctypes.sizeof(a)
        a.m, a.n, a.k = m, n, k
        a.wq, a.wsf = _ptr(p["wq"]), _ptr(p["wsf"])
        if xb is None:
            a.xq, a.xsf = _ptr(p["xq"]), _ptr(p["xsf"])
        else:
            a.x_bf16 = _ptr(xb)
        a.out = out.data_ptr()
        self.dll.m3qkv_golden_gemm(ctypes.addressof(a))
        return out
