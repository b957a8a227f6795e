// The workspace layout contract (DESIGN.md, "Workspace layout"): the counter region is
// always bytes [0, 8 MiB); the other regions follow it, 256-aligned, in order, without
// overlap; sizes are exact in 64-bit arithmetic even far past 2^31 elements.
#include "cc/splitkv/workspace_layout.h"

#include <cstdint>
#include <vector>

#include "tests/cc/test_check.h"

namespace {

using splitkv::ComputeWorkspaceLayout;
using splitkv::kCounterRegionBytes;
using splitkv::kWorkspaceAlignment;
using splitkv::LayoutShape;
using splitkv::RequiredWorkspaceBytes;
using splitkv::WorkspaceLayout;

static_assert(kCounterRegionBytes == 8 * 1024 * 1024);
static_assert(splitkv::kStatusOffset + splitkv::kStatusBytes == kCounterRegionBytes,
              "the status record is the counter region's tail");
static_assert(splitkv::kMaxCounters == splitkv::kStatusOffset / 4 && splitkv::kMaxCounters == 2097088);
static_assert(RequiredWorkspaceBytes(LayoutShape{1, 1, 1}, 1) == kCounterRegionBytes,
              "the layout must stay usable in constant expressions");

const std::vector<int64_t> kTotalQ = {0, 1, 7, 1000, int64_t{1} << 20, 3'000'001};
const std::vector<int64_t> kHeads = {1, 8, 32, 128};
const std::vector<int64_t> kHeadDims = {1, 64, 128, 256};
const std::vector<int64_t> kSplits = {1, 2, 3, 16, 64, 1000};

// Exact byte counts in 128-bit arithmetic, to catch any 32-bit intermediate.
__int128 Partials(const LayoutShape& shape, int64_t num_splits) {
  return num_splits > 1 ? __int128{num_splits} * shape.total_q * shape.num_qo_heads : 0;
}

int64_t Low64(__int128 x) { return static_cast<int64_t>(x); }

TEST(CounterRegionIsFixedForEveryShape) {
  for (int64_t tq : kTotalQ) {
    for (int64_t h : kHeads) {
      for (int64_t d : kHeadDims) {
        for (int64_t s : kSplits) {
          const WorkspaceLayout layout = ComputeWorkspaceLayout(LayoutShape{tq, h, d}, s);
          EXPECT_EQ(int64_t{0}, layout.counter_offset);
          EXPECT_EQ(kCounterRegionBytes, layout.counter_bytes);
        }
      }
    }
  }
}

TEST(RegionsAreAlignedOrderedAndExact) {
  for (int64_t tq : kTotalQ) {
    for (int64_t h : kHeads) {
      for (int64_t d : kHeadDims) {
        for (int64_t s : kSplits) {
          const LayoutShape shape{tq, h, d};
          const WorkspaceLayout l = ComputeWorkspaceLayout(shape, s);
          EXPECT_EQ(int64_t{0}, l.softmax_offset % kWorkspaceAlignment);
          EXPECT_EQ(int64_t{0}, l.scratch_offset % kWorkspaceAlignment);
          EXPECT_EQ(int64_t{0}, l.required_bytes % kWorkspaceAlignment);
          // In order, no overlap, and packed (less than one alignment of padding between).
          EXPECT_LE(l.counter_offset + l.counter_bytes, l.softmax_offset);
          EXPECT_LT(l.softmax_offset - (l.counter_offset + l.counter_bytes), kWorkspaceAlignment);
          EXPECT_LE(l.softmax_offset + l.softmax_bytes, l.scratch_offset);
          EXPECT_LT(l.scratch_offset - (l.softmax_offset + l.softmax_bytes), kWorkspaceAlignment);
          EXPECT_LE(l.scratch_offset + l.scratch_bytes, l.required_bytes);
          EXPECT_LT(l.required_bytes - (l.scratch_offset + l.scratch_bytes), kWorkspaceAlignment);
          EXPECT_EQ(Low64(Partials(shape, s) * 8), l.softmax_bytes);
          EXPECT_EQ(Low64(Partials(shape, s) * d * 4), l.scratch_bytes);
          EXPECT_EQ(l.required_bytes, RequiredWorkspaceBytes(shape, s));
        }
      }
    }
  }
}

TEST(SizesPast2To31ElementsUse64Bits) {
  // 2^20 tokens x 128 heads x 64 splits = 2^33 partials; x 256 dims = 2^41 scratch floats.
  const LayoutShape shape{int64_t{1} << 20, 128, 256};
  const WorkspaceLayout l = ComputeWorkspaceLayout(shape, 64);
  EXPECT_EQ(int64_t{1} << 36, l.softmax_bytes);
  EXPECT_EQ(int64_t{1} << 43, l.scratch_bytes);
  EXPECT_EQ(kCounterRegionBytes + (int64_t{1} << 36), l.scratch_offset);
  EXPECT_EQ(kCounterRegionBytes + (int64_t{1} << 36) + (int64_t{1} << 43), l.required_bytes);
  // An odd shape whose element count is past 2^31 but not a power of two.
  const LayoutShape odd{3'000'001, 96, 192};
  const __int128 partials = __int128{48} * 3'000'001 * 96;
  const WorkspaceLayout m = ComputeWorkspaceLayout(odd, 48);
  EXPECT_GT(m.scratch_bytes, int64_t{1} << 31);
  EXPECT_EQ(Low64(partials * 192 * 4), m.scratch_bytes);
  EXPECT_EQ(Low64(partials * 8), m.softmax_bytes);
}

TEST(OneSplitNeedsExactlyTheCounterRegion) {
  for (int64_t tq : kTotalQ) {
    for (int64_t h : kHeads) {
      for (int64_t d : kHeadDims) {
        const WorkspaceLayout l = ComputeWorkspaceLayout(LayoutShape{tq, h, d}, 1);
        EXPECT_EQ(kCounterRegionBytes, l.required_bytes);
        EXPECT_EQ(int64_t{0}, l.softmax_bytes);
        EXPECT_EQ(int64_t{0}, l.scratch_bytes);
      }
    }
  }
  EXPECT_EQ(int64_t{0}, splitkv::RequiredCounters(1000, 8, 4, 1));
}

TEST(RequiredBytesAreMonotoneInNumSplits) {
  for (int64_t tq : {int64_t{1}, int64_t{13}, int64_t{4096}}) {
    for (int64_t h : {int64_t{1}, int64_t{32}}) {
      for (int64_t d : {int64_t{1}, int64_t{128}}) {
        const LayoutShape shape{tq, h, d};
        // Non-decreasing (alignment may round neighbours to the same size), and any split
        // beyond one needs more than the counter region.
        EXPECT_GT(RequiredWorkspaceBytes(shape, 2), RequiredWorkspaceBytes(shape, 1));
        int64_t previous = RequiredWorkspaceBytes(shape, 1), decreases = 0;
        for (int64_t s = 2; s <= 256; ++s) {
          const int64_t bytes = RequiredWorkspaceBytes(shape, s);
          decreases += bytes < previous;
          previous = bytes;
        }
        EXPECT_EQ(int64_t{0}, decreases);
        EXPECT_GT(RequiredWorkspaceBytes(shape, 256), RequiredWorkspaceBytes(shape, 2));
      }
    }
  }
  // An empty call needs only the counter region whatever num_splits says.
  EXPECT_EQ(kCounterRegionBytes, RequiredWorkspaceBytes(LayoutShape{0, 32, 128}, 64));
}

TEST(PartialIndexFillsTheStatAndScratchRegionsOnce) {
  const LayoutShape shape{5, 3, 7};
  const int64_t num_splits = 4;
  const WorkspaceLayout l = ComputeWorkspaceLayout(shape, num_splits);
  std::vector<int> seen(num_splits * shape.total_q * shape.num_qo_heads, 0);
  bool in_range = true;
  for (int64_t s = 0; s < num_splits; ++s) {
    for (int64_t t = 0; t < shape.total_q; ++t) {
      for (int64_t h = 0; h < shape.num_qo_heads; ++h) {
        const int64_t i = splitkv::PartialIndex(shape, num_splits, s, t, h);
        if (i < 0 || i >= static_cast<int64_t>(seen.size())) {
          in_range = false;
          continue;
        }
        ++seen[i];
        // Its stat and its head_dim floats lie inside their regions.
        in_range &= (i + 1) * splitkv::kSoftmaxStatBytes <= l.softmax_bytes;
        in_range &= (i + 1) * shape.head_dim * splitkv::kScratchElementBytes <= l.scratch_bytes;
      }
    }
  }
  EXPECT_TRUE(in_range);
  int wrong = 0;
  for (int count : seen) wrong += count != 1;
  EXPECT_EQ(0, wrong);
}

TEST(TileCounterIndexIsDenseAndFitsTheRegion) {
  const int64_t batch = 6, kv_heads = 3, max_q_tiles = 5;
  const int64_t needed = splitkv::RequiredCounters(batch, kv_heads, max_q_tiles, 2);
  EXPECT_EQ(batch * kv_heads * max_q_tiles, needed);
  std::vector<int> seen(needed, 0);
  bool in_range = true;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < kv_heads; ++h) {
      for (int64_t t = 0; t < max_q_tiles; ++t) {
        const int64_t i = splitkv::TileCounterIndex(b, h, t, kv_heads, max_q_tiles);
        if (i < 0 || i >= needed) {
          in_range = false;
          continue;
        }
        ++seen[i];
      }
    }
  }
  EXPECT_TRUE(in_range);
  int wrong = 0;
  for (int count : seen) wrong += count != 1;
  EXPECT_EQ(0, wrong);
}

}  // namespace

// The 16-bit copy of an fp8 call's K/V (StagedKvLayout): k where a one-split call's scratch
// would start (past the counter region), then v, then the paged copy's block table, each
// 256-aligned, sizes exact past 2^31.
TEST(StagedKvFollowsTheCounterRegionAlignedAndExact) {
  const std::vector<int64_t> rows = {0, 1, 7, 16384, int64_t{3} << 30};
  const std::vector<int64_t> row_bytes = {128, 2048, 8 * 256 * 2, 96};
  const std::vector<int64_t> tables = {0, 1, 4097};
  for (int64_t r : rows) {
    for (int64_t b : row_bytes) {
      for (int64_t t : tables) {
        const splitkv::StagedKvLayout l = splitkv::ComputeStagedKvLayout(r, b, t);
        EXPECT_EQ(ComputeWorkspaceLayout(LayoutShape{}, 1).scratch_offset, l.k_offset);
        EXPECT_EQ(kCounterRegionBytes, l.k_offset);
        const __int128 k_end = __int128{l.k_offset} + __int128{r} * b;
        EXPECT_EQ(Low64((k_end + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment), l.v_offset);
        const __int128 v_end = __int128{l.v_offset} + __int128{r} * b;
        EXPECT_EQ(Low64((v_end + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment),
                  l.table_offset);
        const __int128 end = __int128{l.table_offset} + __int128{t} * 4;
        EXPECT_EQ(Low64((end + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment),
                  l.required_bytes);
        EXPECT_EQ(int64_t{0}, l.table_offset % kWorkspaceAlignment);
      }
    }
  }
}

int main() { return splitkv_test::RunAllTests(); }
