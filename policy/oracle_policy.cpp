// The oracle bound: see oracle_policy.h.
#include "policy/oracle_policy.h"

#include <algorithm>
#include <cstdio>
#include <limits>

namespace delta::policy {

namespace {
// A swap fully hidden behind compute still loads the links that later copies queue on: it is
// charged this share of its two transfers, so that among free choices the cheaper ones go first.
constexpr double kLinkLoad = 0.05;
// Every action costs at least this (keeps scores finite and comparable).
constexpr double kCostFloorNs = 1000.0;
// How many levels of evicted inputs a recompute's price follows.
constexpr int kRecomputeDepth = 3;
constexpr double kNever = std::numeric_limits<double>::max();
}  // namespace

std::string OracleRule::name() const {
  std::string s = actions == Actions::kMixed       ? "mixed"
                  : actions == Actions::kSwapOnly  ? "swap-only"
                  : actions == Actions::kDropFirst ? "drop-first"
                                                   : "drop-only";
  s += rank == Rank::kCost ? "/cost" : "/farthest";
  s += window == Prefetcher::Window::kGross ? "/gross"
       : window == Prefetcher::Window::kNet ? "/net"
       : window == Prefetcher::Window::kFar ? "/far"
                                            : "/on-demand";
  if (short_window) s += "/short-window";
  if (swap_weight != 1.0) s += "/swap-x" + std::to_string(static_cast<int>(swap_weight));
  if (!net_of_held) s += "/gross-drops";
  if (!swap_ahead) s += "/no-swap-ahead";
  if (ahead_gate > 0) {
    char share[32];
    std::snprintf(share, sizeof share, "/gate-%.3g", ahead_gate);
    s += share;
  }
  if (rank_last_resort) s += "/ranked-swaps";
  if (plain_drop_price) s += "/plain";
  if (!protect_window) s += "/need-dated";
  return s;
}

std::vector<OracleRule> oracleRules() {
  std::vector<OracleRule> rules;
  for (auto actions : {OracleRule::Actions::kMixed, OracleRule::Actions::kDropFirst, OracleRule::Actions::kDropOnly,
                       OracleRule::Actions::kSwapOnly}) {
    for (auto rank : {OracleRule::Rank::kCost, OracleRule::Rank::kFarthest}) {
      for (auto window : {Prefetcher::Window::kGross, Prefetcher::Window::kNet, Prefetcher::Window::kNone}) {
        for (double swap_weight : {1.0, 4.0}) {
          for (bool net_of_held : {true, false}) {
            // Pure swapping has no drop to weigh a swap against, nor drops to count net.
            if (actions == OracleRule::Actions::kSwapOnly && (swap_weight != 1.0 || !net_of_held)) continue;
            rules.push_back({actions, rank, window, swap_weight, net_of_held});
            // Room ahead that may take what is used after the memory is needed (delta's rule):
            // better on some rows, worse on others than keeping everything the window uses.
            if (window != Prefetcher::Window::kNone && net_of_held) {
              OracleRule r{actions, rank, window, swap_weight, net_of_held};
              r.protect_window = false;
              rules.push_back(r);
            }
          }
        }
      }
    }
  }
  // Drop-based plans that choose what to drop ahead of need by its price (docs/policy.md, *The
  // oracle*: what DenseNet-121, ResNet-32 and the Transformer at 12 GB/s need): no drop ahead
  // that costs more than a share of its round trip over the links, no swap ahead in place of a
  // drop (drop-only), the swaps of last resort ranked.
  auto gated = [&](OracleRule::Actions actions, OracleRule::Rank rank, Prefetcher::Window window, bool swap_ahead,
                   double gate, bool plain) {
    OracleRule r{actions, rank, window, 1.0, true};
    r.swap_ahead = swap_ahead;
    r.ahead_gate = gate;
    r.rank_last_resort = true;
    r.plain_drop_price = plain;
    rules.push_back(r);
  };
  using A = OracleRule::Actions;
  using R = OracleRule::Rank;
  for (auto window : {Prefetcher::Window::kGross, Prefetcher::Window::kNet, Prefetcher::Window::kNone}) {
    for (double gate : {1.0, 1.0 / 16, 1.0 / 64}) {
      gated(A::kDropOnly, R::kCost, window, false, gate, false);
      gated(A::kDropOnly, R::kFarthest, window, false, gate, false);
    }
    for (double gate : {1.0, 1.0 / 16}) {
      gated(A::kDropOnly, R::kCost, window, true, gate, false);
      gated(A::kDropFirst, R::kCost, window, true, gate, false);
    }
    if (window != Prefetcher::Window::kNone) gated(A::kDropOnly, R::kCost, window, false, 1.0 / 64, true);
  }
  // The mixed rules, which choose swaps ahead by their price, also over the short window, last
  // (ties keep the long one): ResNet-32 at 30 and 50 %/50 GB/s 17.74 -> 11.33 % and 3.99 ->
  // 1.31 %, no other shared row moved (docs/policy.md).
  const std::size_t count = rules.size();
  for (std::size_t i = 0; i < count; ++i) {
    if (rules[i].actions != A::kMixed || rules[i].window == Prefetcher::Window::kNone) continue;
    OracleRule r = rules[i];
    r.short_window = true;
    rules.push_back(r);
  }
  // Swaps with room made by the far window (prefetcher.h), which delta's planner may choose:
  // a bound that lacked it would not bound delta.
  for (auto actions : {A::kMixed, A::kSwapOnly}) {
    for (auto rank : {R::kCost, R::kFarthest}) {
      for (double swap_weight : {1.0, 4.0}) {
        if (actions == A::kSwapOnly && swap_weight != 1.0) continue;
        for (bool protect_window : {true, false}) {
          OracleRule r{actions, rank, Prefetcher::Window::kFar, swap_weight, true};
          r.protect_window = protect_window;
          rules.push_back(r);
        }
      }
    }
  }
  return rules;
}

OracleRulePolicy::OracleRulePolicy(const PolicyConfig& config, const Workload& workload, OracleRule rule,
                                   std::span<const std::int64_t> offsets_ns, std::span<const BufferId> vetoed)
    : Policy(config),
      workload_(workload),
      free_op_(workload.buffers.size(), UseSchedule::kNoPos),
      future_(workload.schedule()),
      rule_(rule),
      starts_(workload.ops.size(), 0),
      vetoed_(workload.buffers.size(), 0),
      price_(workload.buffers.size(), -1.0) {
  if (!offsets_ns.empty()) future_.retime(offsets_ns);
  for (BufferId id : vetoed) {
    if (id < vetoed_.size()) vetoed_[id] = 1;
  }
  for (std::uint32_t i = 0; i < workload.ops.size(); ++i) {
    for (BufferId b : workload.ops[i].frees) free_op_[b] = i;
  }
}

std::uint64_t OracleRulePolicy::heldBytes(BufferId id) const {
  const std::int32_t producer = id < workload_.buffers.size() ? workload_.buffers[id].producer : -1;
  if (producer < 0) return 0;
  const std::uint32_t next = future_.nextUsePos(id, position_);
  std::uint64_t held = 0;
  for (BufferId in : workload_.ops[static_cast<std::size_t>(producer)].reads) {
    const std::uint32_t freed = free_op_[in];
    if (freed == UseSchedule::kNoPos || freed < position_) continue;
    if (next == UseSchedule::kNoPos || next < position_ || freed < next) held += workload_.buffers[in].bytes;
  }
  return held;
}

std::vector<std::int64_t> OracleRulePolicy::runOffsets() const {
  if (iteration_start_ < 0 || position_ != starts_.size() || starts_.empty()) return last_offsets_;
  // The last iteration ended with its last op (the simulator says no more).
  std::vector<std::int64_t> offsets(starts_.size() + 1);
  for (std::size_t i = 0; i < starts_.size(); ++i) offsets[i] = starts_[i] - iteration_start_;
  offsets.back() = offsets[starts_.size() - 1] + workload_.ops.back().compute_ns;
  return offsets;
}

void OracleRulePolicy::onLaunch(const Launch& launch) {
  if (position_ < starts_.size()) starts_[position_] = launch.now_ns;
  ++position_;  // first: the launch's buffers are ranked by their use after this one
  Policy::onLaunch(launch);
}

void OracleRulePolicy::noteChoice(BufferId id, const BufferState&, Action) const {
  if (id < price_.size()) price_[id] = std::max(price_[id], rated_price_);
}

std::vector<std::pair<double, BufferId>> OracleRulePolicy::evictionPrices() const {
  const bool whole = iteration_start_ >= 0 && position_ == starts_.size();
  const std::vector<double>& prices = whole ? price_ : last_price_;
  std::vector<std::pair<double, BufferId>> out;
  for (BufferId id = 0; id < prices.size(); ++id) {
    if (prices[id] >= 0) out.emplace_back(prices[id], id);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
  return out;
}

void OracleRulePolicy::onIteration(std::int64_t now_ns) {
  if (iteration_start_ >= 0 && position_ == starts_.size()) last_price_ = price_;
  std::fill(price_.begin(), price_.end(), -1.0);
  if (iteration_start_ >= 0 && position_ == starts_.size()) {
    last_offsets_.resize(starts_.size() + 1);
    for (std::size_t i = 0; i < starts_.size(); ++i) last_offsets_[i] = starts_[i] - iteration_start_;
    last_offsets_.back() = now_ns - iteration_start_;
  }
  iteration_start_ = now_ns;
  position_ = 0;
  reindexAll();
}

double OracleRulePolicy::rankKey(BufferId id, const BufferState& state) const {
  const std::int64_t next_use = future_.nextUseNs(id, position_);
  if (next_use == kUnknownNs) return kNever;
  return static_cast<double>(state.last_use_ns + next_use);  // absolute: farthest first
}

double OracleRulePolicy::recomputeNs(BufferId id, int depth) const {
  double ns = static_cast<double>(std::max<std::int64_t>(0, table_[id].recompute_ns));
  const std::int32_t producer = id < workload_.buffers.size() ? workload_.buffers[id].producer : -1;
  if (producer < 0) return ns;
  for (BufferId in : workload_.ops[static_cast<std::size_t>(producer)].reads) {
    if (!table_.valid(in)) continue;
    const BufferState& s = table_[in];
    if (s.residency != Residency::kEvicted) continue;
    if (s.evicted_by == Action::kRecompute && s.recompute_ns != kUnknownNs) {
      ns += depth > 0 ? recomputeNs(in, depth - 1) : static_cast<double>(s.recompute_ns);
    } else {
      ns += static_cast<double>(costs_.transferNs(Direction::kHostToDevice, s.bytes));
    }
  }
  return ns;
}

Policy::Rating OracleRulePolicy::rate(BufferId id, const BufferState& state, const EvictRequest& request) const {
  const UseSchedule::NextUse next = future_.nextUse(id, position_);
  const bool known = next.ns != kUnknownNs;
  const bool reused = known && next.reused;
  if (reused && request.not_before_ns > 0 && next.ns <= request.not_before_ns) return {};
  const bool can_drop = state.recompute_ns != kUnknownNs;

  // Drop: the recompute at the next use (nothing if it is freed first).
  const double drop = !can_drop ? kNever
                     : !reused  ? 0.0
                     : rule_.plain_drop_price ? static_cast<double>(state.recompute_ns)
                                              : recomputeNs(id, kRecomputeDepth);
  // Swap: the wait for the copy out when the memory is needed now (or beyond the window when
  // asked ahead), and the part of the copy back that cannot end before the next use.
  const auto now = static_cast<double>(request.now_ns);
  const auto out_ns = static_cast<double>(costs_.transferNs(Direction::kDeviceToHost, state.bytes));
  const auto in_ns = static_cast<double>(costs_.transferNs(Direction::kHostToDevice, state.bytes));
  const double out_end = std::max(now, static_cast<double>(request.d2h_busy_until_ns)) + out_ns;
  const double needed_at = request.urgent ? now : now + static_cast<double>(request.not_before_ns);
  double swap = std::max(0.0, out_end - needed_at) + kLinkLoad * out_ns;
  double restore = 0;
  if (reused) {
    const double in_end = std::max(out_end, static_cast<double>(request.h2d_busy_until_ns)) + in_ns;
    restore = std::max(0.0, in_end - (now + static_cast<double>(next.ns))) + kLinkLoad * in_ns;
  }
  swap = (swap + restore) * rule_.swap_weight;
  const double drop_price = drop;

  Action action = Action::kSwap;
  double cost = swap;
  switch (rule_.actions) {
    case OracleRule::Actions::kMixed:
      if (drop_price <= swap) {
        action = Action::kRecompute;
        cost = drop_price;
      }
      break;
    case OracleRule::Actions::kDropFirst:
      if (can_drop) {
        action = Action::kRecompute;
        cost = drop_price;
      }
      break;
    case OracleRule::Actions::kDropOnly:
      if (can_drop) {
        action = Action::kRecompute;
        cost = drop_price;
      } else {
        // Ahead of need a drop may still come later: no swap takes its place.
        if (!request.urgent && !rule_.swap_ahead) return {};
        cost = kNever;  // last resort: scored below every drop
      }
      break;
    case OracleRule::Actions::kSwapOnly:
      break;
  }
  // Ahead of need, evicting only chooses earlier: worth it for a copy out that then overlaps
  // compute, or a drop made while the inputs its recompute needs are still alive. A drop that
  // costs more than a share of copying the buffer out and back is left for the request that
  // needs the memory now, which may find cheaper room (DenseNet-121: its small batch-norm
  // results, 256 bytes for a 1.5 ms recompute, were dropped ahead by the hundred).
  if (rule_.ahead_gate > 0 && !request.urgent && action == Action::kRecompute &&
      cost > rule_.ahead_gate * (out_ns + in_ns)) {
    return {};
  }
  rated_price_ = cost == kNever ? swap : cost;
  // Vetoed: after every other candidate of its kind (eligible still: a veto must not leave the
  // budget, nor skip the rest of its bucket).
  if (vetoed_[id]) return {cost == kNever ? -1.0 : 1e-200, action, true};
  const double distance = static_cast<double>(std::max<std::int64_t>(1, next.ns));
  if (cost == kNever) {
    if (!rule_.rank_last_resort) return {std::numeric_limits<double>::min(), action, true};
    // Below every drop (negative), and among themselves by what the swap frees per ns it costs
    // (all alike, the lowest ids went first: DenseNet-121's small parameters, by the hundred).
    const double d = known ? distance : kNever;
    return {-1.0 / (1.0 + static_cast<double>(state.bytes) * d / (swap + kCostFloorNs)), action, true};
  }
  if (!known) return {kNever, action, true};
  if (rule_.rank == OracleRule::Rank::kFarthest) return {reused ? distance : kNever, action, true};
  // What a drop frees is less what it keeps alive for its recompute.
  double bytes = static_cast<double>(state.bytes);
  if (action == Action::kRecompute && reused && rule_.net_of_held) {
    bytes = std::max(bytes / 16, bytes - static_cast<double>(heldBytes(id)));
  }
  return {bytes * distance / (cost + kCostFloorNs), action, true};
}

std::size_t OracleRulePolicy::choosePrefetches(const PrefetchRequest& request, std::span<Prefetch> out) {
  return Prefetcher::choose(future_, position_, table_, costs_, request, out);
}

std::uint64_t OracleRulePolicy::upcomingBytes(std::int64_t, std::int64_t& need_at_ns) const {
  std::int64_t window_ns = 0;
  const std::uint64_t need =
      Prefetcher::upcomingBytes(future_, position_, table_, costs_, need_at_ns, rule_.window, &window_ns, rule_.short_window);
  if (rule_.protect_window) need_at_ns = window_ns;
  return need;
}

std::string OracleCandidate::name() const {
  if (planned) {
    std::string s = configured == DirectorMode::kMixed      ? "delta:"
                    : configured == DirectorMode::kSwapOnly ? "swap-only:"
                                                            : "recompute-only:";
    s += plan.planned ? plan.name() : "unplanned";
    if (!vetoed.empty()) s += "/+vetoed-" + std::to_string(vetoed.size());
    return s;
  }
  std::string s = rule.name();
  if (retimed > 0) s += "/retimed-" + std::to_string(retimed);
  if (!vetoed.empty()) s += "/vetoed-" + std::to_string(vetoed.size());
  return s;
}

OraclePolicy::OraclePolicy(const PolicyConfig& config, const Workload& workload, OracleSearch found)
    : OracleRulePolicy(config, workload, found.candidates[found.best].rule, found.candidates[found.best].offsets_ns,
                       found.candidates[found.best].vetoed),
      OracleChoice(std::move(found)) {}

namespace {
// The planner's start run as the candidate says: delta as it runs, or adopting its plan with
// the oracle's vetoes added once it has learned the iteration.
void adoptCandidate(DeltaPolicy& policy, const OracleCandidate& c) {
  if (c.vetoed.empty()) return;
  Plan plan = c.plan;
  plan.vetoed.insert(plan.vetoed.end(), c.vetoed.begin(), c.vetoed.end());
  policy.adoptWhenLearned(plan);
}
}  // namespace

OraclePlannedPolicy::OraclePlannedPolicy(const PolicyConfig& config, OracleSearch found)
    : DeltaPolicy(config, found.candidates[found.best].configured), OracleChoice(std::move(found)) {
  adoptCandidate(*this, chosen());
}

std::unique_ptr<Policy> makeOracle(const PolicyConfig& config, const Workload& workload, const SimOptions& options) {
  OracleSearch found = searchOracle(config, workload, options);
  if (found.candidates[found.best].planned) return std::make_unique<OraclePlannedPolicy>(config, std::move(found));
  return std::make_unique<OraclePolicy>(config, workload, std::move(found));
}

OracleSearch searchOracle(const PolicyConfig& config, const Workload& workload, const SimOptions& options) {
  // A candidate whose run (warm-up included) takes over this many times the best complete run
  // so far cannot win: it is cut short, which bounds the search's time.
  constexpr std::int64_t kGiveUpFactor = 2;
  // Retiming: the best few rules, each this many rounds (each round timed by the previous run).
  constexpr std::size_t kRetimedRules = 8;
  constexpr int kRetimeRounds = 3;
  // Local search: how many of the best run's dearest evictions are vetoed in turn.
  constexpr std::size_t kVetoMoves = 8;
  // The gate's line search: at most this many steps each way.
  constexpr int kGateSteps = 3;
  OracleSearch s;
  auto better = [](const SimResult& a, const SimResult& b) {
    return !a.gave_up && (b.gave_up || a.over_budget_ops < b.over_budget_ops ||
                          (a.over_budget_ops == b.over_budget_ops && a.total_ns < b.total_ns));
  };
  // Replays one candidate; returns the timing its run produced (for the next round). The prices
  // of its evictions go to `last_prices`, and to `best_prices` if it is the best run so far (the
  // local search's moves).
  std::vector<std::pair<double, BufferId>> prices;       // the local search's, below
  std::vector<std::pair<double, BufferId>> best_prices;  // the best run's so far
  std::vector<std::pair<double, BufferId>> last_prices;  // the last run's
  auto replay = [&](const OracleRule& rule, int retimed, std::vector<std::int64_t> offsets,
                    std::vector<BufferId> vetoed = {}) {
    SimOptions o = options;
    const SimResult& best = s.candidates.empty() ? SimResult{} : s.candidates[s.best].result;
    if (!s.candidates.empty() && best.over_budget_ops == 0) o.give_up_after_ns = kGiveUpFactor * best.run_ns;
    OracleRulePolicy candidate(config, workload, rule, offsets, vetoed);
    Simulator sim(workload, o);
    const SimResult r = sim.run(candidate);
    std::vector<std::int64_t> next = r.gave_up ? std::vector<std::int64_t>{} : candidate.runOffsets();
    OracleCandidate c;
    c.rule = rule;
    c.result = r;
    c.retimed = retimed;
    c.offsets_ns = std::move(offsets);
    c.vetoed = std::move(vetoed);
    s.candidates.push_back(std::move(c));
    last_prices = candidate.evictionPrices();
    if (s.candidates.size() == 1 || better(r, s.candidates[s.best].result)) {
      s.best = s.candidates.size() - 1;
      best_prices = last_prices;
    }
    return next;
  };
  std::vector<std::pair<std::size_t, std::vector<std::int64_t>>> timed;  // candidate, its run's timing
  for (const OracleRule& rule : oracleRules()) {
    std::vector<std::int64_t> next = replay(rule, 0, {});
    if (!next.empty()) timed.emplace_back(s.candidates.size() - 1, std::move(next));
  }
  // The best few complete runs, best first (ties: the earlier rule).
  std::stable_sort(timed.begin(), timed.end(), [&](const auto& a, const auto& b) {
    return better(s.candidates[a.first].result, s.candidates[b.first].result);
  });
  if (timed.size() > kRetimedRules) timed.resize(kRetimedRules);
  for (auto& [index, offsets] : timed) {
    const OracleRule rule = s.candidates[index].rule;
    std::vector<std::int64_t> timing = std::move(offsets);
    for (int round = 1; round <= kRetimeRounds && !timing.empty(); ++round) {
      timing = replay(rule, round, std::move(timing));
    }
  }
  // Line search on the gate of the best run, when it is gated: its share doubled or halved
  // while that makes the run faster, then a step of a square root of 2 either way (which drops
  // may go ahead is the whole difference on the Transformer at 12 GB/s).
  if (s.candidates[s.best].rule.ahead_gate > 0) {
    for (double factor : {2.0, 0.5, 1.4142135623730951, 0.7071067811865476}) {
      for (int step = 0; step < kGateSteps; ++step) {
        const OracleCandidate base = s.candidates[s.best];
        OracleRule rule = base.rule;
        rule.ahead_gate *= factor;
        const std::size_t before = s.best;
        replay(rule, base.retimed, base.offsets_ns, base.vetoed);
        if (s.best == before) break;  // no faster: the next direction
      }
    }
  }
  // Local search: veto, one at a time, the dearest evictions of the best run (evicted only when
  // nothing else is left), keeping each veto that makes the run faster (a cheaper buffer takes
  // the dear one's place: the Transformer at 12 GB/s, where which 160 MiB results are dropped
  // ahead is the whole difference). From two starts: the best run, and the best of the rules that
  // make room by another window (replayed once more for its prices). From the best alone, the
  // search ended wherever its first rule led: with the far window's rules added, 21 rows of the
  // regret benchmark at 50 GB/s ended slower than without them (`gan-17` at 70 %:
  // mixed/cost/far/vetoed-1 2.15 %, where mixed/cost/gross/vetoed-1 had reached 0.0).
  auto search_from = [&](std::size_t start) {
    std::size_t chain = start;
    std::vector<BufferId> tried;
    for (std::size_t move = 0; move < kVetoMoves; ++move) {
      // The dearest eviction of the chain's best run not tried yet.
      BufferId pick = kNoBuffer;
      for (const auto& [price, id] : prices) {
        if (price <= 0) break;
        if (std::find(tried.begin(), tried.end(), id) == tried.end()) {
          pick = id;
          break;
        }
      }
      if (pick == kNoBuffer) break;
      tried.push_back(pick);
      const OracleCandidate base = s.candidates[chain];
      std::vector<BufferId> vetoed = base.vetoed;
      vetoed.push_back(pick);
      replay(base.rule, base.retimed, base.offsets_ns, std::move(vetoed));
      if (better(s.candidates.back().result, s.candidates[chain].result)) {
        chain = s.candidates.size() - 1;
        prices = last_prices;
      }
    }
  };
  const std::size_t best_before = s.best;
  prices = best_prices;
  search_from(best_before);
  std::size_t other = s.candidates.size();
  for (std::size_t i = 0; i < s.candidates.size(); ++i) {
    if (s.candidates[i].rule.window == s.candidates[best_before].rule.window) continue;
    if (other == s.candidates.size() || better(s.candidates[i].result, s.candidates[other].result)) other = i;
  }
  if (other < s.candidates.size() && !s.candidates[other].result.gave_up) {
    const OracleCandidate base = s.candidates[other];
    replay(base.rule, base.retimed, base.offsets_ns, base.vetoed);  // for its prices
    prices = last_prices;
    if (!s.candidates.back().result.gave_up) search_from(s.candidates.size() - 1);
  }
  // The planners' starts. Delta learns the iteration that the replay repeats exactly, and its
  // planner replays its candidates on it, checks them as the run will go, then vetoes the
  // buffers the check waited for longest: a mode learned and replayed whole, which no rule is.
  // The oracle runs delta and its two variants as the replay will, then goes on from the
  // fastest where its search stopped: the buffers the run waited for longest (over the measured
  // iterations, not the planner's two) vetoed in turn on top of the plan's, each kept if the
  // run is faster.
  //
  // Replays `configured`'s planner start with `vetoed` added to `base` (none: the policy as it
  // runs), cut short once its run passes `give_up_ns` (0: never); returns what the run waited
  // for each buffer (empty when it was cut short). Not cut by the rules' runs: a planner's
  // first iteration learns, unplanned, and can take several times theirs, which know the
  // future from the start, while its measured iterations are faster (tree-rnn-27 at 30 %/50 GB/s:
  // delta 3.80 %, cut at twice the best rule's run, which ran 4.13 %).
  auto replay_planned = [&](DirectorMode configured, const Plan& base, std::vector<BufferId> vetoed,
                            std::int64_t give_up_ns) {
    SimOptions o = options;
    o.give_up_after_ns = give_up_ns;
    OracleCandidate c;
    c.planned = true;
    c.configured = configured;
    c.plan = base;
    c.vetoed = std::move(vetoed);
    DeltaPolicy policy(config, configured);
    adoptCandidate(policy, c);
    Simulator sim(workload, o);
    sim.recordWaitsByBuffer();
    c.result = sim.run(policy);
    if (c.vetoed.empty()) c.plan = policy.plan();
    s.candidates.push_back(std::move(c));
    if (better(s.candidates.back().result, s.candidates[s.best].result)) s.best = s.candidates.size() - 1;
    return s.candidates.back().result.gave_up ? std::vector<std::int64_t>{} : sim.waitedByBuffer();
  };
  constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();
  std::size_t chain = kNone;  // the fastest start's candidate, then the search's best
  std::vector<std::int64_t> chain_waits;
  // The starts uncut (each is its policy's whole run, as a sweep of it costs: the oracle is then
  // no slower than any of the three by construction); each move cut at twice its chain's run,
  // whose learning iteration it shares.
  for (DirectorMode mode : {DirectorMode::kMixed, DirectorMode::kSwapOnly, DirectorMode::kRecomputeOnly}) {
    std::vector<std::int64_t> waits = replay_planned(mode, {}, {}, 0);
    const OracleCandidate& c = s.candidates.back();
    if (waits.empty() || !c.plan.planned) continue;
    if (chain == kNone || better(c.result, s.candidates[chain].result)) {
      chain = s.candidates.size() - 1;
      chain_waits = std::move(waits);
    }
  }
  if (chain != kNone) {
    std::vector<std::uint8_t> tried(workload.buffers.size(), 0);
    for (BufferId id : s.candidates[chain].plan.vetoed) {
      if (id < tried.size()) tried[id] = 1;  // the plan's own
    }
    for (std::size_t move = 0; move < kVetoMoves; ++move) {
      BufferId pick = kNoBuffer;
      for (BufferId id = 0; id < chain_waits.size() && id < tried.size(); ++id) {
        if (tried[id] == 0 && chain_waits[id] > 0 && (pick == kNoBuffer || chain_waits[id] > chain_waits[pick])) {
          pick = id;
        }
      }
      if (pick == kNoBuffer) break;
      tried[pick] = 1;
      const OracleCandidate base = s.candidates[chain];
      std::vector<BufferId> vetoed = base.vetoed;
      vetoed.push_back(pick);
      std::vector<std::int64_t> waits =
          replay_planned(base.configured, base.plan, std::move(vetoed), kGiveUpFactor * base.result.run_ns);
      if (better(s.candidates.back().result, s.candidates[chain].result)) {
        chain = s.candidates.size() - 1;
        chain_waits = std::move(waits);
      }
    }
  }
  return s;
}

}  // namespace delta::policy
