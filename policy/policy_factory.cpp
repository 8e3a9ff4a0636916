// Policy construction by name: see policy_factory.h.
#include "policy/policy_factory.h"

#include <array>

#include "policy/belady_policy.h"
#include "policy/delta_policy.h"
#include "policy/dtr_policy.h"
#include "policy/lru_policy.h"
#include "policy/oracle_policy.h"

namespace delta::policy {

namespace {
constexpr std::array<std::string_view, 6> kNames = {"delta",     "lru",           "dtr",
                                                    "swap-only", "recompute-only", "belady"};
// Not in kNames: the shim's options take every name of policyNames() that builds without a
// future as a DELTA_POLICY; `oracle` needs the workload itself, which only a replay has.
constexpr std::array<std::string_view, 7> kReplayNames = {"delta",          "lru",    "dtr",   "swap-only",
                                                          "recompute-only", "belady", "oracle"};
}  // namespace

std::span<const std::string_view> policyNames() { return kNames; }
std::span<const std::string_view> replayPolicyNames() { return kReplayNames; }

PolicyResult makePolicy(std::string_view name, const PolicyConfig& config, const UseSchedule* future,
                        const ReplayContext* replay) {
  PolicyResult r;
  if (name == "delta") {
    r.policy = std::make_unique<DeltaPolicy>(config, DirectorMode::kMixed);
  } else if (name == "swap-only") {
    r.policy = std::make_unique<DeltaPolicy>(config, DirectorMode::kSwapOnly);
  } else if (name == "recompute-only") {
    r.policy = std::make_unique<DeltaPolicy>(config, DirectorMode::kRecomputeOnly);
  } else if (name == "lru") {
    r.policy = std::make_unique<LruPolicy>(config);
  } else if (name == "dtr") {
    r.policy = std::make_unique<DtrPolicy>(config);
  } else if (name == "belady") {
    if (future == nullptr) {
      r.error = "policy 'belady' needs the future and is available only in replay (delta-trace)";
    } else {
      r.policy = std::make_unique<BeladyPolicy>(config, *future);
    }
  } else if (name == "oracle") {
    if (replay == nullptr || replay->workload == nullptr) {
      r.error = "policy 'oracle' needs the future and is available only in replay (delta-trace)";
    } else {
      r.policy = makeOracle(config, *replay->workload, replay->options);
    }
  } else {
    r.error = "unknown policy '" + std::string(name) + "' (accepted:";
    for (std::size_t i = 0; i < kReplayNames.size(); ++i) {
      r.error += (i ? ", " : " ") + std::string(kReplayNames[i]);
    }
    r.error += ")";
  }
  return r;
}

}  // namespace delta::policy
