// Candidate ranking: see filter.h.
#include "policy/filter.h"

#include <algorithm>

namespace delta::policy {

double Filter::score(std::uint64_t bytes, std::int64_t distance_ns, std::int64_t cost_ns) {
  const double distance = static_cast<double>(std::max<std::int64_t>(distance_ns, 1));
  const double cost = static_cast<double>(std::max<std::int64_t>(cost_ns, 0)) + kCostFloorNs;
  return static_cast<double>(bytes) * distance / cost;
}

}  // namespace delta::policy
