// torch custom ops m3qkv::{fused_qkv, qknorm_rope_kv_insert, mxfp8_gemm,
// mxfp8_quantize} in C++ through libtorch's stable ABI (torch/csrc/stable,
// the C shim): built for the version TORCH_TARGET_VERSION names (2.10, set by
// CMakeLists.txt), one build is meant to load in that torch and every later
// one, as the ctypes path does (tested with torch 2.11).
//
// Ownership (python/m3qkv/_native.py): `import m3qkv` loads this library
// with torch.ops.load_library before python/m3qkv/_ops.py declares anything;
// its static initializers below define the four schemas and register the
// CUDA and CPU kernels; _ops.py then registers the fake (meta) kernels and
// the backend op in Python and binds the library to the libm3qkv.so that
// ctypes loaded (m3qkv_torch_ops_bind below: the same library instance, so
// m3qkv.library(), M3QKV_LIBRARY and m3qkv_set_backend act on these ops too).
//
// Each kernel runs the argument checks of python/m3qkv/_ops.py (_check_*,
// rule for rule, in the same order, with the same messages: the tests
// compare the two on every error case), fills the C struct as _ops.py's
// _fill_epilogue does, and calls the C API on the current CUDA stream of the
// tensors' device. No host synchronization: capturable into CUDA graphs.
// Errors: a bad argument is std::invalid_argument (ValueError in Python), a
// C error carries m3qkv_last_error() ("M3QKV_ERROR_<NAME>: message") as
// std::invalid_argument for the caller's errors and std::runtime_error for
// the rest (ValueError / RuntimeError; the ctypes path raises the
// M3qkvValueError / M3qkvRuntimeError subclasses of the same two).
// CPU tensors pass the checks and are then refused by name, as in _ops.py.
#include <m3qkv/m3qkv.h>

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>

using torch::stable::Tensor;
using OptTensor = std::optional<Tensor>;
using OptInt = std::optional<int64_t>;

#define M3QKV_TORCH_OPS_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

// ------------------------------------------------------------ schemas
// Exactly the strings of python/m3qkv/_ops.py (SCHEMAS); _native.py compares
// the registered schemas with the parsed Python ones at import.
#define M3QKV_EPILOGUE_KW                                                                                  \
  "Tensor slot_mapping, Tensor? index_slot_mapping, Tensor(a!) kv_cache, Tensor(b!)? index_cache, "        \
  "Tensor(c!)? index_q_out, Tensor(d!)? q_out=None, Tensor(e!)? q_fp8_out=None, "                          \
  "float q_fp8_scale=1.0, float k_scale=1.0, float v_scale=1.0"
#define M3QKV_EPILOGUE_TAIL                                                                                \
  "bool use_pdl=True, int? grid=None, Tensor(f!)? v_cache=None, int? nq=None, int? nkv=None, "             \
  "int? niq=None, int? nik=None, Tensor(g!)? error_flags=None"

constexpr const char* kFusedSchema =
    "fused_qkv(Tensor? xq, Tensor? xsf, Tensor wq, Tensor wsf, Tensor positions, Tensor cos_sin_cache, "
    "Tensor q_norm_weight, Tensor k_norm_weight, Tensor? index_q_norm_weight, Tensor? index_k_norm_weight, "
    "float eps, *, " M3QKV_EPILOGUE_KW ", int? cta_group=None, " M3QKV_EPILOGUE_TAIL
    ", Tensor? x_bf16=None) -> ()";
constexpr const char* kInsertSchema =
    "qknorm_rope_kv_insert(Tensor qkv, Tensor positions, Tensor cos_sin_cache, Tensor q_norm_weight, "
    "Tensor k_norm_weight, Tensor? index_q_norm_weight, Tensor? index_k_norm_weight, float eps, *, "
    M3QKV_EPILOGUE_KW ", " M3QKV_EPILOGUE_TAIL ") -> ()";
constexpr const char* kGemmSchema =
    "mxfp8_gemm(Tensor? xq, Tensor? xsf, Tensor wq, Tensor wsf, *, bool use_pdl=True, int? grid=None, "
    "Tensor? x_bf16=None) -> Tensor";
constexpr const char* kQuantizeSchema = "mxfp8_quantize(Tensor x, *, bool use_pdl=True) -> (Tensor, Tensor)";

// ------------------------------------------------------------ binding
// The C API of the libm3qkv.so that ctypes loaded (m3qkv_torch_ops_bind).
struct Api {
  m3qkv_status (*fused_qkv)(const m3qkv_fused_args*, cudaStream_t);
  m3qkv_status (*qknorm_rope_kv_insert)(const m3qkv_insert_args*, cudaStream_t);
  m3qkv_status (*mxfp8_gemm)(const m3qkv_gemm_args*, cudaStream_t);
  m3qkv_status (*mxfp8_quantize)(const m3qkv_quantize_args*, cudaStream_t);
  const char* (*last_error)(void);
  const char* (*status_string)(m3qkv_status);
};
Api g_api;
std::atomic<bool> g_bound{false};

const Api& api() {
  if (!g_bound.load(std::memory_order_acquire)) {
    throw std::runtime_error(
        "m3qkv torch ops: libm3qkv_torch_ops.so is not bound to a libm3qkv.so (`import m3qkv` loads and binds "
        "it; torch.ops.load_library alone does not)");
  }
  return g_api;
}

// ------------------------------------------------------------ tensors
using torch::headeronly::ScalarType;
constexpr int32_t dt(ScalarType s) { return static_cast<int32_t>(s); }
constexpr int32_t kU8 = dt(ScalarType::Byte), kI32 = dt(ScalarType::Int), kI64 = dt(ScalarType::Long),
                  kU32 = dt(ScalarType::UInt32), kBF16 = dt(ScalarType::BFloat16),
                  kE4M3 = dt(ScalarType::Float8_e4m3fn), kE8M0 = dt(ScalarType::Float8_e8m0fnu);

void check(AOTITorchError e, const char* what) {
  if (e != AOTI_TORCH_SUCCESS) throw std::runtime_error(std::string("m3qkv torch ops: ") + what + " failed");
}

// torch's str(dtype)
std::string dtype_name(int32_t d) {
  switch (static_cast<ScalarType>(d)) {
    case ScalarType::Byte: return "torch.uint8";
    case ScalarType::Char: return "torch.int8";
    case ScalarType::Short: return "torch.int16";
    case ScalarType::Int: return "torch.int32";
    case ScalarType::Long: return "torch.int64";
    case ScalarType::Half: return "torch.float16";
    case ScalarType::Float: return "torch.float32";
    case ScalarType::Double: return "torch.float64";
    case ScalarType::ComplexHalf: return "torch.complex32";
    case ScalarType::ComplexFloat: return "torch.complex64";
    case ScalarType::ComplexDouble: return "torch.complex128";
    case ScalarType::Bool: return "torch.bool";
    case ScalarType::BFloat16: return "torch.bfloat16";
    case ScalarType::Float8_e5m2: return "torch.float8_e5m2";
    case ScalarType::Float8_e4m3fn: return "torch.float8_e4m3fn";
    case ScalarType::Float8_e5m2fnuz: return "torch.float8_e5m2fnuz";
    case ScalarType::Float8_e4m3fnuz: return "torch.float8_e4m3fnuz";
    case ScalarType::UInt16: return "torch.uint16";
    case ScalarType::UInt32: return "torch.uint32";
    case ScalarType::UInt64: return "torch.uint64";
    case ScalarType::Float8_e8m0fnu: return "torch.float8_e8m0fnu";
    case ScalarType::Float4_e2m1fn_x2: return "torch.float4_e2m1fn_x2";
    default: return std::string("torch.") + torch::headeronly::toString(static_cast<ScalarType>(d));
  }
}

struct Dev {
  int32_t type = 0;
  int32_t index = -1;
  bool operator==(const Dev& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Dev& o) const { return !(*this == o); }
  bool cuda() const { return type == aoti_torch_device_type_cuda(); }
  // torch's str(device)
  std::string str() const {
    std::string s = type == aoti_torch_device_type_cpu()    ? "cpu"
                    : type == aoti_torch_device_type_cuda() ? "cuda"
                    : type == aoti_torch_device_type_meta() ? "meta"
                                                            : "device type " + std::to_string(type);
    return index >= 0 ? s + ":" + std::to_string(index) : s;
  }
};

// One tensor argument, read once through the C shim; h == nullptr for None
// (and for an undefined tensor: Python's None for a `Tensor` argument).
struct T {
  AtenTensorHandle h = nullptr;
  int32_t dtype = -1;
  Dev dev;
  int64_t ndim = 0;
  const int64_t* sz = nullptr;
  const int64_t* st = nullptr;

  T() = default;
  explicit T(const Tensor& t) {
    bool defined = false;
    check(aoti_torch_is_defined(t.get(), &defined), "aoti_torch_is_defined");
    if (!defined) return;
    h = t.get();
    check(aoti_torch_get_dtype(h, &dtype), "aoti_torch_get_dtype");
    check(aoti_torch_get_device_type(h, &dev.type), "aoti_torch_get_device_type");
    check(aoti_torch_get_device_index(h, &dev.index), "aoti_torch_get_device_index");
    check(aoti_torch_get_dim(h, &ndim), "aoti_torch_get_dim");
    int64_t* p = nullptr;
    check(aoti_torch_get_sizes(h, &p), "aoti_torch_get_sizes");
    sz = p;
    check(aoti_torch_get_strides(h, &p), "aoti_torch_get_strides");
    st = p;
  }
  explicit T(const OptTensor& t) : T(t.has_value() ? T(*t) : T()) {}

  bool none() const { return h == nullptr; }
  int64_t size(int64_t i) const { return sz[i]; }
  int64_t stride(int64_t i) const { return st[i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t i = 0; i < ndim; ++i) n *= sz[i];
    return n;
  }
  // torch's is_contiguous() (c10 compute_contiguous), from the sizes and
  // strides read above rather than one more shim call per tensor.
  bool contiguous() const {
    for (int64_t i = 0; i < ndim; ++i)
      if (sz[i] == 0) return true;
    int64_t expected = 1;
    for (int64_t i = ndim - 1; i >= 0; --i) {
      if (sz[i] != 1) {
        if (st[i] != expected) return false;
        expected *= sz[i];
      }
    }
    return true;
  }
  int64_t element_size() const { return dtype == kBF16 ? 2 : dtype == kI32 || dtype == kU32 ? 4 : dtype == kI64 ? 8 : 1; }
  void* ptr() const {
    if (h == nullptr) return nullptr;
    void* p = nullptr;
    check(aoti_torch_get_data_ptr(h, &p), "aoti_torch_get_data_ptr");
    return p;
  }
  bool shape_is(std::initializer_list<int64_t> s) const {
    if (static_cast<int64_t>(s.size()) != ndim) return false;
    int64_t i = 0;
    for (int64_t v : s)
      if (sz[i++] != v) return false;
    return true;
  }
  // Python's list(t.shape) and t.stride()
  std::string shape_str() const {
    std::string s = "[";
    for (int64_t i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(sz[i]);
    return s + "]";
  }
  std::string stride_str() const {
    std::string s = "(";
    for (int64_t i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(st[i]);
    return s + (ndim == 1 ? ",)" : ")");
  }
  // _ops._desc
  std::string desc() const { return dtype_name(dtype) + " " + shape_str() + " on " + dev.str(); }
};

std::string num(int64_t v) { return std::to_string(v); }
std::string opt(const OptInt& v) { return v.has_value() ? std::to_string(*v) : "None"; }

int64_t f8_128x4_bytes(int64_t rows, int64_t k) {
  const int64_t cols = k / 32;
  return (rows + 127) / 128 * 128 * ((cols + 3) / 4 * 4);
}

// ------------------------------------------------------------ checks
// The rules of python/m3qkv/_ops.py, one function per helper there.
struct Checker {
  const char* fn;
  const char* first;  // the tensor whose device the others must share
  Dev dev;

  [[noreturn]] void fail(const std::string& msg) const { throw std::invalid_argument(std::string(fn) + ": " + msg); }

  void device(const char* name, const T& t) const {
    if (t.dev != dev) {
      fail(std::string(name) + " is on " + t.dev.str() + ", but " + first + " is on " + dev.str() +
           ": every tensor must be on one CUDA device");
    }
  }
  // _tensor: dtypes is one dtype or two (d2 >= 0)
  void tensor(const char* name, const T& t, int32_t d1, int32_t d2 = -1, int64_t ndim = -1) const {
    if (t.none()) fail(std::string(name) + " is required here");
    if (t.dtype != d1 && (d2 < 0 || t.dtype != d2)) {
      fail(std::string(name) + " must have dtype " + dtype_name(d1) + (d2 >= 0 ? " or " + dtype_name(d2) : "") +
           ", got " + t.desc());
    }
    if (t.dev != dev) device(name, t);
    if (ndim >= 0 && t.ndim != ndim) fail(std::string(name) + " must be " + num(ndim) + "-D, got " + t.desc());
    if (!t.contiguous()) {
      fail(std::string(name) + " must be contiguous, got strides " + t.stride_str() + " for " + t.desc());
    }
  }
  // `what` (the head count behind n: what_n >= 0) is formatted only on failure.
  void shape1(const char* name, const T& t, int64_t n, const char* what = "", int64_t what_n = -1) const {
    if (!t.shape_is({n})) {
      fail(std::string(name) + " must have shape [" + num(n) + "]" + what + (what_n >= 0 ? num(what_n) + ")" : "") +
           ", got " + t.desc());
    }
  }
  void rows(const char* name, const T& t, int64_t m, int64_t width, int32_t d) const {
    tensor(name, t, d);
    if (t.ndim < 1 || t.size(0) != m || t.numel() != m * width) {
      fail(std::string(name) + " must hold [" + num(m) + ", " + num(width) + "] values (m rows), got " + t.desc());
    }
  }
  void scales(const char* name, const T& t, int64_t rows, int64_t k, const char* of) const {
    tensor(name, t, kU8, kE8M0);
    const int64_t want = f8_128x4_bytes(rows, k);
    if (t.numel() != want) {
      fail(std::string(name) + " must hold the F8_128x4-swizzled e8m0 scales of " + of + " [" + num(rows) + ", " +
           num(k) + "]: ceil(" + num(rows) + "/128)·128 · ceil(" + num(k / 32) + "/4)·4 = " + num(want) +
           " bytes, got " + t.desc());
    }
  }
};

// Python's floor division and modulo for the (non-negative) sizes here.
struct Heads {
  int64_t nq, nkv, niq, nik;
};

Heads heads(const Checker& c, const char* what, int64_t n, const OptInt& nq, const OptInt& nkv, const OptInt& niq,
            const OptInt& nik, const T& index_q_out, const T& index_cache) {
  if (!nq && !nkv && !niq && !nik) {
    const int64_t h = n / 128, r = n % 128;
    if (r || h < 20 || (h - 1) % 19) {
      c.fail(std::string(what) + " has N = " + num(n) +
             " rows, which is not (19·nkv + 1)·128 for any nkv >= 1 (the layout nq = 16·nkv, niq = nkv, nik = 1 "
             "inferred when no head counts are given); pass nq=, nkv=, niq=, nik= for other layouts (TP8: nq=8, "
             "nkv=1, niq=1, nik=1 -> N = 1536; dense: niq=0, nik=0)");
    }
    const int64_t kv = (h - 1) / 19;
    return {16 * kv, kv, kv, 1};
  }
  if (!nq || !nkv) {
    c.fail("explicit head counts need at least nq and nkv (got nq=" + opt(nq) + ", nkv=" + opt(nkv) + ")");
  }
  const int64_t q = *nq, kv = *nkv;
  const int64_t iq = niq ? *niq : (index_q_out.none() ? 0 : kv);
  const int64_t ik = nik ? *nik : (index_cache.none() ? 0 : 1);
  if ((q + 2 * kv + iq + ik) * 128 != n) {
    c.fail(std::string(what) + " has N = " + num(n) + " rows, but the head counts nq=" + num(q) + ", nkv=" + num(kv) +
           ", niq=" + num(iq) + ", nik=" + num(ik) + " give (nq + 2·nkv + niq + nik)·128 = " +
           num((q + 2 * kv + iq + ik) * 128));
  }
  return {q, kv, iq, ik};
}

struct KvFormat {  // _kv_cache's result
  int32_t fmt;
  int64_t num_blocks, block_size, page, token, head;
  bool has_voff;
  int64_t voff;
};

KvFormat kv_cache_format(const Checker& c, const T& kv, const T& v, int64_t nkv) {
  if (kv.none()) c.fail("kv_cache is required");
  c.device("kv_cache", kv);
  if (kv.dtype == kU8) {
    if (kv.ndim != 4 || kv.size(1) != 2 * nkv || kv.size(3) != 72) {
      c.fail("an NVFP4 kv_cache (uint8) must be [num_blocks, 2·nkv = " + num(2 * nkv) + ", block_size, 72], got " +
             kv.desc());
    }
    const int64_t bs = kv.size(2);
    if (kv.stride(3) != 1 || kv.stride(2) != 72 || kv.stride(1) != bs * 72) {
      c.fail("kv_cache pages must be packed inside ([.., 2·nkv, block_size, 72] contiguous; any page stride): got "
             "strides " + kv.stride_str() + " for " + kv.desc());
    }
    if (!v.none()) c.fail("v_cache must be None with an NVFP4 kv_cache (K and V share the pages)");
    return {M3QKV_CACHE_NVFP4, kv.size(0), bs, kv.stride(0), 0, 0, false, 0};
  }
  if (kv.dtype != kE4M3 && kv.dtype != kBF16) {
    c.fail("kv_cache must be uint8 (NVFP4 pages [num_blocks, 2·nkv, block_size, 72]) or float8_e4m3fn / bfloat16 "
           "(vLLM flash layout [num_blocks, 2, block_size, nkv, 128] or K and V as two [num_blocks, block_size, nkv, "
           "128]), got " + kv.desc());
  }
  const int32_t fmt = kv.dtype == kE4M3 ? M3QKV_CACHE_FP8 : M3QKV_CACHE_BF16;
  const int64_t e = kv.element_size();
  if (kv.ndim == 5) {
    if (kv.size(1) != 2 || kv.size(3) != nkv || kv.size(4) != 128) {
      c.fail("a 5-D kv_cache must be [num_blocks, 2, block_size, nkv = " + num(nkv) + ", 128], got " + kv.desc());
    }
    if (!v.none()) c.fail("v_cache must be None when kv_cache holds K and V ([num_blocks, 2, block_size, nkv, 128])");
    if (kv.stride(4) != 1) c.fail("kv_cache's last dimension must be contiguous, got strides " + kv.stride_str());
    return {fmt, kv.size(0), kv.size(2), kv.stride(0) * e, kv.stride(2) * e, kv.stride(3) * e, true, kv.stride(1) * e};
  }
  if (kv.ndim == 4) {
    if (kv.size(2) != nkv || kv.size(3) != 128) {
      c.fail("a 4-D " + dtype_name(kv.dtype) + " kv_cache must be [num_blocks, block_size, nkv = " + num(nkv) +
             ", 128], got " + kv.desc());
    }
    if (v.none()) c.fail("v_cache is required with a 4-D kv_cache (K alone: [num_blocks, block_size, nkv, 128])");
    bool same = v.dtype == kv.dtype && v.ndim == kv.ndim && v.dev == c.dev;
    for (int64_t i = 0; same && i < kv.ndim; ++i) same = v.size(i) == kv.size(i) && v.stride(i) == kv.stride(i);
    if (!same) {
      c.fail("v_cache must match kv_cache in dtype, shape, strides and device: kv_cache " + kv.desc() + " strides " +
             kv.stride_str() + ", v_cache " + v.desc() + " strides " + v.stride_str());
    }
    if (kv.stride(3) != 1) c.fail("kv_cache's last dimension must be contiguous, got strides " + kv.stride_str());
    return {fmt, kv.size(0), kv.size(1), kv.stride(0) * e, kv.stride(1) * e, kv.stride(2) * e, false, 0};
  }
  c.fail("a " + dtype_name(kv.dtype) + " kv_cache must be 5-D [num_blocks, 2, block_size, nkv, 128] or 4-D "
         "[num_blocks, block_size, nkv, 128] with v_cache, got " + kv.desc());
}

struct IxFormat {  // _index_cache's result
  int32_t fmt;
  int64_t num_blocks, page;
};

IxFormat index_cache_format(const Checker& c, const T& ix, int64_t bs) {
  if (ix.none()) c.fail("index_cache is required when nik > 0");
  c.device("index_cache", ix);
  if (ix.dtype == kU8) {
    if (ix.ndim != 3 || ix.size(2) != 72 || ix.size(1) != bs) {
      c.fail("an NVFP4 index_cache (uint8) must be [num_index_blocks, block_size = " + num(bs) + ", 72], got " +
             ix.desc());
    }
    if (ix.stride(2) != 1 || ix.stride(1) != 72) {
      c.fail("index_cache pages must be packed inside ([.., block_size, 72] contiguous; any page stride): got "
             "strides " + ix.stride_str());
    }
    return {M3QKV_CACHE_NVFP4, ix.size(0), ix.stride(0)};
  }
  if (ix.dtype != kE4M3 && ix.dtype != kBF16) {
    c.fail("index_cache must be uint8 (NVFP4 [num_index_blocks, block_size, 72]) or float8_e4m3fn / bfloat16 "
           "([num_index_blocks, block_size, 128]), got " + ix.desc());
  }
  if (ix.ndim != 3 || ix.size(1) != bs || ix.size(2) != 128) {
    c.fail("a " + dtype_name(ix.dtype) + " index_cache must be [num_index_blocks, block_size = " + num(bs) +
           ", 128], got " + ix.desc());
  }
  if (ix.stride(2) != 1 || ix.stride(1) != 128) {
    c.fail("index_cache tokens must be packed ([.., block_size, 128] contiguous; any page stride): got strides " +
           ix.stride_str());
  }
  return {ix.dtype == kE4M3 ? M3QKV_CACHE_FP8 : M3QKV_CACHE_BF16, ix.size(0), ix.stride(0) * ix.element_size()};
}

// The epilogue's tensors (both epilogue ops).
struct Epilogue {
  T positions, cos_sin_cache, q_norm_weight, k_norm_weight, index_q_norm_weight, index_k_norm_weight;
  T slot_mapping, index_slot_mapping, kv_cache, index_cache, index_q_out, q_out, q_fp8_out, v_cache, error_flags;
};

void check_epilogue(const Checker& c, int64_t m, const Heads& h, const Epilogue& e, KvFormat* kvf, IxFormat* ixf) {
  c.tensor("positions", e.positions, kI64);
  c.shape1("positions", e.positions, m, " (one per token)");
  c.tensor("cos_sin_cache", e.cos_sin_cache, kBF16, -1, 2);
  if (e.cos_sin_cache.size(1) != 64) {
    c.fail("cos_sin_cache must be [max_position, 64] (row = [cos 0..31 | sin 0..31]), got " + e.cos_sin_cache.desc());
  }
  c.tensor("q_norm_weight", e.q_norm_weight, kBF16);
  c.shape1("q_norm_weight", e.q_norm_weight, 128);
  c.tensor("k_norm_weight", e.k_norm_weight, kBF16);
  c.shape1("k_norm_weight", e.k_norm_weight, 128);
  if (h.niq) {
    c.tensor("index_q_norm_weight", e.index_q_norm_weight, kBF16);
    c.shape1("index_q_norm_weight", e.index_q_norm_weight, 128, " (niq = ", h.niq);
    c.rows("index_q_out", e.index_q_out, m, h.niq * 128, kE4M3);
  }
  if (h.nik) {
    c.tensor("index_k_norm_weight", e.index_k_norm_weight, kBF16);
    c.shape1("index_k_norm_weight", e.index_k_norm_weight, 128, " (nik = ", h.nik);
    c.tensor("index_slot_mapping", e.index_slot_mapping, kI64);
    c.shape1("index_slot_mapping", e.index_slot_mapping, m, " (one per token)");
  }
  c.tensor("slot_mapping", e.slot_mapping, kI64);
  c.shape1("slot_mapping", e.slot_mapping, m, " (one per token)");
  if (e.q_out.none() && e.q_fp8_out.none()) {
    c.fail("at least one of q_out (bf16) and q_fp8_out (float8_e4m3fn) is required");
  }
  if (!e.q_out.none()) c.rows("q_out", e.q_out, m, h.nq * 128, kBF16);
  if (!e.q_fp8_out.none()) c.rows("q_fp8_out", e.q_fp8_out, m, h.nq * 128, kE4M3);
  if (!e.error_flags.none()) {
    c.tensor("error_flags", e.error_flags, kI32, kU32);
    if (e.error_flags.numel() < 1) c.fail("error_flags must hold at least one int32");
  }
  *kvf = kv_cache_format(c, e.kv_cache, e.v_cache, h.nkv);
  *ixf = h.nik ? index_cache_format(c, e.index_cache, kvf->block_size) : IxFormat{M3QKV_CACHE_NVFP4, 0, 0};
}

// _activations: -> (m, k); sets c.first and c.dev.
void activations(Checker& c, const T& xq, const T& xsf, const T& x_bf16, int64_t* m, int64_t* k) {
  if (!x_bf16.none()) {
    if (!xq.none() || !xsf.none()) {
      const std::string given = !xq.none() && !xsf.none() ? "xq and xsf" : !xq.none() ? "xq" : "xsf";
      c.fail("x_bf16 and " + given + " are given: pass either x_bf16 (bf16 activations [M, K]) or xq and xsf (MXFP8 "
             "activations), not both (xq=None, xsf=None with x_bf16)");
    }
    c.first = "x_bf16";
    c.dev = x_bf16.dev;
    c.tensor("x_bf16", x_bf16, kBF16, -1, 2);
    *m = x_bf16.size(0);
    *k = x_bf16.size(1);
    return;
  }
  c.first = "xq";
  if (xq.none()) c.fail("xq is required (or bf16 activations as x_bf16=, with xq=None and xsf=None)");
  if (xq.dtype == kBF16) {
    c.fail("xq must have dtype torch.float8_e4m3fn (MXFP8, with its scales xsf), got " + xq.desc() +
           ": pass bf16 activations as x_bf16= (with xq=None and xsf=None)");
  }
  c.dev = xq.dev;
  c.tensor("xq", xq, kE4M3, -1, 2);
  if (xsf.none()) c.fail("xsf is required with xq (the F8_128x4-swizzled e8m0 scales of xq)");
  *m = xq.size(0);
  *k = xq.size(1);
}

// wq and the scales (fused_qkv and mxfp8_gemm): -> n
int64_t check_weights(const Checker& c, int64_t m, int64_t k, const T& xsf, const T& wq, const T& wsf, bool bf16) {
  c.tensor("wq", wq, kE4M3, -1, 2);
  const int64_t n = wq.size(0);
  if (wq.size(1) != k) {
    c.fail("wq must be [N, K = " + num(k) + "] (K-major, K as in " + c.first + "), got " + wq.desc());
  }
  if (!bf16) c.scales("xsf", xsf, m, k, "xq");
  c.scales("wsf", wsf, n, k, "wq");
  return n;
}

void cuda_only(const Checker& c) {
  if (!c.dev.cuda()) c.fail("the tensors must be CUDA tensors, got device " + c.dev.str());
}

// ------------------------------------------------------------ the C call
const char* status_name(m3qkv_status s) {
  switch (s) {
    case M3QKV_SUCCESS: return "M3QKV_SUCCESS";
    case M3QKV_ERROR_INVALID_ARGUMENT: return "M3QKV_ERROR_INVALID_ARGUMENT";
    case M3QKV_ERROR_MISALIGNED: return "M3QKV_ERROR_MISALIGNED";
    case M3QKV_ERROR_UNSUPPORTED_DEVICE: return "M3QKV_ERROR_UNSUPPORTED_DEVICE";
    case M3QKV_ERROR_CUDA_ERROR: return "M3QKV_ERROR_CUDA_ERROR";
    case M3QKV_ERROR_NULL_POINTER: return "M3QKV_ERROR_NULL_POINTER";
    case M3QKV_ERROR_STRUCT_SIZE: return "M3QKV_ERROR_STRUCT_SIZE";
    case M3QKV_ERROR_INVALID_SHAPE: return "M3QKV_ERROR_INVALID_SHAPE";
    case M3QKV_ERROR_TOO_LARGE: return "M3QKV_ERROR_TOO_LARGE";
    case M3QKV_ERROR_INTERNAL: return "M3QKV_ERROR_INTERNAL";
    case M3QKV_ERROR_SELFTEST_FAILED: return "M3QKV_ERROR_SELFTEST_FAILED";
    case M3QKV_WARNING_BACKEND_FALLBACK: return "M3QKV_WARNING_BACKEND_FALLBACK";
  }
  return nullptr;
}

// _capi.Library.error: the caller's errors are ValueError, the rest RuntimeError.
[[noreturn]] void raise_status(m3qkv_status s) {
  const Api& a = api();
  const char* msg = a.last_error();
  if (msg == nullptr || *msg == '\0') msg = a.status_string(s);
  const char* name = status_name(s);
  const std::string text =
      (name ? std::string(name) : "status " + std::to_string(static_cast<int>(s))) + ": " + (msg ? msg : "");
  switch (s) {
    case M3QKV_ERROR_INVALID_ARGUMENT:
    case M3QKV_ERROR_INVALID_SHAPE:
    case M3QKV_ERROR_MISALIGNED:
    case M3QKV_ERROR_NULL_POINTER:
    case M3QKV_ERROR_STRUCT_SIZE:
    case M3QKV_ERROR_TOO_LARGE:
      throw std::invalid_argument(text);
    default:
      throw std::runtime_error(text);
  }
}

// f(args, the current stream of `dev`) with `dev` current (as _ops._call).
template <class Args>
void call(const Dev& dev, m3qkv_status (*f)(const Args*, cudaStream_t), const Args& args) {
  int32_t cur = -1;
  check(aoti_torch_get_current_device_index(&cur), "aoti_torch_get_current_device_index");
  DeviceGuardHandle guard = nullptr;
  if (cur != dev.index) check(aoti_torch_create_device_guard(dev.index, &guard), "aoti_torch_create_device_guard");
  void* stream = nullptr;
  AOTITorchError e = aoti_torch_get_current_cuda_stream(dev.index, &stream);
  m3qkv_status s = M3QKV_SUCCESS;
  if (e == AOTI_TORCH_SUCCESS) s = f(&args, static_cast<cudaStream_t>(stream));
  if (guard != nullptr) aoti_torch_delete_device_guard(guard);
  check(e, "aoti_torch_get_current_cuda_stream");
  if (s != M3QKV_SUCCESS) raise_status(s);
}

Tensor empty(std::initializer_list<int64_t> sizes, int32_t dtype, const Dev& dev) {
  int64_t sz[2], st[2];
  const int64_t n = static_cast<int64_t>(sizes.size());
  int64_t i = 0;
  for (int64_t v : sizes) sz[i++] = v;
  st[n - 1] = 1;
  if (n == 2) st[0] = sz[1];
  AtenTensorHandle h = nullptr;
  check(aoti_torch_empty_strided(n, sz, st, dtype, dev.type, dev.index, &h), "aoti_torch_empty_strided");
  return Tensor(h);
}

// _ops._fill_epilogue (the fields both epilogue structs share).
template <class Args>
void fill_epilogue(Args* a, int64_t m, const Heads& h, const KvFormat& kvf, const IxFormat& ixf, const Epilogue& e,
                   double eps, double q_fp8_scale, double k_scale, double v_scale, bool use_pdl, const OptInt& grid) {
  a->m = m;
  a->nq = static_cast<int32_t>(h.nq);
  a->nkv = static_cast<int32_t>(h.nkv);
  a->niq = static_cast<int32_t>(h.niq);
  a->nik = static_cast<int32_t>(h.nik);
  a->positions = static_cast<const int64_t*>(e.positions.ptr());
  a->max_position = e.cos_sin_cache.size(0);
  a->cos_sin_cache = e.cos_sin_cache.ptr();
  a->q_norm_weight = e.q_norm_weight.ptr();
  a->k_norm_weight = e.k_norm_weight.ptr();
  a->index_q_norm_weight = h.niq ? e.index_q_norm_weight.ptr() : nullptr;
  a->index_k_norm_weight = h.nik ? e.index_k_norm_weight.ptr() : nullptr;
  a->eps = static_cast<float>(eps);
  a->slot_mapping = static_cast<const int64_t*>(e.slot_mapping.ptr());
  a->index_slot_mapping = h.nik ? static_cast<const int64_t*>(e.index_slot_mapping.ptr()) : nullptr;
  char* base = static_cast<char*>(e.kv_cache.ptr());
  a->kv_cache = base;
  a->kv_page_stride = kvf.page;
  a->num_blocks = kvf.num_blocks;
  a->block_size = static_cast<int32_t>(kvf.block_size);
  if (h.nik) {
    a->index_cache = e.index_cache.ptr();
    a->index_page_stride = ixf.page;
    a->num_index_blocks = ixf.num_blocks;
  }
  a->q_out = e.q_out.ptr();
  a->q_fp8_out = e.q_fp8_out.ptr();
  a->index_q_out = h.niq ? e.index_q_out.ptr() : nullptr;
  a->q_fp8_scale = static_cast<float>(q_fp8_scale);
  a->k_scale = static_cast<float>(k_scale);
  a->v_scale = static_cast<float>(v_scale);
  a->use_pdl = use_pdl ? 1 : 0;
  a->grid = grid ? static_cast<int32_t>(*grid) : 0;
  a->error_flags = static_cast<uint32_t*>(e.error_flags.ptr());
  a->kv_cache_dtype = kvf.fmt;
  a->index_cache_dtype = ixf.fmt;
  a->v_cache = kvf.fmt == M3QKV_CACHE_NVFP4 ? nullptr : kvf.has_voff ? base + kvf.voff : e.v_cache.ptr();
  a->kv_token_stride = kvf.token;
  a->kv_head_stride = kvf.head;
}

// ------------------------------------------------------------ the ops
void fused_qkv(const OptTensor& xq_, const OptTensor& xsf_, const Tensor& wq_, const Tensor& wsf_,
               const Tensor& positions, const Tensor& cos_sin_cache, const Tensor& q_norm_weight,
               const Tensor& k_norm_weight, const OptTensor& index_q_norm_weight,
               const OptTensor& index_k_norm_weight, double eps, const Tensor& slot_mapping,
               const OptTensor& index_slot_mapping, const Tensor& kv_cache, const OptTensor& index_cache,
               const OptTensor& index_q_out, const OptTensor& q_out, const OptTensor& q_fp8_out, double q_fp8_scale,
               double k_scale, double v_scale, OptInt cta_group, bool use_pdl, OptInt grid, const OptTensor& v_cache,
               OptInt nq, OptInt nkv, OptInt niq, OptInt nik, const OptTensor& error_flags,
               const OptTensor& x_bf16_) {
  Checker c{"m3qkv.fused_qkv", "xq", {}};
  const T xq(xq_), xsf(xsf_), wq(wq_), wsf(wsf_), x_bf16(x_bf16_);
  const Epilogue e{T(positions),    T(cos_sin_cache), T(q_norm_weight),      T(k_norm_weight),
                   T(index_q_norm_weight), T(index_k_norm_weight), T(slot_mapping), T(index_slot_mapping),
                   T(kv_cache),     T(index_cache),   T(index_q_out),        T(q_out),
                   T(q_fp8_out),    T(v_cache),       T(error_flags)};
  int64_t m = 0, k = 0;
  activations(c, xq, xsf, x_bf16, &m, &k);
  const int64_t n = check_weights(c, m, k, xsf, wq, wsf, !x_bf16.none());
  const Heads h = heads(c, "wq", n, nq, nkv, niq, nik, e.index_q_out, e.index_cache);
  KvFormat kvf;
  IxFormat ixf;
  check_epilogue(c, m, h, e, &kvf, &ixf);
  cuda_only(c);
  m3qkv_fused_args a;
  std::memset(&a, 0, sizeof a);
  a.struct_size = sizeof a;
  fill_epilogue(&a, m, h, kvf, ixf, e, eps, q_fp8_scale, k_scale, v_scale, use_pdl, grid);
  a.k = k;
  a.xq = xq.ptr();
  a.xsf = xsf.ptr();
  a.wq = wq.ptr();
  a.wsf = wsf.ptr();
  a.cta_group = cta_group ? static_cast<int32_t>(*cta_group) : 0;
  a.x_bf16 = x_bf16.ptr();
  call(c.dev, api().fused_qkv, a);
}

void qknorm_rope_kv_insert(const Tensor& qkv_, const Tensor& positions, const Tensor& cos_sin_cache,
                           const Tensor& q_norm_weight, const Tensor& k_norm_weight,
                           const OptTensor& index_q_norm_weight, const OptTensor& index_k_norm_weight, double eps,
                           const Tensor& slot_mapping, const OptTensor& index_slot_mapping, const Tensor& kv_cache,
                           const OptTensor& index_cache, const OptTensor& index_q_out, const OptTensor& q_out,
                           const OptTensor& q_fp8_out, double q_fp8_scale, double k_scale, double v_scale,
                           bool use_pdl, OptInt grid, const OptTensor& v_cache, OptInt nq, OptInt nkv, OptInt niq,
                           OptInt nik, const OptTensor& error_flags) {
  const T qkv(qkv_);
  Checker c{"m3qkv.qknorm_rope_kv_insert", "qkv", qkv.dev};
  const Epilogue e{T(positions),    T(cos_sin_cache), T(q_norm_weight),      T(k_norm_weight),
                   T(index_q_norm_weight), T(index_k_norm_weight), T(slot_mapping), T(index_slot_mapping),
                   T(kv_cache),     T(index_cache),   T(index_q_out),        T(q_out),
                   T(q_fp8_out),    T(v_cache),       T(error_flags)};
  c.tensor("qkv", qkv, kBF16, -1, 2);
  const int64_t m = qkv.size(0), n = qkv.size(1);
  const Heads h = heads(c, "qkv", n, nq, nkv, niq, nik, e.index_q_out, e.index_cache);
  KvFormat kvf;
  IxFormat ixf;
  check_epilogue(c, m, h, e, &kvf, &ixf);
  cuda_only(c);
  m3qkv_insert_args a;
  std::memset(&a, 0, sizeof a);
  a.struct_size = sizeof a;
  fill_epilogue(&a, m, h, kvf, ixf, e, eps, q_fp8_scale, k_scale, v_scale, use_pdl, grid);
  a.qkv = qkv.ptr();
  call(c.dev, api().qknorm_rope_kv_insert, a);
}

Tensor mxfp8_gemm(const OptTensor& xq_, const OptTensor& xsf_, const Tensor& wq_, const Tensor& wsf_, bool use_pdl,
                  OptInt grid, const OptTensor& x_bf16_) {
  Checker c{"m3qkv.mxfp8_gemm", "xq", {}};
  const T xq(xq_), xsf(xsf_), wq(wq_), wsf(wsf_), x_bf16(x_bf16_);
  int64_t m = 0, k = 0;
  activations(c, xq, xsf, x_bf16, &m, &k);
  const int64_t n = check_weights(c, m, k, xsf, wq, wsf, !x_bf16.none());
  cuda_only(c);
  Tensor out = empty({m, n}, kBF16, c.dev);
  m3qkv_gemm_args a;
  std::memset(&a, 0, sizeof a);
  a.struct_size = sizeof a;
  a.m = m;
  a.n = n;
  a.k = k;
  a.xq = xq.ptr();
  a.xsf = xsf.ptr();
  a.wq = wq.ptr();
  a.wsf = wsf.ptr();
  a.x_bf16 = x_bf16.ptr();
  a.out = T(out).ptr();
  a.use_pdl = use_pdl ? 1 : 0;
  a.grid = grid ? static_cast<int32_t>(*grid) : 0;
  call(c.dev, api().mxfp8_gemm, a);
  return out;
}

std::tuple<Tensor, Tensor> mxfp8_quantize(const Tensor& x_, bool use_pdl) {
  const T x(x_);
  Checker c{"m3qkv.mxfp8_quantize", "x", x.dev};
  if (x.none()) c.fail("x is required");
  c.tensor("x", x, kBF16, -1, 2);
  const int64_t m = x.size(0), k = x.size(1);
  if (k % 128) c.fail("x must be [M, K] with K % 128 == 0, got " + x.desc());
  cuda_only(c);
  Tensor xq = empty({m, k}, kE4M3, c.dev);
  Tensor xsf = empty({f8_128x4_bytes(m, k)}, kU8, c.dev);
  m3qkv_quantize_args a;
  std::memset(&a, 0, sizeof a);
  a.struct_size = sizeof a;
  a.m = m;
  a.k = k;
  a.x = x.ptr();
  a.xq = T(xq).ptr();
  a.xsf = T(xsf).ptr();
  a.use_pdl = use_pdl ? 1 : 0;
  call(c.dev, api().mxfp8_quantize, a);
  return {xq, xsf};
}

}  // namespace

// A FRAGMENT, not STABLE_TORCH_LIBRARY: a second DEF block of one namespace
// (e.g. this library loaded after some other code declared m3qkv ops in a
// torch.library.Library "DEF") crashes the process inside this static
// initializer (a segfault with torch 2.11), while a fragment logs the clash
// and goes on (its kernels then override the earlier ones). _native.py loads
// the library only when no m3qkv op exists yet.
STABLE_TORCH_LIBRARY_FRAGMENT(m3qkv, m) {
  m.def(kFusedSchema);
  m.def(kInsertSchema);
  m.def(kGemmSchema);
  m.def(kQuantizeSchema);
}

STABLE_TORCH_LIBRARY_IMPL(m3qkv, CUDA, m) {
  m.impl("fused_qkv", TORCH_BOX(&fused_qkv));
  m.impl("qknorm_rope_kv_insert", TORCH_BOX(&qknorm_rope_kv_insert));
  m.impl("mxfp8_gemm", TORCH_BOX(&mxfp8_gemm));
  m.impl("mxfp8_quantize", TORCH_BOX(&mxfp8_quantize));
}

// CPU: the same checks, then "the tensors must be CUDA tensors" (instead of
// torch's "no kernel for CPU"), as the Python CPU kernels say it.
STABLE_TORCH_LIBRARY_IMPL(m3qkv, CPU, m) {
  m.impl("fused_qkv", TORCH_BOX(&fused_qkv));
  m.impl("qknorm_rope_kv_insert", TORCH_BOX(&qknorm_rope_kv_insert));
  m.impl("mxfp8_gemm", TORCH_BOX(&mxfp8_gemm));
  m.impl("mxfp8_quantize", TORCH_BOX(&mxfp8_quantize));
}

// Binds the ops to the C API of one loaded libm3qkv.so (function pointers
// taken from its ctypes handle) whose argument structs are the sizes given
// (what it accepts, found by _capi.Library's probe). Returns 0, or 1 when a
// size is not this header's sizeof (a library of another version: the ctypes
// path, which speaks every released layout, serves it instead); `sizes_out`
// (4 entries) receives this header's sizes: fused, insert, gemm, quantize.
M3QKV_TORCH_OPS_EXPORT int m3qkv_torch_ops_bind(void* fused_qkv, void* qknorm_rope_kv_insert, void* mxfp8_gemm,
                                               void* mxfp8_quantize, void* last_error, void* status_string,
                                               const uint64_t* sizes, uint64_t* sizes_out) {
  const uint64_t want[4] = {sizeof(m3qkv_fused_args), sizeof(m3qkv_insert_args), sizeof(m3qkv_gemm_args),
                            sizeof(m3qkv_quantize_args)};
  if (sizes_out != nullptr) std::memcpy(sizes_out, want, sizeof want);
  if (sizes == nullptr || std::memcmp(sizes, want, sizeof want) != 0) return 1;
  if (!fused_qkv || !qknorm_rope_kv_insert || !mxfp8_gemm || !mxfp8_quantize || !last_error || !status_string) {
    return 2;
  }
  g_api.fused_qkv = reinterpret_cast<decltype(g_api.fused_qkv)>(fused_qkv);
  g_api.qknorm_rope_kv_insert = reinterpret_cast<decltype(g_api.qknorm_rope_kv_insert)>(qknorm_rope_kv_insert);
  g_api.mxfp8_gemm = reinterpret_cast<decltype(g_api.mxfp8_gemm)>(mxfp8_gemm);
  g_api.mxfp8_quantize = reinterpret_cast<decltype(g_api.mxfp8_quantize)>(mxfp8_quantize);
  g_api.last_error = reinterpret_cast<decltype(g_api.last_error)>(last_error);
  g_api.status_string = reinterpret_cast<decltype(g_api.status_string)>(status_string);
  g_bound.store(true, std::memory_order_release);
  return 0;
}
