// Table-driven tests of what delta learns from the outcomes of its own actions: the simulator
// reports every wait (onWaited) and they add up to the time lost; delta's measured cost of a
// swap per context and of a recompute; the link's queueing price and the measured recompute
// factor in the director; no eviction ahead of need that undoes a prefetch or costs more than
// evicting on demand has cost lately.
#include <gtest/gtest.h>

#include <array>
#include <random>
#include <string>
#include <vector>

#include "policy/delta_policy.h"
#include "policy/director.h"
#include "policy/dtr_policy.h"
#include "policy/lru_policy.h"
#include "policy/simulator.h"
#include "workload_builder.h"

namespace delta::policy {
namespace {

using testing::trainingWorkload;
using testing::WorkloadBuilder;

constexpr std::uint64_t kMiB = 1u << 20;
constexpr std::int64_t kMs = 1'000'000;

// Any policy, plus the sum of the waits the simulator reported to it.
template <typename Base>
class Recording : public Base {
 public:
  using Base::Base;
  void onWaited(BufferId id, std::int64_t waited_ns) override {
    Base::onWaited(id, waited_ns);
    EXPECT_GT(waited_ns, 0);
    waited_ns_ += waited_ns;
  }
  std::int64_t waited_ns_ = 0;
};

PolicyConfig configFor(const Workload& w, double gbps) {
  PolicyConfig c;
  c.max_buffers = static_cast<std::uint32_t>(w.buffers.size());
  c.max_launches = 4096;
  c.max_uses = 1 << 16;
  c.h2d_gbps = c.d2h_gbps = gbps;
  return c;
}

// Recompute b needs a, which may be dropped too (a chain), while t crowds the memory.
Workload chainWorkload() {
  WorkloadBuilder b;
  const BufferId in = b.persistent("in", kMiB);
  const BufferId a = b.op("make_a", 2 * kMs, {in}, {256 * kMiB})[0];
  const BufferId c = b.op("make_b", 3 * kMs, {a}, {256 * kMiB})[0];
  const BufferId t = b.op("temp", 1 * kMs, {in}, {512 * kMiB}, {}, false)[0];
  b.op("use_t", 1 * kMs, {t});
  b.free(t);
  b.op("use_b", 1 * kMs, {c, a});
  b.free(a);
  b.free(c);
  return b.take();
}

struct WaitCase {
  const char* name;
  const char* policy;
  int workload;  // 0: training, 1: chain
  double budget_share;
  double gbps;
};

class ReportedWaits : public ::testing::TestWithParam<WaitCase> {};

// With one iteration and no warm-up, every ns the run takes beyond its compute is a wait some
// buffer was blamed for, once: a restore, a recompute, a copy out holding memory.
TEST_P(ReportedWaits, AddUpToTheTimeLost) {
  const WaitCase& c = GetParam();
  const Workload w = c.workload == 0 ? trainingWorkload(8, 64 * kMiB, 2 * kMs) : chainWorkload();
  ASSERT_EQ(w.validate(), "");
  SimOptions o;
  o.budget_bytes = static_cast<std::uint64_t>(c.budget_share * static_cast<double>(w.peakBytes()));
  o.h2d_gbps = o.d2h_gbps = c.gbps;
  o.iterations = 1;
  o.warmup = 0;
  const PolicyConfig config = configFor(w, c.gbps);
  const std::string name = c.policy;
  std::int64_t waited = 0;
  SimResult r;
  if (name == "lru") {
    Recording<LruPolicy> p(config);
    r = Simulator(w, o).run(p);
    waited = p.waited_ns_;
  } else if (name == "dtr") {
    Recording<DtrPolicy> p(config);
    r = Simulator(w, o).run(p);
    waited = p.waited_ns_;
  } else {
    Recording<DeltaPolicy> p(config, name == "swap-only" ? DirectorMode::kSwapOnly : DirectorMode::kMixed);
    r = Simulator(w, o).run(p);
    waited = p.waited_ns_;
  }
  EXPECT_EQ(r.used_while_evicted, 0u);
  EXPECT_GT(r.total_ns, r.compute_ns) << "the case must lose time to test anything";
  EXPECT_EQ(waited, r.total_ns - r.compute_ns);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ReportedWaits,
    ::testing::Values(WaitCase{"lru_training", "lru", 0, 0.5, 12.0},
                      WaitCase{"dtr_training", "dtr", 0, 0.5, 12.0},
                      WaitCase{"delta_training", "delta", 0, 0.5, 12.0},
                      WaitCase{"swap_only_training", "swap-only", 0, 0.4, 12.0},
                      WaitCase{"delta_chain", "delta", 1, 0.6, 12.0},
                      WaitCase{"dtr_chain", "dtr", 1, 0.6, 12.0}),
    [](const auto& info) { return std::string(info.param.name); });

// An lru that also makes room ahead once: after the second launch it asks for one buffer's
// worth (the first buffer, the staler, goes), and it keeps what each wait was blamed on.
class AheadOnceLru : public LruPolicy {
 public:
  AheadOnceLru(const PolicyConfig& config, std::uint64_t ahead_bytes) : LruPolicy(config), ahead_bytes_(ahead_bytes) {
    waited_by_.assign(config.max_buffers, 0);
  }
  void onLaunch(const Launch& launch) override {
    LruPolicy::onLaunch(launch);
    ++launches_;
  }
  void onWaited(BufferId id, std::int64_t waited_ns) override {
    LruPolicy::onWaited(id, waited_ns);
    waited_by_.at(id) += waited_ns;
  }
  std::uint64_t upcomingBytes(std::int64_t, std::int64_t& need_at_ns) const override {
    need_at_ns = 0;
    return launches_ == 2 ? ahead_bytes_ : 0;
  }
  std::vector<std::int64_t> waited_by_;

 private:
  std::uint64_t ahead_bytes_;
  int launches_ = 0;
};

// A copy out started ahead and cancelled (its buffer used again, or freed, before the copy
// ended) frees no memory: a later launch that waits for room waits for the copy behind it,
// and the wait is that buffer's. Blamed on the cancelled one, the wait priced its next action:
// a recompute, later, looked several times its cost (the Transformer, docs/shim.md).
TEST(ReportedWaits, ACancelledCopyOutIsNotBlamedForTheMemoryWaitedFor) {
  for (const std::uint64_t mib : {32, 64, 96}) {
    for (const bool freed : {false, true}) {
      const std::uint64_t bytes = mib * kMiB;
      WorkloadBuilder b;
      const BufferId a = b.op("make_a", kMs, {}, {bytes}, {}, false)[0];
      const BufferId c = b.op("make_b", kMs, {}, {bytes}, {}, false)[0];  // a's copy out starts
      std::vector<BufferId> last;
      if (freed) {
        b.op("other", kMs, {c});
        b.free(a);  // while its copy is under way
        last = b.op("make_two", kMs, {}, {bytes, bytes}, {}, false);
      } else {
        b.op("use_a", kMs, {a});  // cancels the copy
        last = b.op("make_one", kMs, {}, {bytes}, {}, false);
        b.free(a);
      }
      b.free(c);
      for (BufferId id : last) b.free(id);
      const Workload w = b.take();
      ASSERT_EQ(w.validate(), "");
      SimOptions o;
      o.budget_bytes = 2 * bytes;
      o.h2d_gbps = o.d2h_gbps = 1.0;  // a byte a nanosecond: the copies take far longer than the ops
      o.iterations = 1;
      o.warmup = 0;
      AheadOnceLru p(configFor(w, 1.0), bytes);
      const SimResult r = Simulator(w, o).run(p);
      EXPECT_EQ(r.over_budget_ops, 0u);
      EXPECT_EQ(r.used_while_evicted, 0u);
      EXPECT_EQ(r.swaps, 2u) << "a ahead, then b for the last allocation";
      std::int64_t waited = 0;
      for (std::int64_t ns : p.waited_by_) waited += ns;
      EXPECT_EQ(waited, r.total_ns - r.compute_ns) << mib << " " << freed;
      EXPECT_EQ(p.waited_by_[a], 0) << mib << " " << freed;
      // b's copy queued behind a's: the memory waited for both, and b is what freed it.
      EXPECT_GE(p.waited_by_[c], static_cast<std::int64_t>(bytes)) << mib << " " << freed;
    }
  }
}

// --- What delta learns from outcomes. ---

struct OutcomeCase {
  const char* name;
  Action action;
  std::int64_t waited_ns;  // reported before the use (0: nothing reported)
  bool used;               // the buffer is used after it came back (else freed)
  double expected_share;   // swapVisibleShare of the urgent, no-slack class
  double expected_factor;  // recomputeFactor
};

class DeltaOutcome : public ::testing::TestWithParam<OutcomeCase> {};

TEST_P(DeltaOutcome, LearnsWhatTheActionCost) {
  const OutcomeCase& c = GetParam();
  PolicyConfig config;
  config.max_buffers = 4;
  DeltaPolicy p(config, DirectorMode::kMixed);
  // 120 MiB: ~10.5 ms each way at 12 GB/s; a 4 ms recompute.
  p.onAlloc(0, 120 * kMiB, 0);
  p.onRecomputable(0, 4 * kMs);
  const std::array<BufferId, 1> ws = {0};
  p.onLaunch({0, 0, ws});
  p.onEvicted(0, c.action);  // the caller's own eviction: urgent, no slack
  p.onRestored(0, 10 * kMs);
  if (c.waited_ns > 0) p.onWaited(0, c.waited_ns);
  if (c.used) {
    p.onLaunch({20 * kMs, 0, ws});
  } else {
    p.onFree(0, 20 * kMs);
  }
  const std::uint32_t cls = DeltaPolicy::swapClass(true, kUnknownNs, 0);
  EXPECT_NEAR(p.swapVisibleShare(cls), c.expected_share, 0.01);
  EXPECT_NEAR(p.recomputeFactor(), c.expected_factor, 0.01);
}

const std::int64_t kTransfer = static_cast<std::int64_t>(static_cast<double>(120 * kMiB) / 12.0);

INSTANTIATE_TEST_SUITE_P(
    Cases, DeltaOutcome,
    ::testing::Values(
        // Nothing measured yet would read 1 / 1; a restore that came back in time: 0.
        OutcomeCase{"swap_hidden", Action::kSwap, 0, true, 0.0, 1.0},
        // The launch waited the whole transfer: 1; twice it (queued behind another): 2.
        OutcomeCase{"swap_on_demand", Action::kSwap, kTransfer, true, 1.0, 1.0},
        OutcomeCase{"swap_queued", Action::kSwap, 2 * kTransfer, true, 2.0, 1.0},
        // Swapped and freed unused: no restore to compare with, the share stays unmeasured.
        OutcomeCase{"swap_never_used", Action::kSwap, 0, false, 1.0, 1.0},
        // A recompute that took its op's time: 1; one that had to recompute its input too: 2.
        OutcomeCase{"recompute_alone", Action::kRecompute, 4 * kMs, true, 1.0, 1.0},
        OutcomeCase{"recompute_chain", Action::kRecompute, 8 * kMs, true, 1.0, 2.0}),
    [](const auto& info) { return std::string(info.param.name); });

// A swap freed while still out (never brought back): its waits (its copy out holding memory)
// compare with the one transfer it made. Compared with nothing, as a restore thrown away is,
// a workload whose swaps are mostly of buffers never read again priced every swap at hundreds
// of its transfers (the LSTM's, docs/policy.md).
TEST(DeltaOutcome, ASwapFreedWhileOutComparesItsWaitsWithItsCopyOut) {
  for (const double share : {0.0, 0.5, 1.0, 2.0}) {
    PolicyConfig config;
    config.max_buffers = 4;
    DeltaPolicy p(config, DirectorMode::kMixed);
    p.onAlloc(0, 120 * kMiB, 0);
    const std::array<BufferId, 1> ws = {0};
    p.onLaunch({0, 0, ws});
    p.onEvicted(0, Action::kSwap);
    const auto waited = static_cast<std::int64_t>(share * static_cast<double>(kTransfer));
    if (waited > 0) p.onWaited(0, waited);
    p.onFree(0, 20 * kMs);
    EXPECT_NEAR(p.swapVisibleShare(DeltaPolicy::swapClass(true, kUnknownNs, 0)), share, 0.01) << share;
  }
}

// Each of `steps` steps reads the last state and makes the next one (recomputable) and a stash
// nobody reads again before the iteration's end frees it (no hook: a swap that never comes
// back); a backward pass reads the states in reverse, freeing each. Sizes and times from the
// seed. Under a budget the stashes are the victims to take: their copies out can hide behind
// the steps, where dropping a state costs a recompute in backward.
Workload stashWorkload(std::mt19937& rng, int steps) {
  std::uniform_int_distribution<int> mib(2, 6), us(300, 900);
  WorkloadBuilder b;
  BufferId state = b.persistent("h0", 4 * kMiB);
  std::vector<BufferId> states, stashes;
  for (int t = 0; t < steps; ++t) {
    state = b.op("step" + std::to_string(t), us(rng) * 1000, {state}, {4 * kMiB})[0];
    states.push_back(state);
    stashes.push_back(b.op("stash" + std::to_string(t), us(rng) * 100, {state},
                           {static_cast<std::uint64_t>(mib(rng)) * kMiB}, {}, false)[0]);
  }
  for (int t = steps - 1; t >= 0; --t) {
    b.op("back" + std::to_string(t), 2 * us(rng) * 1000, {states[static_cast<std::size_t>(t)]});
    b.free(states[static_cast<std::size_t>(t)]);
  }
  for (BufferId s : stashes) b.free(s);
  return b.take();
}

TEST(DeltaOutcome, SwapsTheStashesNeverReadAgainRatherThanDroppingStates) {
  for (std::uint32_t seed = 1; seed <= 6; ++seed) {
    std::mt19937 rng(seed);
    const Workload w = stashWorkload(rng, 24 + static_cast<int>(seed) * 4);
    ASSERT_EQ(w.validate(), "");
    for (const double budget : {0.5, 0.7}) {
      SimOptions o;
      o.budget_bytes = static_cast<std::uint64_t>(budget * static_cast<double>(w.peakBytes()));
      o.iterations = 4;
      o.warmup = 2;
      o.plan = false;
      DeltaPolicy delta(configFor(w, 12.0), DirectorMode::kMixed);
      const SimResult r = Simulator(w, o).run(delta);
      LruPolicy lru(configFor(w, 12.0));
      const SimResult l = Simulator(w, o).run(lru);
      EXPECT_EQ(r.over_budget_ops, 0u);
      EXPECT_LE(r.overhead_pct, l.overhead_pct) << "seed " << seed << " budget " << budget;
      EXPECT_LE(r.recompute_ns, r.compute_ns / 50) << "seed " << seed << " budget " << budget;
    }
  }
}

struct ClassCase {
  bool urgent;
  std::int64_t next_ns;
  std::int64_t h2d_ns;
  std::uint32_t expected;
};

class SwapClass : public ::testing::TestWithParam<ClassCase> {};

TEST_P(SwapClass, BySlackAndUrgency) {
  const ClassCase& c = GetParam();
  EXPECT_EQ(DeltaPolicy::swapClass(c.urgent, c.next_ns, c.h2d_ns), c.expected);
}

constexpr std::uint32_t kU = DeltaPolicy::kSlackClasses;  // offset of the urgent classes

INSTANTIATE_TEST_SUITE_P(Cases, SwapClass,
                         ::testing::Values(ClassCase{false, kUnknownNs, 10, 0}, ClassCase{false, 19, 10, 0},
                                           ClassCase{false, 20, 10, 1}, ClassCase{false, 79, 10, 1},
                                           ClassCase{false, 80, 10, 2}, ClassCase{false, 320, 10, 3},
                                           ClassCase{false, 1'000'000, 10, 3}, ClassCase{true, kUnknownNs, 10, kU},
                                           ClassCase{true, 80, 10, kU + 2}, ClassCase{true, 5, 0, kU + 1}));

// --- The director's new terms. ---

struct PriceCase {
  const char* name;
  double recent_ns;  // restores started over about the last period
  double recompute_factor;
  Action expected;
};

class DirectorPrice : public ::testing::TestWithParam<PriceCase> {};

TEST_P(DirectorPrice, PicksCheaper) {
  const PriceCase& c = GetParam();
  BufferState s;
  s.bytes = 12 * kMiB;  // ~1 ms each way at 12 GB/s
  s.recompute_ns = 3 * kMs;
  EvictRequest req;
  req.urgent = false;
  const CostModel costs(12.0, 12.0);
  const Director d(DirectorMode::kMixed);
  // Used again in 100 ms of a 100 ms iteration, restores measured as hidden (share 0).
  const Director::Decision dec =
      d.decide(s, {100 * kMs, true}, req, costs, 0, c.recent_ns, 100 * kMs, 0.0, c.recompute_factor);
  EXPECT_TRUE(dec.possible);
  EXPECT_EQ(dec.action, c.expected);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, DirectorPrice,
    ::testing::Values(
        // An idle link hides the restore: swap.
        PriceCase{"idle_link_swaps", 0, 1.0, Action::kSwap},
        // A link busy 90 % of the iteration delays a transfer ~9 transfers (~9 ms): recompute.
        PriceCase{"busy_link_recomputes", 90.0 * kMs, 1.0, Action::kRecompute},
        // Half busy: ~1 ms, still below the 3 ms recompute.
        PriceCase{"half_busy_swaps", 50.0 * kMs, 1.0, Action::kSwap},
        // Measured recomputes cost 4x their op (inputs dropped too): 12 ms, so even the busy
        // link's ~9 ms swap is cheaper.
        PriceCase{"costly_recompute_chain_swaps", 90.0 * kMs, 4.0, Action::kSwap}),
    [](const auto& info) { return std::string(info.param.name); });

struct SwapCostCase {
  const char* name;
  UseSchedule::NextUse next;
  double share;             // measured visible share of the swap's class
  double expected_transfers;  // expected cost in one-way transfers (~1 ms each here)
};

class SwapCost : public ::testing::TestWithParam<SwapCostCase> {};

// Asked ahead with idle engines, a swap costs the model's part (nothing here) or, at least, its
// measured share of a transfer, whether it will be restored or not (a copy out that is never
// restored still holds memory and the link while it runs).
TEST_P(SwapCost, AtLeastTheMeasuredShare) {
  const SwapCostCase& c = GetParam();
  EvictRequest req;
  req.urgent = false;
  req.not_before_ns = 50 * kMs;
  const CostModel costs(12.0, 12.0);
  const std::uint64_t bytes = 12 * kMiB;
  const double transfer = static_cast<double>(costs.transferNs(Direction::kDeviceToHost, bytes));
  const std::int64_t cost = Director::swapCostNs(bytes, c.next, req, costs, 0, 0, 0, c.share);
  EXPECT_NEAR(static_cast<double>(cost), c.expected_transfers * transfer, 2.0);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, SwapCost,
    ::testing::Values(SwapCostCase{"reused_hidden", {100 * kMs, true}, 0.0, 0.0},
                      SwapCostCase{"reused_measured", {100 * kMs, true}, 2.5, 2.5},
                      SwapCostCase{"freed_unmeasured_hidden", {100 * kMs, false}, 0.0, 0.0},
                      SwapCostCase{"freed_measured", {100 * kMs, false}, 3.0, 3.0}),
    [](const auto& info) { return std::string(info.param.name); });

// --- Evictions ahead of need. ---

struct AheadCase {
  const char* name;
  bool urgent;
  bool prefetched;       // buffer 0 was swapped and is back, not used yet
  bool priced;           // an urgent eviction of a cheap drop was seen first
  std::vector<BufferId> expected;
};

class DeltaAhead : public ::testing::TestWithParam<AheadCase> {};

TEST_P(DeltaAhead, ChoosesOnlyWhatPays) {
  const AheadCase& c = GetParam();
  PolicyConfig config;
  config.max_buffers = 4;
  DeltaPolicy p(config, DirectorMode::kMixed);
  // 0 and 1: no hook (swap only), 0 is twice 1's size and staler, so the better victim on its
  // own; 2: a cheap drop (1 us), used last.
  p.onAlloc(0, 16 * kMiB, 0);
  p.onAlloc(1, 8 * kMiB, 0);
  p.onAlloc(2, 8 * kMiB, 0);
  p.onRecomputable(2, 1000);
  const std::array<BufferId, 1> w1 = {1};
  const std::array<BufferId, 1> w2 = {2};
  std::array<Victim, 4> out{};
  if (c.prefetched) {
    p.onEvicted(0, Action::kSwap);
    p.onRestored(0, 0);
  }
  p.onLaunch({40 * kMs, 0, w1});
  p.onLaunch({45 * kMs, 0, w2});
  const std::array<BufferId, 1> keep1 = {1};
  if (c.priced) {
    EvictRequest first;
    first.bytes = 1;
    first.now_ns = 46 * kMs;
    first.keep = keep1;  // only 0 and 2 are candidates; 2's drop is the cheaper per byte
    // 0's swap costs its transfer (~1.4 ms, unmeasured), 2's drop 1 us: 2 goes.
    ASSERT_EQ(p.chooseVictims(first, out), 1u);
    ASSERT_EQ(out[0].id, 2u);
    p.onEvicted(2, out[0].action);
  }
  const std::array<BufferId, 1> keep2 = {2};
  EvictRequest req;
  req.bytes = 1;
  req.now_ns = 50 * kMs;
  req.urgent = c.urgent;
  req.keep = keep2;  // 0 or 1 (2 is gone when priced, else it would be the cheapest)
  const std::size_t n = p.chooseVictims(req, out);
  ASSERT_EQ(n, c.expected.size());
  for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(out[i].id, c.expected[i]) << "victim " << i;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, DeltaAhead,
    ::testing::Values(
        // Control: with nothing learned, the bigger, staler buffer goes, ahead or not.
        AheadCase{"control_ahead", false, false, false, {0}},
        AheadCase{"control_urgent", true, false, false, {0}},
        // Just brought back for a use to come: never evicted ahead (it would undo the prefetch
        // the room is made for); when memory is short, it costs its transfer again, still the
        // best here (three times staler).
        AheadCase{"prefetched_kept_ahead", false, true, false, {1}},
        AheadCase{"prefetched_urgent", true, true, false, {0}},
        // On-demand evictions have cost ~0 per byte (a cheap drop): a swap ahead costs more
        // per byte and waits for the need; when the need comes it is taken.
        AheadCase{"dearer_than_on_demand_waits", false, false, true, {}},
        AheadCase{"on_demand_takes_it", true, false, true, {0}}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace delta::policy
