// Table-driven tests of each policy's choices, through the same calls the shim makes.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "policy/access_pattern.h"
#include "policy/delta_policy.h"
#include "policy/lru_policy.h"
#include "policy/policy_factory.h"
#include "policy/prefetcher.h"

namespace delta::policy {
namespace {

constexpr std::uint64_t kMiB = 1u << 20;

struct Buf {
  std::uint64_t bytes;
  std::int64_t last_use_ns;
  std::int64_t recompute_ns;  // kUnknownNs: no hook
  bool pinned = false;
};

struct ChoiceCase {
  const char* name;
  const char* policy;
  std::vector<Buf> buffers;  // ids 0..n-1, allocated at t=0, used at last_use_ns
  std::uint64_t bytes;       // to free
  std::int64_t now_ns;
  std::vector<BufferId> keep;
  std::vector<Victim> expected;
};

std::unique_ptr<Policy> make(const char* name) {
  PolicyConfig config;
  config.max_buffers = 64;
  config.max_launches = 64;
  config.max_uses = 256;
  PolicyResult r = makePolicy(name, config);
  EXPECT_EQ(r.error, "");
  return std::move(r.policy);
}

class PolicyChoice : public ::testing::TestWithParam<ChoiceCase> {};

TEST_P(PolicyChoice, ChoosesExpectedVictims) {
  const ChoiceCase& c = GetParam();
  auto p = make(c.policy);
  for (BufferId id = 0; id < c.buffers.size(); ++id) {
    const Buf& b = c.buffers[id];
    p->onAlloc(id, b.bytes, 0);
    p->onRecomputable(id, b.recompute_ns);
    p->onPinned(id, b.pinned);
    const std::array<BufferId, 1> ws = {id};
    p->onLaunch({b.last_use_ns, 0, ws});
  }
  std::array<Victim, 8> out{};
  EvictRequest req;
  req.bytes = c.bytes;
  req.now_ns = c.now_ns;
  req.keep = c.keep;
  const std::size_t n = p->chooseVictims(req, out);
  ASSERT_EQ(n, c.expected.size());
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_EQ(out[i].id, c.expected[i].id) << "victim " << i;
    EXPECT_EQ(out[i].action, c.expected[i].action) << "victim " << i;
  }
}

constexpr auto kSwap = Action::kSwap;
constexpr auto kDrop = Action::kRecompute;
constexpr std::int64_t kMs = 1'000'000;

INSTANTIATE_TEST_SUITE_P(
    Cases, PolicyChoice,
    ::testing::Values(
        // LRU: oldest use first, regardless of size; always swaps.
        ChoiceCase{"lru_oldest", "lru", {{8 * kMiB, 5, 1}, {8 * kMiB, 1, 1}, {8 * kMiB, 3, 1}}, 8 * kMiB, 10, {},
                   {{1, kSwap}}},
        ChoiceCase{"lru_two", "lru", {{8 * kMiB, 5, 1}, {8 * kMiB, 1, 1}, {8 * kMiB, 3, 1}}, 9 * kMiB, 10, {},
                   {{1, kSwap}, {2, kSwap}}},
        // Kept (in use by the launch) and pinned buffers are never chosen.
        ChoiceCase{"lru_keep_pinned", "lru",
                   {{8 * kMiB, 1, 1}, {8 * kMiB, 2, 1, true}, {8 * kMiB, 3, 1}}, 8 * kMiB, 10, {0}, {{2, kSwap}}},
        // DTR: lowest cost / (bytes x staleness); without a hook a buffer is not a candidate.
        ChoiceCase{"dtr_cheapest", "dtr",
                   {{8 * kMiB, 0, 100 * kMs}, {8 * kMiB, 0, 1 * kMs}, {64 * kMiB, 0, kUnknownNs}}, 1, 10, {},
                   {{1, kDrop}}},
        ChoiceCase{"dtr_none", "dtr", {{8 * kMiB, 0, kUnknownNs}}, 1, 10, {}, {}},
        // delta, no pattern yet: 1 MiB moves in ~0.17 ms both ways at 12 GB/s, cheaper than a
        // 10 ms recompute: swap must win.
        ChoiceCase{"delta_swap_wins", "delta", {{1 * kMiB, 0, 10 * kMs}}, 1, 10, {}, {{0, kSwap}}},
        // 1 GiB takes ~180 ms to move; recomputing it takes 1 ms: recompute must win.
        ChoiceCase{"delta_recompute_wins", "delta", {{1024 * kMiB, 0, 1 * kMs}}, 1, 10, {}, {{0, kDrop}}},
        // No hook: swap even when moving is slow.
        ChoiceCase{"delta_no_hook", "delta", {{1024 * kMiB, 0, kUnknownNs}}, 1, 10, {}, {{0, kSwap}}},
        // Variants are forced to one action; recompute-only cannot take a buffer without a hook.
        ChoiceCase{"swap_only", "swap-only", {{1024 * kMiB, 0, 1 * kMs}}, 1, 10, {}, {{0, kSwap}}},
        ChoiceCase{"recompute_only", "recompute-only",
                   {{1024 * kMiB, 0, kUnknownNs}, {1 * kMiB, 0, 10 * kMs}}, 1, 10, {}, {{1, kDrop}}},
        // Small buffers come only after the large ones.
        ChoiceCase{"delta_small_last", "delta", {{4096, 0, kUnknownNs}, {4 * kMiB, 9, kUnknownNs}}, 1, 10, {},
                   {{1, kSwap}}},
        ChoiceCase{"delta_small_if_needed", "delta", {{4096, 0, kUnknownNs}, {4 * kMiB, 9, kUnknownNs}},
                   4 * kMiB + 1, 10, {}, {{1, kSwap}, {0, kSwap}}}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(PolicyFactory, UnknownNameListsAccepted) {
  const PolicyResult r = makePolicy("fifo", PolicyConfig{});
  EXPECT_EQ(r.policy, nullptr);
  EXPECT_EQ(r.error, "unknown policy 'fifo' (accepted: delta, lru, dtr, swap-only, recompute-only, belady, oracle)");
}

TEST(PolicyFactory, BeladyOnlyWithTheFuture) {
  EXPECT_NE(makePolicy("belady", PolicyConfig{}).error.find("only in replay"), std::string::npos);
  UseSchedule future;
  future.reserve(4, 4, 4);
  future.finish(0);
  EXPECT_NE(makePolicy("belady", PolicyConfig{}, &future).policy, nullptr);
}

TEST(PolicyFactory, EveryNameBuilds) {
  UseSchedule future;
  future.reserve(4, 4, 4);
  future.finish(0);
  for (std::string_view name : policyNames()) {
    PolicyResult r = makePolicy(name, PolicyConfig{}, &future);
    ASSERT_NE(r.policy, nullptr) << name;
    EXPECT_EQ(r.policy->name(), name);
  }
}

TEST(Policy, EvictedAndFreedBuffersAreNotCandidates) {
  auto p = make("lru");
  p->onAlloc(0, kMiB, 0);
  p->onAlloc(1, kMiB, 0);
  p->onAlloc(2, kMiB, 0);
  p->onEvicted(0, Action::kSwap);
  p->onFree(1, 1);
  std::array<Victim, 4> out{};
  EvictRequest req;
  req.bytes = 3 * kMiB;
  ASSERT_EQ(p->chooseVictims(req, out), 1u);
  EXPECT_EQ(out[0].id, 2u);
  p->onRestored(0, 5);
  EXPECT_EQ(p->chooseVictims(req, out), 2u);
}

// LRU with a plan's vetoes (Policy::setVetoed), as delta adopts them.
class VetoingLru : public LruPolicy {
 public:
  using LruPolicy::LruPolicy;
  using Policy::setVetoed;
};

TEST(Policy, AVetoedBufferGoesOnlyWhenMemoryIsNeededAndNothingElseFreesEnough) {
  // Buffers 0..5 of 1 MiB, 0 used least recently; 0 and 3 vetoed. Several sizes, so that a vetoed
  // buffer heads a bucket with others behind it (they must still be reached), and several seeds
  // of which buffers are vetoed.
  for (std::uint64_t bytes : {kMiB, 3 * kMiB, 40 * kMiB}) {
    for (std::uint32_t seed = 0; seed < 4; ++seed) {
      PolicyConfig config;
      config.max_buffers = 16;
      config.budget_bytes = seed % 2 == 0 ? 64 * kMiB : 0;  // reserved at construction, or grown when set
      VetoingLru p(config);
      for (BufferId id = 0; id < 6; ++id) p.onAlloc(id, bytes, id);
      const std::vector<BufferId> vetoed = {seed % 6, (seed + 3) % 6};
      p.setVetoed(vetoed);
      auto isVetoed = [&](BufferId id) { return std::find(vetoed.begin(), vetoed.end(), id) != vetoed.end(); };
      std::array<Victim, 8> out{};
      const std::string row = std::to_string(bytes) + " bytes, seed " + std::to_string(seed);
      // Ahead of need: never a vetoed one, even when that frees less than asked.
      EvictRequest ahead;
      ahead.urgent = false;
      ahead.bytes = 6 * bytes;
      ASSERT_EQ(p.chooseVictims(ahead, out), 4u) << row;
      for (std::size_t i = 0; i < 4; ++i) EXPECT_FALSE(isVetoed(out[i].id)) << row;
      // Needed now, and the others free enough: none of them, oldest first as LRU goes.
      EvictRequest now;
      now.bytes = 2 * bytes;
      ASSERT_EQ(p.chooseVictims(now, out), 2u) << row;
      BufferId expected = 0;
      for (std::size_t i = 0; i < 2; ++i, ++expected) {
        while (isVetoed(expected)) ++expected;
        EXPECT_EQ(out[i].id, expected) << row;
      }
      // Needed now, more than the others hold: the vetoed ones last, and the buffer kept for
      // the launch never.
      now.bytes = 6 * bytes;
      const std::array<BufferId, 1> keep = {vetoed[0]};
      now.keep = keep;
      ASSERT_EQ(p.chooseVictims(now, out), 5u) << row;
      for (std::size_t i = 0; i < 4; ++i) EXPECT_FALSE(isVetoed(out[i].id)) << row;
      EXPECT_EQ(out[4].id, vetoed[1]) << row;
      // A new set replaces the old.
      p.setVetoed({});
      now.keep = {};
      now.bytes = bytes;
      ASSERT_EQ(p.chooseVictims(now, out), 1u) << row;
      EXPECT_EQ(out[0].id, 0u) << row;
    }
  }
}

// Launch sequence of a fake iteration: launch i touches buffers {i, i+1} (mod n).
void runIteration(Policy& p, int n, std::int64_t& t, bool markers) {
  if (markers) p.onIteration(t);
  for (int i = 0; i < n; ++i) {
    const std::array<BufferId, 2> ws = {static_cast<BufferId>(i), static_cast<BufferId>((i + 1) % n)};
    p.onLaunch({t, 0, ws});
    t += 1'000'000;
  }
}

// `n` buffers of `bytes` allocated, runIteration's ring learned over two marked iterations, and
// the third begun: the next launch uses buffers 0 and 1, buffer b is next used (b - 1) ms ahead.
void learnRing(DeltaPolicy& p, int n, std::uint64_t bytes, std::int64_t& t) {
  for (int id = 0; id < n; ++id) p.onAlloc(static_cast<BufferId>(id), bytes, 0);
  runIteration(p, n, t, true);
  runIteration(p, n, t, true);
  p.onIteration(t);
}

// upcomingBytes: the net bytes the window's launches need (allocations and restores, each
// restore once, less what launches earlier in the window free), its peak, never negative.
// Four launches 1 ms apart; the link is so slow that the window runs on as long as the count is
// above zero (the first launch of each case needs room, so it covers the iteration).
enum class Now : std::uint8_t { kFree, kResident, kSwapped, kDropped };
struct UpcomingLaunch {
  std::uint64_t alloc_bytes;  // allocated just before the launch
  std::vector<BufferId> uses;
  std::vector<BufferId> frees;  // freed after the launch
};
struct UpcomingCase {
  const char* name;
  std::vector<Now> now;  // per buffer id (4 MiB each)
  std::vector<UpcomingLaunch> launches;
  std::uint64_t expected;
};

class Upcoming : public ::testing::TestWithParam<UpcomingCase> {};

TEST_P(Upcoming, CountsNetBytes) {
  const UpcomingCase& c = GetParam();
  constexpr std::uint64_t kBytes = 4 * kMiB;
  UseSchedule schedule;
  schedule.reserve(16, 16, 64);
  std::int64_t t = 0;
  for (const UpcomingLaunch& l : c.launches) {
    schedule.addLaunch(t, l.alloc_bytes, l.uses);
    for (BufferId id : l.frees) schedule.addFree(id, kBytes);
    t += kMs;
  }
  schedule.finish(t);
  BufferTable table(16);
  for (BufferId id = 0; id < c.now.size(); ++id) {
    if (c.now[id] == Now::kFree) continue;
    table.allocate(id, kBytes, 0);
    if (c.now[id] == Now::kResident) continue;
    table.setResident(id, false);
    table[id].evicted_by = c.now[id] == Now::kSwapped ? Action::kSwap : Action::kRecompute;
  }
  const CostModel slow(1e-3, 1e-3);  // 4 MiB take ~4 s each way
  std::int64_t horizon = 0;
  EXPECT_EQ(Prefetcher::upcomingBytes(schedule, 0, table, slow, horizon), c.expected);
}

constexpr std::uint64_t k4 = 4 * kMiB;

// Adds `launches` launches `gap` apart from the start, each allocating `bytes` (buffer q) that
// is freed after it.
void allocateAndFreeAtEach(UseSchedule& schedule, BufferId launches, std::int64_t gap, std::uint64_t bytes) {
  for (BufferId id = 0; id < launches; ++id) {
    const BufferId uses[] = {id};
    schedule.addLaunch(static_cast<std::int64_t>(id) * gap, bytes, uses);
    schedule.addFree(id, bytes);
  }
}

// Launches `gap` apart, each allocating 4 MiB (buffer q) that is freed after it.
UseSchedule fourMiBAtEachOf(BufferId launches, std::int64_t gap) {
  UseSchedule schedule;
  schedule.reserve(16, 16, 64);
  allocateAndFreeAtEach(schedule, launches, gap, k4);
  schedule.finish(static_cast<std::int64_t>(launches) * gap);
  return schedule;
}

// `idle` launches `gap` apart that allocate nothing (they use buffer 8, resident), then one that
// allocates 4 MiB (buffer 0, freed after it).
UseSchedule idleThenFourMiB(std::uint32_t idle, std::int64_t gap) {
  UseSchedule schedule;
  schedule.reserve(16, 16, 64);
  for (std::uint32_t q = 0; q < idle; ++q) {
    const BufferId uses[] = {8};
    schedule.addLaunch(static_cast<std::int64_t>(q) * gap, 0, uses);
  }
  const BufferId uses[] = {0};
  schedule.addLaunch(static_cast<std::int64_t>(idle) * gap, k4, uses);
  schedule.addFree(0, k4);
  schedule.finish(static_cast<std::int64_t>(idle + 1) * gap);
  return schedule;
}

// The window's length: set by the gross bytes (each allocation, a restore at every use of a
// swapped buffer) or by the net count. Launches 0.1 ms apart, 4 MiB allocated and freed at
// each: the net count never passes 4 MiB (0.35 ms to copy out at 12 GB/s), so its window ends
// at the launch 0.3 ms ahead; the gross one grows by 4 MiB (0.35 ms) per launch and runs on.
// Either way the need peaks at the first launch: it is needed now.
TEST(Upcoming, TheNetWindowIsShorter) {
  constexpr std::int64_t kGap = kMs / 10;
  const UseSchedule schedule = fourMiBAtEachOf(8, kGap);
  BufferTable table(16);
  const CostModel link(12.0, 12.0);
  std::int64_t gross_window = 0, net_window = 0, need_at = 1;
  EXPECT_EQ(Prefetcher::upcomingBytes(schedule, 0, table, link, need_at, Prefetcher::Window::kGross, &gross_window), k4);
  EXPECT_EQ(need_at, 0);
  need_at = 1;
  EXPECT_EQ(Prefetcher::upcomingBytes(schedule, 0, table, link, need_at, Prefetcher::Window::kNet, &net_window), k4);
  EXPECT_EQ(need_at, 0);
  EXPECT_EQ(net_window, 3 * kGap);
  EXPECT_EQ(gross_window, 7 * kGap);
  // No window: nothing is made room for ahead.
  std::int64_t none_window = 1;
  need_at = 1;
  EXPECT_EQ(Prefetcher::upcomingBytes(schedule, 0, table, link, need_at, Prefetcher::Window::kNone, &none_window), 0u);
  EXPECT_EQ(none_window, 0);
  EXPECT_EQ(need_at, 0);
}

// `quiet` launches `gap` apart, each allocating 1 MiB (buffer q) freed after it, then one that
// allocates `burst` bytes (buffer `quiet`, freed after it).
UseSchedule quietThenBurst(std::uint32_t quiet, std::int64_t gap, std::uint64_t burst) {
  UseSchedule schedule;
  schedule.reserve(16, 16, 64);
  allocateAndFreeAtEach(schedule, quiet, gap, kMiB);
  const BufferId uses[] = {quiet};
  schedule.addLaunch(static_cast<std::int64_t>(quiet) * gap, burst, uses);
  schedule.addFree(quiet, burst);
  schedule.finish(static_cast<std::int64_t>(quiet + 1) * gap);
  return schedule;
}

// The far window reaches past launches outside the window to a burst that is in it by its own
// count: room for it must start now. Launches 0.5 ms apart allocate 1 MiB each (87 us to copy
// out at 12 GB/s: out of the window from the second on, which ends the gross and net windows
// there, with 1 MiB needed now); behind them, a burst whose copy out, with the bytes before
// it, takes longer than the time until it is the far window's need, at its time. A burst that
// can wait, or one too far to reach, leaves the far window as the gross one.
TEST(Upcoming, TheFarWindowReachesABurstBehindLaunchesOutsideTheWindow) {
  constexpr std::int64_t kGap = kMs / 2;
  const CostModel link(12.0, 12.0);
  for (std::uint32_t quiet = 2; quiet <= 6; quiet += 2) {
    for (std::uint64_t burst : {4 * kMiB, 16 * kMiB, 64 * kMiB, 128 * kMiB}) {
      const UseSchedule schedule = quietThenBurst(quiet, kGap, burst);
      const std::int64_t burst_due = static_cast<std::int64_t>(quiet) * kGap;
      const bool reached = link.transferNs(Direction::kDeviceToHost, quiet * kMiB + burst) >= burst_due;
      const std::string where = std::to_string(quiet) + " quiet launches, " + std::to_string(burst >> 20) + " MiB";
      BufferTable table(16);
      for (Prefetcher::Window near : {Prefetcher::Window::kGross, Prefetcher::Window::kNet}) {
        std::int64_t need_at = -1, end = -1;
        EXPECT_EQ(Prefetcher::upcomingBytes(schedule, 0, table, link, need_at, near, &end), kMiB) << where;
        EXPECT_EQ(need_at, 0) << where;
        EXPECT_EQ(end, 0) << where;
      }
      std::int64_t need_at = -1, end = -1;
      const std::uint64_t need =
          Prefetcher::upcomingBytes(schedule, 0, table, link, need_at, Prefetcher::Window::kFar, &end);
      EXPECT_EQ(need, reached ? burst : kMiB) << where;
      EXPECT_EQ(need_at, reached ? burst_due : 0) << where;
      EXPECT_EQ(end, reached ? burst_due : 0) << where;
    }
  }
}

// A launch's own bytes count in the test of whether it is in the window: room for 4 MiB
// takes 0.35 ms to copy out at 12 GB/s, so an allocation 0.1-0.3 ms ahead needs room made now,
// whatever the launches before it allocate. (Tested on the bytes before it, a first launch that
// allocated nothing ended the window there, and the need was seen one launch before it came.)
TEST(Upcoming, AnAllocationCloserThanItsCopyOutIsSeenBehindLaunchesThatAllocateNothing) {
  constexpr std::int64_t kGap = kMs / 10;
  const CostModel link(12.0, 12.0);
  for (Prefetcher::Window window : {Prefetcher::Window::kGross, Prefetcher::Window::kNet}) {
    for (std::uint32_t idle = 1; idle <= 3; ++idle) {
      const UseSchedule schedule = idleThenFourMiB(idle, kGap);
      BufferTable table(16);
      table.allocate(8, kMiB, 0);
      std::int64_t need_at = -1;
      EXPECT_EQ(Prefetcher::upcomingBytes(schedule, 0, table, link, need_at, window), k4) << idle;
      EXPECT_EQ(need_at, static_cast<std::int64_t>(idle) * kGap) << idle;
    }
  }
}

// The short window (the oracle's other choice): each launch tested on the bytes before it, the
// first that fails ends it. Where every launch allocates, it is the window above (the schedule
// of TheNetWindowIsShorter: 7 and 3 launches ahead); behind launches that need nothing, it ends
// at the first of them and sees no allocation after (the need above: 4 MiB; here none).
TEST(Upcoming, TheShortWindowEndsAtTheFirstLaunchItDoesNotReach) {
  constexpr std::int64_t kGap = kMs / 10;
  const CostModel link(12.0, 12.0);
  {
    const UseSchedule schedule = fourMiBAtEachOf(8, kGap);
    BufferTable table(16);
    for (auto [window, reach] : {std::pair{Prefetcher::Window::kGross, 7 * kGap}, std::pair{Prefetcher::Window::kNet, 3 * kGap}}) {
      std::int64_t need_at = 1, long_end = 0, short_end = 0;
      EXPECT_EQ(Prefetcher::upcomingBytes(schedule, 0, table, link, need_at, window, &long_end), k4);
      EXPECT_EQ(Prefetcher::upcomingBytes(schedule, 0, table, link, need_at, window, &short_end, true), k4);
      EXPECT_EQ(short_end, long_end);
      EXPECT_EQ(short_end, reach);
    }
  }
  for (Prefetcher::Window window : {Prefetcher::Window::kGross, Prefetcher::Window::kNet}) {
    for (std::uint32_t idle = 1; idle <= 3; ++idle) {
      const UseSchedule schedule = idleThenFourMiB(idle, kGap);
      BufferTable table(16);
      table.allocate(8, kMiB, 0);
      std::int64_t need_at = -1, end = -1;
      EXPECT_EQ(Prefetcher::upcomingBytes(schedule, 0, table, link, need_at, window, &end, true), 0u) << idle;
      EXPECT_EQ(end, 0) << idle;
      EXPECT_EQ(Prefetcher::upcomingBytes(schedule, 0, table, link, need_at, window, &end), k4) << idle;
    }
  }
}

// Past launches that need nothing, an allocation counts only if it is in the window itself: 4 MiB
// now (0.35 ms to copy out at 12 GB/s) and another 4 MiB `later` launches ahead, launches every
// 0.1 ms between that need nothing. At 0.6 ms both take 0.7 ms to copy out, so the second is in
// the window, which ends there; at 0.9 ms it is not, and the window ends at 0.3 ms, the last
// launch sooner than the first 4 MiB's copy out (the launches walked over after it do not
// lengthen it).
TEST(Upcoming, PastLaunchesThatNeedNothingAnAllocationCountsOnlyInTheWindow) {
  constexpr std::int64_t kGap = kMs / 10;
  const CostModel link(12.0, 12.0);
  struct Case {
    std::uint32_t later;  // in launches (0.1 ms each)
    std::uint64_t need;
    std::int64_t need_at;
    std::int64_t window;
  };
  for (const Case c : {Case{6, 2 * k4, 6 * kGap, 6 * kGap}, Case{9, k4, 0, 3 * kGap}}) {
    UseSchedule schedule;
    schedule.reserve(16, 16, 64);
    for (std::uint32_t q = 0; q <= c.later; ++q) {
      const BufferId first[] = {0}, second[] = {1}, idle[] = {8};
      const bool allocates = q == 0 || q == c.later;
      schedule.addLaunch(static_cast<std::int64_t>(q) * kGap, allocates ? k4 : 0,
                         q == 0 ? first : q == c.later ? second : idle);
    }
    schedule.finish(static_cast<std::int64_t>(c.later + 1) * kGap);
    BufferTable table(16);
    table.allocate(8, kMiB, 0);
    std::int64_t need_at = -1, window = -1;
    EXPECT_EQ(Prefetcher::upcomingBytes(schedule, 0, table, link, need_at, Prefetcher::Window::kGross, &window), c.need)
        << c.later;
    EXPECT_EQ(need_at, c.need_at) << c.later;
    EXPECT_EQ(window, c.window) << c.later;
  }
}

// When the memory is needed: the first launch where the net count reaches its peak, however
// far the window reaches beyond it. Launches 1 ms apart over a link so slow that the window
// covers the iteration (the first launch needs 1 MiB of scratch, freed after it): 4 MiB
// allocated at each launch from `rise` on until the count holds `height` such buffers, all
// freed two launches later. Shapes: the peak soon, in the middle, near the end; one or
// several buffers high.
TEST(Upcoming, TheNeedIsDatedByTheLaunchWhereItPeaks) {
  constexpr std::uint32_t kLaunches = 10;
  constexpr BufferId kScratch = 15;
  for (std::uint32_t rise : {1u, 3u, 6u}) {
    for (std::uint32_t height : {1u, 2u, 3u}) {
      UseSchedule schedule;
      schedule.reserve(16, 16, 64);
      const std::uint32_t top = rise + height - 1;  // the launch of the last allocation
      for (std::uint32_t q = 0; q < kLaunches; ++q) {
        const bool allocates = q >= rise && q <= top;
        std::vector<BufferId> uses;
        if (q == 0) uses.push_back(kScratch);
        if (allocates) uses.push_back(q - rise);
        schedule.addLaunch(static_cast<std::int64_t>(q) * kMs, q == 0 ? kMiB : allocates ? k4 : 0, uses);
        if (q == 0) schedule.addFree(kScratch, kMiB);
        if (q == top + 2) {
          for (BufferId id = 0; id < height; ++id) schedule.addFree(id, k4);
        }
      }
      schedule.finish(kLaunches * kMs);
      BufferTable table(16);
      const CostModel slow(1e-3, 1e-3);
      std::int64_t need_at = -1, window = -1;
      EXPECT_EQ(Prefetcher::upcomingBytes(schedule, 0, table, slow, need_at, Prefetcher::Window::kGross, &window),
                height * k4)
          << rise << " " << height;
      EXPECT_EQ(need_at, static_cast<std::int64_t>(top) * kMs) << rise << " " << height;
      EXPECT_EQ(window, static_cast<std::int64_t>(kLaunches - 1) * kMs) << rise << " " << height;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, Upcoming,
    ::testing::Values(
        UpcomingCase{"allocs_add_up", {Now::kFree, Now::kFree}, {{k4, {0}, {}}, {k4, {1}, {}}, {0, {}, {}}, {0, {}, {}}},
                     2 * k4},
        // Allocated and freed within the window: its room serves the next allocation.
        UpcomingCase{"freed_in_window", {Now::kFree, Now::kFree},
                     {{k4, {0}, {0}}, {k4, {1}, {}}, {0, {}, {}}, {0, {}, {}}}, k4},
        // A resident buffer freed after launch 1 makes room for launch 2's allocation.
        UpcomingCase{"resident_freed", {Now::kResident, Now::kFree, Now::kFree},
                     {{k4, {1}, {}}, {0, {0}, {0}}, {k4, {2}, {}}, {0, {}, {}}}, k4},
        // Freed after the last launch that needs room: no help (the peak comes first).
        UpcomingCase{"freed_too_late", {Now::kResident, Now::kFree, Now::kFree},
                     {{k4, {1}, {}}, {k4, {2}, {}}, {0, {0}, {0}}, {0, {}, {}}}, 2 * k4},
        // A swapped buffer used twice in the window is restored once.
        UpcomingCase{"restore_once", {Now::kSwapped}, {{0, {0}, {}}, {0, {0}, {}}, {0, {0}, {}}, {0, {}, {}}}, k4},
        // Restored, used, freed: its room serves a later allocation.
        UpcomingCase{"restored_then_freed", {Now::kSwapped, Now::kFree},
                     {{0, {0}, {0}}, {k4, {1}, {}}, {0, {}, {}}, {0, {}, {}}}, k4},
        // Swapped and freed before any use: never comes back, frees nothing on the device.
        UpcomingCase{"swapped_freed_unused", {Now::kSwapped, Now::kFree, Now::kFree},
                     {{k4, {1}, {0}}, {k4, {2}, {}}, {0, {}, {}}, {0, {}, {}}}, 2 * k4},
        // A dropped buffer's recompute is not counted, so neither is its free.
        UpcomingCase{"dropped_freed", {Now::kDropped, Now::kFree, Now::kFree},
                     {{k4, {1}, {}}, {0, {0}, {0}}, {k4, {2}, {}}, {0, {}, {}}}, 2 * k4},
        // Frees alone never make the count negative.
        UpcomingCase{"never_negative", {Now::kResident}, {{0, {0}, {0}}, {0, {}, {}}, {0, {}, {}}, {0, {}, {}}}, 0}),
    [](const auto& info) { return std::string(info.param.name); });

// The prefetcher tests' table: a 1-byte buffer 0 resident, `swapped` out by a swap, `bytes`
// large (on the tests' 1 byte/ns link, bytes are ns).
BufferTable tableWithSwappedOut(BufferId swapped, std::uint64_t bytes) {
  BufferTable table(4);
  table.allocate(0, 1, 0);
  table.allocate(swapped, bytes, 0);
  table.setResident(swapped, false);
  table[swapped].evicted_by = Action::kSwap;
  return table;
}

// A swapped buffer (id 1) used at launch `use` of launches `step` apart, as learned with
// `wait` before launch `use - waited_before` (the device stood that long there last
// iteration: for the use itself, its wait for this very restore).
struct LateRestoreCase {
  const char* name;
  std::int64_t step;
  std::int64_t wait;
  std::uint32_t waited_before;  // 0: the use waited; 1: the launch before it
};

class LateRestore : public ::testing::TestWithParam<LateRestoreCase> {};

TEST_P(LateRestore, ARestoreTheLinkWouldStartAtOnceIsTimedWithoutTheLearnedWaits) {
  const LateRestoreCase& c = GetParam();
  constexpr std::uint32_t kLaunches = 8;
  constexpr std::uint32_t kUse = 5;
  constexpr BufferId kSwapped = 1;
  // Decided at `decide`, the next decision comes one step later. The restore takes long enough
  // that by the learned times it can wait for that (the wait makes the use look later) and by
  // the times without the wait it cannot.
  const std::uint32_t decide = kUse - c.waited_before - 2;
  const auto h2d = static_cast<std::int64_t>(kUse - decide - 1) * c.step + c.wait / 2;
  auto scheduleWithWaitAt = [&](std::uint32_t waited) {
    UseSchedule schedule;
    schedule.reserve(4, 16, 32);
    std::int64_t t = 0;
    for (std::uint32_t q = 0; q < kLaunches; ++q) {
      if (q == waited) t += c.wait;
      const BufferId uses[] = {q == kUse ? kSwapped : BufferId{0}};
      schedule.addLaunch(t, 0, uses);
      t += c.step;
    }
    schedule.finish(t);
    return schedule;
  };
  const BufferTable table = tableWithSwappedOut(kSwapped, static_cast<std::uint64_t>(h2d));
  const CostModel link(1.0, 1.0);
  std::array<Prefetch, 4> out{};
  constexpr std::int64_t kNow = 1'000'000'000;

  const std::uint32_t waited = kUse - c.waited_before;
  std::vector<std::int64_t> waits(kLaunches, 0);
  waits[waited] = c.wait;
  const UseSchedule schedule = scheduleWithWaitAt(waited);
  const std::int64_t learned_due = schedule.offsetNs(kUse) - schedule.offsetNs(decide);
  // Without the waits, the learned time says the next decision is soon enough.
  EXPECT_EQ(Prefetcher::choose(schedule, decide, table, link, {kNow, kNow}, out), 0u);
  // With them, a restore the idle link would start now starts now, due when the use comes
  // if the wait does not come round again.
  ASSERT_EQ(Prefetcher::choose(schedule, decide, table, link, {kNow, kNow}, out, waits), 1u);
  EXPECT_EQ(out[0].id, kSwapped);
  EXPECT_EQ(out[0].due_ns, learned_due - c.wait);
  // Behind a restore already on the link, the learned time stands: there the waits are the
  // link's load, and starting early only holds the memory longer.
  EXPECT_EQ(Prefetcher::choose(schedule, decide, table, link, {kNow, kNow + c.wait / 4}, out, waits), 0u);
  // A wait after the use changes nothing: the time to the use is the learned one.
  std::vector<std::int64_t> later(kLaunches, 0);
  later[kUse + 1] = c.wait;
  const UseSchedule waited_later = scheduleWithWaitAt(kUse + 1);
  ASSERT_EQ(Prefetcher::choose(waited_later, decide, table, link, {kNow, kNow}, out, later), 1u);
  EXPECT_EQ(out[0].due_ns, waited_later.offsetNs(kUse) - waited_later.offsetNs(decide));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, LateRestore,
    ::testing::Values(LateRestoreCase{"use_waited_1ms_steps", kMs, kMs, 0},
                      LateRestoreCase{"use_waited_long_after_short_steps", kMs / 5, 3 * kMs, 0},
                      LateRestoreCase{"use_waited_briefly_after_long_steps", 2 * kMs, kMs / 2, 0},
                      LateRestoreCase{"launch_before_waited_1ms_steps", kMs, kMs, 1},
                      LateRestoreCase{"launch_before_waited_long_after_short_steps", kMs / 5, 3 * kMs, 1}),
    [](const auto& info) { return std::string(info.param.name); });

// Decided just as a long launch starts (`step_count` short launches of `step` then lead to the
// use, the use waited `wait` last iteration): a restore behind copies that leave the link idle,
// this one done, before the next decision.
struct DrainingQueueCase {
  const char* name;
  std::int64_t step;
  std::int64_t wait;
  std::uint32_t step_count;
};

class DrainingQueue : public ::testing::TestWithParam<DrainingQueueCase> {};

TEST_P(DrainingQueue, ARestoreDoneBeforeTheNextDecisionIsTimedWithoutTheLearnedWaits) {
  const DrainingQueueCase& c = GetParam();
  constexpr BufferId kSwapped = 1;
  constexpr std::uint32_t kDecide = 2;
  const std::uint32_t use = kDecide + c.step_count;
  // Queue and restore sized so that by the learned times the restore may wait for the next
  // decision and by the times without the wait it may not; the launch running until the next
  // decision outlasts them both.
  const std::int64_t queue_and_restore = static_cast<std::int64_t>(c.step_count - 1) * c.step + c.wait / 2;
  const std::int64_t long_launch = queue_and_restore + c.wait;
  const std::int64_t queued = queue_and_restore / 5;
  const std::int64_t h2d = queue_and_restore - queued;
  UseSchedule schedule;
  schedule.reserve(4, 64, 64);
  std::int64_t t = 0;
  for (std::uint32_t q = 0; q < use + 3; ++q) {
    if (q == use) t += c.wait;
    const BufferId uses[] = {q == use ? kSwapped : BufferId{0}};
    schedule.addLaunch(t, 0, uses);
    t += q + 1 == kDecide ? long_launch : c.step;
  }
  schedule.finish(t);
  std::vector<std::int64_t> waits(use + 3, 0);
  waits[use] = c.wait;
  const BufferTable table = tableWithSwappedOut(kSwapped, static_cast<std::uint64_t>(h2d));
  const CostModel link(1.0, 1.0);
  std::array<Prefetch, 4> out{};
  constexpr std::int64_t kNow = 1'000'000'000;
  const std::int64_t learned_due = schedule.offsetNs(use) - schedule.offsetNs(kDecide);
  ASSERT_EQ(learned_due, static_cast<std::int64_t>(c.step_count) * c.step + c.wait);

  // The link will be idle before the next decision, this restore done: the use's wait last
  // time was this restore's lateness, not the link's load. Timed by the learned times it would
  // wait for the next decision and be late by the wait again.
  ASSERT_EQ(Prefetcher::choose(schedule, kDecide, table, link, {kNow, kNow + queued}, out, waits), 1u);
  EXPECT_EQ(out[0].id, kSwapped);
  EXPECT_EQ(out[0].due_ns, learned_due - c.wait);
  // Behind copies that, with it, outlast the next decision, the learned time stands (the waits
  // may be the link's load): started now all the same, since by it the next decision is late.
  const std::int64_t backlog = long_launch - h2d + c.wait / 4;
  ASSERT_EQ(Prefetcher::choose(schedule, kDecide, table, link, {kNow, kNow + backlog}, out, waits), 1u);
  EXPECT_EQ(out[0].due_ns, learned_due);
  // Without the waits known, the learned time: the next decision is soon enough.
  EXPECT_EQ(Prefetcher::choose(schedule, kDecide, table, link, {kNow, kNow + queued}, out), 0u);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, DrainingQueue,
    ::testing::Values(DrainingQueueCase{"two_1ms_steps_1ms_wait", kMs, kMs, 2},
                      DrainingQueueCase{"three_short_steps_long_wait", kMs / 5, 3 * kMs, 3},
                      DrainingQueueCase{"two_long_steps_short_wait", 2 * kMs, kMs / 2, 2},
                      // gan-6 at 50 %/50 GB/s: nine launches of hundredths of a ms after an 11.6
                      // ms one, the use 11.7 ms late last iteration.
                      DrainingQueueCase{"nine_tiny_steps_gan_like", kMs / 25, 11'700'000, 9}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(AccessPattern, WhatWasAllocatedBeforeTheFirstIterationIsNotItsFirstLaunchs) {
  // The program's setup (weights, optimiser state) is allocated once, before training: not an
  // allocation every iteration makes at its first launch (counted so, every iteration's end
  // made room ahead for it). Allocations before a later iteration's first launch are its own.
  for (bool markers : {true, false}) {
    for (std::uint64_t setup : {std::uint64_t{0}, 64 * kMiB, 4096 * kMiB}) {
      AccessPattern pattern(64, 256, 4096);
      pattern.onAlloc(setup);
      std::int64_t t = 0;
      std::vector<BufferId> ids(1);
      for (int iteration = 0; iteration < 3; ++iteration) {
        if (markers) pattern.onIteration(t);
        pattern.onAlloc(2 * kMiB);  // this iteration's input, before its first launch
        for (BufferId id = 0; id < 12; ++id) {
          ids[0] = id;
          pattern.onLaunch({t, 0, ids});
          t += 1'000;
        }
      }
      ASSERT_TRUE(pattern.schedule().ready()) << markers;
      // Learned from the first iteration with markers: its input counts, the setup does not.
      // Without, the first iteration starts at its first launch, after both.
      EXPECT_EQ(pattern.schedule().allocBytesAt(0), markers ? 2 * kMiB : 0) << markers << " " << setup;
    }
  }
}

TEST(AccessPattern, DetectsRepetitionWithoutMarkers) {
  PolicyConfig config;
  config.max_buffers = 64;
  DeltaPolicy p(config, DirectorMode::kMixed);
  std::int64_t t = 0;
  for (int id = 0; id < 20; ++id) p.onAlloc(static_cast<BufferId>(id), kMiB, 0);
  runIteration(p, 20, t, false);
  EXPECT_FALSE(p.pattern().schedule().ready());
  runIteration(p, 20, t, false);
  ASSERT_TRUE(p.pattern().schedule().ready());
  EXPECT_EQ(p.pattern().schedule().length(), 20u);
  EXPECT_EQ(p.pattern().position(), 20u);
  // From the start of the next iteration, buffer 5 is first used by launch 4, 4 ms ahead.
  EXPECT_EQ(p.pattern().schedule().nextUseNs(5, 0), 4'000'000);
  // Before launch 19, buffer 1 is next used by launch 0 of the next iteration (wrap).
  EXPECT_EQ(p.pattern().schedule().nextUseNs(1, 19), 1'000'000);
  EXPECT_EQ(p.pattern().schedule().nextUseNs(40, 0), kUnknownNs);
}

TEST(AccessPattern, AFirstLaunchThatNeverComesRoundAgainIsDroppedAsTheAnchor) {
  // Without markers an iteration is recognised by its first launch coming round again. A
  // program that allocates afresh each iteration may start its first iteration on buffers
  // (ids) the later ones never touch: recording starts again from a later launch, and the loop
  // is found; its iterations then start there (a rotation of the program's own).
  for (std::uint32_t period : {12u, 40u, 300u}) {
    AccessPattern pattern(512, 4096, 1 << 16);
    std::int64_t t = 0;
    const BufferId fresh = 500;  // used by the very first launch only
    for (std::uint32_t it = 0; it < 8 + 1600 / period; ++it) {
      for (std::uint32_t pos = 0; pos < period; ++pos) {
        const BufferId id = it == 0 && pos == 0 ? fresh : static_cast<BufferId>(pos % 400);
        const BufferId ids[] = {id};
        pattern.onLaunch(Launch{t += 1000, 0, ids});
      }
    }
    ASSERT_TRUE(pattern.schedule().ready()) << period;
    EXPECT_EQ(pattern.schedule().length(), period);
    EXPECT_GE(pattern.boundaries(), 3u) << period;
  }
}

TEST(AccessPattern, LaunchesThatNameNoBufferAreLearnedButNeverTheAnchor) {
  // Without markers: launches that name no buffer (all theirs unmanaged) are launches of the
  // iteration, but all alike; one as the anchor would cut an iteration every few launches.
  for (std::uint32_t period : {12u, 40u, 300u}) {
    for (std::uint32_t leading : {1u, 3u}) {  // the iteration starts with this many of them
      SCOPED_TRACE(testing::Message() << period << ", " << leading);
      AccessPattern pattern(512, 4096, 1 << 16);
      std::int64_t t = 0;
      for (std::uint32_t it = 0; it < 6; ++it) {
        for (std::uint32_t pos = 0; pos < period; ++pos) {
          const BufferId ids[] = {static_cast<BufferId>(pos % 400)};
          const bool named = pos >= leading && pos % 3 != 0;
          pattern.onLaunch(Launch{t += 1000, 0, named ? std::span<const BufferId>(ids) : std::span<const BufferId>()});
        }
      }
      ASSERT_TRUE(pattern.schedule().ready());
      EXPECT_EQ(pattern.schedule().length(), period);
      EXPECT_GE(pattern.boundaries(), 4u);
      EXPECT_EQ(pattern.schedule().durationNs(), static_cast<std::int64_t>(period) * 1000);
    }
  }
}

TEST(AccessPattern, ARepeatIsLearnedOnceUnlessAskedToLearnItAgain) {
  AccessPattern pattern(8, 16, 64);
  const BufferId ids[] = {0, 1};
  auto iteration = [&](std::int64_t start, std::int64_t gap) {
    pattern.onIteration(start);
    for (int i = 0; i < 4; ++i) pattern.onLaunch({start + i * gap, 0, ids});
  };
  iteration(0, 1'000);
  iteration(10'000, 1'000);
  pattern.onIteration(20'000);
  const std::uint32_t learned = pattern.generation();
  EXPECT_EQ(pattern.schedule().offsetNs(3), 3'000);
  iteration(20'000, 2'000);  // the same launches, slower: not learned again
  pattern.onIteration(30'000);
  EXPECT_EQ(pattern.generation(), learned);
  EXPECT_EQ(pattern.schedule().offsetNs(3), 3'000);
  pattern.relearnNext();  // the caller acts differently now: the times change
  iteration(30'000, 2'000);
  pattern.onIteration(40'000);
  EXPECT_EQ(pattern.generation(), learned + 1);
  EXPECT_EQ(pattern.schedule().offsetNs(3), 6'000);
  iteration(40'000, 3'000);  // once only
  pattern.onIteration(50'000);
  EXPECT_EQ(pattern.generation(), learned + 1);
}

TEST(AccessPattern, ALearnedIterationCanBeRetimedNotReshaped) {
  AccessPattern pattern(8, 16, 64);
  const BufferId ids[] = {0, 1};
  for (std::int64_t start : {0, 10'000}) {
    pattern.onIteration(start);
    for (int i = 0; i < 4; ++i) pattern.onLaunch({start + i * 1'000, 0, ids});
  }
  pattern.onIteration(20'000);
  const std::uint32_t learned = pattern.generation();
  const std::int64_t times[] = {0, 2'000, 4'000, 6'000, 15'000};  // four launches, then the end
  EXPECT_FALSE(pattern.retimeLearned(std::span(times, 4)));  // not this iteration's length
  EXPECT_EQ(pattern.schedule().offsetNs(3), 3'000);
  ASSERT_TRUE(pattern.retimeLearned(times));
  EXPECT_EQ(pattern.schedule().offsetNs(3), 6'000);
  EXPECT_EQ(pattern.schedule().durationNs(), 15'000);
  EXPECT_EQ(pattern.generation(), learned);  // the same launches: predictions keep their index
}

// The host issues launches far ahead of the device (10 ns apart here); the device runs them
// `device_gap` apart. Reports come `lag` launches late, in order or not, some never.
struct DeviceRun {
  AccessPattern pattern{64, 256, 4096, true};
  std::uint64_t launched = 0;
  std::int64_t host_ns = 0;
  void iteration(std::uint32_t length, std::uint32_t first_id = 0) {
    pattern.onIteration(host_ns);
    for (std::uint32_t i = 0; i < length; ++i) {
      const BufferId ids[] = {static_cast<BufferId>((first_id + i) % 64)};
      pattern.onLaunch({host_ns += 10, 0, ids});
      ++launched;
    }
  }
};

TEST(AccessPattern, TheDeviceTimesTheLearnedIterationAsItRanWaitsIncluded) {
  for (std::uint32_t length : {5u, 17u, 64u}) {
    for (std::int64_t unit : {1'000, 250'000}) {
      for (bool reversed : {false, true}) {
        SCOPED_TRACE(testing::Message() << length << " launches, " << unit << " ns, reversed " << reversed);
        DeviceRun run;
        run.iteration(length);
        run.iteration(length);
        run.pattern.onIteration(run.host_ns);
        ASSERT_TRUE(run.pattern.schedule().ready());
        EXPECT_EQ(run.pattern.schedule().offsetNs(length - 1), 10 * static_cast<std::int64_t>(length));
        // On the device (origin 7 ms) each launch runs 1-3 units; every fourth first waits 5
        // (a restore, a recompute, a host that fell behind).
        std::vector<std::int64_t> start(run.launched), end(run.launched);
        std::int64_t t = 7'000'000;
        for (std::uint64_t k = 0; k < run.launched; ++k) {
          start[k] = t + (k % 4 == 3 ? 5 * unit : 0);
          end[k] = t = start[k] + static_cast<std::int64_t>(k % 3 + 1) * unit;
        }
        std::uint32_t retimed = 0;
        for (std::uint64_t k = 0; k < run.launched; ++k) {
          const std::uint64_t launch = reversed ? run.launched - 1 - k : k;
          retimed += run.pattern.onLaunchTimed(launch, start[launch], end[launch]) ? 1 : 0;
        }
        // The second iteration (the learned one repeated) is timed by the device, once.
        EXPECT_EQ(retimed, 1u);
        EXPECT_EQ(run.pattern.deviceTimed(), 1u);
        // Each launch where it started, its wait before it included; the iteration ends where its
        // last launch did. What it ran alone would be shorter by every wait but the first's.
        const std::int64_t origin = start[length];
        std::int64_t ran = 0;
        for (std::uint32_t pos = 0; pos < length; ++pos) {
          EXPECT_EQ(run.pattern.schedule().offsetNs(pos), start[length + pos] - origin) << pos;
          ran += end[length + pos] - start[length + pos];
        }
        const std::int64_t duration = end[2 * length - 1] - origin;
        EXPECT_EQ(run.pattern.schedule().durationNs(), duration);
        EXPECT_GT(duration, ran);
        EXPECT_EQ(run.pattern.schedule().nextUseNs(0, 1), duration - (start[length + 1] - origin));  // wraps
        // What each launch waited, from the end of the one before (the first's: nothing).
        const std::span<const std::int64_t> waits = run.pattern.deviceWaits();
        ASSERT_EQ(waits.size(), length);
        for (std::uint32_t pos = 0; pos < length; ++pos)
          EXPECT_EQ(waits[pos], pos == 0 ? 0 : start[length + pos] - end[length + pos - 1]) << pos;
      }
    }
  }
}

TEST(AccessPattern, DeviceWaitsAreOnlyThoseOfTheDevicesTimesOfTheLearnedIteration) {
  // Before the device has timed the learned iteration, after it is retimed by the caller (a
  // plan's replay) and once another iteration is learned, there are none: they would be of
  // other times than the schedule's.
  for (std::uint32_t length : {8u, 24u}) {
    for (std::int64_t wait : {0, 3'000}) {
      SCOPED_TRACE(testing::Message() << length << " launches, wait " << wait);
      DeviceRun run;
      run.iteration(length);
      run.iteration(length);
      EXPECT_TRUE(run.pattern.deviceWaits().empty());  // learned, not timed
      run.pattern.onIteration(run.host_ns);
      EXPECT_TRUE(run.pattern.deviceWaits().empty());
      // Launches length..2*length-1 (the repeat): 1 us each, every third after a wait; every
      // fourth after work the policy was not told of, and that gap is not all waiting.
      std::int64_t t = 0;
      for (std::uint32_t p = 0; p < length; ++p) {
        t += p % 3 == 2 ? wait : 0;
        run.pattern.onLaunchTimed(length + p, t, t + 1000, p % 4 != 3);
        t += 1000;
      }
      ASSERT_EQ(run.pattern.deviceTimed(), 1u);
      ASSERT_EQ(run.pattern.deviceWaits().size(), length);
      for (std::uint32_t p = 0; p < length; ++p)
        EXPECT_EQ(run.pattern.deviceWaits()[p],
                  p % 4 == 3 ? AccessPattern::kWaitsUnknown : p % 3 == 2 ? wait : 0) << p;
      std::vector<std::int64_t> offsets(length + 1);
      for (std::uint32_t p = 0; p <= length; ++p) offsets[p] = 2 * static_cast<std::int64_t>(p) * 1000;
      ASSERT_TRUE(run.pattern.retimeLearned(offsets));
      EXPECT_TRUE(run.pattern.deviceWaits().empty());
      // Times with the waits of the run they come from (a plan's replay): those waits.
      std::vector<std::int64_t> replayed(length);
      for (std::uint32_t p = 0; p < length; ++p) replayed[p] = p % 2 == 0 ? wait + 7 : 0;
      ASSERT_TRUE(run.pattern.retimeLearned(offsets, replayed));
      ASSERT_EQ(run.pattern.deviceWaits().size(), length);
      for (std::uint32_t p = 0; p < length; ++p) EXPECT_EQ(run.pattern.deviceWaits()[p], replayed[p]) << p;
      // Waits of another length than the iteration's are no one's: none.
      ASSERT_TRUE(run.pattern.retimeLearned(offsets, std::span(replayed).first(length - 1)));
      EXPECT_TRUE(run.pattern.deviceWaits().empty());
      // Timed again by the device (the next repeat, launches 2 * length on): there again.
      run.iteration(length);
      run.pattern.onIteration(run.host_ns);
      t = 100'000;
      for (std::uint32_t p = 0; p < length; ++p, t += 1000) run.pattern.onLaunchTimed(2 * length + p, t, t + 1000);
      ASSERT_EQ(run.pattern.deviceTimed(), 2u);
      EXPECT_EQ(run.pattern.deviceWaits().size(), length);
      // Other launches, learned: none until the device times them.
      run.iteration(length, 32);
      run.pattern.onIteration(run.host_ns);
      ASSERT_EQ(run.pattern.schedule().buffersAt(0)[0], 32u);
      EXPECT_TRUE(run.pattern.deviceWaits().empty());
    }
  }
}

TEST(AccessPattern, WithoutTheFlagReportsChangeNothing) {
  AccessPattern untimed(64, 256, 4096);
  const BufferId ids[] = {1};
  for (std::int64_t start : {0, 1000}) {
    untimed.onIteration(start);
    for (int i = 0; i < 4; ++i) untimed.onLaunch({start + i * 10, 0, ids});
  }
  untimed.onIteration(2000);
  for (std::uint64_t k = 0; k < 8; ++k) {
    const auto at = static_cast<std::int64_t>(k) * 1'000'000;
    EXPECT_FALSE(untimed.onLaunchTimed(k, at, at + 1'000'000));
  }
  EXPECT_EQ(untimed.schedule().offsetNs(3), 30);
  EXPECT_EQ(untimed.deviceTimed(), 0u);
}

TEST(AccessPattern, LaunchesNeverReportedShareTheDeviceTimeAroundThemAndALaterIterationCompletesTheEarlierOne) {
  // Launches with no report ran all the same (their marks lost when the host ran far ahead):
  // a run of them between reported launches shares what the device took from the end of the
  // one before to the start of the one after, in proportion to the times learned for them; a
  // run at either end keeps its learned times. Never nothing: the LSTM's iteration came out at
  // a quarter of its length that way.
  struct Gap {
    std::uint32_t first, after;
  };
  for (Gap gap : {Gap{4, 5}, Gap{3, 7}, Gap{0, 3}, Gap{7, 10}, Gap{1, 9}}) {
    for (std::int64_t wait : {0, 2'500}) {
      SCOPED_TRACE(testing::Message() << "[" << gap.first << ", " << gap.after << "), wait " << wait);
      DeviceRun run;
      run.iteration(10);
      // The learned (host) times: uneven, so that the shares are by them, not launch for launch.
      run.pattern.onIteration(run.host_ns);
      for (std::uint32_t i = 0; i < 10; ++i) {
        const BufferId ids[] = {static_cast<BufferId>(i)};
        run.pattern.onLaunch({run.host_ns += 10 * (1 + i % 3), 0, ids});
        ++run.launched;
      }
      run.pattern.relearnNext();  // learned although it repeats the first launch for launch
      run.iteration(10);
      const UseSchedule& s = run.pattern.schedule();
      ASSERT_TRUE(s.ready());
      std::vector<std::int64_t> host(11);
      for (std::uint32_t p = 0; p <= 10; ++p) host[p] = s.offsetNs(p);
      // On the device, launches 10-19 (the second iteration) run 1 us each, back to back, but
      // for a wait before the first launch after the gap (part of what the gap shares).
      auto startOf = [&](std::uint32_t p) { return static_cast<std::int64_t>(p) * 1000 + (p >= gap.after ? wait : 0); };
      for (std::uint32_t p = 0; p < 10; ++p) {
        if (p >= gap.first && p < gap.after) continue;
        EXPECT_FALSE(run.pattern.onLaunchTimed(10 + p, startOf(p), startOf(p) + 1000));
      }
      EXPECT_EQ(run.pattern.deviceTimed(), 0u);  // not complete: the missing ones may still come
      EXPECT_TRUE(run.pattern.onLaunchTimed(20, 50'000, 51'000));  // the third iteration's: they will not
      // Expected: reported launches add their run; an inner gap the device's time across it,
      // shared by the host times; a gap at an end its host times.
      std::vector<std::int64_t> expected(11);
      const bool inner = gap.first > 0 && gap.after < 10;
      const std::int64_t gap_ns = inner ? startOf(gap.after) - startOf(gap.first - 1) - 1000 : host[gap.after] - host[gap.first];
      std::int64_t offset = 0;
      for (std::uint32_t p = 0; p < 10; ++p) {
        if (p >= gap.first && p < gap.after) {
          const std::int64_t learned = host[gap.after] - host[gap.first];
          expected[p] = offset + (learned > 0 ? gap_ns * (host[p] - host[gap.first]) / learned : 0);
          if (p + 1 == gap.after) offset += gap_ns;
          continue;
        }
        expected[p] = offset;
        offset += 1000;
      }
      expected[10] = offset;
      for (std::uint32_t p = 0; p <= 10; ++p) EXPECT_NEAR(s.offsetNs(p), expected[p], 1) << p;
      // The device's time, with the inner gap's wait in it and nothing for the missing ones lost.
      EXPECT_EQ(s.durationNs(), 1000 * (10 - (gap.after - gap.first)) + gap_ns);
    }
  }
}

TEST(AccessPattern, OverlappingStreamsCountTheBusyTimeOnce) {
  for (std::int64_t last_end : {25'000, 35'000}) {
    DeviceRun run;
    run.iteration(6);
    run.iteration(6);
    run.iteration(6);
    // Launches 6-11 alternate between two streams: the second's run within the first's, but
    // for the last, which may end after everything else.
    const std::int64_t start[] = {0, 2'000, 10'000, 8'000, 20'000, 21'000};
    const std::int64_t end[] = {10'000, 6'000, 20'000, 12'000, 30'000, last_end};
    for (std::uint64_t k = 0; k < 6; ++k) run.pattern.onLaunchTimed(6 + k, start[k], end[k]);
    ASSERT_EQ(run.pattern.deviceTimed(), 1u);
    const std::int64_t expected[] = {0, 10'000, 10'000, 20'000, 20'000, 30'000};
    for (std::uint32_t pos = 0; pos < 6; ++pos) EXPECT_EQ(run.pattern.schedule().offsetNs(pos), expected[pos]) << pos;
    EXPECT_EQ(run.pattern.schedule().durationNs(), std::max<std::int64_t>(30'000, last_end));
  }
}

TEST(AccessPattern, LateReportsOfAnIterationNoLongerLearnedChangeNothing) {
  DeviceRun run;
  run.iteration(8, 0);
  run.iteration(8, 0);
  run.iteration(8, 20);  // other launches: learned at the next boundary
  run.pattern.onIteration(run.host_ns);
  const std::uint32_t generation = run.pattern.generation();
  ASSERT_EQ(run.pattern.schedule().buffersAt(0)[0], 20u);
  auto report = [&](std::uint64_t launch) {
    const auto end = static_cast<std::int64_t>(launch + 1) * 1000;
    return run.pattern.onLaunchTimed(launch, end - 1000, end);
  };
  // The second iteration's (launches 8-15) reports, late: of the iteration learned before.
  for (std::uint64_t launch = 8; launch < 16; ++launch) EXPECT_FALSE(report(launch));
  EXPECT_EQ(run.pattern.schedule().offsetNs(7), 80);
  // Its own (launches 16-23) time it.
  for (std::uint64_t launch = 16; launch < 24; ++launch) report(launch);
  EXPECT_EQ(run.pattern.deviceTimed(), 1u);
  EXPECT_EQ(run.pattern.schedule().offsetNs(7), 7'000);
  EXPECT_EQ(run.pattern.generation(), generation);
}

TEST(DeltaPolicy, AsksForDeviceTimesOnlyWhenConfiguredForThem) {
  PolicyConfig config;
  config.max_buffers = 64;
  DeltaPolicy plain(config, DirectorMode::kMixed);
  EXPECT_FALSE(plain.wantsLaunchTimes());
  config.timed_launches = true;
  DeltaPolicy timed(config, DirectorMode::kMixed);
  EXPECT_TRUE(timed.wantsLaunchTimes());
  EXPECT_FALSE(makePolicy("lru", config).policy->wantsLaunchTimes());
}

// A swapped buffer (id 1) used at launch 6 of launches `step` apart, whose restore takes 3.5 steps;
// decided at launch 2, the next decision one step later. Launch `alloc_at` allocates `alloc`
// bytes; with `resident_freed`, a resident buffer (id 2) of as many bytes is freed after launch 3.
struct BacklogCase {
  const char* name;
  std::int64_t step;
  std::uint32_t alloc_at;
  bool resident_freed;
  bool waits;  // behind a backlog of 4.5 steps, with room for the restore alone
};

class RestoreBehindBacklog : public ::testing::TestWithParam<BacklogCase> {};

TEST_P(RestoreBehindBacklog, WaitsOnlyWhileTheLaunchesBeforeItsTransferNeedItsMemory) {
  const BacklogCase& c = GetParam();
  constexpr std::uint32_t kLaunches = 10;
  constexpr std::uint32_t kUse = 6;
  constexpr std::uint32_t kDecide = 2;
  constexpr BufferId kSwapped = 1;
  constexpr BufferId kFreed = 2;
  const auto restore_bytes = static_cast<std::uint64_t>(c.step * 7 / 2);  // 1 byte/ns: bytes are ns
  const std::uint64_t alloc = 5 * restore_bytes;
  UseSchedule schedule;
  schedule.reserve(4, 16, 32);
  for (std::uint32_t q = 0; q < kLaunches; ++q) {
    const BufferId uses[] = {q == kUse ? kSwapped : BufferId{0}};
    schedule.addLaunch(q * c.step, q == c.alloc_at ? alloc : 0, uses);
    if (q == 3 && c.resident_freed) schedule.addFree(kFreed, alloc);
  }
  schedule.finish(kLaunches * c.step);
  BufferTable table = tableWithSwappedOut(kSwapped, restore_bytes);
  if (c.resident_freed) table.allocate(kFreed, alloc, 0);
  const CostModel link(1.0, 1.0);
  std::array<Prefetch, 4> out{};
  constexpr std::int64_t kNow = 1'000'000'000;
  const std::int64_t backlog = kNow + c.step * 9 / 2;

  // Free memory unknown (a caller that does not say): started, as always.
  EXPECT_EQ(Prefetcher::choose(schedule, kDecide, table, link, {kNow, backlog}, out), 1u);
  // Room for the restore and the allocations before its transfer starts: started.
  EXPECT_EQ(Prefetcher::choose(schedule, kDecide, table, link, {kNow, backlog, restore_bytes + alloc}, out), 1u);
  // Room for the restore alone: it waits where the launches before its transfer need the rest.
  EXPECT_EQ(Prefetcher::choose(schedule, kDecide, table, link, {kNow, backlog, restore_bytes}, out),
            c.waits ? 0u : 1u);
  // A link whose queue ends before the next decision: started, whatever the memory (the caller
  // starts it only into free memory).
  ASSERT_EQ(Prefetcher::choose(schedule, kDecide, table, link, {kNow, kNow + c.step / 2, 0}, out), 1u);
  EXPECT_EQ(out[0].id, kSwapped);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, RestoreBehindBacklog,
    ::testing::Values(BacklogCase{"allocation_before_the_transfer_1ms", kMs, 4, false, true},
                      BacklogCase{"allocation_before_the_transfer_200us", kMs / 5, 5, false, true},
                      BacklogCase{"allocation_at_the_next_launch", kMs, 2, false, true},
                      BacklogCase{"allocation_after_the_transfer_starts", kMs, 8, false, false},
                      BacklogCase{"room_freed_before_the_allocation", kMs, 4, true, false},
                      BacklogCase{"room_freed_after_the_allocation", kMs, 3, true, true}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(DeltaPolicy, LearnedNextUseOrdersVictims) {
  PolicyConfig config;
  config.max_buffers = 64;
  DeltaPolicy p(config, DirectorMode::kSwapOnly);
  std::int64_t t = 0;
  for (int id = 0; id < 20; ++id) p.onAlloc(static_cast<BufferId>(id), 16 * kMiB, 0);
  runIteration(p, 20, t, true);
  runIteration(p, 20, t, true);
  p.onIteration(t);
  // At the start of an iteration, buffer 19 is the one needed last (launch 18): it goes first,
  // though it was used most recently.
  std::array<Victim, 1> out{};
  EvictRequest req;
  req.bytes = 1;
  req.now_ns = t;
  ASSERT_EQ(p.chooseVictims(req, out), 1u);
  EXPECT_EQ(out[0].id, 19u);
  // Prefetching: evict buffer 6 (first used by launch 5). 16 MiB takes ~1.4 ms to restore and
  // the next decision comes 1 ms later, so it must start when launch 5 is 2 ms away.
  p.onEvicted(6, Action::kSwap);
  std::array<Prefetch, 4> pf{};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(p.choosePrefetches({t, t}, pf), 0u) << "at launch " << i;
    const std::array<BufferId, 2> ws = {static_cast<BufferId>(i), static_cast<BufferId>(i + 1)};
    p.onLaunch({t, 0, ws});
    t += 1'000'000;
  }
  ASSERT_EQ(p.choosePrefetches({t, t}, pf), 1u);
  EXPECT_EQ(pf[0].id, 6u);
  EXPECT_EQ(pf[0].due_ns, 2'000'000);
  // A busy host-to-device engine makes it start earlier; a dropped buffer is never prefetched.
  p.onEvicted(9, Action::kSwap);
  p.onEvicted(12, Action::kRecompute);
  EXPECT_EQ(p.choosePrefetches({t, t + 4'000'000}, pf), 2u);
}

TEST(DeltaPolicy, AheadOfNeedNeverEvictsWhatTheNextLaunchUses) {
  // Room made ahead with a window of 0 (upcomingBytes covered just the next launch) used to be
  // taken from any buffer, the next launch's own included: swapped out only to be restored at
  // once, at every launch (a Tree-LSTM's recurrent weight). Ahead of need, the buffers the next
  // launch uses are not candidates; when memory is needed at once, they still are.
  for (DirectorMode mode : {DirectorMode::kMixed, DirectorMode::kSwapOnly}) {
    for (int n : {8, 20, 40}) {
      PolicyConfig config;
      config.max_buffers = 64;
      DeltaPolicy p(config, mode);
      std::int64_t t = 0;
      learnRing(p, n, 16 * kMiB, t);  // the next launch uses buffers 0 and 1
      std::vector<Victim> out(static_cast<std::size_t>(n));
      EvictRequest ahead;
      ahead.bytes = static_cast<std::uint64_t>(n) * 16 * kMiB;
      ahead.now_ns = t;
      ahead.urgent = false;
      ahead.not_before_ns = 0;
      const std::size_t k = p.chooseVictims(ahead, out);
      EXPECT_GT(k, 0u) << n;
      for (std::size_t i = 0; i < k; ++i) {
        EXPECT_NE(out[i].id, 0u) << n;
        EXPECT_NE(out[i].id, 1u) << n;
      }
      EvictRequest now = ahead;
      now.urgent = true;
      EXPECT_EQ(p.chooseVictims(now, out), static_cast<std::size_t>(n)) << n;
    }
  }
}

TEST(DeltaPolicy, AheadOfNeedEvictsOnlyWhatCanComeBackAfterTheNeed) {
  // Room made ahead for memory needed `need_at` from now may take a buffer used after that, but
  // not one whose restore would have to start before it (its next use less its transfer): until
  // the need has passed there is no memory to restore it into. Launch i uses buffers {i, i+1},
  // 1 ms apart, so buffer b is next used (b - 1) ms ahead; 16 MiB takes ~1.4 ms back at 12 GB/s.
  for (DirectorMode mode : {DirectorMode::kMixed, DirectorMode::kSwapOnly}) {
    for (int n : {20, 40}) {
      for (std::int64_t need_at : {2 * kMs, 5 * kMs, 11 * kMs}) {
        PolicyConfig config;
        config.max_buffers = 64;
        DeltaPolicy p(config, mode);
        std::int64_t t = 0;
        learnRing(p, n, 16 * kMiB, t);
        const std::int64_t restore = p.costs().transferNs(Direction::kHostToDevice, 16 * kMiB);
        std::vector<Victim> out(static_cast<std::size_t>(n));
        EvictRequest ahead;
        ahead.bytes = static_cast<std::uint64_t>(n) * 16 * kMiB;
        ahead.now_ns = t;
        ahead.urgent = false;
        ahead.not_before_ns = need_at;
        const std::size_t k = p.chooseVictims(ahead, out);
        std::size_t expected = 0;
        for (int b = 1; b < n; ++b) expected += (b - 1) * kMs - restore > need_at ? 1 : 0;
        EXPECT_EQ(k, expected) << n << " " << need_at;
        for (std::size_t i = 0; i < k; ++i) {
          const std::int64_t next_use = (static_cast<std::int64_t>(out[i].id) - 1) * kMs;
          EXPECT_GT(next_use - restore, need_at) << "buffer " << out[i].id;
        }
      }
    }
  }
}

TEST(DeltaPolicy, AheadOfNeedNeverEvictsWhatIsFreedBeforeTheNeed) {
  // The need counted ahead (upcomingBytes) is net of the frees before it: a buffer freed
  // before the memory is needed gives its memory back in time by itself. Evicted ahead, it
  // made no room, and its copy out (cancelled by the free) held the link for the copies that
  // did (a Transformer at 30 %, as played at 12 GB/s: 0.56 GiB a step copied out and thrown
  // away, 85 % overhead where 30 % was reached before). When memory is needed now, it may go.
  // The ring of runIteration, 1 ms a launch, and a temporary `tmp` made with launch 0 and freed
  // after launch `freed_after`: seen from launch 1, freed (freed_after) ms ahead.
  for (DirectorMode mode : {DirectorMode::kMixed, DirectorMode::kSwapOnly}) {
    for (const bool hook : {false, true}) {
      for (const int n : {8, 20}) {
        for (const int freed_after : {2, 5}) {
          PolicyConfig config;
          config.max_buffers = 64;
          DeltaPolicy p(config, mode);
          const auto tmp = static_cast<BufferId>(n);
          for (int id = 0; id < n; ++id) p.onAlloc(static_cast<BufferId>(id), 16 * kMiB, 0);
          std::int64_t t = 0;
          auto iteration = [&](bool whole) {
            p.onIteration(t);
            p.onAlloc(tmp, 32 * kMiB, t);
            if (hook) p.onRecomputable(tmp, kMs);
            for (int i = 0; i < n; ++i) {
              const std::array<BufferId, 3> ws = {static_cast<BufferId>(i), static_cast<BufferId>((i + 1) % n), tmp};
              p.onLaunch({t, 0, std::span<const BufferId>(ws).first(i == 0 ? 3 : 2)});
              t += kMs;
              if (i == freed_after) p.onFree(tmp, t);
              if (!whole) return;
            }
          };
          iteration(true);
          iteration(true);
          iteration(false);  // launch 0 only: tmp is resident, freed freed_after ms from here
          std::vector<BufferId> ring;
          for (int id = 0; id < n; ++id) ring.push_back(static_cast<BufferId>(id));
          std::array<Victim, 4> out{};
          for (const std::int64_t need_at : {std::int64_t{0}, (freed_after - 1) * kMs, freed_after * kMs,
                                             (freed_after + 3) * kMs}) {
            EvictRequest ahead;
            ahead.bytes = 32 * kMiB;
            ahead.now_ns = t;
            ahead.urgent = false;
            ahead.not_before_ns = need_at;
            ahead.keep = ring;  // tmp is the only candidate
            const std::size_t expected = need_at < freed_after * kMs ? 1 : 0;
            ASSERT_EQ(p.chooseVictims(ahead, out), expected)
                << static_cast<int>(mode) << " " << hook << " " << n << " " << freed_after << " " << need_at;
            if (expected == 1) {
              EXPECT_EQ(out[0].id, tmp);
            }
            EvictRequest now = ahead;
            now.urgent = true;
            now.not_before_ns = 0;
            ASSERT_EQ(p.chooseVictims(now, out), 1u);
            EXPECT_EQ(out[0].id, tmp);
          }
        }
      }
    }
  }
}

TEST(DeltaPolicy, ASwapAheadIsNotLeftForLaterForItsCopyOut) {
  // Evicting ahead is optional, and waits when it costs more per byte than on-demand evictions
  // have lately. A swap's copy out that would end after the memory is needed is no reason to
  // wait (on demand, all of it would show): a swap whose restore is hidden goes ahead even when
  // on-demand evictions were cheap drops. Launch i uses buffers {i, i+1}, 1 ms apart.
  for (int n : {20, 40}) {
    for (std::uint64_t bytes : {16 * kMiB, 48 * kMiB}) {
      PolicyConfig config;
      config.max_buffers = 64;
      DeltaPolicy p(config, DirectorMode::kMixed);
      std::int64_t t = 0;
      learnRing(p, n, bytes, t);
      const auto last = static_cast<BufferId>(n - 1);  // next used by launch n - 2
      // One victim asked for, now, with every buffer but `candidate` kept.
      std::vector<BufferId> all_but;
      std::array<Victim, 1> out{};
      auto choose = [&](bool urgent, BufferId candidate) {
        all_but.clear();
        for (int b = 0; b < n; ++b) {
          if (static_cast<BufferId>(b) != candidate) all_but.push_back(static_cast<BufferId>(b));
        }
        EvictRequest request;
        request.bytes = bytes;
        request.urgent = urgent;
        request.now_ns = t;
        request.keep = all_but;
        return p.chooseVictims(request, out);
      };
      // A swap ahead of the last buffer that comes back in time: its class costs nothing.
      ASSERT_EQ(choose(false, last), 1u);
      ASSERT_EQ(out[0].action, Action::kSwap);
      p.onEvicted(last, Action::kSwap);
      for (int i = 0; i < n; ++i) {
        if (i == n - 2) p.onRestored(last, t);
        const std::array<BufferId, 2> ws = {static_cast<BufferId>(i), static_cast<BufferId>((i + 1) % n)};
        p.onLaunch({t, 0, ws});
        t += kMs;
      }
      // On-demand evictions are cheap drops (half a transfer: above what the restore's share
      // of the link's load costs, below a whole copy out).
      const auto cheap = static_cast<BufferId>(n / 2);
      p.onRecomputable(cheap, p.costs().transferNs(Direction::kHostToDevice, bytes) / 2);
      ASSERT_EQ(choose(true, cheap), 1u);
      ASSERT_EQ(out[0].action, Action::kRecompute);
      p.onEvicted(cheap, Action::kRecompute);
      // Memory needed at the next launch: the last buffer's copy out would show in full, its
      // restore would not. It goes now.
      p.onIteration(t);
      ASSERT_EQ(choose(false, last), 1u) << n << " " << bytes;
      EXPECT_EQ(out[0].id, last);
      EXPECT_EQ(out[0].action, Action::kSwap);
    }
  }
}

TEST(CostModel, FollowsMeasuredCopies) {
  CostModel c(12.0, 12.0);
  EXPECT_EQ(c.transferNs(Direction::kHostToDevice, 12'000'000), 1'000'000);
  for (int i = 0; i < 50; ++i) c.onCopyMeasured(Direction::kHostToDevice, 50'000'000, 1'000'000);
  EXPECT_NEAR(c.bytesPerNs(Direction::kHostToDevice), 50.0, 0.1);
  EXPECT_NEAR(c.bytesPerNs(Direction::kDeviceToHost), 12.0, 1e-9);
  c.onCopyMeasured(Direction::kDeviceToHost, 1000, 1);  // tiny copies are ignored
  EXPECT_NEAR(c.bytesPerNs(Direction::kDeviceToHost), 12.0, 1e-9);
}

TEST(CostModel, TheFirstMeasurementEachWayReplacesTheSeedLaterOnesAreSmoothed) {
  for (double link : {1.5, 12.0, 450.0}) {  // a scaled test link, PCIe, a chip-to-chip link
    CostModel c(12.0, 12.0);
    c.onCopyMeasured(Direction::kDeviceToHost, 64'000'000, static_cast<std::int64_t>(64'000'000 / link));
    EXPECT_NEAR(c.bytesPerNs(Direction::kDeviceToHost), link, link * 1e-5);
    EXPECT_NEAR(c.bytesPerNs(Direction::kHostToDevice), 12.0, 1e-9);  // not measured yet
    // One odd copy (a link shared for a moment) moves the estimate a fifth of the way.
    c.onCopyMeasured(Direction::kDeviceToHost, 64'000'000, static_cast<std::int64_t>(64'000'000 / (link / 2)));
    EXPECT_NEAR(c.bytesPerNs(Direction::kDeviceToHost), link * 0.9, link * 1e-5);
  }
}

TEST(CostModel, LearnsHowFarRecomputeEstimatesAreFromMeasuredTimes) {
  CostModel c(12.0, 12.0);
  EXPECT_DOUBLE_EQ(c.recomputeScale(), 1.0);
  for (int i = 0; i < 50; ++i) c.onRecomputeMeasured(1'000, 3'000);
  EXPECT_NEAR(c.recomputeScale(), 3.0, 0.01);
  // Nonsense samples are ignored; one absurd one moves the scale only so far.
  c.onRecomputeMeasured(0, 5'000);
  c.onRecomputeMeasured(1'000, -1);
  EXPECT_NEAR(c.recomputeScale(), 3.0, 0.01);
  c.onRecomputeMeasured(1, 1'000'000'000);
  EXPECT_LT(c.recomputeScale(), 3.0 + 0.2 * 100.0 + 0.01);
}

TEST(Policy, MeasuredRecomputeTimeReplacesTheEstimateAndScalesLaterOnes) {
  auto p = make("delta");
  p->onAlloc(0, 8 * kMiB, 0);
  p->onAlloc(1, 8 * kMiB, 0);
  p->onRecomputable(0, 1'000);
  EXPECT_EQ(p->buffers()[0].recompute_ns, 1'000);
  p->onRecomputeMeasured(0, 1'000, 4'000);
  EXPECT_EQ(p->buffers()[0].recompute_ns, 4'000);
  // The next estimate is corrected by what was learnt (one sample: 1 + 0.2 * (4 - 1)).
  p->onRecomputable(1, 1'000);
  EXPECT_EQ(p->buffers()[1].recompute_ns, 1'600);
  // A buffer that cannot be recomputed stays so whatever is measured.
  p->onRecomputable(1, kUnknownNs);
  p->onRecomputeMeasured(1, 1'000, 4'000);
  EXPECT_EQ(p->buffers()[1].recompute_ns, kUnknownNs);
}

}  // namespace
}  // namespace delta::policy
