// Benchmarks of the trace library: the cost of one recorded launch on the job's thread (the
// writer's background thread writes to a file in /tmp meanwhile; target < 100 ns with stacks
// off), and the reader's speed in records per second over a generated trace of ~10 million
// records (target > 20 M/s). Files are removed afterwards.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <string>

#include <unistd.h>

#include "trace/trace_reader.h"
#include "trace/trace_writer.h"

namespace {

using namespace delta::trace;

std::string benchPath(const char* name) {
  return "/tmp/delta_bench_" + std::to_string(getpid()) + "_" + name + ".dtrace";
}

void BM_RecordLaunch(benchmark::State& state) {
  TraceWriter w;
  WriterOptions o;
  o.path = benchPath("launch");
  if (std::string err = w.open(o, TraceInfo{}); !err.empty()) {
    state.SkipWithError(err.c_str());
    return;
  }
  static const char* kKernel = "volta_sgemm_128x64_nn";
  const std::uint64_t ids[] = {11, 12, 13, 14};
  std::uint64_t t = 0;
  for (auto _ : state) {
    LaunchRecord r;
    r.time_ns = ++t;
    r.stream = 7;
    r.kernel = w.internName(kKernel);
    r.grid[0] = 128;
    r.block[0] = 256;
    r.flags = kLaunchAnalysed;
    r.buffers = ids;
    w.launch(r);
  }
  const WriterCounts c = w.close({});
  state.counters["dropped"] = static_cast<double>(c.dropped);
  state.SetItemsProcessed(state.iterations());
  unlink(w.path().c_str());
}
BENCHMARK(BM_RecordLaunch);

void BM_ReadRecords(benchmark::State& state) {
  const std::string path = benchPath("read");
  constexpr std::uint64_t kRecords = 10'000'000;
  {
    TraceWriter w;
    WriterOptions o;
    o.path = path;
    o.queue_buffers = 1 << 14;  // generation: never drop
    if (std::string err = w.open(o, TraceInfo{}); !err.empty()) {
      state.SkipWithError(err.c_str());
      return;
    }
    const std::uint32_t k = w.internString("kernel");
    const std::uint64_t ids[] = {1, 2, 3};
    for (std::uint64_t i = 0; i < kRecords; ++i) {
      switch (i % 4) {
        case 0:
        case 1: w.launch({i, 1, k, {1, 1, 1}, {1, 1, 1}, kLaunchAnalysed, ids}); break;
        case 2: w.alloc({i, i, i << 8, 4096, 1, 0, kAllocManaged}); break;
        default: w.free({i, i - 1, 4096, Residency::kResident}); break;
      }
    }
    if (w.close({}).dropped != 0) state.SkipWithError("records dropped while generating");
  }
  std::uint64_t total = 0;
  for (auto _ : state) {
    TraceReader r;
    r.open(path);
    Record rec;
    std::uint64_t n = 0;
    while (r.next(rec)) ++n;
    benchmark::DoNotOptimize(n);
    total += n;
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(total));
  unlink(path.c_str());
}
BENCHMARK(BM_ReadRecords)->Unit(benchmark::kMillisecond)->Iterations(3);

}  // namespace

BENCHMARK_MAIN();
