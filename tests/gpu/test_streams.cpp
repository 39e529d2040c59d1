// m3qkv_fused_qkv under CUDA-graph capture / replay and on concurrent streams
// (issue 4), against the CPU golden model, byte for byte (guards included).
//
//  - GpuGraph.CaptureReplaySameBytes: one call captured into a graph (global
//    capture mode, the strictest): the call succeeds during capture, the
//    capture stays valid, the graph holds >= 1 kernel node, nothing runs at
//    capture time; one graph exec replayed on salt-0 poison, on salt-1 poison
//    and again on its own output equals the golden expectation each time and
//    the bytes of a direct (non-captured) call; a later capture of the same
//    call picks the same launch configuration.
//  - GpuGraph.TwoCallsChainedInOrder: two calls writing the same buffers in
//    one graph (with PDL: a programmatic edge between them): the later wins.
//  - GpuStreams.TwoCallsConcurrently / SameShapeTwoOutputSets: two independent
//    problems enqueued on two non-blocking streams, both held behind one gate
//    until both are enqueued, so they start together and may overlap.
//  - GpuStreams.TwoHostThreadsConcurrently: the same, each call made from its
//    own host thread at the same time (the library's host path concurrently).
// Each runs for the automatic backend (public m3qkv_fused_qkv: SM90 on an
// H200) and the portable backend forced through m3qkv_testing_fused_qkv;
// error_flags (preset or not) always equal the golden flags.
//
// Exact data everywhere: the golden f32 accumulator is the accumulator on any
// hardware, so every expectation comes from the golden model alone. Every
// problem draws its data from the process seed (M3QKV_TEST_SEED) mixed with a
// per-problem tag: fresh data every run, distinct data for the two calls.
//
// Running `m3qkv_gpu_tests --gtest_filter='GpuGraph*'` in a process of its own
// makes the first captured call the library's first call for its backend, so
// its one-time setup (device query, cudaFuncSetAttribute, occupancy queries,
// tensor-map encoder lookup, module loading) also happens under capture.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ostream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "api/internal.h"  // m3qkv_testing_fused_qkv (forced backend)
#include "common/problem.h"
#include "common/test_util.h"
#include "golden/golden.h"
#include "sm90/decode_plan.h"  // decode_preferred: which shapes take the decode path
#include "gpu/gpu_util.h"
#include "gpu/harness.h"

namespace {

using namespace m3qkv_gpu;
using m3qkv_test::make_problem;

// ---------------------------------------------------------------- problems
struct Shape {
  Heads heads;
  int64_t m, k;
  int block_size;
  bool oor;  // out-of-range slots and positions: error_flags set, those tokens skipped
};

std::string shape_name(const Shape& s) {
  return std::string(s.heads.name) + "_M" + std::to_string(s.m) + "_K" + std::to_string(s.k) + "_B" +
         std::to_string(s.block_size) + (s.oor ? "_OutOfRange" : "");
}

// Decode: one 64-row tile per head (20 tiles on 132 SMs): SM90 splits K over
// a thread-block cluster. M = 1 keeps oor off (its only token would be skipped).
constexpr Shape kDecode{kTP4, 1, 6144, 128, false};
// A full 64-row tile, still split-K on SM90, with out-of-range slots / positions.
constexpr Shape kSplitTile{kTP4, 64, 2048, 16, true};
// 5 x 39 = 195 128-row tiles on 132 SMs: persistent CTAs take several tiles
// (SM90); the portable grid has one CTA per tile, more than fit at once.
constexpr Shape kWaves{kTP2, 513, 512, 64, true};
// Prefill-like, TP1 (odd head count 77), out-of-range slots / positions.
constexpr Shape kTP1Prefill{kTP1, 129, 512, 16, true};
// The SM90 prefill kernel's range (M >= 1024: its conversion grid, then the
// GEMM with PDL; both copies in the stream workspace, allocated during the
// capture when this runs first).
constexpr Shape kPrefill{kTP4, 1024, 256, 16, true};

ProblemConfig config(const Shape& s, uint64_t seed_tag) {
  ProblemConfig cfg;
  cfg.m = s.m;
  cfg.k = s.k;
  cfg.nq = s.heads.nq;
  cfg.nkv = s.heads.nkv;
  cfg.niq = s.heads.niq;
  cfg.nik = s.heads.nik;
  cfg.block_size = s.block_size;
  cfg.exact_data = true;
  cfg.slot_skip_fraction = 0.125;
  cfg.out_of_range_slots = s.oor;
  cfg.out_of_range_positions = s.oor;
  cfg.seed = m3qkv_test::test_seed() ^ (seed_tag * 0x9E3779B97F4A7C15ULL);
  return cfg;
}

// One problem on the device: inputs, guarded poisoned outputs, the args that
// point at them, and the golden accumulator.
struct Job {
  Problem p;
  DeviceInputs in;
  DeviceOutputs out;
  m3qkv_fused_args args{};
  std::vector<float> acc;  // exact data: THE accumulator on any hardware

  // Golden outputs on the poison of `salt` with error_flags preset to `preset`.
  HostOutputs expected(int salt, uint32_t preset) const {
    HostOutputs w = poisoned_host_outputs(p, salt, preset);
    golden_epilogue(p, acc.data(), &w);
    return w;
  }
};

// Builds `j` (fatal on a CUDA error; call through ASSERT_NO_FATAL_FAILURE).
void setup_job(Job* j, const ProblemConfig& cfg, int salt, uint32_t preset, int use_pdl) {
  j->p = make_problem(cfg);
  const Problem& p = j->p;
  j->acc = m3qkv::golden::mxfp8_acc(p.xq.data(), p.xsf.data(), p.wq.data(), p.wsf.data(), p.m, p.n(), p.k);
  CUDA_OK(j->in.upload(p));
  CUDA_OK(j->out.init(p, salt, preset));
  j->args = p.args_with(j->in.mapper(), j->out.ptrs());
  j->args.use_pdl = use_pdl;
}

// The call under test: the public entry (automatic dispatch) for NONE, else
// the test entry with the backend forced. Enqueues only (asynchronous).
m3qkv_status call(const m3qkv_fused_args& a, m3qkv_backend_kind b, cudaStream_t s) {
  return b == M3QKV_BACKEND_NONE ? m3qkv_fused_qkv(&a, s) : m3qkv_testing_fused_qkv(&a, nullptr, b, s);
}

std::string call_name(m3qkv_backend_kind b) {
  return b == M3QKV_BACKEND_NONE ? "m3qkv_fused_qkv" : "m3qkv_testing_fused_qkv(force " + backend_label(b) + ")";
}

// Synchronizes `s`, downloads the outputs and compares them with `want`.
void check_outputs(const Job& j, cudaStream_t s, const HostOutputs& want, const std::string& what,
                   Fetched* got_out = nullptr) {
  CUDA_OK(cudaStreamSynchronize(s));
  CUDA_OK(cudaGetLastError());
  Fetched got;
  CUDA_OK(fetch_outputs(j.out, &got));
  expect_same_outputs(j.p, want, got, what);
  if (got_out) *got_out = std::move(got);
}

// -------------------------------------------------------------- graph RAII
class Graph {
 public:
  Graph() = default;
  ~Graph() { reset(nullptr); }
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  void reset(cudaGraph_t g) {
    if (g_) cudaGraphDestroy(g_);
    g_ = g;
  }
  cudaGraph_t get() const { return g_; }

 private:
  cudaGraph_t g_ = nullptr;
};

class GraphExec {
 public:
  GraphExec() = default;
  ~GraphExec() {
    if (e_) cudaGraphExecDestroy(e_);
  }
  GraphExec(const GraphExec&) = delete;
  GraphExec& operator=(const GraphExec&) = delete;
  cudaError_t instantiate(cudaGraph_t g) { return cudaGraphInstantiate(&e_, g, 0); }
  cudaGraphExec_t get() const { return e_; }

 private:
  cudaGraphExec_t e_ = nullptr;
};

// Captures what `enqueue` puts on `s` into *graph, in global capture mode: a
// capture-unsafe CUDA call (synchronous memcpy / memset, cudaMalloc, a
// stream / device synchronization or query...) made by the library from any
// thread invalidates the capture, and is reported here as a failure of the
// library, not worked around. `enqueue` returns the status of its m3qkv calls.
template <class F>
void capture(cudaStream_t s, const std::string& what, F&& enqueue, Graph* graph) {
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  const m3qkv_status st = enqueue();
  const std::string msg = m3qkv_last_error();
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  const cudaError_t qe = cudaStreamIsCapturing(s, &cs);
  // Always end the capture: the stream must leave capture mode whatever happened.
  cudaGraph_t g = nullptr;
  const cudaError_t ee = cudaStreamEndCapture(s, &g);
  graph->reset(g);
  const cudaError_t le = cudaGetLastError();
  EXPECT_EQ(st, M3QKV_SUCCESS) << what << " returned " << m3qkv_status_string(st)
                               << " during stream capture: " << msg;
  EXPECT_EQ(qe, cudaSuccess) << cuda_msg(qe, "cudaStreamIsCapturing", __FILE__, __LINE__);
  EXPECT_EQ(cs, cudaStreamCaptureStatusActive)
      << what << " left the capture " << (cs == cudaStreamCaptureStatusInvalidated ? "invalidated" : "inactive")
      << ": it made a capture-unsafe CUDA call (an error the library swallowed, if it returned success)";
  ASSERT_EQ(ee, cudaSuccess) << cuda_msg(ee, "cudaStreamEndCapture", __FILE__, __LINE__) << " after " << what;
  ASSERT_EQ(le, cudaSuccess) << cuda_msg(le, "cudaGetLastError after the capture", __FILE__, __LINE__);
  ASSERT_EQ(st, M3QKV_SUCCESS);
  ASSERT_NE(g, nullptr);
}

// The launch configuration of one kernel node.
struct KernelNode {
  dim3 grid, block;
  size_t smem = 0;
  unsigned cluster = 0;  // cluster size (x; the library uses 1-D clusters), 0 = not reported
  std::string describe() const {
    return "grid (" + std::to_string(grid.x) + "," + std::to_string(grid.y) + "," + std::to_string(grid.z) +
           ") block " + std::to_string(block.x) + " smem " + std::to_string(smem) + " cluster " +
           std::to_string(cluster);
  }
  bool operator==(const KernelNode& o) const {
    return grid.x == o.grid.x && grid.y == o.grid.y && grid.z == o.grid.z && block.x == o.block.x &&
           block.y == o.block.y && block.z == o.block.z && smem == o.smem && cluster == o.cluster;
  }
};

// The kernel nodes of `g`; *total = all its nodes (fatal on a CUDA error).
void kernel_nodes(cudaGraph_t g, std::vector<KernelNode>* out, size_t* total) {
  out->clear();
  size_t n = 0;
  CUDA_OK(cudaGraphGetNodes(g, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n) CUDA_OK(cudaGraphGetNodes(g, nodes.data(), &n));
  *total = n;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType t;
    CUDA_OK(cudaGraphNodeGetType(node, &t));
    if (t != cudaGraphNodeTypeKernel) continue;
    cudaKernelNodeParams kp{};
    CUDA_OK(cudaGraphKernelNodeGetParams(node, &kp));
    KernelNode k;
    k.grid = kp.gridDim;
    k.block = kp.blockDim;
    k.smem = kp.sharedMemBytes;
    cudaLaunchAttributeValue v{};
    if (cudaGraphKernelNodeGetAttribute(node, cudaLaunchAttributeClusterDimension, &v) == cudaSuccess)
      k.cluster = v.clusterDim.x * v.clusterDim.y * v.clusterDim.z;
    else
      (void)cudaGetLastError();  // not reported: cluster stays 0 (no claim is made on it)
    out->push_back(k);
  }
}

std::string describe_nodes(const std::vector<KernelNode>& v, size_t total) {
  std::string s = std::to_string(total) + " node(s), " + std::to_string(v.size()) + " kernel node(s)";
  for (const KernelNode& k : v) s += "; " + k.describe();
  return s;
}

// Whether the automatic backend on the current device is SM90 (split-K claims).
bool auto_is_sm90() {
  int dev = 0;
  m3qkv_backend_kind k = M3QKV_BACKEND_NONE;
  return cudaGetDevice(&dev) == cudaSuccess && m3qkv_backend(dev, &k) == M3QKV_SUCCESS &&
         k == M3QKV_BACKEND_SM90;
}

// ------------------------------------------------------------- parameters
struct GraphCase {
  m3qkv_backend_kind backend;  // NONE = automatic (public entry point)
  int use_pdl;
};
std::string graph_case_name(const GraphCase& c) { return backend_label(c.backend) + "_pdl" + std::to_string(c.use_pdl); }
void PrintTo(const GraphCase& c, std::ostream* os) { *os << graph_case_name(c); }

const GraphCase kGraphCases[] = {{M3QKV_BACKEND_NONE, 0},
                                 {M3QKV_BACKEND_NONE, 1},
                                 {M3QKV_BACKEND_PORTABLE, 0},
                                 {M3QKV_BACKEND_PORTABLE, 1}};

struct StreamCase {
  m3qkv_backend_kind backend;
};
std::string stream_case_name(const StreamCase& c) { return backend_label(c.backend); }
void PrintTo(const StreamCase& c, std::ostream* os) { *os << stream_case_name(c); }

const StreamCase kStreamCases[] = {{M3QKV_BACKEND_NONE}, {M3QKV_BACKEND_PORTABLE}};

// ------------------------------------------------------------ graph tests
class GpuGraph : public ::testing::TestWithParam<GraphCase> {};

// One shape of CaptureReplaySameBytes (fatal failures end this shape only).
void capture_replay_one(const GraphCase& c, const Shape& shape, uint64_t seed_tag) {
  const std::string what = graph_case_name(c) + " " + shape_name(shape);
  SCOPED_TRACE(what);
  Job j;
  ASSERT_NO_FATAL_FAILURE(setup_job(&j, config(shape, seed_tag), /*salt=*/0, /*preset=*/0, c.use_pdl));
  const HostOutputs want0 = j.expected(0, 0);
  const HostOutputs want1 = j.expected(1, 0x100u);  // flags OR-ed into a preset value
  if (shape.oor) {
    ASSERT_NE(want0.flags, 0u) << "golden flags are 0 on an out-of-range problem: the flags check would be vacuous";
  }
  CUDA_OK(cudaDeviceSynchronize());  // the poison (legacy-stream copies) lands before the non-blocking stream runs

  Stream s;
  CUDA_OK(s.error());
  // Captured before anything else of the library runs in this test (see the
  // header: in a process of its own this is its first call).
  Graph g;
  ASSERT_NO_FATAL_FAILURE(capture(s.get(), call_name(c.backend), [&] { return call(j.args, c.backend, s.get()); }, &g));
  std::vector<KernelNode> nodes;
  size_t total = 0;
  ASSERT_NO_FATAL_FAILURE(kernel_nodes(g.get(), &nodes, &total));
  ASSERT_GE(nodes.size(), 1u) << "the captured graph has no kernel node: " << describe_nodes(nodes, total);
  std::printf("[ graph ] %s: %s\n", what.c_str(), describe_nodes(nodes, total).c_str());
  // The SM90 decode kernel's split-K (a grid over every SM, partials through
  // the per-stream workspace) is what the decode shapes are here for: its
  // workspace is allocated during this capture when the test runs first in
  // its process. A grid of one CTA per head means the plan did not split.
  const Heads& hd = shape.heads;
  const int heads = hd.nq + 2 * hd.nkv + hd.niq + hd.nik;
  if (c.backend == M3QKV_BACKEND_NONE && m3qkv::sm90::decode_preferred(shape.m, heads, false) && auto_is_sm90()) {
    bool split = false;
    for (const KernelNode& k : nodes) split = split || k.grid.x > static_cast<unsigned>(heads);
    EXPECT_TRUE(split) << "SM90 did not take the split-K decode path on " << shape_name(shape) << ": "
                       << describe_nodes(nodes, total);
  }

  // Capturing runs nothing: the outputs still hold the salt-0 poison.
  {
    Fetched untouched;
    CUDA_OK(fetch_outputs(j.out, &untouched));
    expect_same_outputs(j.p, poisoned_host_outputs(j.p, 0), untouched, what + " after capture, before any launch");
  }

  GraphExec exec;
  CUDA_OK(exec.instantiate(g.get()));
  // Replay 1 on salt-0 poison.
  Fetched graph0;
  CUDA_OK(cudaGraphLaunch(exec.get(), s.get()));
  ASSERT_NO_FATAL_FAILURE(check_outputs(j, s.get(), want0, what + " graph replay 1 (salt 0)", &graph0));
  // Replay 2, same exec, on salt-1 poison with preset flags: every byte is
  // written by the replay (no byte can equal both poisons) and nothing else.
  CUDA_OK(j.out.repoison(1, 0x100u));
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaGraphLaunch(exec.get(), s.get()));
  ASSERT_NO_FATAL_FAILURE(check_outputs(j, s.get(), want1, what + " graph replay 2 (salt 1, flags preset 0x100)"));
  // Replay 3 on its own output: no state consumed by a launch (a tile
  // counter, a split-K semaphore left set) and no dependence on the poison.
  CUDA_OK(cudaGraphLaunch(exec.get(), s.get()));
  ASSERT_NO_FATAL_FAILURE(check_outputs(j, s.get(), want1, what + " graph replay 3 (on replay 2's output)"));

  // A direct call: the golden bytes, and the graph's bytes.
  FusedRun run;
  run.backend = c.backend;
  run.use_pdl = c.use_pdl;
  Fetched direct;
  ASSERT_NO_FATAL_FAILURE(run_fused(j.p, j.in, run, 0, &direct));
  expect_same_outputs(j.p, want0, direct, what + " direct call");
  expect_same_fetched(j.p, direct, graph0, what + " graph replay 1 vs direct call");

  // A second capture, with the library warm: the same launch configuration
  // (the first capture may have been the library's first call).
  Graph g2;
  ASSERT_NO_FATAL_FAILURE(
      capture(s.get(), call_name(c.backend) + " (second capture)", [&] { return call(j.args, c.backend, s.get()); }, &g2));
  std::vector<KernelNode> nodes2;
  size_t total2 = 0;
  ASSERT_NO_FATAL_FAILURE(kernel_nodes(g2.get(), &nodes2, &total2));
  EXPECT_TRUE(total2 == total && nodes2 == nodes)
      << "the first and a later capture of the same call differ:\n  first:  " << describe_nodes(nodes, total)
      << "\n  second: " << describe_nodes(nodes2, total2);
}

TEST_P(GpuGraph, CaptureReplaySameBytes) {
  M3QKV_REQUIRE_GPU();
  print_seed_once();
  const GraphCase& c = GetParam();
  const Shape shapes[] = {kDecode, kSplitTile, kWaves, kPrefill};
  uint64_t tag = 0x6A00 + uint64_t(c.backend) * 16 + uint64_t(c.use_pdl) * 4;
  for (const Shape& s : shapes) {
    capture_replay_one(c, s, ++tag);
    if (HasFailure()) return;  // one shape's report is enough
  }
}

// Two calls on the same output buffers captured in one graph (with PDL the
// second node hangs on a programmatic edge and may start early): every byte
// both write must hold the second call's value, as in stream order.
TEST_P(GpuGraph, TwoCallsChainedInOrder) {
  M3QKV_REQUIRE_GPU();
  print_seed_once();
  const GraphCase& c = GetParam();
  const std::string what = graph_case_name(c) + " " + shape_name(kSplitTile) + " A then B";
  Job a, b;
  const uint64_t tag = 0x6B00 + uint64_t(c.backend) * 16 + uint64_t(c.use_pdl) * 4;
  ASSERT_NO_FATAL_FAILURE(setup_job(&a, config(kSplitTile, tag + 1), 0, 0, c.use_pdl));
  ASSERT_NO_FATAL_FAILURE(setup_job(&b, config(kSplitTile, tag + 2), 0, 0, c.use_pdl));
  // B writes into A's buffers (same shape: same sizes; the slots overlap in part).
  m3qkv_fused_args args_b = b.p.args_with(b.in.mapper(), a.out.ptrs());
  args_b.use_pdl = c.use_pdl;
  auto expected = [&](int salt, uint32_t preset) {
    HostOutputs w = poisoned_host_outputs(a.p, salt, preset);
    golden_epilogue(a.p, a.acc.data(), &w);
    golden_epilogue(b.p, b.acc.data(), &w);
    return w;
  };
  const HostOutputs want0 = expected(0, 0), want1 = expected(1, 0x100u);
  CUDA_OK(cudaDeviceSynchronize());

  Stream s;
  CUDA_OK(s.error());
  Graph g;
  ASSERT_NO_FATAL_FAILURE(capture(s.get(), call_name(c.backend) + " x2",
                                  [&] {
                                    const m3qkv_status st = call(a.args, c.backend, s.get());
                                    return st != M3QKV_SUCCESS ? st : call(args_b, c.backend, s.get());
                                  },
                                  &g));
  std::vector<KernelNode> nodes;
  size_t total = 0;
  ASSERT_NO_FATAL_FAILURE(kernel_nodes(g.get(), &nodes, &total));
  ASSERT_GE(nodes.size(), 2u) << "two calls, fewer than two kernel nodes: " << describe_nodes(nodes, total);
  GraphExec exec;
  CUDA_OK(exec.instantiate(g.get()));
  CUDA_OK(cudaGraphLaunch(exec.get(), s.get()));
  ASSERT_NO_FATAL_FAILURE(check_outputs(a, s.get(), want0, what + " replay 1 (salt 0)"));
  CUDA_OK(a.out.repoison(1, 0x100u));
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaGraphLaunch(exec.get(), s.get()));
  ASSERT_NO_FATAL_FAILURE(check_outputs(a, s.get(), want1, what + " replay 2 (salt 1, flags preset 0x100)"));
  // b's own outputs were never a target: still the poison.
  Fetched untouched;
  CUDA_OK(fetch_outputs(b.out, &untouched));
  expect_same_outputs(b.p, poisoned_host_outputs(b.p, 0), untouched, what + ": B's unused output set");
}

INSTANTIATE_TEST_SUITE_P(, GpuGraph, ::testing::ValuesIn(kGraphCases),
                         [](const ::testing::TestParamInfo<GraphCase>& i) { return graph_case_name(i.param); });

// ----------------------------------------------------------- stream tests
// Holds every stream that waits on it until open() (or a timeout), so work
// enqueued on several streams becomes ready at the same moment: the calls are
// all enqueued (their host-side setup done) before any of their kernels runs,
// and the kernels start together and may overlap. A host function on a third
// stream blocks the gate's event; it polls a flag the test sets.
//
// If a library call blocks the host until other streams' work is done (a
// device-wide synchronization, cudaMalloc / cudaFree, a synchronous copy), it
// waits for the gate, which waits for the test to finish enqueuing: the
// timeout breaks that deadlock and reports it.
class Gate {
 public:
  static constexpr std::chrono::seconds kTimeout{20};
  cudaError_t arm() {
    cudaError_t e = stream_.error();
    if (e == cudaSuccess) e = event_.error();
    if (e == cudaSuccess) e = cudaLaunchHostFunc(stream_.get(), &Gate::hold, this);
    if (e == cudaSuccess) e = cudaEventRecord(event_.get(), stream_.get());
    return e;
  }
  cudaError_t hold_back(cudaStream_t s) { return cudaStreamWaitEvent(s, event_.get(), 0); }
  void open() { open_.store(true, std::memory_order_release); }
  bool timed_out() const { return timed_out_.load(std::memory_order_acquire); }
  ~Gate() {
    open();
    (void)cudaStreamSynchronize(stream_.get());  // `hold` reads this object: let it finish first
  }

 private:
  static void CUDART_CB hold(void* self) {
    Gate* g = static_cast<Gate*>(self);
    const auto until = std::chrono::steady_clock::now() + kTimeout;
    while (!g->open_.load(std::memory_order_acquire)) {
      if (std::chrono::steady_clock::now() > until) {
        g->timed_out_.store(true, std::memory_order_release);
        return;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
  Stream stream_;
  Event event_;
  std::atomic<bool> open_{false};
  std::atomic<bool> timed_out_{false};
};

class GpuStreams : public ::testing::TestWithParam<StreamCase> {};

// Two independent problems on two non-blocking streams, enqueued back to back
// with no synchronization between them, both behind one gate; then both
// compared with their own golden outputs. `threads`: each call made from its
// own host thread, both at once. Overlap on the device is likely (neither
// call fills the GPU for long) but not required for the test to pass.
//
// What it catches: state shared by two calls in flight — a static / global
// parameter or scratch buffer (device or host) written by the second call's
// launch while the first kernel has not read it yet, a split-K or scheduler
// workspace shared between kernels, a cached tensor map or argument block
// keyed by shape (the same-shape case: equal shapes, different pointers and
// data), setup done on the default or a library-owned stream instead of the
// caller's, or a blocking call in the launch path (the gate's timeout); with
// threads, races in the library's host-side caches and thread-local errors.
void run_two(m3qkv_backend_kind backend, const Shape& sa, const Shape& sb, uint64_t tag, bool threads) {
  Job a, b;
  ASSERT_NO_FATAL_FAILURE(setup_job(&a, config(sa, tag + 1), 0, 0, 0));
  ASSERT_NO_FATAL_FAILURE(setup_job(&b, config(sb, tag + 2), 1, 0x100u, 0));
  // Warm the library first (documented use: module loading and attributes
  // outside the timed / gated region), so the gate only holds kernels.
  int dev = 0;
  CUDA_OK(cudaGetDevice(&dev));
  M3QKV_OK(m3qkv_warmup(dev));
  Stream s1, s2;
  CUDA_OK(s1.error());
  CUDA_OK(s2.error());
  // Two rounds: the poison salts and flag presets swapped, PDL off then on.
  for (int round = 0; round < 2; ++round) {
    const int salt_a = round, salt_b = 1 - round;
    const uint32_t preset_a = round ? 0x100u : 0u, preset_b = round ? 0u : 0x100u;
    a.args.use_pdl = b.args.use_pdl = round;  // PDL on in the second round
    const std::string what = backend_label(backend) + (threads ? " two host threads" : " one host thread") +
                             ", round " + std::to_string(round) + " (use_pdl " + std::to_string(round) + "): ";
    SCOPED_TRACE(what);
    CUDA_OK(a.out.repoison(salt_a, preset_a));
    CUDA_OK(b.out.repoison(salt_b, preset_b));
    CUDA_OK(cudaDeviceSynchronize());
    Gate gate;
    CUDA_OK(gate.arm());
    CUDA_OK(gate.hold_back(s1.get()));
    CUDA_OK(gate.hold_back(s2.get()));
    m3qkv_status st_a = M3QKV_ERROR_INTERNAL, st_b = M3QKV_ERROR_INTERNAL;
    std::string msg_a, msg_b;
    if (threads) {
      std::atomic<int> ready{0};
      auto body = [&](const m3qkv_fused_args* args, cudaStream_t s, m3qkv_status* st, std::string* msg) {
        const cudaError_t e = cudaSetDevice(dev);  // the current device is per host thread
        ready.fetch_add(1);
        while (ready.load() < 2) std::this_thread::yield();  // both threads call at the same time
        if (e != cudaSuccess) {
          *msg = cuda_msg(e, "cudaSetDevice in the calling thread", __FILE__, __LINE__);
          return;  // *st stays INTERNAL: reported below
        }
        *st = call(*args, backend, s);
        *msg = m3qkv_last_error();  // thread-local: each thread's own message
      };
      std::thread ta(body, &a.args, s1.get(), &st_a, &msg_a);
      std::thread tb(body, &b.args, s2.get(), &st_b, &msg_b);
      ta.join();
      tb.join();
    } else {
      st_a = call(a.args, backend, s1.get());
      msg_a = m3qkv_last_error();
      st_b = call(b.args, backend, s2.get());
      msg_b = m3qkv_last_error();
    }
    gate.open();
    EXPECT_EQ(st_a, M3QKV_SUCCESS) << what << call_name(backend) << " A: " << m3qkv_status_string(st_a) << ": "
                                   << msg_a;
    EXPECT_EQ(st_b, M3QKV_SUCCESS) << what << call_name(backend) << " B: " << m3qkv_status_string(st_b) << ": "
                                   << msg_b;
    CUDA_OK(cudaStreamSynchronize(s1.get()));
    CUDA_OK(cudaStreamSynchronize(s2.get()));
    EXPECT_FALSE(gate.timed_out()) << what << "the gate timed out: a call blocked the host until work on other "
                                   << "streams finished (a synchronizing CUDA call in the launch path)";
    ASSERT_NO_FATAL_FAILURE(check_outputs(a, s1.get(), a.expected(salt_a, preset_a), what + "A " + shape_name(sa)));
    ASSERT_NO_FATAL_FAILURE(check_outputs(b, s2.get(), b.expected(salt_b, preset_b), what + "B " + shape_name(sb)));
    if (::testing::Test::HasFailure()) return;
  }
}

// Different shapes: decode (SM90 split-K cluster kernel) next to a TP1 prefill.
TEST_P(GpuStreams, TwoCallsConcurrently) {
  M3QKV_REQUIRE_GPU();
  print_seed_once();
  run_two(GetParam().backend, kDecode, kTP1Prefill, 0x5A00 + uint64_t(GetParam().backend) * 16, false);
}

// The same shape on both streams, different data, two separate output sets.
TEST_P(GpuStreams, SameShapeTwoOutputSets) {
  M3QKV_REQUIRE_GPU();
  print_seed_once();
  run_two(GetParam().backend, kSplitTile, kSplitTile, 0x5B00 + uint64_t(GetParam().backend) * 16, false);
}

// The different-shape pair again, each call from its own host thread at once.
TEST_P(GpuStreams, TwoHostThreadsConcurrently) {
  M3QKV_REQUIRE_GPU();
  print_seed_once();
  run_two(GetParam().backend, kDecode, kTP1Prefill, 0x5C00 + uint64_t(GetParam().backend) * 16, true);
}

// The pairs again in a fresh process, so that every workspace and setup is a
// first one and happens behind the gate, with one hardware queue for every
// stream (CUDA_DEVICE_MAX_CONNECTIONS=1: the most false sharing between
// streams a process can have). Any host wait for device work in a launch
// path then holds the call until the gate's timeout (a stream's new
// workspace is zeroed by a cudaMemsetAsync on that stream, without a host
// wait: workspace.h).
TEST(GpuStreamsOneQueue, NoCallWaitsForOtherStreams) {
  M3QKV_REQUIRE_GPU();
  expect_child_passes("DISABLED_GpuStreamsChild.OneQueue", "CUDA_DEVICE_MAX_CONNECTIONS=1");
}

TEST(DISABLED_GpuStreamsChild, OneQueue) {
  CHILD_ONLY();
  print_seed_once();
  for (const StreamCase& c : kStreamCases) {
    const uint64_t tag = 0x5D00 + uint64_t(c.backend) * 16;
    ASSERT_NO_FATAL_FAILURE(run_two(c.backend, kDecode, kTP1Prefill, tag, true));
    ASSERT_NO_FATAL_FAILURE(run_two(c.backend, kSplitTile, kSplitTile, tag + 4, false));
  }
}

// ------------------------------------------------- serving-shaped probes
// A server that makes a stream per request: 1,000 x {create a stream; one
// fused call at TP4 M = 4096 (the prefill path: its x̂ / ŵ copies, 80 MiB,
// from the stream-ordered pool); synchronize; destroy the stream}. The device
// memory the library keeps afterwards is bounded (host/workspace.h: at most
// kMaxStreamWorkspaces heads per context, the pool's memory returned at
// synchronization), not 80 MiB a stream. The last cycle, on re-poisoned
// outputs, writes the first call's bytes.
TEST(GpuServing, StreamChurnKeepsBoundedMemory) {
  M3QKV_REQUIRE_GPU();
  print_seed_once();
  ProblemConfig cfg = config(Shape{kTP4, 4096, 6144, 128, false}, 0x6100);
  Job j;
  j.p = make_problem(cfg);  // no golden accumulator: cycles are compared with the first
  CUDA_OK(j.in.upload(j.p));
  CUDA_OK(j.out.init(j.p, 1, 0));  // the poison the last cycle writes into again
  j.args = j.p.args_with(j.in.mapper(), j.out.ptrs());
  M3QKV_OK(m3qkv_fused_qkv(&j.args, nullptr));  // modules loaded, the default stream's head made
  CUDA_OK(cudaDeviceSynchronize());
  Fetched first;
  CUDA_OK(fetch_outputs(j.out, &first));
  size_t free0 = 0, total = 0;
  CUDA_OK(cudaMemGetInfo(&free0, &total));
  constexpr int kCycles = 1000;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kCycles; ++i) {
    if (i == kCycles - 1) {
      CUDA_OK(j.out.repoison(1, 0));  // synchronous: nothing in flight reads the outputs then
      CUDA_OK(cudaDeviceSynchronize());
    }
    cudaStream_t s = nullptr;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const m3qkv_status st = m3qkv_fused_qkv(&j.args, s);
    const cudaError_t e = cudaStreamSynchronize(s);
    CUDA_OK(cudaStreamDestroy(s));
    ASSERT_EQ(st, M3QKV_SUCCESS) << "cycle " << i << ": " << m3qkv_last_error();
    CUDA_OK(e);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CUDA_OK(cudaDeviceSynchronize());
  size_t free1 = 0;
  CUDA_OK(cudaMemGetInfo(&free1, &total));
  const double retained_mib = (static_cast<double>(free0) - static_cast<double>(free1)) / (1 << 20);
  std::printf("[ serving ] %d stream churn cycles at TP4 M 4096: %.1f MiB retained, %.1f us per cycle\n", kCycles,
              retained_mib, secs * 1e6 / kCycles);
  RecordProperty("churn_retained_mib", std::to_string(retained_mib));
  EXPECT_LE(retained_mib, 64.0) << "stream workspaces outlive their streams";
  Fetched last;
  CUDA_OK(fetch_outputs(j.out, &last));
  expect_same_fetched(j.p, first, last, "the last churn cycle against the first");
}

// The self-test on another thread while this one has a global-mode capture
// open: the self-test's allocations run in relaxed capture mode, so the
// capture stays valid and its graph replays the golden bytes (10 rounds).
TEST(GpuServing, SelftestDuringAnotherThreadsCapture) {
  M3QKV_REQUIRE_GPU();
  print_seed_once();
  int dev = 0;
  CUDA_OK(cudaGetDevice(&dev));
  M3QKV_OK(m3qkv_warmup(dev));
  Job j;
  ASSERT_NO_FATAL_FAILURE(setup_job(&j, config(Shape{kTP4, 64, 512, 16, false}, 0x6200), 0, 0, 1));
  Stream s;
  CUDA_OK(s.error());
  for (int round = 0; round < 10; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    m3qkv_selftest_report report{};
    report.struct_size = sizeof(report);
    m3qkv_status selftest_st = M3QKV_ERROR_INTERNAL;
    std::string selftest_msg;
    Graph g;
    ASSERT_NO_FATAL_FAILURE(capture(s.get(), "m3qkv_fused_qkv with a self-test on another thread", [&] {
      const m3qkv_status st = m3qkv_fused_qkv(&j.args, s.get());
      std::thread other([&] {
        (void)cudaSetDevice(dev);
        selftest_st = m3qkv_selftest(dev, &report);
        selftest_msg = m3qkv_last_error();
      });
      other.join();  // the capture is still open while the self-test runs
      return st;
    }, &g));
    EXPECT_EQ(selftest_st, M3QKV_SUCCESS) << selftest_msg;
    EXPECT_EQ(report.status, M3QKV_SUCCESS);
    GraphExec exec;
    CUDA_OK(exec.instantiate(g.get()));
    CUDA_OK(j.out.repoison(round % 2, 0));
    CUDA_OK(cudaGraphLaunch(exec.get(), s.get()));
    ASSERT_NO_FATAL_FAILURE(check_outputs(j, s.get(), j.expected(round % 2, 0), "replay after the self-test"));
    if (HasFailure()) return;
  }
}

// Two threads capture on cudaStreamPerThread at once (one handle, two
// streams), M = 1 (split-K counters and partials) and M = 1024 (the prefill
// path: grid barrier and x̂ / ŵ): each capture has its own workspace, so the
// two graphs replayed concurrently 1,000 times each come out golden.
TEST(GpuServing, PerThreadStreamCapturesReplayConcurrently) {
  M3QKV_REQUIRE_GPU();
  print_seed_once();
  int dev = 0;
  CUDA_OK(cudaGetDevice(&dev));
  M3QKV_OK(m3qkv_warmup(dev));
  Job a, b;
  ASSERT_NO_FATAL_FAILURE(setup_job(&a, config(Shape{kTP4, 1, 1024, 128, false}, 0x6300), 0, 0, 1));
  ASSERT_NO_FATAL_FAILURE(setup_job(&b, config(Shape{kTP4, 1024, 256, 16, true}, 0x6301), 1, 0x100u, 1));
  std::atomic<int> captured{0}, failed{0};
  constexpr int kReplays = 1000;
  auto body = [&](Job* job, const char* what) {
    if (cudaSetDevice(dev) != cudaSuccess) {
      ++failed;
      return;
    }
    Graph g;
    capture(cudaStreamPerThread, what, [&] {
      const m3qkv_status st = m3qkv_fused_qkv(&job->args, cudaStreamPerThread);
      ++captured;
      while (captured.load() < 2 && failed.load() == 0) std::this_thread::yield();  // both captures open at once
      return st;
    }, &g);
    if (g.get() == nullptr) {
      ++failed;
      return;
    }
    GraphExec exec;
    EXPECT_EQ(exec.instantiate(g.get()), cudaSuccess);
    for (int i = 0; i < kReplays; ++i) EXPECT_EQ(cudaGraphLaunch(exec.get(), cudaStreamPerThread), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(cudaStreamPerThread), cudaSuccess) << what;
  };
  std::thread ta(body, &a, "M 1 on cudaStreamPerThread");
  std::thread tb(body, &b, "M 1024 on cudaStreamPerThread");
  ta.join();
  tb.join();
  ASSERT_EQ(failed.load(), 0);
  ASSERT_NO_FATAL_FAILURE(check_outputs(a, nullptr, a.expected(0, 0), "M 1 after 1,000 concurrent replays"));
  ASSERT_NO_FATAL_FAILURE(check_outputs(b, nullptr, b.expected(1, 0x100u), "M 1024 after 1,000 concurrent replays"));
}

INSTANTIATE_TEST_SUITE_P(, GpuStreams, ::testing::ValuesIn(kStreamCases),
                         [](const ::testing::TestParamInfo<StreamCase>& i) { return stream_case_name(i.param); });

}  // namespace
