// The shim seen from a program: cudaMalloc+cudaFree pairs and kernel launches through
// cudasim's runtime, run once as is and once under LD_PRELOAD=libdelta.so (meson's
// `benchmark` runs both; see bench/meson.build). The difference between the two runs is
// what the shim adds:
//   malloc_free/4MiB    a managed buffer (>= DELTA_MIN_BYTES): Residency::allocate and free
//                       (cuMemMap + cuMemSetAccess + cuMemUnmap on cudasim, reservations and
//                       physical handles reused from the shim's caches) instead of the
//                       platform's cuMemAlloc/cuMemFree.
//   malloc_free/64KiB   below DELTA_MIN_BYTES: passed through; the cost of the interposer.
//   launch8/managed     cudaLaunchKernel of an empty kernel with 8 pointer parameters, each a
//                       different managed buffer: under the shim, the CUPTI callback
//                       (switchboard, function-by-symbol and layout lookups, scan, prepare).
//   launch8/unmanaged   the same with 8 unmanaged (64 KiB) buffers: the hook's miss path.
// A launch on cudasim queues the kernel to the stream's worker thread; the stream is
// synchronised every kSyncEvery launches and that share is part of the figure. The platform
// dominates these numbers: compare medians of repetitions, and the hook's own cost in
// shim_bench.
#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <cudasim/cudasim.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

constexpr int kPointers = 8;
constexpr int kSyncEvery = 64;

void emptyKernel(void**, dim3, dim3) {}
const char kKernelSymbol = 0;  // the kernel's key, as a stub's address is on a real build

void registerKernel() {
  static const bool done = [] {
    size_t sizes[kPointers];
    for (size_t& s : sizes) s = sizeof(void*);
    cudasimRegisterKernel(&kKernelSymbol, "empty8", emptyKernel, kPointers, sizes);
    return true;
  }();
  (void)done;
}

void mallocFree(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  for (auto _ : state) {
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess || cudaFree(p) != cudaSuccess) {
      state.SkipWithError("cudaMalloc/cudaFree failed");
      break;
    }
  }
}

void launch8(benchmark::State& state) {
  registerKernel();
  const size_t bytes = static_cast<size_t>(state.range(0));
  void* buffers[kPointers];
  for (void*& b : buffers)
    if (cudaMalloc(&b, bytes) != cudaSuccess) {
      state.SkipWithError("cudaMalloc failed");
      return;
    }
  void* args[kPointers];
  for (int i = 0; i < kPointers; ++i) args[i] = &buffers[i];
  int sinceSync = 0;
  for (auto _ : state) {
    if (cudaLaunchKernel(&kKernelSymbol, dim3(1), dim3(1), args, 0, nullptr) != cudaSuccess) {
      state.SkipWithError("cudaLaunchKernel failed");
      break;
    }
    if (++sinceSync == kSyncEvery) {
      cudaStreamSynchronize(nullptr);
      sinceSync = 0;
    }
  }
  cudaStreamSynchronize(nullptr);
  for (void* b : buffers) cudaFree(b);
}

}  // namespace

// Wall time: part of each call's work is done by cudasim's stream thread, not this one.
BENCHMARK(mallocFree)->Name("malloc_free/4MiB")->Arg(4 << 20)->UseRealTime();
BENCHMARK(mallocFree)->Name("malloc_free/64KiB")->Arg(64 << 10)->UseRealTime();
BENCHMARK(launch8)->Name("launch8/managed")->Arg(4 << 20)->UseRealTime();
BENCHMARK(launch8)->Name("launch8/unmanaged")->Arg(64 << 10)->UseRealTime();

int main(int argc, char** argv) {
  // Which run this is, for the reader of the output.
  const char* preload = std::getenv("LD_PRELOAD");
  std::printf("LD_PRELOAD=%s\n", preload && *preload ? preload : "(none)");
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  // The runtime's first call creates the context: not part of any figure.
  cudaFree(nullptr);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
