#pragma once
// Helpers of the GPU suite: the no-device skip, checked CUDA calls, RAII
// device memory / streams / events, and poisoned buffers.
//
// Every test body starts with M3QKV_REQUIRE_GPU(): on a machine without a CUDA
// device (CI, the build host) the whole suite reports SKIPPED, never FAILED.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "golden/problem.h"
#include "m3qkv/m3qkv.h"

namespace m3qkv_gpu {

// 0 when there is no usable device (driver missing, no GPU, or error).
inline int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

// Why there is no device, in words (for the skip message): cudaGetDeviceCount's
// error, e.g. cudaErrorInsufficientDriver when no NVIDIA driver is installed.
inline std::string no_device_reason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  (void)cudaGetLastError();
  if (e == cudaSuccess) return "cudaGetDeviceCount reports 0 devices";
  std::string r = std::string("cudaGetDeviceCount failed with ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
  if (e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice)
    r += ": no NVIDIA GPU with a loaded CUDA driver on this machine";
  return r;
}

// Compute capability of the current device as 10·major + minor (0 if none).
inline int device_cc() {
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return 0;
  if (cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) return 0;
  return major * 10 + minor;
}

inline std::string cuda_msg(cudaError_t e, const char* what, const char* file, int line) {
  return std::string(what) + " failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ") at " + file + ":" +
         std::to_string(line);
}

}  // namespace m3qkv_gpu

// Skips the current test (whole body) when no CUDA device is present.
#define M3QKV_REQUIRE_GPU()                                                                         \
  do {                                                                                              \
    if (::m3qkv_gpu::device_count() == 0)                                                           \
      GTEST_SKIP() << "no CUDA device (" << ::m3qkv_gpu::no_device_reason() << "): GPU test skipped"; \
  } while (0)

// Checked CUDA runtime call inside a test (fatal: returns from the test body).
#define CUDA_OK(call)                                                                               \
  do {                                                                                              \
    const cudaError_t e_ = (call);                                                                  \
    ASSERT_EQ(e_, cudaSuccess) << ::m3qkv_gpu::cuda_msg(e_, #call, __FILE__, __LINE__);             \
  } while (0)

// Checked m3qkv call inside a test (fatal), with the library's message.
#define M3QKV_OK(call)                                                                              \
  do {                                                                                              \
    const m3qkv_status s_ = (call);                                                                 \
    ASSERT_EQ(s_, M3QKV_SUCCESS) << #call << ": " << m3qkv_status_string(s_) << ": " << m3qkv_last_error(); \
  } while (0)

namespace m3qkv_gpu {

// Owning device allocation. Allocation failures are reported through ok()/err
// (constructors cannot ASSERT); use M3QKV_ALLOC() to check in a test.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) { alloc(bytes); }
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), n_(o.n_), err_(o.err_) { o.p_ = nullptr; o.n_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) { reset(); p_ = o.p_; n_ = o.n_; err_ = o.err_; o.p_ = nullptr; o.n_ = 0; }
    return *this;
  }
  cudaError_t alloc(size_t bytes) {
    reset();
    n_ = bytes;
    err_ = bytes ? cudaMalloc(&p_, bytes) : cudaSuccess;
    if (err_ != cudaSuccess) { p_ = nullptr; n_ = 0; }
    return err_;
  }
  void reset() {
    if (p_) cudaFree(p_);
    p_ = nullptr;
    n_ = 0;
  }
  void* get() const { return p_; }
  template <class T> T* as() const { return static_cast<T*>(p_); }
  size_t size() const { return n_; }
  cudaError_t error() const { return err_; }
  // Host -> device (whole vector; must fit).
  template <class T> cudaError_t upload(const std::vector<T>& h) {
    if (h.size() * sizeof(T) > n_) return cudaErrorInvalidValue;
    return h.empty() ? cudaSuccess : cudaMemcpy(p_, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  // Device -> host, the whole buffer as bytes.
  cudaError_t download(std::vector<uint8_t>* h) const {
    h->resize(n_);
    return n_ ? cudaMemcpy(h->data(), p_, n_, cudaMemcpyDeviceToHost) : cudaSuccess;
  }
  template <class T> cudaError_t download_as(std::vector<T>* h) const {
    h->resize(n_ / sizeof(T));
    return n_ ? cudaMemcpy(h->data(), p_, h->size() * sizeof(T), cudaMemcpyDeviceToHost) : cudaSuccess;
  }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
  cudaError_t err_ = cudaSuccess;
};

class Stream {
 public:
  Stream() { err_ = cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking); }
  ~Stream() { if (s_) cudaStreamDestroy(s_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }
  cudaError_t error() const { return err_; }
 private:
  cudaStream_t s_ = nullptr;
  cudaError_t err_ = cudaSuccess;
};

class Event {
 public:
  Event() { err_ = cudaEventCreate(&e_); }
  ~Event() { if (e_) cudaEventDestroy(e_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return e_; }
  cudaError_t error() const { return err_; }
 private:
  cudaEvent_t e_ = nullptr;
  cudaError_t err_ = cudaSuccess;
};

// The poison byte pattern (golden/problem.h: the self-test uses it too).
using m3qkv::golden::poison_byte;
inline std::vector<uint8_t> poison_pattern(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = poison_byte(i);
  return v;
}

// First differing byte between two buffers, or -1.
inline int64_t first_diff(const uint8_t* a, const uint8_t* b, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  return -1;
}
inline size_t count_diff(const uint8_t* a, const uint8_t* b, size_t n) {
  size_t c = 0;
  for (size_t i = 0; i < n; ++i) c += a[i] != b[i];
  return c;
}

}  // namespace m3qkv_gpu

// Allocates and checks (fatal) a DeviceBuffer `name` of `bytes`.
#define M3QKV_ALLOC(name, bytes)                                                                    \
  ::m3qkv_gpu::DeviceBuffer name(bytes);                                                            \
  CUDA_OK(name.error())
