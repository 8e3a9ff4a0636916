// Mode planning on the learned iteration: see planner.h.
#include "policy/planner.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "policy/delta_policy.h"
#include "policy/simulator.h"

namespace delta::policy {

namespace {
constexpr const char* kModeNames[] = {"mixed", "swap-only", "recompute-only"};
constexpr const char* kWindowNames[] = {"", "/net", "/on-demand", "/far"};
constexpr const char* kStartNames[] = {"", "/fresh"};

std::string candidateName(int start, int mode, int window, bool optimistic) {
  const bool mixed = mode == static_cast<int>(DirectorMode::kMixed);
  return std::string(kModeNames[mode]) + kWindowNames[window] + kStartNames[start] +
         (mixed && optimistic ? "/optimistic" : "");
}

std::string timeText(std::int64_t ns) {
  char time[32];
  if (ns == Plan::kGaveUp) {
    std::snprintf(time, sizeof time, "too slow");
  } else {
    std::snprintf(time, sizeof time, "%.2f ms", static_cast<double>(ns) / 1e6);
  }
  return time;
}
}  // namespace

std::string Plan::name() const {
  return candidateName(static_cast<int>(start), static_cast<int>(mode), static_cast<int>(window), optimistic) +
         (vetoed.empty() ? "" : "/vetoed-" + std::to_string(vetoed.size()));
}

std::string Plan::predictions() const {
  std::string text;
  for (int s = 0; s < 2; ++s) {
    for (int w = 0; w < Prefetcher::kWindows; ++w) {
      for (int m = 0; m < 3; ++m) {
        const std::int64_t ns = predicted_ns[s][m][w];
        if (ns == kNotReplayed) continue;
        text += (text.empty() ? "" : ", ") + candidateName(s, m, w, optimistic) + " " + timeText(ns);
        if (checked[s][m][w]) text += " as adopted";
        if (s == 0 && m == static_cast<int>(DirectorMode::kMixed) && w == 0 && other_prior_ns != kNotReplayed) {
          text += ", " + candidateName(s, m, w, !optimistic) + " " + timeText(other_prior_ns);
        }
      }
    }
  }
  if (!vetoed.empty()) text += ", " + name() + " " + timeText(vetoed_ns) + " as adopted";
  return text;
}

Workload Planner::workloadFrom(const UseSchedule& schedule, std::span<const PlannedBuffer> buffers,
                               std::span<const std::int64_t> waited_ns, std::vector<BufferId>* source_ids) {
  Workload w;
  if (source_ids != nullptr) source_ids->clear();
  w.name = "learned iteration";
  const std::uint32_t len = schedule.length();
  if (!schedule.ready() || len == 0) return w;
  constexpr std::uint32_t kNone = 0xffffffffu;
  const std::uint32_t nbuf = static_cast<std::uint32_t>(buffers.size());
  // Where each id is freed in the iteration (the last time, for an id reused).
  std::vector<std::uint32_t> freed_at(nbuf, kNone);
  for (std::uint32_t pos = 0; pos < len; ++pos) {
    for (BufferId id : schedule.freesAt(pos)) {
      if (id < nbuf) freed_at[id] = pos;
    }
  }
  // The workload buffer an id stands for now (kNone: none live). An id used again after its
  // free is a new allocation in the same slot: a new workload buffer, freed at the end.
  std::vector<BufferId> current(nbuf, kNone);
  // Never freed in the iteration: it lives across iterations (weights, optimiser state), and
  // exists before the replay's first launch. Made first and in id order, the order the policy
  // met them in: before the iteration is learned, a policy breaks ties of use by it, and a
  // replay that ordered them by first use learned another first iteration than the run did
  // (a tree-rnn at 50 %: it evicted other weights first, and predicted its mixed mode at
  // 195 ms per iteration where the run took 304 and then 364).
  for (BufferId id = 0; id < nbuf; ++id) {
    if (buffers[id].bytes == 0 || freed_at[id] != kNone ||
        schedule.nextUsePos(id, 0) == UseSchedule::kNoPos)
      continue;
    WorkloadBuffer b;
    b.name = "buffer " + std::to_string(id);
    b.bytes = buffers[id].bytes;
    b.persistent = true;
    current[id] = static_cast<BufferId>(w.buffers.size());
    w.buffers.push_back(std::move(b));
    if (source_ids != nullptr) source_ids->push_back(id);
  }
  w.ops.resize(len);
  for (std::uint32_t pos = 0; pos < len; ++pos) {
    WorkloadOp& op = w.ops[pos];
    op.name = "launch " + std::to_string(pos);
    const std::int64_t interval = schedule.offsetNs(pos + 1) - schedule.offsetNs(pos);
    const std::int64_t waited_next = pos + 1 < waited_ns.size() && pos + 1 < len ? waited_ns[pos + 1] : 0;
    op.compute_ns = std::max<std::int64_t>(0, interval - waited_next);
    for (BufferId id : schedule.buffersAt(pos)) {
      if (id >= nbuf || buffers[id].bytes == 0) continue;
      if (current[id] == kNone) {
        WorkloadBuffer b;
        b.name = "buffer " + std::to_string(id);
        b.bytes = buffers[id].bytes;
        if (buffers[id].recompute_ns != kUnknownNs) {
          b.producer = static_cast<std::int32_t>(pos);
          b.recompute_ns = buffers[id].recompute_ns;
        }
        current[id] = static_cast<BufferId>(w.buffers.size());
        op.allocs.push_back(current[id]);
        w.buffers.push_back(std::move(b));
        if (source_ids != nullptr) source_ids->push_back(id);
        continue;
      }
      const BufferId b = current[id];
      if (std::find(op.allocs.begin(), op.allocs.end(), b) == op.allocs.end() &&
          std::find(op.reads.begin(), op.reads.end(), b) == op.reads.end() &&
          std::find(op.writes.begin(), op.writes.end(), b) == op.writes.end()) {
        if (buffers[id].lost_at == pos && w.buffers[b].producer >= 0) {
          op.writes.push_back(b);
        } else {
          op.reads.push_back(b);
        }
      }
    }
    for (BufferId id : schedule.freesAt(pos)) {
      if (id >= nbuf || current[id] == kNone || w.buffers[current[id]].persistent) continue;
      op.frees.push_back(current[id]);
      current[id] = kNone;
    }
  }
  // Still live at the end (an id used again after its free): freed after the last launch, as
  // a workload's buffers must be (persistent ones aside).
  for (BufferId id = 0; id < nbuf; ++id) {
    if (current[id] != kNone && !w.buffers[current[id]].persistent) w.ops.back().frees.push_back(current[id]);
  }
  return w;
}

Plan Planner::choose(const Workload& workload, std::uint64_t budget_bytes, const CostModel& costs,
                     DirectorMode configured, std::span<const BufferId> source_ids) {
  Plan plan;
  if (budget_bytes == 0 || workload.ops.empty() || !workload.validate().empty()) return plan;
  // It fits: nothing will be evicted, whatever the plan. Not worth the replays.
  if (workload.peakBytes() <= budget_bytes) return plan;
  SimOptions options;
  options.budget_bytes = budget_bytes;
  options.h2d_gbps = costs.bytesPerNs(Direction::kHostToDevice);
  options.d2h_gbps = costs.bytesPerNs(Direction::kDeviceToHost);
  // Three iterations: one to learn the pattern (run as configured, as delta did, or fresh in the
  // candidate's mode), one run the planned way (learned again for its times when switched to),
  // then the one predicted, where an adopted plan starts. Candidates are ranked by the last two
  // together: a mode whose iterations alternate (the state one leaves shapes the next) runs
  // either, and which one a run enters the planner cannot tell. Ranked by the last alone, a
  // training loop of 8 layers at 12 GB/s chose mixed for its replayed 44.4 ms (unplanned, its
  // iterations run 53.6, 45.2, 46.8, 53.0 ms) and ran 54.0 ms every iteration once adopted
  // (docs/policy.md, *Where delta's regret at 50 GB/s comes from*).
  options.iterations = 3;
  options.warmup = 1;
  PolicyConfig config = policyConfigFor(workload, options);
  config.budget_bytes = 0;  // the replays do not plan in turn
  // Every replay learns its first iteration in one of three modes, the configured one or the mode
  // it starts fresh in, and only then switches to its candidate: that iteration is run once per
  // mode, and each replay runs on from a copy of it (Simulator::runFirst), exactly as it would have
  // from the start: half the planner's time at 10,000 launches. The first run of a mode's iteration
  // is cut short at the give-up time of the replay that asks for it; later replays give up at lower
  // times or the same (the check's learn at the configured mode, the first replay's, never cut
  // short), so a copy gives up wherever the replay would have.
  struct Learned {
    std::optional<Simulator> sim;
    std::optional<DeltaPolicy> policy;
  };
  Learned learned[3];  // by the mode learned in
  // A replay in `learn_mode` as far as the iteration is learned, to be told its candidate and
  // resumed, cut short at `give_up_ns`.
  auto learnedIn = [&](DirectorMode learn_mode, std::int64_t give_up_ns) -> std::pair<Simulator, DeltaPolicy> {
    Learned& l = learned[static_cast<int>(learn_mode)];
    if (!l.sim) {
      l.sim.emplace(workload, options);
      l.sim->setGiveUpAfter(give_up_ns);
      l.sim->recordWaitsByBuffer();  // for the veto search
      l.policy.emplace(config, learn_mode);
      // Learned at the second iteration's marker: the switch told to a copy comes in time
      // (simulator_test ACopyResumedRunsAsTheWholeRunWould).
      l.sim->runFirst(*l.policy, 1);
    }
    std::pair<Simulator, DeltaPolicy> copy{*l.sim, *l.policy};
    copy.first.setGiveUpAfter(give_up_ns);
    return copy;
  };
  std::uint64_t best_over = 0;
  std::int64_t best_ns = -1;
  std::int64_t best_run_ns = 0;
  std::int64_t best_last_ns = 0;
  // Of the replays so far that kept the budget, warm-up included. One over it is no measure:
  // it ran fast by not evicting, and would cut short the candidates that do.
  std::int64_t shortest_run_ns = 0;
  // Delta chooses its mode; a forced variant keeps its own and chooses only the window.
  const DirectorMode all[] = {DirectorMode::kMixed, DirectorMode::kSwapOnly, DirectorMode::kRecomputeOnly};
  const std::span<const DirectorMode> modes = configured == DirectorMode::kMixed
                                                  ? std::span<const DirectorMode>(all)
                                                  : std::span<const DirectorMode>(&configured, 1);
  plan.mode = configured;
  struct Candidate {
    SimResult result;
    Plan plan;  // mode, window, start, prior, and the state a run adopting it starts from
    bool other_prior = false;  // mixed under the prior not kept (Plan::other_prior_ns)
    std::vector<std::int64_t> waited_by_buffer;  // in the run its figures are from
    bool checked = false;  // its figures are its check's (or it adopts nothing: its replay's)
  };
  std::vector<Candidate> candidates;
  std::size_t chosen = 0;
  // One candidate's replay, kept in `candidates` (`chosen` when it beats the best so far): the
  // run, and whether it was the best.
  auto replay = [&](PlanStart start, Prefetcher::Window window, DirectorMode mode,
                    bool optimistic) -> std::pair<SimResult, bool> {
    // A run many times longer than the shortest so far cannot have the fastest third
    // iteration; cut it short. It bounds the planner's own time: a fresh recompute-only
    // start on a long chain of activations regenerates chains that grow with the layers
    // (quadratic; 5 s of the 5.6 s a 10,000-launch plan took without the cut).
    auto [sim, policy] = learnedIn(start == PlanStart::kFresh ? mode : configured,
                                   shortest_run_ns > 0 ? kGiveUpFactor * shortest_run_ns : 0);
    policy.switchWhenLearned(mode, window, optimistic);
    const SimResult r = sim.resume(policy);
    if (r.gave_up) return {r, false};
    if (r.over_budget_ops == 0) {
      shortest_run_ns = shortest_run_ns > 0 ? std::min(shortest_run_ns, r.run_ns) : r.run_ns;
    }
    // A tie of predicted iterations goes to the cheaper whole replay, the way there: LSTM
    // at 70 %/50 GB/s predicted mixed and recompute-only alike and ran mixed at 2.47 %
    // against recompute-only's 2.17, the difference all in the iteration after learning.
    bool better = best_ns < 0 || r.over_budget_ops < best_over ||
                  (r.over_budget_ops == best_over && r.total_ns < best_ns) ||
                  (r.over_budget_ops == best_over && r.total_ns == best_ns && r.run_ns < best_run_ns);
    // The far window wins only if its predicted iteration, the third, is no slower than the
    // best's so far (the best of the other windows, or a far one that beat it). Ranked by
    // the two iterations alone, it was chosen for a fast first iteration after
    // the switch that the run did not have: DenseNet-121 at 30 %/50 GB/s, mixed/far for
    // 419.41 ms predicted against mixed's 408.93, ran at 18.98 % overhead against 15.93;
    // the LSTM at 30 %/12 GB/s, 20.44 % against swap-only's 16.71.
    if (better && window == Prefetcher::Window::kFar && best_ns >= 0 && r.over_budget_ops == best_over &&
        r.last_iteration_ns > best_last_ns) {
      better = false;
    }
    // What a run adopting this candidate starts from (applyPlan), kept for the check below.
    Candidate c;
    c.result = r;
    c.plan.planned = true;
    c.plan.mode = mode;
    c.plan.window = window;
    c.plan.start = start;
    c.plan.optimistic = optimistic;
    const UseSchedule& learned = policy.pattern().schedule();
    if (learned.ready() && learned.length() == workload.ops.size()) {
      for (std::uint32_t pos = 0; pos <= learned.length(); ++pos) {
        c.plan.learned_offsets_ns.push_back(learned.offsetNs(pos));
      }
    }
    const std::span<const std::int64_t> waits = policy.pattern().deviceWaits();
    c.plan.learned_waits_ns.assign(waits.begin(), waits.end());
    c.plan.outcomes = policy.measuredOutcomes();
    c.waited_by_buffer = sim.waitedByBuffer();
    candidates.push_back(std::move(c));
    if (!better) return {r, false};
    best_last_ns = r.last_iteration_ns;
    best_ns = r.total_ns;
    best_run_ns = r.run_ns;
    best_over = r.over_budget_ops;
    chosen = candidates.size() - 1;
    return {r, true};
  };
  auto predicted = [](const SimResult& r) { return r.gave_up ? Plan::kGaveUp : r.last_iteration_ns; };
  // A candidate's figures in `plan`.
  auto record = [&](PlanStart start, Prefetcher::Window window, DirectorMode mode, const SimResult& r) {
    const int s = static_cast<int>(start), m = static_cast<int>(mode), wi = static_cast<int>(window);
    plan.predicted_ns[s][m][wi] = predicted(r);
    plan.ranked_ns[s][m][wi] = r.gave_up ? Plan::kGaveUp : r.total_ns;
    if (!r.gave_up) plan.over_budget_ops[s][m][wi] = r.over_budget_ops;
  };
  // The far window's candidates last, each then weighed against the best of the others (below).
  const Prefetcher::Window near_windows[] = {Prefetcher::Window::kGross, Prefetcher::Window::kNet,
                                             Prefetcher::Window::kNone};
  const Prefetcher::Window far_window[] = {Prefetcher::Window::kFar};
  for (std::span<const Prefetcher::Window> windows : {std::span<const Prefetcher::Window>(near_windows),
                                                      std::span<const Prefetcher::Window>(far_window)}) {
    for (PlanStart start : {PlanStart::kSwitched, PlanStart::kFresh}) {
      for (Prefetcher::Window window : windows) {
        for (DirectorMode mode : modes) {
          // Fresh in the configured mode is what switching to it does: the same replay.
          if (start == PlanStart::kFresh && mode == configured) continue;
          // Room made ahead lets copies out overlap compute. Recompute-only has none to overlap;
          // whether it should still drop ahead (choosing earlier, by the window's protection) or
          // only when memory is needed depends on the workload. With swaps, evicting only on
          // demand put every copy out on the critical path, and what it gained in the first
          // iterations it lost in the steady state (docs/policy.md): not a candidate there.
          if (window == Prefetcher::Window::kNone && mode != DirectorMode::kRecomputeOnly) continue;
          // Making room far ahead pays off where copies out must start long before a burst of
          // allocations; recompute-only drops, which free memory at once: not a candidate there.
          if (window == Prefetcher::Window::kFar && mode == DirectorMode::kRecomputeOnly) continue;
          // Mixed's first candidate, the first replay of all, under both priors
          // (Plan::optimistic): the pessimistic one is the best so far, the optimistic one
          // replaces it if better, and its prior is then every later mixed candidate's.
          if (mode == DirectorMode::kMixed && start == PlanStart::kSwitched && window == Prefetcher::Window::kGross) {
            const std::size_t first = candidates.size();
            const SimResult pessimistic = replay(start, window, mode, false).first;
            const auto [optimistic, kept] = replay(start, window, mode, true);
            // The prior not kept is no candidate (a replay cut short was not kept at all).
            for (std::size_t i = first; i < candidates.size(); ++i) {
              candidates[i].other_prior = candidates[i].plan.optimistic != kept;
            }
            plan.optimistic = kept;
            record(start, window, mode, kept ? optimistic : pessimistic);
            plan.other_prior_ns = predicted(kept ? pessimistic : optimistic);
            continue;
          }
          record(start, window, mode, replay(start, window, mode, plan.optimistic).first);
        }
      }
    }
  }
  // The check. A run does not switch as the replays did: it adopts the candidate's state as its
  // replay ended (applyPlan), and from there it may run otherwise than the replay's iterations
  // after the switch (gan-21 at 70 %/50 GB/s: mixed/optimistic ranked first at 24.6 and 23.1 ms per
  // iteration, and the run adopting it ran 26.6 and 26.1). So every candidate that kept the budget
  // as well as the best (the one chosen above first, then by their first replays) is replayed again
  // as a run adopting it goes; the fastest checked is chosen, and each checked one's figures are
  // what it ran then. Checking only the best three, or only until the fastest checked was no slower
  // than the next one's first replay, saved replays and lost rows: a check comes out faster than
  // its first replay as often as slower, and by more than the gaps between first replays
  // (docs/policy.md). Each check after the first is cut short once slower than the fastest checked,
  // so the checks cost less than the first pass. A candidate that adopts nothing (a new window
  // alone relearns the iteration) has run as the run will already. The far window's rule (above)
  // does not hold among the checks: it keeps a far window that ranked first by a fast first
  // iteration after the switch that the run would not have, and a check replays that iteration as
  // the run has it (gan-21 again: mixed/optimistic 23.1 ms at the third replayed, 26.1 checked;
  // held to the 23.1, every far window was left out and the run took 13.2 % overhead;
  // mixed/far/optimistic, 24.8 ms checked, runs at 11.2 %). Held to its checked third iteration
  // instead, it still cost rows (wide-branches-22 at 30 %/50 GB/s 14.0 -> 20.5 % for 0.2 ms at the
  // third) and won none (docs/policy.md).
  if (!candidates.empty()) {
    std::vector<std::size_t> order;
    for (std::size_t i = 0; i < candidates.size(); ++i) {
      const Candidate& c = candidates[i];
      if (c.other_prior || c.result.gave_up || c.result.over_budget_ops != best_over) continue;
      order.push_back(i);
    }
    // The one chosen first, then by their first replays: the likeliest fastest first, so that
    // the checks after them are cut short soonest.
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      if (a == chosen || b == chosen) return a == chosen && b != chosen;
      return candidates[a].result.total_ns < candidates[b].result.total_ns;
    });
    // Every check learns its first iteration as configured, as the switched replays did: the
    // first replay's first iteration. A check slower after it than the fastest checked so far
    // cannot be chosen; the first is cut short at kGiveUpFactor times its first replay.
    const std::int64_t learn_ns =
        candidates.front().plan.start == PlanStart::kSwitched && !candidates.front().result.gave_up
            ? candidates.front().result.run_ns - candidates.front().result.total_ns
            : 0;
    std::size_t best = chosen;
    std::int64_t best_checked_ns = -1;
    for (std::size_t i : order) {
      Candidate& c = candidates[i];
      SimResult r = c.result;
      // Unplanned, the run is in the configured mode with the gross window.
      if (DeltaPolicy::adoptsReplayedState(configured, Prefetcher::Window::kGross, c.plan.mode, c.plan.window)) {
        auto [sim, policy] = learnedIn(configured, learn_ns == 0 ? 0
                                                               : learn_ns + (best_checked_ns >= 0 ? best_checked_ns
                                                                                                  : kGiveUpFactor * c.result.total_ns));
        policy.adoptWhenLearned(c.plan);
        r = sim.resume(policy);
        if (r.gave_up) continue;  // slower than the fastest checked: keeps its first figures
        record(c.plan.start, c.plan.window, c.plan.mode, r);
        if (r.over_budget_ops > best_over) continue;
        c.result = r;
        c.waited_by_buffer = sim.waitedByBuffer();
      }
      plan.checked[static_cast<int>(c.plan.start)][static_cast<int>(c.plan.mode)][static_cast<int>(c.plan.window)] = true;
      c.checked = true;
      if (best_checked_ns < 0 || r.total_ns < best_checked_ns) {
        best_checked_ns = r.total_ns;
        best = i;
      }
    }
    // The veto search. A mode and a window decide every eviction by one rule, and where the run
    // waits is often a few buffers the rule evicts at the wrong time (a restore that cannot be
    // hidden, a recompute on the critical path). The chosen candidate is replayed as a run
    // adopting it goes with the buffer whose evictions its run waited for longest vetoed (kept
    // resident while anything else can make room, Policy::setVetoed), and the veto is kept if
    // that run is faster; then the next, kVetoMoves in all, each ranked by the fastest run so
    // far. A veto names an id of the learned iteration, so every workload buffer standing for
    // it is vetoed together, as the run will veto them. Each move is one more check, cut short
    // once slower than the fastest.
    //
    // The same from the fastest checked candidate of another mode, and the faster of the two
    // searches' ends is chosen: which candidate vetoes help most is not which ran fastest
    // without them. From the chosen one alone, `swap-only` or `recompute-only` (one mode each,
    // and its veto search on it) beat delta on 25 of 216 rows of the regret sample at 50 GB/s
    // (tree-rnn-5 at 70 %: delta mixed/far/optimistic 3.9 % with four vetoes, swap-only/far
    // 0.0 % with eight; docs/policy.md). The second search ends after kVetoMisses moves rejected
    // in a row; the first runs all its moves.
    struct Searched {
      std::int64_t fastest_ns = -1;  // the run with the vetoes kept (its two ranked iterations)
      std::vector<BufferId> vetoed_sources;
      std::int64_t vetoed_ns = Plan::kNotReplayed;
      std::int64_t vetoed_ranked_ns = Plan::kNotReplayed;
      bool ranked_fresh = false;
    };
    auto sourceOf = [&](BufferId w) { return w < source_ids.size() ? source_ids[w] : w; };
    BufferId sources = 0;
    for (BufferId w = 0; w < workload.buffers.size(); ++w) sources = std::max(sources, sourceOf(w) + 1);
    // The workload's buffers standing for the learned iteration's `ids`: vetoed together, as the
    // run will veto them.
    auto standingFor = [&](const std::vector<BufferId>& ids) {
      std::vector<BufferId> out;
      for (BufferId w = 0; w < workload.buffers.size(); ++w) {
        if (std::find(ids.begin(), ids.end(), sourceOf(w)) != ids.end()) out.push_back(w);
      }
      return out;
    };
    // `learn_mode`: the mode the runs learn the iteration in; `learn_time_ns`: how long that
    // iteration runs (0: the runs are not cut short).
    auto veto_search = [&](Candidate& c, std::int64_t start_ns, int max_misses, DirectorMode learn_mode,
                           std::int64_t learn_time_ns) {
      Searched out;
      out.fastest_ns = start_ns;
      std::vector<std::uint8_t> tried(sources, 0);
      std::vector<std::int64_t> waits_by_source(sources, 0);
      const bool adopts =
          DeltaPolicy::adoptsReplayedState(learn_mode, Prefetcher::Window::kGross, c.plan.mode, c.plan.window);
      int misses = 0;  // moves rejected in a row
      for (int move = 0; move < kVetoMoves && misses < max_misses; ++move) {
        std::fill(waits_by_source.begin(), waits_by_source.end(), 0);
        for (BufferId w = 0; w < c.waited_by_buffer.size(); ++w) waits_by_source[sourceOf(w)] += c.waited_by_buffer[w];
        BufferId next = kNoBuffer;
        for (BufferId id = 0; id < sources; ++id) {
          if (tried[id] == 0 && waits_by_source[id] > 0 &&
              (next == kNoBuffer || waits_by_source[id] > waits_by_source[next])) {
            next = id;
          }
        }
        if (next == kNoBuffer) break;
        tried[next] = 1;
        out.vetoed_sources.push_back(next);
        std::vector<BufferId> vetoed = standingFor(out.vetoed_sources);
        auto [sim, policy] = learnedIn(learn_mode, learn_time_ns == 0 ? 0 : learn_time_ns + out.fastest_ns);
        if (adopts) {
          Plan trial = c.plan;
          trial.vetoed = vetoed;
          policy.adoptWhenLearned(trial);
        } else {
          policy.switchWhenLearned(c.plan.mode, c.plan.window, c.plan.optimistic, vetoed);
        }
        const SimResult r = sim.resume(policy);
        if (r.gave_up || r.over_budget_ops > best_over || r.total_ns >= out.fastest_ns) {
          out.vetoed_sources.pop_back();
          ++misses;
          continue;
        }
        misses = 0;
        out.fastest_ns = r.total_ns;
        c.result = r;
        c.waited_by_buffer = sim.waitedByBuffer();
        c.plan.vetoed = std::move(vetoed);
        out.vetoed_ns = r.last_iteration_ns;
        out.vetoed_ranked_ns = r.total_ns;
      }
      return out;
    };
    const std::int64_t chosen_ns = best_checked_ns >= 0 ? best_checked_ns : candidates[best].result.total_ns;
    if (!candidates[best].result.gave_up && chosen_ns > 0) {
      Searched searched = veto_search(candidates[best], chosen_ns, kVetoMoves, configured, learn_ns);
      // Another mode's fastest, by its check, or by its first replay where its check was cut
      // short as slower than the fastest checked (most of them: the cut is what keeps the
      // checks cheap); such a one is checked again, uncut, for the run its search starts from.
      std::size_t other = candidates.size();
      for (std::size_t i : order) {
        const Candidate& o = candidates[i];
        if (o.plan.mode == candidates[best].plan.mode) continue;
        if (other == candidates.size() || o.result.total_ns < candidates[other].result.total_ns) other = i;
      }
      if (other < candidates.size() && !candidates[other].checked) {
        Candidate& o = candidates[other];
        auto [sim, policy] = learnedIn(configured, learn_ns == 0 ? 0 : learn_ns + kGiveUpFactor * o.result.total_ns);
        policy.adoptWhenLearned(o.plan);
        const SimResult r = sim.resume(policy);
        if (r.gave_up || r.over_budget_ops > best_over) {
          other = candidates.size();
        } else {
          record(o.plan.start, o.plan.window, o.plan.mode, r);
          plan.checked[static_cast<int>(o.plan.start)][static_cast<int>(o.plan.mode)][static_cast<int>(o.plan.window)] =
              true;
          o.result = r;
          o.waited_by_buffer = sim.waitedByBuffer();
          o.checked = true;
        }
      }
      if (other < candidates.size() && candidates[other].result.total_ns > 0) {
        Searched second =
            veto_search(candidates[other], candidates[other].result.total_ns, kVetoMisses, configured, learn_ns);
        if (second.fastest_ns < searched.fastest_ns) {
          best = other;
          searched = std::move(second);
        }
      }
      // The chosen mode's own search, where that is not the configured mode. The searches above
      // rank vetoes by runs that learned the iteration in the configured mode and adopted the
      // candidate's state from there; the mode's own planner (swap-only's, recompute-only's) ranks
      // them by a run that learned it fresh in the mode, and finds others (deep-residual-2 at
      // 50 %/50 GB/s: delta's swap-only kept one veto, 4.04 %; swap-only's planner six, 0.66 %). So
      // the chosen mode and window's fresh candidate is replayed again as its first replay went,
      // its own veto search runs on it (ending after kVetoMisses rejected in a row), and the
      // vetoes it keeps are checked on the chosen candidate as the run adopts it: kept if that is
      // faster than the searches above found.
      Candidate& won = candidates[best];
      const auto fresh = std::find_if(candidates.begin(), candidates.end(), [&](const Candidate& o) {
        return o.plan.start == PlanStart::kFresh && o.plan.mode == won.plan.mode && o.plan.window == won.plan.window &&
               !o.other_prior;
      });
      if (won.plan.mode != configured && fresh != candidates.end()) {
        // The first veto is ranked by the fresh candidate's first replay as it went (switched to
        // once learned); its moves adopt the state that replay ended in, as the other searches'
        // do. Started by adopting that state as well, it kept fewer vetoes on the regret sample
        // (deep-residual-11 at 50 %/50 GB/s: 4.59 % against 2.47).
        auto [sim, policy] = learnedIn(won.plan.mode, 0);
        policy.switchWhenLearned(fresh->plan.mode, fresh->plan.window, fresh->plan.optimistic);
        const SimResult r = sim.resume(policy);
        if (!r.gave_up && r.over_budget_ops <= best_over && r.total_ns > 0) {
          Candidate own = *fresh;
          own.result = r;
          own.waited_by_buffer = sim.waitedByBuffer();
          Searched found = veto_search(own, r.total_ns, kVetoMisses, won.plan.mode, r.run_ns - r.total_ns);
          if (!found.vetoed_sources.empty()) {
            std::vector<BufferId> vetoed = standingFor(found.vetoed_sources);
            // A new mode: the run adopts the chosen candidate's state (adoptsReplayedState).
            auto [check, adopting] = learnedIn(configured, learn_ns == 0 ? 0 : learn_ns + searched.fastest_ns);
            Plan trial = won.plan;
            trial.vetoed = vetoed;
            adopting.adoptWhenLearned(trial);
            const SimResult checked = check.resume(adopting);
            if (!checked.gave_up && checked.over_budget_ops <= best_over && checked.total_ns < searched.fastest_ns) {
              won.result = checked;
              won.plan.vetoed = std::move(vetoed);
              searched.fastest_ns = checked.total_ns;
              searched.vetoed_sources = std::move(found.vetoed_sources);
              searched.vetoed_ns = checked.last_iteration_ns;
              searched.vetoed_ranked_ns = checked.total_ns;
              searched.ranked_fresh = true;
            }
          }
        }
      }
      plan.vetoed = std::move(searched.vetoed_sources);  // those kept, as the run names them
      plan.vetoed_ns = searched.vetoed_ns;
      plan.vetoed_ranked_ns = searched.vetoed_ranked_ns;
      plan.vetoes_ranked_fresh = searched.ranked_fresh;
    }
    Candidate& c = candidates[best];
    plan.mode = c.plan.mode;
    plan.window = c.plan.window;
    plan.start = c.plan.start;
    plan.optimistic = c.plan.optimistic;
    plan.learned_offsets_ns = std::move(c.plan.learned_offsets_ns);
    plan.learned_waits_ns = std::move(c.plan.learned_waits_ns);
    plan.outcomes = c.plan.outcomes;
  }
  for (const WorkloadOp& op : workload.ops) plan.compute_ns += op.compute_ns;
  plan.planned = true;
  return plan;
}

}  // namespace delta::policy
