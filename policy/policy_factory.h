// Policies by name, as DELTA_POLICY and the replay tools spell them. Not on the hot path.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "policy/policy.h"
#include "policy/use_schedule.h"

namespace delta::policy {

struct PolicyResult {
  std::unique_ptr<Policy> policy;  // null on error
  std::string error;               // e.g. "unknown policy 'x' (accepted: delta, lru, ...)"
};

// Names a caller may pass; `belady` is accepted only with `future` (the simulator).
std::span<const std::string_view> policyNames();
inline constexpr std::string_view kDefaultPolicy = "delta";

PolicyResult makePolicy(std::string_view name, const PolicyConfig& config,
                        const UseSchedule* future = nullptr);

}  // namespace delta::policy
