// Policies by name, as DELTA_POLICY and the replay tools spell them. Not on the hot path.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "policy/policy.h"
#include "policy/simulator.h"
#include "policy/use_schedule.h"
#include "policy/workload.h"

namespace delta::policy {

struct PolicyResult {
  std::unique_ptr<Policy> policy;  // null on error
  std::string error;               // e.g. "unknown policy 'x' (accepted: delta, lru, ...)"
};

// Names a caller may pass; `belady` is accepted only with `future` (the simulator).
std::span<const std::string_view> policyNames();
// Those and the names only a replay can build, with `replay` (`oracle`): what delta-trace takes.
std::span<const std::string_view> replayPolicyNames();
inline constexpr std::string_view kDefaultPolicy = "delta";

// What `oracle` needs besides the future: the workload itself (producers, recompute costs) and
// the replay's options, under which it replays its candidate plans before the run.
struct ReplayContext {
  const Workload* workload = nullptr;  // must outlive the policy
  SimOptions options;
};

PolicyResult makePolicy(std::string_view name, const PolicyConfig& config,
                        const UseSchedule* future = nullptr, const ReplayContext* replay = nullptr);

}  // namespace delta::policy
