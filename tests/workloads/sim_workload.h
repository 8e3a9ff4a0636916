// What the cudasim workloads written against the runtime API share: stopping with one line when
// a CUDA call fails, reading a kernel body's parameters, and the hash that fills buffers with
// values that depend only on a seed. Each workload defines kProgram (its name, for messages)
// before including this.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace delta::workloads {

[[noreturn]] inline void cudaCallFailed(const char* program, const char* call, cudaError_t error,
                                        int line) {
  std::fprintf(stderr, "%s: %s failed (line %d): %s\n", program, call, line,
               cudaGetErrorString(error));
  std::exit(1);
}

// A kernel body's parameter `i`, as cudasim hands them over (one pointer per parameter).
template <typename T>
T arg(void** params, int i) {
  return *static_cast<T*>(params[i]);
}

// A value in [0, 1) that depends only on (seed, i).
inline float hashedUnit(uint64_t seed, uint64_t i) {
  uint64_t x = (seed + i) * 0x9E3779B97F4A7C15ull;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return static_cast<float>(x & 0xffffffffu) / 4294967296.0f;
}

}  // namespace delta::workloads

#define CHECK(call)                                                                    \
  do {                                                                                 \
    cudaError_t e_ = (call);                                                           \
    if (e_ != cudaSuccess) ::delta::workloads::cudaCallFailed(kProgram, #call, e_, __LINE__); \
  } while (0)
