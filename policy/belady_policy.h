// The `belady` bound, for the simulator only: it is handed the future (the workload's schedule),
// evicts the buffer whose next use is farthest, always by swapping, and prefetches with perfect
// knowledge. It shows how far the online policies are from ideal. Costs as in policy.h.
#pragma once

#include "policy/policy.h"
#include "policy/use_schedule.h"

namespace delta::policy {

class BeladyPolicy : public Policy {
 public:
  // `future`: one iteration of the workload, positions counted in launches.
  BeladyPolicy(const PolicyConfig& config, const UseSchedule& future);

  std::string_view name() const override { return "belady"; }
  void onLaunch(const Launch& launch) override;
  void onIteration(std::int64_t now_ns) override;
  std::size_t choosePrefetches(const PrefetchRequest& request, std::span<Prefetch> out) override;
  std::uint64_t upcomingBytes(std::int64_t now_ns, std::int64_t& need_at_ns) const override;

 protected:
  Rating rate(BufferId id, const BufferState& state, const EvictRequest& request) const override;
  double rankKey(BufferId id, const BufferState& state) const override;

 private:
  UseSchedule future_;
  std::uint32_t position_ = 0;
};

}  // namespace delta::policy
