// The workload as delta-play plays it under the shim (tools/played_sizes.h): what the budget
// sees, and where delta-play --recompute frees what its registered results keep alive.
#include "tools/played_sizes.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "tests/policy/workload_builder.h"

namespace delta::tools {
namespace {

using policy::BufferId;
using policy::testing::WorkloadBuilder;

constexpr std::uint64_t kMiB = 1u << 20;

// The op whose frees list `id` (-1: none).
int freedAfter(const policy::Workload& w, BufferId id) {
  for (std::size_t i = 0; i < w.ops.size(); ++i) {
    const auto& frees = w.ops[i].frees;
    if (std::find(frees.begin(), frees.end(), id) != frees.end()) return static_cast<int>(i);
  }
  return -1;
}

TEST(PlayedSizes, EachSizeDividedAsDeltaPlayDividesIt) {
  EXPECT_EQ(playedBytes(1 << 20, 16), 65536u);
  EXPECT_EQ(playedBytes(100, 1), 104u);  // a multiple of 8
  EXPECT_EQ(playedBytes(4, 16), 64u);    // room for three tokens
  WorkloadBuilder b;
  const BufferId weight = b.persistent("w", 16 * kMiB);
  b.op("f", 1000, {weight}, {8 * kMiB});
  const policy::Workload w = played(b.take(), 8);
  EXPECT_EQ(w.buffers[0].bytes, 2 * kMiB);
  EXPECT_EQ(w.buffers[1].bytes, 1 * kMiB);
}

TEST(PlayedSizes, BelowTheThresholdOutOfTheBudgetTheRestInWholeGranules) {
  WorkloadBuilder b;
  const BufferId small = b.persistent("small", kMiB - 8);
  const BufferId exact = b.persistent("exact", kMiB);
  const BufferId odd = b.persistent("odd", 5 * kMiB + 1);
  b.op("f", 1000, {small, exact, odd});
  const policy::Workload w = asManagedByShim(b.take(), false);
  EXPECT_EQ(w.buffers[small].bytes, 0u);  // unmanaged: never counted, never moved
  EXPECT_EQ(w.buffers[exact].bytes, 2 * kMiB);
  EXPECT_EQ(w.buffers[odd].bytes, 6 * kMiB);
}

TEST(PlayedSizes, WithoutRecomputeEveryBufferIsFreedWhereTheProgramFreesIt) {
  WorkloadBuilder b;
  const BufferId x = b.op("x", 10, {}, {2 * kMiB})[0];
  const BufferId y = b.op("y", 10, {x}, {2 * kMiB})[0];
  b.free(x);
  b.op("z", 10, {y});
  b.free(y);
  const policy::Workload w = asManagedByShim(b.take(), false);
  EXPECT_EQ(freedAfter(w, x), 1);
  EXPECT_EQ(freedAfter(w, y), 2);
}

TEST(PlayedSizes, ARegisteredResultKeepsItsProducersInputsUntilItGoes) {
  // x feeds y; the program frees x after y's op, but y (registered: recomputable and managed)
  // needs x to be recomputed, so delta-play keeps x until y is freed.
  WorkloadBuilder b;
  const BufferId x = b.op("x", 10, {}, {2 * kMiB})[0];
  const BufferId y = b.op("y", 10, {x}, {2 * kMiB})[0];
  b.free(x);
  b.op("z", 10, {y});
  b.op("later", 10, {});
  b.free(y);
  const policy::Workload w = asManagedByShim(b.take(), true);
  EXPECT_EQ(freedAfter(w, x), 3) << "kept alive for y";
  EXPECT_EQ(freedAfter(w, y), 3);
  EXPECT_EQ(w.validate(), "");
  EXPECT_GT(w.peakBytes(), 0u);
}

TEST(PlayedSizes, AnUnmanagedResultIsNotRegisteredAndKeepsNothing) {
  WorkloadBuilder b;
  const BufferId x = b.op("x", 10, {}, {2 * kMiB})[0];
  const BufferId y = b.op("y", 10, {x}, {kMiB / 2})[0];  // below the threshold: refused
  b.free(x);
  b.op("later", 10, {y});
  b.free(y);
  const policy::Workload w = asManagedByShim(b.take(), true);
  EXPECT_EQ(freedAfter(w, x), 1);
}

TEST(PlayedSizes, WritingAnInputInPlaceEndsTheHoldsOnIt) {
  // y is computed from x; an in-place write of x unregisters y (its recompute would read the
  // new x), and with that x is free to go where the program freed it.
  WorkloadBuilder b;
  const BufferId x = b.op("x", 10, {}, {2 * kMiB})[0];
  const BufferId y = b.op("y", 10, {x}, {2 * kMiB})[0];
  b.op("x_", 10, {}, {}, {x});
  b.free(x);
  b.op("later", 10, {y});
  b.free(y);
  const policy::Workload w = asManagedByShim(b.take(), true);
  EXPECT_EQ(freedAfter(w, x), 2);
  EXPECT_EQ(freedAfter(w, y), 3);
}

}  // namespace
}  // namespace delta::tools
