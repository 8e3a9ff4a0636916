// cudasim: how long a copy call on one thread takes while another thread pins host memory
// (docs/shim.md, "Victims the device is done with; pinning that held every copy"). The shim pins
// its chunks on a background thread; a driver, real or simulated, that made every copy wait for
// that pinning would stall the program's host thread for as long as it takes.
//   meson test -C build --benchmark --suite cudasim   (or build/bench/pinning_bench)
// Counters: pin_ms (one cuMemHostAlloc of 128 MiB), longest_copy_call_ms (the slowest
// cuMemcpyDtoHAsync call made meanwhile), copy_calls.
#include <benchmark/benchmark.h>
#include <cuda.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

namespace {

double msSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

void copyCallsWhilePinning(benchmark::State& state) {
  CUdevice device;
  CUcontext context;
  if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&device, 0) != CUDA_SUCCESS ||
      cuDevicePrimaryCtxRetain(&context, device) != CUDA_SUCCESS ||
      cuCtxSetCurrent(context) != CUDA_SUCCESS) {
    state.SkipWithError("no device");
    return;
  }
  constexpr size_t kCopy = 1 << 20;
  constexpr size_t kPinned = 128ull << 20;
  void* host = nullptr;
  CUdeviceptr device_memory = 0;
  CUstream stream = nullptr;
  if (cuMemHostAlloc(&host, kCopy, 0) != CUDA_SUCCESS || cuMemAlloc(&device_memory, kCopy) != CUDA_SUCCESS ||
      cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
    state.SkipWithError("setting up failed");
    return;
  }
  double pinMs = 0, longestMs = 0;
  int64_t calls = 0;
  for (auto _ : state) {
    std::atomic<bool> done{false};
    std::thread pinner([&] {
      cuCtxSetCurrent(context);
      const auto start = std::chrono::steady_clock::now();
      void* block = nullptr;
      if (cuMemHostAlloc(&block, kPinned, 0) == CUDA_SUCCESS) cuMemFreeHost(block);
      pinMs = msSince(start);
      done = true;
    });
    while (!done) {
      const auto start = std::chrono::steady_clock::now();
      cuMemcpyDtoHAsync(host, device_memory, kCopy, stream);
      longestMs = std::max(longestMs, msSince(start));
      ++calls;
      cuStreamSynchronize(stream);
    }
    pinner.join();
  }
  state.counters["pin_ms"] = pinMs;
  state.counters["longest_copy_call_ms"] = longestMs;
  state.counters["copy_calls"] = static_cast<double>(calls);
  cuStreamDestroy(stream);
  cuMemFree(device_memory);
  cuMemFreeHost(host);
}

BENCHMARK(copyCallsWhilePinning)->Iterations(3)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
