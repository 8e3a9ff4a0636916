// delta-play's real-CUDA kernels (play_kernels.cu; the cudasim build runs host bodies instead):
// one op's launch passed by value, so that every buffer pointer is a word of the kernel's
// parameters, where the shim finds it; results reported through mapped host memory, so that
// reading them moves nothing through the shim. Plain C++17 (nvcc compiles it).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace delta::play {

// Buffers one op may pass: the parameters stay under CUDA's 4 KiB.
inline constexpr int kMaxKernelBuffers = 56;

enum : uint8_t { kKernelRead = 0, kKernelWrite = 1, kKernelAlloc = 2 };

struct PlayOpArgs {
  uint64_t op = 0;
  uint64_t iteration = 0;
  int64_t only = -1;       // a recompute writes this parameter only; -1: an ordinary launch
  uint32_t count = 0;
  uint32_t unused = 0;
  int64_t cycles = 0;      // the op's time, in clock64() cycles
  unsigned char* ptr[kMaxKernelBuffers] = {};  // nullptr: not passed (recompute)
  uint64_t bytes[kMaxKernelBuffers] = {};
  uint64_t expected[kMaxKernelBuffers] = {};   // token an input must carry
  uint64_t stamp[kMaxKernelBuffers] = {};      // token an output gets
  uint8_t role[kMaxKernelBuffers] = {};
};

// In mapped pinned host memory: the first mismatch, and the checksum of every token read.
struct PlayReport {
  unsigned int failed;
  uint32_t param;
  uint64_t op, iteration, offset, found, expected;
  unsigned long long checksum;
};

}  // namespace delta::play

extern "C" {
cudaError_t deltaPlayLaunchOp(const delta::play::PlayOpArgs* args, delta::play::PlayReport* report,
                              cudaStream_t stream);
cudaError_t deltaPlayLaunchInit(void* buffer, uint64_t bytes, uint64_t stamp, cudaStream_t stream);
}
