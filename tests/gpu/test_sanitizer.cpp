// Small problems for compute-sanitizer runs (memcheck, racecheck, synccheck):
//   compute-sanitizer --tool memcheck  m3qkv_gpu_tests --gtest_filter='*Sanitizer*'
//   compute-sanitizer --tool racecheck m3qkv_gpu_tests --gtest_filter='*Sanitizer*'
// One M = 129 TP8 problem (a full 128-row tile plus a 1-row tail) through
// every entry point, with skipped and out-of-range slots and positions so the
// guard paths run too; the insert in each of its lane layouts. The tests also check the bytes, so they are useful
// without the sanitizer; they are kept small so the sanitizer finishes fast.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/layouts.h"
#include "common/problem.h"
#include "golden/golden.h"
#include "gpu/gpu_util.h"
#include "gpu/harness.h"

namespace {

using namespace m3qkv_gpu;

ProblemConfig sanitizer_config() {
  ProblemConfig c;
  c.m = 129;
  c.k = 256;
  c.nq = 8;
  c.nkv = 1;
  c.niq = 1;
  c.nik = 1;
  c.block_size = 16;
  c.exact_data = true;
  c.out_of_range_slots = true;
  c.out_of_range_positions = true;
  c.slot_skip_fraction = 0.25;
  return c;
}

TEST(GpuSanitizer, FusedTP8M129) {
  M3QKV_REQUIRE_GPU();
  const Problem p = m3qkv_test::make_problem(sanitizer_config());
  const auto acc = m3qkv::golden::mxfp8_acc(p.xq.data(), p.xsf.data(), p.wq.data(), p.wsf.data(), p.m, p.n(), p.k);
  DeviceInputs in;
  CUDA_OK(in.upload(p));
  for (m3qkv_backend_kind b : fused_backends()) {
    for (int pdl = 0; pdl < 2; ++pdl) {
      FusedRun run;
      run.backend = b;
      run.tap = pdl == 0;
      run.use_pdl = pdl;
      Fetched got;
      ASSERT_NO_FATAL_FAILURE(run_fused(p, in, run, pdl, &got));
      HostOutputs want = poisoned_host_outputs(p, pdl);
      golden_epilogue(p, acc.data(), &want);
      expect_same_outputs(p, want, got, "sanitizer fused [" + backend_label(b) + "] use_pdl " + std::to_string(pdl));
    }
  }
}

// The SM90 prefill paths (M >= 512: activations, then also weights converted
// into the stream workspace; the prefill kernel's epilogue warpgroup and its
// shared-memory hand-off) through the automatic choice: TP8 M = 1024 K = 256
// (96 tiles of 128 rows: one tile per CTA, the hand-off buffers used once)
// and M = 1024 with a grid of 8 (every CTA walks 12 tiles: both hand-off
// buffers and the stage ring wrap). Other backends run the same problem.
TEST(GpuSanitizer, FusedPrefillTP8M1024) {
  M3QKV_REQUIRE_GPU();
  ProblemConfig c = sanitizer_config();
  c.m = 1024;
  const Problem p = m3qkv_test::make_problem(c);
  const auto acc = m3qkv::golden::mxfp8_acc(p.xq.data(), p.xsf.data(), p.wq.data(), p.wsf.data(), p.m, p.n(), p.k);
  DeviceInputs in;
  CUDA_OK(in.upload(p));
  for (int grid : {0, 8}) {
    FusedRun run;
    run.backend = M3QKV_BACKEND_NONE;  // automatic: the SM90 prefill kernel on the H200
    run.grid = grid;
    run.use_pdl = 1;
    Fetched got;
    ASSERT_NO_FATAL_FAILURE(run_fused(p, in, run, 0, &got));
    HostOutputs want = poisoned_host_outputs(p, 0);
    golden_epilogue(p, acc.data(), &want);
    expect_same_outputs(p, want, got, "sanitizer prefill grid " + std::to_string(grid));
  }
}

TEST(GpuSanitizer, UnfusedTP8M129) {
  M3QKV_REQUIRE_GPU();
  const Problem p = m3qkv_test::make_problem(sanitizer_config());
  DeviceInputs in;
  CUDA_OK(in.upload(p));
  const auto ins = p.inputs();
  // quantize: bf16 -> xq / xsf (values from the exact operands, decoded)
  std::vector<uint16_t> x(size_t(p.m * p.k));
  {
    const auto d = m3qkv::golden::mxfp8_decode(p.xq.data(), p.xsf.data(), p.m, p.k);
    std::vector<float> f(d.begin(), d.end());
    x = m3qkv_test::to_bf16(f);
  }
  std::vector<uint8_t> want_q(size_t(p.m * p.k)), want_sf(p.xsf.size());
  m3qkv::golden::mxfp8_quantize(x.data(), p.m, p.k, want_q.data(), want_sf.data());
  M3QKV_ALLOC(dx, x.size() * 2);
  CUDA_OK(dx.upload(x));
  GuardedBuffer q, sf;
  CUDA_OK(q.init(want_q.size(), 0));
  CUDA_OK(sf.init(want_sf.size(), 0));
  m3qkv_quantize_args qa{};
  qa.struct_size = sizeof qa;
  qa.m = p.m;
  qa.k = p.k;
  qa.x = dx.get();
  qa.xq = q.payload();
  qa.xsf = sf.payload();
  M3QKV_OK(m3qkv_mxfp8_quantize(&qa, nullptr));

  // gemm -> insert
  GuardedBuffer qkv;
  CUDA_OK(qkv.init(size_t(p.m * p.n()) * 2, 0));
  m3qkv_gemm_args g{};
  g.struct_size = sizeof g;
  g.m = p.m;
  g.n = p.n();
  g.k = p.k;
  g.xq = in.get(ins[0]);
  g.xsf = in.get(ins[1]);
  g.wq = in.get(ins[2]);
  g.wsf = in.get(ins[3]);
  g.out = qkv.payload();
  M3QKV_OK(m3qkv_mxfp8_gemm(&g, nullptr));
  DeviceOutputs d;
  CUDA_OK(d.init(p, 1));
  m3qkv_insert_args a = p.insert_args_with(in.mapper(), qkv.payload(), d.ptrs());
  a.use_pdl = 1;
  M3QKV_OK(m3qkv_qknorm_rope_kv_insert(&a, nullptr));
  CUDA_OK(cudaDeviceSynchronize());

  std::vector<uint8_t> gq, gsf, gqkv;
  bool ok1 = false, ok2 = false, ok3 = false;
  int64_t bad = 0;
  CUDA_OK(q.fetch(&gq, &ok1, &bad));
  CUDA_OK(sf.fetch(&gsf, &ok2, &bad));
  CUDA_OK(qkv.fetch(&gqkv, &ok3, &bad));
  EXPECT_TRUE(ok1 && ok2 && ok3) << "write outside a buffer";
  EXPECT_EQ(gq, want_q) << "quantize xq";
  EXPECT_EQ(gsf, want_sf) << "quantize xsf";
  std::vector<uint16_t> want_qkv(size_t(p.m * p.n()));
  m3qkv_gemm_args h = g;
  h.xq = p.xq.data();
  h.xsf = p.xsf.data();
  h.wq = p.wq.data();
  h.wsf = p.wsf.data();
  h.out = want_qkv.data();
  m3qkv::golden::gemm_bf16(h);
  ASSERT_EQ(gqkv.size(), want_qkv.size() * 2);
  EXPECT_EQ(first_diff(gqkv.data(), reinterpret_cast<const uint8_t*>(want_qkv.data()), gqkv.size()), -1) << "gemm out";
  Fetched got;
  CUDA_OK(fetch_outputs(d, &got));
  HostOutputs want = poisoned_host_outputs(p, 1);
  golden_insert(p, want_qkv.data(), &want);
  expect_same_outputs(p, want, got, "sanitizer insert");
  // The plan's layout above (NVFP4 KV, TP8, 1548 head rows: split c32q8); the others forced.
  for (int layout : {kInsertQuadRows, kInsertWarpRows, kInsertLane8Rows, kInsertSplitC16Q8}) {
    InsertLayoutScope forced(layout);
    DeviceOutputs d2;
    CUDA_OK(d2.init(p, 1));
    m3qkv_insert_args a2 = p.insert_args_with(in.mapper(), qkv.payload(), d2.ptrs());
    a2.use_pdl = 1;
    M3QKV_OK(m3qkv_qknorm_rope_kv_insert(&a2, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    Fetched got2;
    CUDA_OK(fetch_outputs(d2, &got2));
    expect_same_outputs(p, want, got2, std::string("sanitizer insert, ") + insert_layout_name(layout));
  }
}

}  // namespace
