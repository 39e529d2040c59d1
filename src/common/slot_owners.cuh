// Slot ownership within one call (docs/contract.md §4.4): where several tokens
// of a call name one slot (or one index slot), the last of them (the largest
// row) owns it and writes its row whole; the others are treated as if their
// slot were negative. Without this, two writers of one row race store by
// store, and an NVFP4 row could keep one token's data bytes and the other's
// scale bytes.
//
// A kernel decides ownership for a block of rows [row0, row0 + rows) that
// it is about to finish, in shared memory: an open-addressing table of the
// block's slots (at most half full), each with the largest row naming it,
// first among the block's rows, then over every later row of the call. The
// cost is one pass over the later rows' slot words per block, spread over
// the block's threads (rows before the block cannot own its slots); a query
// is a hash and a probe or two. row_dest (epilogue_quad.cuh) and
// epilogue_head_row (epilogue.cuh) ask it for every cache row; the golden
// model applies the same rule (golden.cpp).
#pragma once

#include <stdint.h>

#include "common/layouts.h"
#include "common/numerics.h"

namespace m3qkv {
namespace epi {

// Which slot words a block's table holds: the KV slots (k / v heads), the
// index slots (index_k heads), or both (blocks that mix heads).
enum SlotMaps : uint32_t { kSlotMapKv = 1u, kSlotMapIndex = 2u, kSlotMapBoth = 3u };

// A key: the slot, bit 63 set for an index slot (slots are >= 0). The empty
// marker is the index slot INT64_MAX, which no cache can hold: a row naming
// it owns it unasked (resolve_slot flags it out of range anyway).
constexpr unsigned long long kSlotKeyEmpty = ~0ull;
M3_HD unsigned long long slot_key(int64_t slot, bool index) {
  return static_cast<unsigned long long>(slot) | (index ? (1ull << 63) : 0ull);
}
M3_HD uint32_t slot_hash(unsigned long long key, uint32_t mask) {
  return static_cast<uint32_t>((key * 0x9E3779B97F4A7C15ull) >> 32) & mask;  // Fibonacci hashing
}

// The read side, passed by value to the row epilogues.
struct SlotOwners {
  const unsigned long long* key;  // shared memory
  const int32_t* last;            // the largest row naming key[i] (rows < 2^31: the API's bound on M)
  uint32_t mask;                  // entries - 1
  // Whether `row` (whose slot word is `slot`) writes that slot. `slot` < 0:
  // nothing to own (the caller skips the row anyway).
  M3_HD bool owns(int64_t slot, bool index, int64_t row) const {
    if (slot < 0) return true;
    const unsigned long long k = slot_key(slot, index);
    if (k == kSlotKeyEmpty) return true;
    for (uint32_t h = slot_hash(k, mask);; h = (h + 1) & mask) {
      const unsigned long long v = key[h];
      if (v == k) return last[h] == row;
      if (v == kSlotKeyEmpty) return true;  // not a row of this block: never asked
    }
  }
};

// The table of one block's slot words: at most kKeys of them (rows for a
// block of one head kind, twice that for kSlotMapBoth). Lives in shared
// memory (a Config region).
template <int kKeys>
struct SlotOwnerTable {
  static constexpr int entries() {
    int e = 1;
    while (e < 2 * kKeys) e *= 2;
    return e;
  }
  static constexpr int kEntries = entries();  // a power of two, >= 2 keys per entry used
  unsigned long long key[kEntries];
  int32_t last[kEntries];

  M3_HD SlotOwners view() const { return {key, last, kEntries - 1u}; }
};

// Shared-memory atomics on the device; the host form (CPU tests: one
// thread, sync a no-op) does the same in plain code.
M3_HD unsigned long long owner_cas(unsigned long long* a, unsigned long long expect, unsigned long long v) {
#ifdef __CUDA_ARCH__
  return atomicCAS(a, expect, v);
#else
  const unsigned long long old = *a;
  if (old == expect) *a = v;
  return old;
#endif
}
M3_HD void owner_max(int32_t* a, int32_t v) {
#ifdef __CUDA_ARCH__
  atomicMax(a, v);
#else
  if (v > *a) *a = v;
#endif
}

// Empties `t` (every query then says "owns"), then sync(): the start of every
// fill below, and all the kernels running on resolved slot words need.
template <int kKeys, class Sync>
M3_HD void clear_slot_owners(SlotOwnerTable<kKeys>& t, int tid, int nthreads, const Sync& sync) {
  for (int i = tid; i < SlotOwnerTable<kKeys>::kEntries; i += nthreads) {
    t.key[i] = kSlotKeyEmpty;
    t.last[i] = -1;
  }
  sync();
}

// Fills `t` for rows [row0, row0 + rows) of a call of m rows (rows past m are
// left out); rows · (maps == kSlotMapBoth ? 2 : 1) <= kKeys. Called by threads
// tid = 0 .. nthreads-1 of the block, all of them, after their last query of
// the table's previous contents; sync() is their barrier (__syncthreads or a
// named barrier), after which t.view() answers for the block. slots / index_slots: the call's
// slot_mapping / index_slot_mapping (null where `maps` leaves it out).
// kBatch: later rows read per thread at a time (the cost of the pass is its
// loads; 1 where registers are tight).
constexpr int kOwnerBatch = 8;
template <int kBatch = kOwnerBatch, int kKeys, class Sync>
M3_HD void build_slot_owners(SlotOwnerTable<kKeys>& t, const int64_t* slots,
                                                  const int64_t* index_slots, uint32_t maps, int64_t m, int64_t row0,
                                                  int rows, int tid, int nthreads, const Sync& sync) {
  using Table = SlotOwnerTable<kKeys>;
  constexpr uint32_t kMask = Table::kEntries - 1u;
  const int n = static_cast<int>(row0 + rows <= m ? rows : (m > row0 ? m - row0 : 0));
  clear_slot_owners(t, tid, nthreads, sync);
  const bool kv = (maps & kSlotMapKv) != 0u, ix = (maps & kSlotMapIndex) != 0u;
  // The block's rows: insert each key, keep the largest row.
  for (int i = tid; i < 2 * n; i += nthreads) {
    const bool index = i >= n;
    if (index ? !ix : !kv) continue;
    const int64_t row = row0 + (index ? i - n : i);
    const int64_t s = (index ? index_slots : slots)[row];
    if (s < 0) continue;
    const unsigned long long k = slot_key(s, index);
    if (k == kSlotKeyEmpty) continue;
    for (uint32_t h = slot_hash(k, kMask);; h = (h + 1) & kMask) {
      const unsigned long long old = owner_cas(&t.key[h], kSlotKeyEmpty, k);
      if (old == kSlotKeyEmpty || old == k) {
        owner_max(&t.last[h], static_cast<int32_t>(row));
        break;
      }
    }
  }
  sync();
  // Every later row: a slot the block holds goes to it. kBatch rows per
  // thread at a time (consecutive threads on consecutive rows): their loads
  // are in flight together.
  for (int64_t row0b = row0 + n + tid; row0b < m; row0b += static_cast<int64_t>(kBatch) * nthreads) {
    int64_t s[kBatch][2];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int64_t row = row0b + static_cast<int64_t>(b) * nthreads;
      s[b][0] = kv && row < m ? slots[row] : -1;
      s[b][1] = ix && row < m ? index_slots[row] : -1;
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b)
#pragma unroll
      for (int w = 0; w < 2; ++w) {
        if (s[b][w] < 0) continue;
        const unsigned long long k = slot_key(s[b][w], w == 1);
        if (k == kSlotKeyEmpty) continue;
        for (uint32_t h = slot_hash(k, kMask);; h = (h + 1) & kMask) {
          const unsigned long long v = t.key[h];
          if (v == k) {
            owner_max(&t.last[h], static_cast<int32_t>(row0b + static_cast<int64_t>(b) * nthreads));
            break;
          }
          if (v == kSlotKeyEmpty) break;
        }
      }
  }
  sync();
}

// The whole-call form, for a kernel whose blocks would otherwise each scan
// every later row (the insert at large M: O(M²/rows per block) slot loads;
// portable/launch.cu): one table of every row's slot words in global memory,
// built in three grid-wide passes (clear, insert, resolve), each a loop of
// these per-entry / per-row steps; the resolve pass writes each row's slot
// word as the kernels should see it: its own where it owns the slot (or names
// none), -1 where a later row does. The kernels then run on those words with
// an empty block table (every row owns what it names).
constexpr int64_t owner_entries_for(int64_t keys) {
  int64_t e = 1;
  while (e < 2 * keys) e *= 2;
  return e;
}
M3_HD void owner_table_clear(unsigned long long* key, int32_t* last, int64_t i) {
  key[i] = kSlotKeyEmpty;
  last[i] = -1;
}
M3_HD void owner_table_insert(unsigned long long* key, int32_t* last, uint32_t mask, int64_t slot, bool index,
                              int64_t row) {
  if (slot < 0) return;
  const unsigned long long k = slot_key(slot, index);
  if (k == kSlotKeyEmpty) return;
  for (uint32_t h = slot_hash(k, mask);; h = (h + 1) & mask) {
    const unsigned long long old = owner_cas(&key[h], kSlotKeyEmpty, k);
    if (old == kSlotKeyEmpty || old == k) {
      owner_max(&last[h], static_cast<int32_t>(row));
      return;
    }
  }
}
M3_HD int64_t owner_table_resolve(const unsigned long long* key, const int32_t* last, uint32_t mask, int64_t slot,
                                  bool index, int64_t row) {
  return SlotOwners{key, last, mask}.owns(slot, index, row) ? slot : -1;
}

// The slot words a block of `kind` heads writes (0: q / index_q heads, no
// table); uniform over the block, as its barriers need.
M3_HD uint32_t slot_maps_of(HeadKind kind) {
  return kind == HeadKind::K || kind == HeadKind::V ? kSlotMapKv : kind == HeadKind::IndexK ? kSlotMapIndex : 0u;
}

}  // namespace epi
}  // namespace m3qkv
