// Benchmarks: the policy's hot-path call (choose victims among 1k and 100k resident buffers:
// sizes and costs alike, or spread over every size/cost bucket; plus onLaunch), delta's planning
// step, and the simulator's speed on a synthetic training iteration and, when ../shared is
// present, on a real DTR trace (skipped with a message otherwise).
#include <benchmark/benchmark.h>

#include <array>
#include <filesystem>
#include <span>
#include <string>

#include "policy/dtr_log_reader.h"
#include "policy/planner.h"
#include "policy/prefetcher.h"
#include "policy/policy_factory.h"
#include "policy/simulator.h"

namespace delta::policy {
namespace {

void BM_ChooseVictims(benchmark::State& state, const char* name) {
  const auto n = static_cast<std::uint32_t>(state.range(0));
  PolicyConfig config;
  config.max_buffers = n;
  config.max_launches = 1024;
  config.max_uses = 4096;
  PolicyResult p = makePolicy(name, config);
  for (BufferId id = 0; id < n; ++id) {
    p.policy->onAlloc(id, (1u << 20) + (id % 97) * 4096, id);
    p.policy->onRecomputable(id, 1000 + id % 13);
  }
  std::array<Victim, 16> out{};
  std::array<BufferId, 4> keep = {0, 1, 2, 3};
  std::int64_t now = n;
  for (auto _ : state) {
    EvictRequest req;
    req.bytes = 8u << 20;
    req.now_ns = ++now;
    req.keep = keep;
    benchmark::DoNotOptimize(p.policy->chooseVictims(req, out));
  }
  state.SetItemsProcessed(state.iterations());
}

// The worst case for the bucketed index: sizes from 4 KiB to 1 GiB and recompute costs over six
// decades, so that hundreds of buckets are non-empty and each call rates every bucket's top.
void BM_ChooseVictimsSpread(benchmark::State& state, const char* name) {
  const auto n = static_cast<std::uint32_t>(state.range(0));
  PolicyConfig config;
  config.max_buffers = n;
  config.max_launches = 1024;
  config.max_uses = 4096;
  PolicyResult p = makePolicy(name, config);
  std::uint64_t x = 88172645463325252ull;  // xorshift: deterministic spread
  for (BufferId id = 0; id < n; ++id) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p.policy->onAlloc(id, std::uint64_t{4096} << (x % 19), id);
    p.policy->onRecomputable(id, (x >> 8) % 7 == 0 ? kUnknownNs : static_cast<std::int64_t>(1000u << ((x >> 16) % 20)));
  }
  std::array<Victim, 16> out{};
  std::array<BufferId, 4> keep = {0, 1, 2, 3};
  std::int64_t now = n;
  for (auto _ : state) {
    EvictRequest req;
    req.bytes = 64u << 20;
    req.now_ns = ++now;
    req.keep = keep;
    benchmark::DoNotOptimize(p.policy->chooseVictims(req, out));
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_OnLaunch(benchmark::State& state) {
  PolicyConfig config;
  config.max_buffers = 1u << 17;
  PolicyResult p = makePolicy("delta", config);
  std::array<BufferId, 8> ws{};
  std::int64_t now = 0;
  for (auto _ : state) {
    for (std::size_t i = 0; i < ws.size(); ++i) ws[i] = static_cast<BufferId>((now * 8 + static_cast<std::int64_t>(i)) % 100000);
    p.policy->onLaunch({++now, 0, ws});
  }
}

Workload synthetic(int layers) {
  Workload w;
  auto add = [&](std::uint64_t bytes, bool persistent, std::int32_t producer, std::int64_t ns) {
    w.buffers.push_back({"b" + std::to_string(w.buffers.size()), bytes, persistent, producer, ns});
    return static_cast<BufferId>(w.buffers.size() - 1);
  };
  std::vector<BufferId> acts;
  BufferId prev = add(64u << 20, true, -1, kUnknownNs);
  for (int i = 0; i < layers; ++i) {
    const BufferId wgt = add(4u << 20, true, -1, kUnknownNs);
    const auto op = static_cast<std::int32_t>(w.ops.size());
    const BufferId a = add(64u << 20, false, op, 500'000);
    w.ops.push_back({"fwd", 500'000, {a}, {prev, wgt}, {}, {}});
    acts.push_back(a);
    prev = a;
  }
  for (int i = layers - 1; i >= 0; --i) {
    w.ops.push_back({"bwd", 1'000'000, {}, {acts[static_cast<std::size_t>(i)]}, {}, {acts[static_cast<std::size_t>(i)]}});
  }
  return w;
}

void BM_SimulateSynthetic(benchmark::State& state, const char* name) {
  const Workload w = synthetic(static_cast<int>(state.range(0)));
  const UseSchedule future = w.schedule();
  SimOptions o;
  o.budget_bytes = w.peakBytes() / 2;
  for (auto _ : state) {
    PolicyConfig config;
    config.max_buffers = static_cast<std::uint32_t>(w.buffers.size());
    config.max_launches = static_cast<std::uint32_t>(w.ops.size()) * 2;
    config.max_uses = static_cast<std::uint32_t>(w.ops.size()) * 8;
    PolicyResult p = makePolicy(name, config, &future);
    Simulator sim(w, o);
    benchmark::DoNotOptimize(sim.run(*p.policy));
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(w.ops.size()) * 3);
}

void BM_SimulateDtrTrace(benchmark::State& state) {
  const char* path = "../shared/traces/dtr/transformer-10-8000000000.0-2020-10-1-10-56-5-default.log.gz";
  std::string full = std::string(DELTA_SOURCE_ROOT) + "/" + path;
  if (!std::filesystem::exists(full)) {
    state.SkipWithError(("skipped: shared trace not found at " + full).c_str());
    return;
  }
  const ImportResult r = readDtrLog(full);
  const UseSchedule future = r.workload.schedule();
  SimOptions o;
  o.budget_bytes = r.workload.peakBytes() / 2;
  for (auto _ : state) {
    PolicyConfig config;
    config.max_buffers = static_cast<std::uint32_t>(r.workload.buffers.size());
    config.max_launches = static_cast<std::uint32_t>(r.workload.ops.size()) * 2;
    config.max_uses = 1u << 20;
    PolicyResult p = makePolicy("delta", config, &future);
    Simulator sim(r.workload, o);
    benchmark::DoNotOptimize(sim.run(*p.policy));
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(r.workload.ops.size()) * 3);
}

// The room to make ahead (Prefetcher::upcomingBytes), asked after every launch once memory has
// been short: a learned iteration of 2,000 launches 10 us apart, where every k-th launch
// allocates 2 MiB (freed 20 launches later) and the others allocate nothing (the shim leaves
// small buffers unmanaged); 12 GB/s. Launches that allocate nothing do not end the window, so
// the sparser the allocations, the further a call walks (kMaxScan at most).
void BM_UpcomingBytes(benchmark::State& state) {
  const auto every = static_cast<std::uint32_t>(state.range(0));
  constexpr std::uint32_t kLaunches = 2000;
  constexpr std::uint64_t kBytes = 2u << 20;
  UseSchedule schedule;
  schedule.reserve(kLaunches, kLaunches, 4 * kLaunches);
  BufferTable table(kLaunches);
  for (std::uint32_t q = 0; q < kLaunches; ++q) {
    const bool allocates = q % every == 0;
    std::array<BufferId, 1> uses = {q};
    schedule.addLaunch(static_cast<std::int64_t>(q) * 10'000, allocates ? kBytes : 0,
                       allocates ? std::span<const BufferId>(uses) : std::span<const BufferId>());
    if (allocates) table.allocate(q, kBytes, 0);
    if (q >= 20 && (q - 20) % every == 0) schedule.addFree(q - 20, kBytes);
  }
  schedule.finish(static_cast<std::int64_t>(kLaunches) * 10'000);
  const CostModel link(12.0, 12.0);
  const bool far = state.range(1) != 0;
  const Prefetcher::Window window = far ? Prefetcher::Window::kFar : Prefetcher::Window::kGross;
  std::uint32_t position = 0;
  std::int64_t need_at = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(Prefetcher::upcomingBytes(schedule, position, table, link, need_at, window));
    position = (position + 1) % kLaunches;
  }
  state.SetLabel("an allocation every " + std::to_string(every) + " launches" + (far ? ", far window" : ""));
}
// Second argument 1: the far window, which walks on past launches outside it (to kMaxScan).
BENCHMARK(BM_UpcomingBytes)->ArgsProduct({{1, 8, 64}, {0, 1}});

// Delta's planning step (planner.h): the learned iteration replayed under each candidate,
// once per newly learned iteration. Per plan, for iterations of 2 x layers launches.
void BM_Plan(benchmark::State& state) {
  const Workload w = synthetic(static_cast<int>(state.range(0)));
  const CostModel costs(12.0, 12.0);
  for (auto _ : state) benchmark::DoNotOptimize(Planner::choose(w, w.peakBytes() / 2, costs));
  state.SetLabel(std::to_string(w.ops.size()) + " launches");
}

BENCHMARK_CAPTURE(BM_ChooseVictims, delta, "delta")->Arg(1000)->Arg(100000);
BENCHMARK_CAPTURE(BM_ChooseVictims, lru, "lru")->Arg(1000)->Arg(100000);
BENCHMARK_CAPTURE(BM_ChooseVictims, dtr, "dtr")->Arg(1000)->Arg(100000);
BENCHMARK_CAPTURE(BM_ChooseVictimsSpread, delta, "delta")->Arg(1000)->Arg(100000);
BENCHMARK_CAPTURE(BM_ChooseVictimsSpread, dtr, "dtr")->Arg(1000)->Arg(100000);
BENCHMARK(BM_OnLaunch);
BENCHMARK_CAPTURE(BM_SimulateSynthetic, delta, "delta")->Arg(100)->Arg(1000);
BENCHMARK_CAPTURE(BM_SimulateSynthetic, belady, "belady")->Arg(100);
BENCHMARK(BM_SimulateDtrTrace);
BENCHMARK(BM_Plan)->Arg(100)->Arg(1000)->Arg(5000)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace delta::policy

BENCHMARK_MAIN();
