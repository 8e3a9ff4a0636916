// The `delta` policy (and its `swap-only` / `recompute-only` variants): the paper's filter,
// director and prefetcher, driven by the iteration pattern it learns online. Costs as in
// policy.h; learning adds O(buffers of the launch) per launch and O(uses) per iteration.
#pragma once

#include <string_view>

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

 protected:
  Rating rate(BufferId id, const BufferState& state, const EvictRequest& request) const override;

 private:
  AccessPattern pattern_;
  Director director_;
  DirectorMode mode_;
};

}  // namespace delta::policy
