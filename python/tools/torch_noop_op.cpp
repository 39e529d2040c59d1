// m3qkv_overhead::fused_qkv_noop_stable: fused_qkv's schema and C++ signature
// registered through libtorch's stable ABI exactly as python/csrc/m3qkv_torch_ops.cpp
// registers fused_qkv, with a kernel that returns at once. Built only for
// python/tools/measure_overhead.py: the floor of the dispatcher, the stable
// ABI's boxing and the argument conversion for this schema, which no kernel
// of that shape can go below.
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>

#include <optional>

using torch::stable::Tensor;
using OptTensor = std::optional<Tensor>;
using OptInt = std::optional<int64_t>;

namespace {

// The schema string of python/m3qkv/_ops.py's SCHEMAS["fused_qkv"] under another name
// (measure_overhead.py checks that the two agree after the rename).
constexpr const char* kNoopSchema =
    "fused_qkv_noop_stable(Tensor? xq, Tensor? xsf, Tensor wq, Tensor wsf, Tensor positions, Tensor cos_sin_cache, "
    "Tensor q_norm_weight, Tensor k_norm_weight, Tensor? index_q_norm_weight, Tensor? index_k_norm_weight, "
    "float eps, *, Tensor slot_mapping, Tensor? index_slot_mapping, Tensor(a!) kv_cache, Tensor(b!)? index_cache, "
    "Tensor(c!)? index_q_out, Tensor(d!)? q_out=None, Tensor(e!)? q_fp8_out=None, "
    "float q_fp8_scale=1.0, float k_scale=1.0, float v_scale=1.0, int? cta_group=None, "
    "bool use_pdl=True, int? grid=None, Tensor(f!)? v_cache=None, int? nq=None, int? nkv=None, "
    "int? niq=None, int? nik=None, Tensor(g!)? error_flags=None, Tensor? x_bf16=None) -> ()";

void fused_qkv_noop(const OptTensor&, const OptTensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                    const Tensor&, const Tensor&, const OptTensor&, const OptTensor&, double, const Tensor&,
                    const OptTensor&, const Tensor&, const OptTensor&, const OptTensor&, const OptTensor&,
                    const OptTensor&, double, double, double, OptInt, bool, OptInt, const OptTensor&, OptInt, OptInt,
                    OptInt, OptInt, const OptTensor&, const OptTensor&) {}

}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(m3qkv_overhead, m) { m.def(kNoopSchema); }

STABLE_TORCH_LIBRARY_IMPL(m3qkv_overhead, CPU, m) { m.impl("fused_qkv_noop_stable", TORCH_BOX(&fused_qkv_noop)); }
STABLE_TORCH_LIBRARY_IMPL(m3qkv_overhead, CUDA, m) { m.impl("fused_qkv_noop_stable", TORCH_BOX(&fused_qkv_noop)); }
