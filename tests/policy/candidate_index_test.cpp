// CandidateIndex (the incrementally ranked eviction candidates) and the director's cost rules,
// table-driven: each mechanism added for the O(k log n) victim choice and the link ledger.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "policy/candidate_index.h"
#include "policy/director.h"
#include "policy/policy_factory.h"

namespace delta::policy {
namespace {

constexpr std::uint64_t kMiB = 1u << 20;
constexpr std::int64_t kMs = 1'000'000;

// Random inserts, key changes, erases and pops against a brute-force model.
TEST(CandidateIndex, MatchesBruteForce) {
  constexpr std::uint32_t kN = 300;
  CandidateIndex index(kN);
  std::map<BufferId, std::pair<std::uint32_t, double>> model;
  std::mt19937 rng(7);
  for (int step = 0; step < 20000; ++step) {
    const BufferId id = rng() % kN;
    const std::uint32_t bucket = rng() % 5;
    switch (rng() % 4) {
      case 0:
      case 1: {
        const double key = static_cast<double>(rng() % 50);
        index.set(id, bucket, key);
        model[id] = {bucket, key};
        break;
      }
      case 2:
        index.erase(id);
        model.erase(id);
        break;
      case 3: {
        // Expected top of the bucket: highest key, then lowest id.
        BufferId best = kNoBuffer;
        for (const auto& [b, v] : model) {
          if (v.first != bucket) continue;
          if (best == kNoBuffer || v.second > model[best].second) best = b;
        }
        ASSERT_EQ(index.top(bucket), best) << "step " << step;
        if (best != kNoBuffer && rng() % 2) {
          EXPECT_EQ(index.pop(bucket), best);
          model.erase(best);
        }
        break;
      }
    }
    ASSERT_EQ(index.size(), model.size());
  }
  std::vector<std::uint32_t> seen;
  index.forEachBucket([&](std::uint32_t b) { seen.push_back(b); });
  for (std::uint32_t b : seen) EXPECT_NE(index.top(b), kNoBuffer);
}

TEST(CandidateIndex, BucketsSeparateSmallSizeAndCost) {
  constexpr std::uint64_t kSmall = 64u << 10;
  const auto b = [&](std::uint64_t bytes, std::int64_t ns) { return CandidateIndex::bucketFor(bytes, ns, kSmall); };
  EXPECT_TRUE(CandidateIndex::smallBucket(b(4096, kUnknownNs)));
  EXPECT_FALSE(CandidateIndex::smallBucket(b(kMiB, kUnknownNs)));
  EXPECT_NE(b(kMiB, kUnknownNs), b(kMiB, 1000));      // no hook vs a hook
  EXPECT_NE(b(kMiB, 1000), b(kMiB, 1'000'000));       // cheap vs dear per byte
  EXPECT_NE(b(kMiB, 1000), b(64 * kMiB, 64'000));     // same cost per byte, other size
  EXPECT_EQ(b(kMiB, 1000), b(kMiB + 4096, 1000));     // within a class
}

// The director's rules, one row each. Times in ns; 12 GB/s == 12 bytes/ns.
struct DirectorCase {
  const char* name;
  std::uint64_t bytes;
  std::int64_t recompute_ns;          // kUnknownNs: no hook
  UseSchedule::NextUse next;
  bool urgent;
  std::int64_t owed_ns;               // restores the policy already owes
  double on_demand_share;
  Action expected;
};

class DirectorRule : public ::testing::TestWithParam<DirectorCase> {};

TEST_P(DirectorRule, PicksCheaper) {
  const DirectorCase& c = GetParam();
  BufferState s;
  s.bytes = c.bytes;
  s.recompute_ns = c.recompute_ns;
  EvictRequest req;
  req.now_ns = 0;
  req.urgent = c.urgent;
  const CostModel costs(12.0, 12.0);
  const Director d(DirectorMode::kMixed);
  const Director::Decision dec = d.decide(s, c.next, req, costs, c.owed_ns, 0, 0, c.on_demand_share);
  EXPECT_TRUE(dec.possible);
  EXPECT_EQ(dec.action, c.expected);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, DirectorRule,
    ::testing::Values(
        // 12 MiB: ~1 ms each way. Used again in 100 ms, link free, asked ahead: fully hidden,
        // so swap beats a 5 ms recompute.
        DirectorCase{"swap_hidden", 12 * kMiB, 5 * kMs, {100 * kMs, true}, false, 0, 0, Action::kSwap},
        // The same, but the policy already owes 150 ms of restores: the restore is ~50 ms late,
        // dearer than recomputing.
        DirectorCase{"owed_link_makes_recompute_win", 12 * kMiB, 5 * kMs, {100 * kMs, true}, false, 150 * kMs, 0,
                     Action::kRecompute},
        // Needed in 1 ms: the restore cannot be hidden; recompute (0.2 ms) wins.
        DirectorCase{"too_soon_recompute", 12 * kMiB, 200'000, {1 * kMs, true}, false, 0, 0, Action::kRecompute},
        // Needed in 1 ms but recompute costs 50 ms: swap still wins.
        DirectorCase{"too_soon_costly_recompute", 12 * kMiB, 50 * kMs, {1 * kMs, true}, false, 0, 0, Action::kSwap},
        // Freed before it is used again: a drop costs nothing, a swap its copy out.
        DirectorCase{"freed_before_use_drops", 12 * kMiB, 50 * kMs, {10 * kMs, false}, true, 0, 0,
                     Action::kRecompute},
        // Its restores have been starting on demand: half of the transfer shows, more than a
        // 0.2 ms recompute.
        DirectorCase{"on_demand_history", 12 * kMiB, 200'000, {100 * kMs, true}, false, 0, 0.5, Action::kRecompute},
        // No hook: swap whatever it costs.
        DirectorCase{"no_hook", 12 * kMiB, kUnknownNs, {1 * kMs, true}, true, 500 * kMs, 1.0, Action::kSwap}),
    [](const auto& info) { return std::string(info.param.name); });

// Within one request, each victim sees the copies the earlier ones queue: the first swaps, the
// rest find the link owed and are recomputed. With no swap measured yet, delta assumes a
// restore is not hidden (it costs its whole transfer, ~10.5 ms): a 15 ms recompute is dearer
// than that, until the queue of copies makes the restores late.
TEST(DeltaPolicy, LaterVictimsSeeEarlierChoices) {
  PolicyConfig config;
  config.max_buffers = 16;
  PolicyResult p = makePolicy("delta", config);
  std::int64_t t = 0;
  // Learn an iteration: buffers 0..3 used at launch 0, then 3 launches of 10 ms touching 4.
  for (int it = 0; it < 3; ++it) {
    p.policy->onIteration(t);
    if (it == 0) {
      for (BufferId id = 0; id < 5; ++id) {
        p.policy->onAlloc(id, 120 * kMiB, t);  // ~10.5 ms each way at 12 GB/s
        p.policy->onRecomputable(id, id < 4 ? 15 * kMs : kUnknownNs);
      }
    }
    const std::array<BufferId, 4> first = {0, 1, 2, 3};
    p.policy->onLaunch({t, 0, first});
    t += 10 * kMs;
    for (int i = 0; i < 3; ++i) {
      const std::array<BufferId, 1> other = {4};
      p.policy->onLaunch({t, 0, other});
      t += 10 * kMs;
    }
  }
  p.policy->onIteration(t);
  const std::array<BufferId, 1> other = {4};
  p.policy->onLaunch({t, 0, other});
  t += 10 * kMs;
  // Buffers 0..3 are next used in ~30 ms and the memory is wanted in 15 ms: one copy out and
  // restore (10.5 ms each) fit, four do not.
  std::array<Victim, 4> out{};
  EvictRequest req;
  req.bytes = 4 * 120 * kMiB;
  req.now_ns = t;
  req.urgent = false;
  req.not_before_ns = 15 * kMs;
  req.keep = other;
  ASSERT_EQ(p.policy->chooseVictims(req, out), 4u);
  int swaps = 0;
  for (const Victim& v : out) swaps += v.action == Action::kSwap;
  EXPECT_GE(swaps, 1);
  EXPECT_LT(swaps, 4);
}

// Many buffers: the index gives the same victims as the scan would, best first.
TEST(Policy, LruOrderWithManyBuffers) {
  PolicyConfig config;
  config.max_buffers = 5000;
  PolicyResult p = makePolicy("lru", config);
  for (BufferId id = 0; id < 5000; ++id) {
    p.policy->onAlloc(id, kMiB + (id % 7) * 4096, 0);
    const std::array<BufferId, 1> ws = {id};
    p.policy->onLaunch({static_cast<std::int64_t>((id * 7919) % 5000), 0, ws});
  }
  std::array<Victim, 8> out{};
  EvictRequest req;
  req.bytes = 8 * kMiB;
  req.now_ns = 10'000;
  ASSERT_EQ(p.policy->chooseVictims(req, out), 8u);
  for (std::size_t i = 0; i < 8; ++i) {
    EXPECT_EQ((out[i].id * 7919) % 5000, i) << "victim " << i;  // used at t = 0, 1, 2, ...
  }
}

}  // namespace
}  // namespace delta::policy
