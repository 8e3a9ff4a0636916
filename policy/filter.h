// DELTA's filter: how much releasing a buffer is worth. Memory freed for the longest time at the
// lowest cost comes first: bytes x time-until-next-use / cost. Before the access pattern is
// known, staleness (time since the last use) stands in for time-until-next-use, as in the paper.
// O(1), no allocation.
#pragma once

#include <cstdint>

namespace delta::policy {

class Filter {
 public:
  // `distance_ns`: predicted time to the next use, or staleness when not predicted.
  // `cost_ns`: the director's cost of the chosen action.
  static double score(std::uint64_t bytes, std::int64_t distance_ns, std::int64_t cost_ns);

 private:
  // Cost floor: a free eviction is not infinitely good; 10 us is about one map/unmap pair.
  static constexpr double kCostFloorNs = 10'000.0;
};

}  // namespace delta::policy
