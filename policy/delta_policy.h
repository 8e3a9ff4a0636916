// The `delta` policy (and its `swap-only` / `recompute-only` variants): the paper's filter,
// director and prefetcher, driven by the iteration pattern it learns online.
//
// Candidates are ranked by predicted next use (farthest first; before the pattern is known, or
// for a buffer it does not cover, one iteration after the last use, which is LRU order), kept up
// to date on each use. The policy also keeps a ledger of the link time it owes: the restore time
// of every buffer it swapped out and has not brought back, plus those chosen earlier in the same
// request; the director charges a swap for the part of its restore that this load leaves
// visible (director.h). Costs as in policy.h; learning adds O(buffers of the launch) per launch,
// and a newly learned iteration re-ranks the resident buffers once (O(n log n)).
#pragma once

#include <string_view>
#include <vector>

#include "policy/access_pattern.h"
#include "policy/director.h"
#include "policy/policy.h"

namespace delta::policy {

class DeltaPolicy : public Policy {
 public:
  DeltaPolicy(const PolicyConfig& config, DirectorMode mode);

  std::string_view name() const override;
  void onAlloc(BufferId id, std::uint64_t bytes, std::int64_t now_ns) override;
  void onFree(BufferId id, std::int64_t now_ns) override;
  void onLaunch(const Launch& launch) override;
  void onIteration(std::int64_t now_ns) override;
  std::size_t choosePrefetches(const PrefetchRequest& request, std::span<Prefetch> out) override;
  std::uint64_t upcomingBytes(std::int64_t now_ns, std::int64_t& horizon_ns) const override;

  const AccessPattern& pattern() const { return pattern_; }
  // Host-to-device time of the restores owed for buffers swapped out and not yet restored.
  std::int64_t owedRestoreNs() const { return owed_ns_; }

 protected:
  Rating rate(BufferId id, const BufferState& state, const EvictRequest& request) const override;
  double rankKey(BufferId id, const BufferState& state) const override;
  void beginChoice() const override { tentative_ns_ = 0; }
  void noteChoice(BufferId id, const BufferState& state, Action action) const override;
  void residencyChanged(BufferId id) override;

 private:
  // Weight of one restore's outcome in on_demand_share_.
  static constexpr double kOutcomeWeight = 0.05;
  // Without a learned iteration, a buffer is expected back about this long after its last use.
  static constexpr std::int64_t kDefaultPeriodNs = 1'000'000'000;

  void relearnIfChanged();
  void checkRestores(const Launch& launch);
  std::int64_t periodNs() const;
  double recentLoadNs(std::int64_t now_ns) const;

  AccessPattern pattern_;
  Director director_;
  DirectorMode mode_;
  std::uint32_t generation_ = 0;
  std::vector<std::int64_t> owed_by_;  // per buffer: its share of owed_ns_; sized at construction
  std::int64_t owed_ns_ = 0;
  // Host-to-device time of the restores started over about the last iteration (an
  // exponentially decayed sum with the iteration's length as time constant), and when it was
  // last brought up to date.
  double recent_ns_ = 0;
  // Share of restores that started only when their launch came (on demand: nothing of the
  // transfer hidden), learned from the policy's own restores: prefetching needs free memory
  // and link time, and under a tight budget it often has neither. Exponentially averaged.
  double on_demand_share_ = 0;
  std::vector<std::int64_t> restore_started_;  // per buffer; kUnknownNs: no restore to check
  std::int64_t last_launch_ns_ = 0;
  std::int64_t recent_at_ns_ = 0;
  mutable std::int64_t tentative_ns_ = 0;  // restores owed by victims chosen in this request
};

}  // namespace delta::policy
