// Delta's planner: which of the director's modes to run for the iteration just learned, and
// how far ahead to make room.
//
// Training repeats one iteration. Once delta has learned it (access_pattern.h), the planner
// rebuilds it as a workload (one op per launch; the time to the next launch, less what that
// launch waited for memory, as its compute; the buffers never freed in it persistent, made
// before it in id order, each other buffer allocated at its first use and freed where it was;
// the hooks' recompute costs, the launch that allocated a buffer as its producer and the other
// buffers of that launch as its inputs) and replays it on the policy's own model
// of the GPU (the budget, the measured link) under each candidate: the modes mixed, swap-only and
// recompute-only, each with the window that makes room ahead set by the gross or by the net bytes
// (Prefetcher::Window; recompute-only also with no room made ahead, dropping only when memory is
// needed; mixed and swap-only also with the far window, which reaches past launches that need
// little to a burst behind them, and ranks first only if its predicted iteration is no slower too),
// and each reached two ways: switched to after an iteration run as configured (as delta gets
// there), or run from a fresh start; mixed under the prior for swaps not measured yet that its
// replay with the gross window found faster (Plan::optimistic). The fastest is kept until the
// iteration changes, and delta switching to its mode (or keeping mode and window) starts where the
// candidate's measured iteration started in the replay: with the times it had learned and the costs
// it had measured (the Plan carries them). A forced variant (swap-only, recompute-only) keeps its
// mode and chooses only the window.
//
// Why: the director decides one buffer at a time from modelled and measured costs, and on some
// workloads and links the mix it reaches is slower than one of the pure modes (swaps that cost
// more than the recomputes they replace, or the other way round); and how far ahead room is
// best made depends on the workload (the net window is better on the CNNs, the gross one on
// the LSTM; docs/policy.md has the rows). A replay of the whole iteration sees what one decision
// at a time cannot: how the choices add up on the link and in memory. Measured outcomes
// (onWaited) still correct each decision within the chosen candidate. Why both starts: what a
// mode learns in its own first iteration differs from what it learns after another mode's,
// and on some workloads one is faster, on others the other (LSTM 50 % at 12 GB/s: fresh
// recompute-only 8.2 % overhead, switched to 9.0; docs/policy.md).
//
// Then the check: a run does not switch as these replays did, it adopts the chosen replay's
// state as that replay ended, and can run otherwise from there. Every candidate that kept the
// budget as well as the best is replayed again as a run adopting it goes
// (DeltaPolicy::adoptWhenLearned); the fastest checked is chosen, with the figures of its check,
// a far window as any other.
//
// Then the veto search: one rule decides every eviction of a candidate, and where its run waits
// is often a few buffers the rule evicts at the wrong time. The buffer whose evictions the
// chosen candidate's run waited for longest (Simulator::recordWaitsByBuffer) is vetoed: kept
// resident while anything else can make room (Policy::setVetoed). The veto stays if the run
// adopting the plan with it is faster, and the next dearest buffer of the fastest run so far is
// tried, kVetoMoves in all. The same search runs from the fastest checked candidate of another
// mode (ending after kVetoMisses moves rejected in a row), and the faster end is chosen: which
// candidate vetoes help most is not always the one fastest without them. Where the chosen
// candidate's mode is not the configured one, its fresh candidate (the same mode and window,
// learned in the mode) is searched too, as that mode's own planner searches it, and the vetoes
// it keeps are checked on the chosen candidate: kept if faster (Plan::vetoes_ranked_fresh). The
// plan carries the vetoes as ids of the learned iteration (Plan::vetoed); the run drops them if
// it runs clearly slower with them than the candidate is predicted to without
// (DeltaPolicy::checkPlan).
//
// Cost: building the workload is O(launches + uses); each replay simulates three iterations
// (learn, switch, measure), sixteen replays for delta (mixed with the gross window twice, once
// per prior: Plan::optimistic), three for swap-only and three for recompute-only (the slowest cut
// short: Planner::kGiveUpFactor), then a check of each that kept the budget (none for a candidate
// that adopts nothing; each cut short once slower than the fastest checked), then up to
// kVetoMoves more checks from each of the veto search's two starts (one for a forced variant:
// it has one mode; one more check where the second start's was cut short), and where a mode
// other than the configured one is chosen, one replay of its fresh candidate, up to kVetoMoves
// moves from it and one check; each move O(buffers) to rank and name its vetoes. The learning
// iteration is run once per mode it is learned in (the configured one and each fresh start's:
// three at most) and shared: every replay runs on from a copy of it (the simulator's and the
// policy's state, O(buffers + uses); Simulator::runFirst), so each simulates two of its own. It
// allocates, so it runs only when a new iteration is learned (a stable loop: once), never per
// launch; docs/policy.md gives the time.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "policy/cost_model.h"
#include "policy/director.h"
#include "policy/policy.h"
#include "policy/prefetcher.h"
#include "policy/use_schedule.h"
#include "policy/workload.h"

namespace delta::policy {

// What the planner knows of each buffer id of the learned iteration, kept past its free.
struct PlannedBuffer {
  std::uint64_t bytes = 0;
  std::int64_t recompute_ns = kUnknownNs;  // the hook's cost when it was last allocated
  // The launch after which it could no longer be recomputed (written in place), if it was
  // recomputable: replayed as a write at that launch, which ends recomputability there too.
  std::uint32_t lost_at = UseSchedule::kNoPos;
};

// What delta measured of its own actions (DeltaPolicy's outcome sums, per swap class, for
// recomputes, and the price of urgent evictions), carried out of a replay.
struct MeasuredOutcomes {
  struct Sums {
    double waited_ns = 0;
    double expected_ns = 0;
  };
  static constexpr std::uint32_t kSwapClasses = 8;
  Sums swap[kSwapClasses];
  Sums recompute;
  Sums urgent_price;  // expected_ns holds bytes: the urgent victims' cost per byte
  // The link time of the restores started over about the last iteration (decayed): what an
  // eviction's copy back is priced to queue behind.
  double recent_load_ns = 0;
};

// How a candidate's replay reaches its mode: run as configured while the iteration is learned,
// then switched (as delta itself does), or in that mode from the start (its first iteration
// learned the new mode's way: a fresh start).
enum class PlanStart : std::uint8_t { kSwitched, kFresh };

struct Plan {
  DirectorMode mode = DirectorMode::kMixed;
  Prefetcher::Window window = Prefetcher::Window::kGross;
  PlanStart start = PlanStart::kSwitched;
  // The prior of the mixed candidates for a swap context not measured yet
  // (DeltaPolicy::swapVisibleShare): false, priced as if its restore were all visible, until
  // measured; true, priced by the director's model alone. Pessimism never tries the swaps that
  // would turn out hidden, and the mix stays drop-heavy where swapping is cheap (ResNet-32 at
  // 50 GB/s); optimism tries swaps whose restores find no free memory to land in early
  // (wide-branches at 30 %). Which holds is the workload's: both priors are replayed with the
  // gross window, and every mixed candidate runs with the faster one (docs/policy.md).
  bool optimistic = false;
  // false: no budget, no usable iteration, or it fits the budget; the configured mode and the
  // gross window stay.
  bool planned = false;
  // Predicted iteration time per candidate, predicted_ns[start][mode][window] (indexed by
  // PlanStart, DirectorMode and Prefetcher::Window); kNotReplayed, or kGaveUp for a replay cut
  // short (its three iterations took over Planner::kGiveUpFactor times the shortest replay's).
  static constexpr std::int64_t kNotReplayed = -1;
  static constexpr std::int64_t kGaveUp = -2;
  std::int64_t predicted_ns[2][3][Prefetcher::kWindows] = {
      {{-1, -1, -1, -1}, {-1, -1, -1, -1}, {-1, -1, -1, -1}}, {{-1, -1, -1, -1}, {-1, -1, -1, -1}, {-1, -1, -1, -1}}};
  // What candidates are ranked by: the two iterations after learning together, the predicted
  // one and the one before it (Planner::choose); as predicted_ns where not replayed.
  std::int64_t ranked_ns[2][3][Prefetcher::kWindows] = {
      {{-1, -1, -1, -1}, {-1, -1, -1, -1}, {-1, -1, -1, -1}}, {{-1, -1, -1, -1}, {-1, -1, -1, -1}, {-1, -1, -1, -1}}};
  std::uint64_t over_budget_ops[2][3][Prefetcher::kWindows] = {};  // ops the replay ran over the budget
  // Replayed again as a run adopting it goes (Planner::choose), its figures then: those above.
  bool checked[2][3][Prefetcher::kWindows] = {};
  // Mixed with the gross window under the prior not chosen (the other `optimistic`).
  std::int64_t other_prior_ns = kNotReplayed;
  // The replayed iteration's compute alone (its launches' times, nothing waited for): a
  // candidate's predicted time less this is the waits it predicts per iteration, which
  // DeltaPolicy checks the run against.
  std::int64_t compute_ns = 0;
  std::int64_t chosenNs() const {
    return vetoed.empty() ? predicted_ns[static_cast<int>(start)][static_cast<int>(mode)][static_cast<int>(window)]
                          : vetoed_ns;
  }
  // Where the chosen candidate's measured iteration started in its replay, for a policy that
  // switches to its mode: the iteration as the replay had learned it, run the new way (each
  // launch's time offset, then the duration; empty when not planned), and what the replay had
  // measured of the new mode's actions (at the end of the run: as good an estimate).
  std::vector<std::int64_t> learned_offsets_ns;
  // What each launch of that iteration waited for, as the replay's device reported it (empty
  // when not known): the prefetcher times restores without them (Prefetcher::choose).
  std::vector<std::int64_t> learned_waits_ns;
  MeasuredOutcomes outcomes;
  // Buffer ids of the learned iteration that the run keeps resident while anything else can
  // make room (Policy::setVetoed): the veto search's (Planner::choose), each one kept because
  // the run adopting the plan with it was faster. Empty: none.
  std::vector<BufferId> vetoed;
  // The chosen candidate's predicted iteration with them, and its two ranked iterations (its
  // predicted_ns and ranked_ns are without).
  std::int64_t vetoed_ns = kNotReplayed;
  std::int64_t vetoed_ranked_ns = kNotReplayed;
  // How the vetoes were ranked (Planner::choose): by runs that learned the iteration as
  // configured (false), or by the chosen mode's own run, learned fresh in it (true).
  bool vetoes_ranked_fresh = false;

  // The chosen candidate as `replay` prints it: the mode, "/net" when room is made ahead by
  // the net window, "/on-demand" when none is, "/far" by the far window, "/fresh" when its
  // replay started in its mode, "/optimistic" for mixed under the optimistic prior, "/vetoed-N"
  // with N buffers vetoed.
  std::string name() const;
  // Every candidate replayed with its predicted iteration time, in that notation ("as
  // adopted" after the time of one checked), the chosen one with its vetoes last.
  std::string predictions() const;
};

class Planner {
 public:
  // A replay whose three iterations take this many times those of the shortest replay so far
  // (of those that kept the budget) is cut short (Plan::kGaveUp): its third iteration cannot
  // plausibly be the fastest. A switched candidate learns its first iteration as the shortest
  // did, so twice that replay means its last two iterations alone take longer than the
  // shortest's three. Was 4; 2 pays for the far window's candidates (docs/policy.md).
  static constexpr std::int64_t kGiveUpFactor = 2;

  // The learned iteration as a workload. `buffers` is indexed by buffer id; `waited_ns` by
  // launch position (what each launch waited for memory, restores and recomputes).
  // `source_ids`, when given, is filled with the id each workload buffer stands for.
  static Workload workloadFrom(const UseSchedule& schedule, std::span<const PlannedBuffer> buffers,
                               std::span<const std::int64_t> waited_ns, std::vector<BufferId>* source_ids = nullptr);

  // Replays `workload` under each candidate within `budget_bytes` on a link as `costs` measured
  // it, and returns the fastest (ties: the shorter whole replay, learning and switch included;
  // then the gross window, then mixed, then swap-only). A
  // candidate that runs ops over the budget loses to one that does not. `configured`: delta's
  // mode (kMixed: all three are candidates; a forced variant: only its own). Nothing is planned
  // when the workload's peak fits the budget.
  // `source_ids`: the id of the learned iteration each workload buffer stands for (workloadFrom),
  // which Plan::vetoed names; empty: the workload's own ids.
  static Plan choose(const Workload& workload, std::uint64_t budget_bytes, const CostModel& costs,
                     DirectorMode configured = DirectorMode::kMixed, std::span<const BufferId> source_ids = {});
  // Moves of the veto search (choose): each vetoes the buffer whose evictions the best run so far
  // waited for longest, and is kept if the run adopting the plan with it is faster.
  static constexpr int kVetoMoves = 8;
  // The search from another mode's candidate (choose) ends after this many moves rejected in a
  // row: it is the speculative one, and bounds the planner's time. The chosen candidate's runs
  // all kVetoMoves: ended so too, it lost 28 of the 35 points of summed overhead that the second
  // search gained on the regret sample at 50 GB/s (docs/policy.md).
  static constexpr int kVetoMisses = 3;
  static_assert(static_cast<std::size_t>(kVetoMoves) <= Policy::kVetoesReserved, "a plan's vetoes are adopted without allocating");
};

// Everything the planner reads of a learned iteration, copied out of the policy, so that the
// plan can be made on another thread while the policy goes on (PolicyConfig::plan_elsewhere).
// The policy reserves it at construction: taking the copy allocates nothing.
struct PlanRequest {
  UseSchedule schedule;
  std::vector<PlannedBuffer> buffers;       // by buffer id
  std::vector<std::int64_t> waited_ns;      // by launch position
  std::uint64_t budget_bytes = 0;
  CostModel costs{1.0, 1.0};
  DirectorMode configured = DirectorMode::kMixed;
  std::uint32_t generation = 0;  // the learned iteration's (AccessPattern::generation)

  // Planner::choose on the iteration rebuilt: seconds on a long iteration (docs/policy.md).
  Plan run() const {
    std::vector<BufferId> source_ids;
    const Workload workload = Planner::workloadFrom(schedule, buffers, waited_ns, &source_ids);
    return Planner::choose(workload, budget_bytes, costs, configured, source_ids);
  }
};

}  // namespace delta::policy
