// The workload as delta-play plays it under the shim (tools/played_sizes.h): what the budget
// sees, and where delta-play --recompute frees what its registered results keep alive.
#include "tools/played_sizes.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

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

// The op whose unregisters list `id` (-1: none).
int unregisteredAfter(const policy::Workload& w, BufferId id) {
  for (std::size_t i = 0; i < w.ops.size(); ++i) {
    const auto& list = w.ops[i].unregisters;
    if (std::find(list.begin(), list.end(), id) != list.end()) return static_cast<int>(i);
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
  // The link carries what the shim copies, the buffer's own bytes, not the granules it maps.
  EXPECT_EQ(w.buffers[small].copy_bytes, 0u);
  EXPECT_EQ(w.buffers[exact].copy_bytes, kMiB);
  EXPECT_EQ(w.buffers[odd].copy_bytes, 5 * kMiB + 1);
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
  // x is registered too: delta-play unregisters it where the program frees it, and from there
  // it can only be swapped (and is regenerated then if it was dropped). y goes with its free.
  EXPECT_EQ(unregisteredAfter(w, x), 1);
  EXPECT_EQ(unregisteredAfter(w, y), -1);
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
  EXPECT_EQ(unregisteredAfter(w, x), -1);
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

TEST(PlayedSizes, EachLinkOfAChainKeptForTheNextIsUnregisteredWhereTheProgramFreesIt) {
  // A chain of n results, each computed from the one before, each freed by the program right
  // after its successor is made, and the last used at the end: every one but the last is kept
  // for its successor's recompute, and unregistered (no longer droppable) at its own free; it
  // goes when its successor's registration does, at the successor's free, or, for the last but
  // one, with the last.
  for (int n : {2, 3, 6}) {
    WorkloadBuilder b;
    std::vector<BufferId> chain{b.op("c0", 10, {}, {2 * kMiB})[0]};
    for (int i = 1; i < n; ++i) {
      chain.push_back(b.op("c" + std::to_string(i), 10, {chain.back()}, {2 * kMiB})[0]);
      b.free(chain[chain.size() - 2]);
    }
    b.op("use", 10, {chain.back()});
    b.free(chain.back());
    const policy::Workload w = asManagedByShim(b.take(), true);
    EXPECT_EQ(w.validate(), "");
    for (int i = 0; i + 1 < n; ++i) {
      EXPECT_EQ(unregisteredAfter(w, chain[static_cast<std::size_t>(i)]), i + 1) << n << " links, " << i;
      EXPECT_EQ(freedAfter(w, chain[static_cast<std::size_t>(i)]), i + 2 < n ? i + 2 : n) << n << " links, " << i;
    }
    EXPECT_EQ(unregisteredAfter(w, chain.back()), -1);
    // Played without --recompute nothing is registered, so nothing is unregistered.
    WorkloadBuilder again;
    BufferId prev = again.op("c0", 10, {}, {2 * kMiB})[0];
    for (int i = 1; i < n; ++i) {
      const BufferId next = again.op("c" + std::to_string(i), 10, {prev}, {2 * kMiB})[0];
      again.free(prev);
      prev = next;
    }
    again.op("use", 10, {prev});
    again.free(prev);
    const policy::Workload plain = asManagedByShim(again.take(), false);
    for (const policy::WorkloadOp& op : plain.ops) EXPECT_TRUE(op.unregisters.empty());
  }
}

TEST(PlayedSizes, AResultWrittenInPlaceBeforeItsFreeIsNotUnregisteredAgain) {
  // y, which z was computed from, is written in place: that ends both registrations (the
  // replay ends them at the write itself), so at y's free nothing holds it and nothing is left
  // to unregister.
  WorkloadBuilder b;
  const BufferId x = b.op("x", 10, {}, {2 * kMiB})[0];
  const BufferId y = b.op("y", 10, {x}, {2 * kMiB})[0];
  const BufferId z = b.op("z", 10, {y}, {2 * kMiB})[0];
  b.op("y_", 10, {}, {}, {y});
  b.free(y);
  b.op("later", 10, {z});
  b.free(z);
  b.free(x);
  const policy::Workload w = asManagedByShim(b.take(), true);
  EXPECT_EQ(w.validate(), "");
  EXPECT_EQ(unregisteredAfter(w, y), -1);
  EXPECT_EQ(freedAfter(w, y), 3);
}

}  // namespace
}  // namespace delta::tools
