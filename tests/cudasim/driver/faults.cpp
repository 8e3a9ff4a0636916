#include "faults.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cudasim {
namespace {

constexpr const char* kAccepted =
    "expected a comma-separated list of memcreate-fail-after=N[:K], device-taken=SIZE, "
    "copy-fail-after=N[:K], htod-fail-after=N[:K], dtoh-fail-after=N[:K], slow-stream-us=U, "
    "slow-copy-us=U, hostalloc-fail-after=N[:K], pinned-limit=SIZE, cupti-subscribe-fail, "
    "cupti-enable-fail, paraminfo-fail[=TEXT], foreign-stubs";

// The parsed form of a spec, applied to the atomics of Faults only once all of it is valid.
struct CallPlan {
  bool armed = false;
  uint64_t after = 0;
  uint64_t count = 0;
};
struct Plan {
  CallPlan memCreate, anyCopy, hostToDevice, deviceToHost, hostAlloc;
  uint64_t deviceTaken = 0;
  uint64_t pinnedLimit = 0;
  uint32_t slowStreamUs = 0;
  uint32_t slowCopyUs = 0;
  bool cuptiSubscribeFail = false;
  bool cuptiEnableFail = false;
  bool paramInfoFail = false;
  std::string paramInfoFailText;  // empty: every kernel
  bool foreignStubs = false;
};

std::optional<uint64_t> parseCount(std::string_view text, uint64_t max) {
  if (text.empty() || text.size() > 20) return std::nullopt;
  uint64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    const uint64_t digit = static_cast<uint64_t>(c - '0');
    if (value > (max - digit) / 10) return std::nullopt;
    value = value * 10 + digit;
  }
  return value;
}

std::optional<uint64_t> parseSize(std::string_view text) {
  uint64_t scale = 1;
  if (!text.empty()) {
    switch (text.back()) {
      case 'K': case 'k': scale = 1ull << 10; break;
      case 'M': case 'm': scale = 1ull << 20; break;
      case 'G': case 'g': scale = 1ull << 30; break;
      case 'T': case 't': scale = 1ull << 40; break;
      default: break;
    }
    if (scale != 1) text.remove_suffix(1);
  }
  // At most 2^50 bytes: far beyond any capacity cudasim is given, and no overflow when added.
  auto value = parseCount(text, (1ull << 50) / scale);
  if (!value) return std::nullopt;
  return *value * scale;
}

// "N" or "N:K" with K > 0.
std::optional<CallPlan> parseCallPlan(std::string_view text) {
  CallPlan plan;
  plan.armed = true;
  const size_t colon = text.find(':');
  auto after = parseCount(text.substr(0, colon), UINT64_MAX);
  if (!after) return std::nullopt;
  plan.after = *after;
  if (colon != std::string_view::npos) {
    auto count = parseCount(text.substr(colon + 1), UINT64_MAX);
    if (!count || *count == 0) return std::nullopt;
    plan.count = *count;
  }
  return plan;
}

// "" on success, else why `item` is not valid.
std::string parseItem(std::string_view item, Plan& plan) {
  const size_t equals = item.find('=');
  const std::string_view name = item.substr(0, equals);
  const bool hasValue = equals != std::string_view::npos;
  const std::string_view value = hasValue ? item.substr(equals + 1) : std::string_view();
  struct CallItem {
    const char* name;
    CallPlan Plan::*member;
  };
  static constexpr CallItem kCallItems[] = {
      {"memcreate-fail-after", &Plan::memCreate},  {"copy-fail-after", &Plan::anyCopy},
      {"htod-fail-after", &Plan::hostToDevice},    {"dtoh-fail-after", &Plan::deviceToHost},
      {"hostalloc-fail-after", &Plan::hostAlloc},
  };
  for (const CallItem& call : kCallItems) {
    if (name != call.name) continue;
    auto parsed = parseCallPlan(value);
    if (!parsed)
      return "'" + std::string(item) + "': expected " + call.name +
             "=N or =N:K (K > 0), decimal integers";
    plan.*call.member = *parsed;
    return {};
  }
  if (name == "device-taken" || name == "pinned-limit") {
    auto size = parseSize(value);
    if (!size || *size == 0)
      return "'" + std::string(item) + "': expected " + std::string(name) +
             "=SIZE, a positive byte count with an optional K, M, G or T";
    (name == "device-taken" ? plan.deviceTaken : plan.pinnedLimit) = *size;
    return {};
  }
  if (name == "slow-stream-us" || name == "slow-copy-us") {
    // At most 10 s per item: a test that wants more is waiting for nothing.
    auto us = parseCount(value, 10'000'000);
    if (!us)
      return "'" + std::string(item) + "': expected " + std::string(name) +
             "=U, microseconds from 0 to 10000000";
    (name == "slow-stream-us" ? plan.slowStreamUs : plan.slowCopyUs) = static_cast<uint32_t>(*us);
    return {};
  }
  if (name == "cupti-subscribe-fail" || name == "cupti-enable-fail") {
    if (hasValue) return "'" + std::string(item) + "': " + std::string(name) + " takes no value";
    (name == "cupti-subscribe-fail" ? plan.cuptiSubscribeFail : plan.cuptiEnableFail) = true;
    return {};
  }
  if (name == "paraminfo-fail" && hasValue) {
    if (value.empty())
      return "'" + std::string(item) + "': expected paraminfo-fail or paraminfo-fail=TEXT, part "
             "of the names of the kernels whose parameters cannot be read";
    plan.paramInfoFail = true;
    plan.paramInfoFailText = std::string(value);
    return {};
  }
  if (name == "paraminfo-fail" || name == "foreign-stubs") {
    if (hasValue) return "'" + std::string(item) + "': " + std::string(name) + " takes no value";
    (name == "paraminfo-fail" ? plan.paramInfoFail : plan.foreignStubs) = true;
    return {};
  }
  return "unknown fault '" + std::string(name) + "'";
}

std::string parsePlan(std::string_view spec, Plan& plan) {
  plan = Plan{};
  if (spec.empty()) return {};
  for (size_t start = 0;;) {
    const size_t comma = spec.find(',', start);
    const std::string_view item =
        spec.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    if (item.empty()) return "an empty item (two commas, or one at an end)";
    if (std::string error = parseItem(item, plan); !error.empty()) return error;
    if (comma == std::string_view::npos) return {};
    start = comma + 1;
  }
}

void apply(const CallPlan& plan, CallFault& fault) {
  if (plan.armed)
    fault.arm(plan.after, plan.count);
  else
    fault.disarm();
}

void apply(const Plan& plan, Faults& faults) {
  apply(plan.memCreate, faults.memCreate);
  apply(plan.anyCopy, faults.anyCopy);
  apply(plan.hostToDevice, faults.hostToDevice);
  apply(plan.deviceToHost, faults.deviceToHost);
  apply(plan.hostAlloc, faults.hostAlloc);
  faults.deviceTaken.store(plan.deviceTaken);
  faults.pinnedLimit.store(plan.pinnedLimit);
  faults.slowStreamUs.store(plan.slowStreamUs);
  faults.slowCopyUs.store(plan.slowCopyUs);
  faults.cuptiSubscribeFail.store(plan.cuptiSubscribeFail);
  faults.cuptiEnableFail.store(plan.cuptiEnableFail);
  // The text first: a reader that sees the fault on sees its text. Every text stays (a reader
  // may hold the last one), reachable for the leak checker.
  static std::mutex textsMutex;
  static auto* texts = new std::vector<std::unique_ptr<const std::string>>;
  const std::string* text = nullptr;
  if (!plan.paramInfoFailText.empty()) {
    std::lock_guard lock(textsMutex);
    texts->push_back(std::make_unique<const std::string>(plan.paramInfoFailText));
    text = texts->back().get();
  }
  faults.paramInfoFailText.store(text, std::memory_order_release);
  faults.paramInfoFail.store(plan.paramInfoFail);
  faults.foreignStubs.store(plan.foreignStubs);
}

Faults& theFaults() {
  static Faults* instance = new Faults;  // never destroyed: worker threads outlive exit
  return *instance;
}

}  // namespace

void CallFault::arm(uint64_t after, uint64_t count) {
  armed_.store(false);
  after_.store(after);
  count_.store(count);
  calls_.store(0);
  armed_.store(true);
}

bool CallFault::fires() {
  if (!armed_.load(std::memory_order_relaxed)) return false;
  const uint64_t call = calls_.fetch_add(1);
  const uint64_t after = after_.load();
  const uint64_t count = count_.load();
  return call >= after && (count == 0 || call - after < count);
}

Faults& faults() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* spec = std::getenv("CUDASIM_FAULTS");
    if (spec == nullptr) return;
    Plan plan;
    if (std::string error = parsePlan(spec, plan); !error.empty()) {
      std::fprintf(stderr, "cudasim: CUDASIM_FAULTS='%s' is not valid: %s (%s)\n", spec,
                   error.c_str(), kAccepted);
      std::exit(2);
    }
    apply(plan, theFaults());
  });
  return theFaults();
}

const char* setFaults(const char* spec) {
  static std::mutex mutex;
  static std::string lastError;
  std::lock_guard lock(mutex);
  Faults& current = faults();  // CUDASIM_FAULTS first, so that it cannot override this later
  Plan plan;
  if (std::string error = parsePlan(spec ? spec : "", plan); !error.empty()) {
    lastError = error;
    return lastError.c_str();
  }
  apply(plan, current);
  return nullptr;
}

bool copyFails(CopyDirection direction) {
  Faults& plan = faults();
  // Every armed counter sees the copy, so that each counts what its name says.
  bool fails = plan.anyCopy.fires();
  if (direction == CopyDirection::kHostToDevice) fails |= plan.hostToDevice.fires();
  if (direction == CopyDirection::kDeviceToHost) fails |= plan.deviceToHost.fires();
  return fails;
}

}  // namespace cudasim
