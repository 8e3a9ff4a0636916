// Benchmarks of the shim's launch hook when nothing must move (target: under 1 µs per launch,
// growing no faster than log n with the number of live managed buffers).
//
// What is timed, per launch of a kernel with 8 pointer parameters:
//   prepare/...  Residency::prepare() and its paired releaseHeld(): the lock (twice), 8
//                address-map lookups, the working set, the per-buffer stream bookkeeping, the
//                policy's onLaunch, and holding the buffers until the work is enqueued.
//   hook/...     what the CUPTI callback does around it (cupti_switchboard.cpp launch()): the
//                ParamLayoutCache lookup (mutex + unordered_map), scanParams into a vector,
//                then prepare(). Only the CUPTI dispatch itself is missing; shim_launch_bench
//                measures the whole hook through cudasim's runtime.
//   find8/...    8 AddressMap::find calls alone: the part that depends on n.
// Candidates: hit8_fixed (the same 8 distinct resident buffers every launch: hot caches),
// table8 (fake driver only: one parameter is a small unmanaged pointer table holding the 8
// buffers of hit8_fixed, the other 7 are misses; in a world of its own, the only one where a
// table exists, so that the others measure the launch path without tables),
// hit8_random (8 buffers drawn at random per launch from a table of 4096 launches: the map's
// nodes and the buffers' records come from memory, as in a large model), miss8 (8 values
// that are not managed pointers: small integers and host addresses, outside the managed span,
// so the quick reject answers), miss8_in_span (fake driver only: addresses in the gaps
// between managed buffers, which need the full lookup, as unmanaged device pointers do when
// they lie between managed ones).
//
// Two drivers under the residency manager:
//   cudasim  the CPU CUDA platform's libcuda.so.1 (found through this binary's run path),
//            loaded with the shim's own loadDriver; its device memory is raised (before cuInit)
//            to hold 2 MiB for each buffer; that memory is a sparse memfd never written here.
//   fake     a DriverApi whose VMM entry points are stubs that succeed and hand out made-up
//            addresses (2 MiB buffers 2 MiB apart): the shim's own cost with nothing of the
//            platform in it, at any n.
// The launch path calls no driver function when nothing must move (default stream, not a
// per-thread one), so both must give the same figures; the cudasim ones prove that on a
// real driver's address layout.
//
// Note on the delta policy: it takes an iteration boundary whenever a launch's signature
// (stream + buffer ids) comes round again after 8 launches, and each boundary costs
// UseSchedule::finish/clear over max_buffers plus a reindex of every resident buffer. The
// patterns that repeat one launch (hit8_fixed; any pattern at n = 1) hit a boundary every 8
// launches: their `prepare/` figures are that cost, not the lookup's. prepare_lru/ is the
// same path under the LRU policy, which learns nothing.
//
// Run: nice build/bench/shim_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "policy/policy_factory.h"
#include "shim/address_map.h"
#include "shim/param_scanner.h"
#include "shim/real_api.h"
#include "shim/residency.h"
#include "tests/common/fake_driver.h"

namespace {

using namespace delta;
using namespace delta::shim;

constexpr uint64_t kGranularity = 2ull << 20;
constexpr uint64_t kBufferBytes = 2ull << 20;  // one granule: the least a buffer reserves
constexpr int kPointers = 8;
constexpr size_t kRandomLaunches = 4096;
const int64_t kCounts[] = {1, 1000, 100000};
const WorkInfo kWork{WorkInfo::Kind::kKernel, "bench_kernel", {1, 1, 1}, {1, 1, 1}};

// ---- the fake driver (tests/common/fake_driver.h: counters only, nothing recorded) ----------

using testing::fakeDriver;

// 8-pointer kernels for the hook benchmark: cuFuncGetParamInfo of a kernel (void*) x 8.
CUresult fakeParamInfo(CUfunction, size_t index, size_t* offset, size_t* size) {
  if (index >= kPointers) return CUDA_ERROR_INVALID_VALUE;
  *offset = index * 8;
  *size = 8;
  return CUDA_SUCCESS;
}

// ---- cudasim's driver -------------------------------------------------------------------------

const DriverApi* cudasimDriver(std::string* error) {
  static std::string failure;
  static DriverApi* api = [] () -> DriverApi* {
    // Device memory for every world this process builds (1 + 1k + 100k buffers of 2 MiB):
    // a sparse file, nothing is written. Must be set before cuInit.
    setenv("CUDASIM_DEVICE_MEMORY", "256G", 0);
    auto* a = new DriverApi;
    if (!loadDriver(*a)) {
      failure = "cannot load cudasim's libcuda.so.1 (run path of this binary)";
      return nullptr;
    }
    if (a->cuInit(0) != CUDA_SUCCESS) {
      failure = "cuInit failed";
      return nullptr;
    }
    // Not in DriverApi (the shim never makes contexts): fetched the way the shim fetches
    // everything else.
    decltype(&::cuDevicePrimaryCtxRetain) retain = nullptr;
    decltype(&::cuCtxSetCurrent) setCurrent = nullptr;
    a->cuGetProcAddress_v2("cuDevicePrimaryCtxRetain", reinterpret_cast<void**>(&retain),
                           CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, nullptr);
    a->cuGetProcAddress_v2("cuCtxSetCurrent", reinterpret_cast<void**>(&setCurrent), CUDA_VERSION,
                           CU_GET_PROC_ADDRESS_DEFAULT, nullptr);
    CUcontext context = nullptr;
    if (retain == nullptr || setCurrent == nullptr || retain(&context, 0) != CUDA_SUCCESS ||
        setCurrent(context) != CUDA_SUCCESS) {
      failure = "cannot make the primary context current";
      return nullptr;
    }
    return a;
  }();
  if (api == nullptr && error) *error = failure;
  return api;
}

// ---- a residency manager with n live buffers -------------------------------------------------

enum class Driver { kCudasim, kFake };

struct World {
  std::unique_ptr<Residency> residency;
  std::vector<CUdeviceptr> buffers;
  uint64_t table = 0;  // an unmanaged pointer table, in the worlds that have one
  std::string error;  // non-empty: the world could not be built
};

// Where the table world's table lies: outside every managed range, as a small cudaMalloc does.
constexpr uint64_t kTableAddress = 0x500000000000;

World& world(Driver driver, int64_t count, const std::string& policyName = "delta",
             bool withTable = false) {
  // Built once, reused by every run of every benchmark over it.
  static std::map<std::tuple<Driver, int64_t, std::string, bool>, World> worlds;
  auto [it, inserted] = worlds.try_emplace({driver, count, policyName, withTable});
  World& w = it->second;
  if (!inserted) return w;
  const DriverApi* api = driver == Driver::kFake ? &fakeDriver() : cudasimDriver(&w.error);
  if (api == nullptr) return w;
  policy::PolicyConfig policyConfig;
  policyConfig.max_buffers = 1u << 18;  // as the shim configures it (shim.cpp)
  policy::PolicyResult made = policy::makePolicy(policyName, policyConfig);
  if (!made.policy) {
    w.error = made.error;
    return w;
  }
  ResidencyConfig config;
  config.budgetBytes = 1ull << 50;  // nothing must move
  w.residency = std::make_unique<Residency>(*api, config, std::move(made.policy), kGranularity);
  w.buffers.reserve(count);
  for (int64_t i = 0; i < count; ++i) {
    CUdeviceptr address = 0;
    CUresult result = w.residency->allocate(kBufferBytes, &address);
    if (result != CUDA_SUCCESS) {
      w.error = "allocation " + std::to_string(i) + " of " + std::to_string(count) +
                " failed: CUresult " + std::to_string(result);
      return w;
    }
    w.buffers.push_back(address);
  }
  if (withTable) {
    // The table is written the way a program writes it: a small host-to-device copy.
    const size_t n = w.buffers.size();
    uint64_t pointers[kPointers];
    for (int i = 0; i < kPointers; ++i)
      pointers[i] = n >= kPointers ? w.buffers[i * n / kPointers] + 64 * i : w.buffers[i % n] + 4096 * i;
    w.residency->noteUnmanagedAllocation(kTableAddress, sizeof pointers);
    Residency::Touch touches[2];
    touches[0].rangeStart = kTableAddress;
    touches[0].rangeBytes = sizeof pointers;
    touches[0].kind = UseKind::kWrite;
    touches[1].rangeStart = reinterpret_cast<uint64_t>(pointers);
    touches[1].rangeBytes = sizeof pointers;
    touches[1].kind = UseKind::kRead;
    WorkInfo copy;
    copy.kind = WorkInfo::Kind::kCopy;
    copy.copyKind = trace::CopyKind::kHostToDevice;
    copy.bytes = sizeof pointers;
    copy.copyDst = kTableAddress;
    copy.copySrc = reinterpret_cast<uint64_t>(pointers);
    w.residency->prepare(nullptr, false, touches, 2, copy);
    w.residency->releaseHeld();
    w.table = kTableAddress;
  }
  return w;
}

enum class Pattern { kHitFixed, kHitRandom, kMiss, kMissInSpan, kTable };

// kRandomLaunches launches' worth of candidates (one launch for the fixed patterns).
std::vector<uint64_t> candidates(const World& w, Pattern pattern) {
  std::vector<uint64_t> values;
  const size_t n = w.buffers.size();
  std::mt19937_64 random(42);
  switch (pattern) {
    case Pattern::kHitFixed:
      // 8 distinct buffers spread over the map (8 interior pointers of the one when n = 1).
      for (int i = 0; i < kPointers; ++i)
        values.push_back(n >= kPointers ? w.buffers[i * n / kPointers] + 64 * i
                                        : w.buffers[i % n] + 4096 * i);
      break;
    case Pattern::kHitRandom:
      for (size_t i = 0; i < kRandomLaunches * kPointers; ++i)
        values.push_back(w.buffers[random() % n] + (random() % kBufferBytes & ~uint64_t(7)));
      break;
    case Pattern::kMiss: {
      // What a kernel's other parameters look like: sizes, strides, host pointers.
      static int onStack;
      const uint64_t host = reinterpret_cast<uint64_t>(&onStack);
      values = {0, 1, 4096, 1ull << 20, 0x3f800000, host, host + 64,
                reinterpret_cast<uint64_t>(&values)};
      break;
    }
    case Pattern::kMissInSpan:
      for (size_t i = 0; i < kRandomLaunches * kPointers; ++i)
        values.push_back(w.buffers[random() % n] + kBufferBytes + (random() % kBufferBytes));
      break;
    case Pattern::kTable:
      values = {w.table, 0, 1, 4096, 1ull << 20, 0x3f800000, 12345, 7};
      break;
  }
  return values;
}

void setCounters(benchmark::State& state, const World& w) {
  state.counters["buffers"] = static_cast<double>(w.buffers.size());
}

void prepareBench(benchmark::State& state, Driver driver, Pattern pattern,
                  const std::string& policyName) {
  World& w = world(driver, state.range(0), policyName, pattern == Pattern::kTable);
  if (!w.error.empty()) {
    state.SkipWithError(w.error.c_str());
    return;
  }
  const std::vector<uint64_t> values = candidates(w, pattern);
  const size_t launches = values.size() / kPointers;
  size_t launch = 0;
  for (auto _ : state) {
    Residency::Touch touch;
    touch.pointers = values.data() + launch * kPointers;
    touch.pointerCount = kPointers;
    touch.kind = UseKind::kKernel;
    CUresult result = w.residency->prepare(nullptr, false, &touch, 1, kWork);
    w.residency->releaseHeld();  // as at CUPTI's API_EXIT, once the work is enqueued
    benchmark::DoNotOptimize(result);
    if (++launch == launches) launch = 0;
  }
  setCounters(state, w);
}

// As cupti_switchboard.cpp's launch(): layout from the cache, scan into a vector, prepare.
void hookBench(benchmark::State& state, Driver driver, Pattern pattern) {
  World& w = world(driver, state.range(0), "delta", pattern == Pattern::kTable);
  if (!w.error.empty()) {
    state.SkipWithError(w.error.c_str());
    return;
  }
  static DriverApi paramApi = [] {
    DriverApi a;
    a.cuFuncGetParamInfo = fakeParamInfo;
    return a;
  }();
  static ParamLayoutCache layouts;
  // A few hundred kernels in the cache, as in a real model; the launch uses one of them.
  for (uintptr_t f = 1; f <= 300; ++f)
    layouts.layout(paramApi, LaunchTarget::function(reinterpret_cast<CUfunction>(f * 16)));
  const CUfunction function = reinterpret_cast<CUfunction>(uintptr_t(150 * 16));
  const std::vector<uint64_t> values = candidates(w, pattern);
  const size_t launches = values.size() / kPointers;
  // The launch's kernelParams: one pointer per parameter to its value.
  std::vector<void*> params(values.size());
  for (size_t i = 0; i < values.size(); ++i) params[i] = const_cast<uint64_t*>(&values[i]);
  std::vector<uint64_t> scratch;  // tCandidates in the switchboard
  size_t launch = 0;
  for (auto _ : state) {
    const ParamLayout& layout = layouts.layout(paramApi, LaunchTarget::function(function));
    scratch.clear();
    bool ok = scanParams(layout, params.data() + launch * kPointers, nullptr,
                         [&](uint64_t value) { scratch.push_back(value); });
    Residency::Touch touch;
    touch.pointers = scratch.data();
    touch.pointerCount = scratch.size();
    touch.kind = UseKind::kKernel;
    CUresult result = w.residency->prepare(nullptr, false, &touch, 1, kWork);
    w.residency->releaseHeld();  // as at CUPTI's API_EXIT, once the work is enqueued
    benchmark::DoNotOptimize(ok);
    benchmark::DoNotOptimize(result);
    if (++launch == launches) launch = 0;
  }
  setCounters(state, w);
}

// The n-dependent part alone: 8 lookups in an AddressMap of n adjacent 2 MiB ranges.
void findBench(benchmark::State& state, Pattern pattern) {
  World& w = world(Driver::kFake, state.range(0));
  if (!w.error.empty()) {
    state.SkipWithError(w.error.c_str());
    return;
  }
  AddressMap map;
  for (size_t i = 0; i < w.buffers.size(); ++i)
    map.insert(w.buffers[i], kBufferBytes, static_cast<uint32_t>(i));
  const std::vector<uint64_t> values = candidates(w, pattern);
  const size_t launches = values.size() / kPointers;
  size_t launch = 0;
  for (auto _ : state) {
    uint32_t found = 0;
    for (int i = 0; i < kPointers; ++i) found += map.find(values[launch * kPointers + i]);
    benchmark::DoNotOptimize(found);
    if (++launch == launches) launch = 0;
  }
  setCounters(state, w);
}

void registerAll() {
  struct Named {
    const char* name;
    Pattern pattern;
  };
  const Named patterns[] = {{"hit8_fixed", Pattern::kHitFixed},
                            {"hit8_random", Pattern::kHitRandom},
                            {"miss8", Pattern::kMiss},
                            {"miss8_in_span", Pattern::kMissInSpan},
                            {"table8", Pattern::kTable}};
  const std::pair<const char*, Driver> drivers[] = {{"fake", Driver::kFake},
                                                    {"cudasim", Driver::kCudasim}};
  for (auto [driverName, driver] : drivers)
    for (const Named& p : patterns) {
      if (driver == Driver::kCudasim && p.pattern == Pattern::kMissInSpan) continue;  // no gaps
      if (driver == Driver::kCudasim && p.pattern == Pattern::kTable) continue;
      for (int64_t n : kCounts) {
        std::string suffix = std::string(driverName) + "/" + p.name;
        benchmark::RegisterBenchmark(
            ("prepare/" + suffix).c_str(),
            [=](benchmark::State& s) { prepareBench(s, driver, p.pattern, "delta"); })
            ->Arg(n);
        // The same under the plain LRU policy: what the residency manager costs without
        // the delta policy's learning (see the boundary note in the report of the figures).
        if (driver == Driver::kFake)
          benchmark::RegisterBenchmark(
              ("prepare_lru/" + suffix).c_str(),
              [=](benchmark::State& s) { prepareBench(s, driver, p.pattern, "lru"); })
              ->Arg(n);
        benchmark::RegisterBenchmark(("hook/" + suffix).c_str(),
                                     [=](benchmark::State& s) { hookBench(s, driver, p.pattern); })
            ->Arg(n);
      }
    }
  for (const Named& p : patterns)
    if (p.pattern != Pattern::kTable)
    for (int64_t n : kCounts)
      benchmark::RegisterBenchmark((std::string("find8/") + p.name).c_str(),
                                   [=](benchmark::State& s) { findBench(s, p.pattern); })
          ->Arg(n);
}

}  // namespace

int main(int argc, char** argv) {
  registerAll();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
