// The standalone insert's guess before griddepcontrol.wait (epi::row_spec):
// each warp reads its row's slot and position before the wait, while the
// predecessor grid may still be writing them, and checks them after it. Here
// the predecessor does exactly that: it releases its dependents at once
// (griddepcontrol.launch_dependents), spins for 30 µs, then overwrites the
// positions, slot mappings and index slot mappings the insert reads. The
// insert (use_pdl = 1) starts during the spin, so its guesses see the old
// words; the outputs and flags must still equal the golden insert of the new
// ones, byte for byte, in every lane layout. The old words differ from the
// new in every row (other cos / sin rows, other slots, skipped and
// out-of-range slots and positions where the new ones are valid and the
// reverse), so a guess used without its check shows in the bytes.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gpu/harness.h"
#include "ptx/globaltimer.cuh"
#include "ptx/griddepcontrol.cuh"

namespace m3qkv_gpu {
namespace {

// One CTA: lets the dependent grid launch, spins, then copies the new words.
__global__ void release_spin_then_write(int64_t* pos, const int64_t* new_pos, int64_t* slots, const int64_t* new_slots,
                                        int64_t* islots, const int64_t* new_islots, int64_t m, uint64_t spin_ns) {
  griddepcontrol_launch_dependents();
  const uint64_t t0 = m3qkv::ptx::globaltimer();
  while (m3qkv::ptx::globaltimer() - t0 < spin_ns) {
  }
  for (int64_t i = threadIdx.x; i < m; i += blockDim.x) {
    pos[i] = new_pos[i];
    slots[i] = new_slots[i];
    if (islots != nullptr) islots[i] = new_islots[i];
  }
}

// Old words: a different position (so another cos / sin row) or an
// out-of-range one; another token's slot, a skipped or an out-of-range slot.
std::vector<int64_t> old_words(const std::vector<int64_t>& now, int64_t limit, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> old(now.size());
  for (size_t i = 0; i < now.size(); ++i) {
    switch (rng() % 4) {
      case 0: old[i] = now[i] < 0 ? int64_t(rng() % uint64_t(limit)) : -1; break;
      case 1: old[i] = limit + int64_t(rng() % 7); break;  // out of range
      default: {
        int64_t v = int64_t(rng() % uint64_t(limit));
        if (v == now[i]) v = (v + 1) % limit;
        old[i] = v;
      }
    }
  }
  return old;
}

struct PdlCase {
  Heads h;
  int64_t m;
  int kv_dtype, index_dtype;
};

class GpuInsertPdlGuess : public ::testing::TestWithParam<PdlCase> {};

TEST_P(GpuInsertPdlGuess, PredecessorRewritesSlotsAndPositions) {
  M3QKV_REQUIRE_GPU();
  print_seed_once();
  const PdlCase& c = GetParam();
  int cc_major = 0;
  CUDA_OK(cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, 0));
  if (cc_major < 9) GTEST_SKIP() << "griddepcontrol needs compute capability 9.0";
  ProblemConfig cfg;
  cfg.m = c.m;
  cfg.k = 128;  // the GEMM operands are not used
  cfg.nq = c.h.nq;
  cfg.nkv = c.h.nkv;
  cfg.niq = c.h.niq;
  cfg.nik = c.h.nik;
  cfg.kv_dtype = c.kv_dtype;
  cfg.index_dtype = c.index_dtype;
  cfg.out_of_range_slots = true;
  cfg.out_of_range_positions = true;
  cfg.slot_skip_fraction = 0.25;
  const Problem p = m3qkv_test::make_problem(cfg);

  std::mt19937_64 rng(p.cfg.seed ^ 0x9DF0ULL);
  std::normal_distribution<double> nd(0.0, 1.0);
  std::vector<float> x(size_t(p.m * p.n()));
  for (float& v : x) v = float(nd(rng) * 4.0);
  const std::vector<uint16_t> qkv = m3qkv_test::to_bf16(x);

  const std::vector<int64_t> old_pos = old_words(p.positions, p.max_position, p.cfg.seed ^ 1);
  const std::vector<int64_t> old_slots = old_words(p.slot_mapping, p.num_blocks * p.block_size, p.cfg.seed ^ 2);
  const std::vector<int64_t> old_islots =
      p.index_slot_mapping.empty() ? std::vector<int64_t>()
                                   : old_words(p.index_slot_mapping, p.num_index_blocks * p.block_size, p.cfg.seed ^ 3);

  DeviceInputs in;
  CUDA_OK(in.upload(p));
  M3QKV_ALLOC(dqkv, qkv.size() * 2);
  CUDA_OK(dqkv.upload(qkv));
  const size_t words = size_t(p.m) * sizeof(int64_t);
  M3QKV_ALLOC(new_pos, words);
  M3QKV_ALLOC(new_slots, words);
  M3QKV_ALLOC(new_islots, words);
  CUDA_OK(new_pos.upload(p.positions));
  CUDA_OK(new_slots.upload(p.slot_mapping));
  if (!old_islots.empty()) CUDA_OK(new_islots.upload(p.index_slot_mapping));
  Stream s;
  CUDA_OK(s.error());

  for (int layout : {0, kInsertQuadRows, kInsertWarpRows, kInsertLane8Rows, kInsertSplitC32Q8, kInsertSplitC16Q8,
                     kInsertSplitC16Q8Guess}) {
    InsertLayoutScope forced(layout);
    const std::string what = std::string(c.h.name) + " M " + std::to_string(c.m) + " kv " +
                             std::to_string(c.kv_dtype) + " index " + std::to_string(c.index_dtype) + " layout " +
                             (layout == 0 ? std::string("auto") : insert_layout_name(layout));
    SCOPED_TRACE(what);
    DeviceOutputs d;
    CUDA_OK(d.init(p, 0));
    m3qkv_insert_args a = p.insert_args_with(in.mapper(), dqkv.get(), d.ptrs());
    a.use_pdl = 1;
    // The live words start as the old ones.
    int64_t* pos = const_cast<int64_t*>(a.positions);
    int64_t* slots = const_cast<int64_t*>(a.slot_mapping);
    int64_t* islots = const_cast<int64_t*>(a.index_slot_mapping);
    CUDA_OK(cudaMemcpy(pos, old_pos.data(), words, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(slots, old_slots.data(), words, cudaMemcpyHostToDevice));
    if (islots != nullptr) CUDA_OK(cudaMemcpy(islots, old_islots.data(), words, cudaMemcpyHostToDevice));
    CUDA_OK(cudaDeviceSynchronize());  // pageable copies may return before they land
    release_spin_then_write<<<1, 256, 0, s.get()>>>(pos, static_cast<const int64_t*>(new_pos.get()), slots,
                                                     static_cast<const int64_t*>(new_slots.get()), islots,
                                                     static_cast<const int64_t*>(new_islots.get()), p.m, 30000);
    CUDA_OK(cudaGetLastError());
    M3QKV_OK(m3qkv_qknorm_rope_kv_insert(&a, s.get()));
    CUDA_OK(cudaStreamSynchronize(s.get()));
    Fetched got;
    CUDA_OK(fetch_outputs(d, &got));
    HostOutputs want = poisoned_host_outputs(p, 0);
    golden_insert(p, qkv.data(), &want);
    expect_same_outputs(p, want, got, "insert after a predecessor rewriting its slots and positions: " + what);
    if (HasFailure()) return;
  }
}

std::string pdl_name(const ::testing::TestParamInfo<PdlCase>& i) {
  const char* fmt[] = {"Nvfp4", "Fp8", "Bf16"};
  return std::string(i.param.h.name) + "_M" + std::to_string(i.param.m) + "_kv" + fmt[i.param.kv_dtype] + "_index" +
         fmt[i.param.index_dtype];
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuInsertPdlGuess,
                         ::testing::Values(PdlCase{kTP1, 1, 0, 0}, PdlCase{kTP4, 16, 0, 1}, PdlCase{kTP8, 64, 1, 0},
                                           PdlCase{kTP2, 300, 2, 2}, PdlCase{kDense, 7, 1, 1}),
                         pdl_name);

}  // namespace
}  // namespace m3qkv_gpu
