// delta-play's kernels on a real GPU (play_kernel.h): the cudasim build's opBody and initBody,
// in CUDA. One thread does the token work (a few words per buffer); the op's time is spent
// spinning on clock64().
#include "tools/play/play_kernel.h"

namespace delta::play {
namespace {

// As PlayPlan::tokenOffsets: start, middle and end, 8-byte aligned, distinct.
__device__ int tokenOffsets(uint64_t bytes, uint64_t* offsets) {
  const uint64_t candidates[3] = {0, (bytes / 2) / 8 * 8, (bytes - 8) / 8 * 8};
  int n = 0;
  for (uint64_t c : candidates) {
    bool seen = false;
    for (int i = 0; i < n; ++i) seen |= offsets[i] == c;
    if (!seen) offsets[n++] = c;
  }
  return n;
}

__global__ void playOp(PlayOpArgs args, volatile PlayReport* report) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  const long long begin = clock64();
  const bool recomputing = args.only >= 0;
  unsigned long long sum = 0;
  for (uint32_t k = 0; k < args.count; ++k) {
    unsigned char* buffer = args.ptr[k];
    if (buffer == nullptr) continue;
    if (recomputing && args.role[k] == kKernelWrite) continue;
    if (recomputing && args.role[k] == kKernelAlloc && static_cast<int64_t>(k) != args.only) continue;
    uint64_t offsets[3];
    const int n = tokenOffsets(args.bytes[k], offsets);
    if (args.role[k] != kKernelAlloc) {
      for (int i = 0; i < n; ++i) {
        const uint64_t found = *reinterpret_cast<const uint64_t*>(buffer + offsets[i]);
        if (!recomputing) sum += found * (offsets[i] + 1);
        if (found != args.expected[k] && report->failed == 0) {
          report->param = k;
          report->op = args.op;
          report->iteration = args.iteration;
          report->offset = offsets[i];
          report->found = found;
          report->expected = args.expected[k];
          __threadfence_system();
          report->failed = 1;
        }
      }
    }
    if (args.role[k] != kKernelRead)
      for (int i = 0; i < n; ++i) *reinterpret_cast<uint64_t*>(buffer + offsets[i]) = args.stamp[k];
  }
  // Launches run one after another (one stream, or the legacy one, which is ordered with it):
  // no other thread writes the report meanwhile, and host-memory atomics need not exist.
  report->checksum += sum;
  while (clock64() - begin < args.cycles) {
  }
}

__global__ void playInit(unsigned char* buffer, uint64_t bytes, uint64_t stamp) {
  uint64_t offsets[3];
  const int n = tokenOffsets(bytes, offsets);
  for (int i = 0; i < n; ++i) *reinterpret_cast<uint64_t*>(buffer + offsets[i]) = stamp;
}

}  // namespace
}  // namespace delta::play

extern "C" cudaError_t deltaPlayLaunchOp(const delta::play::PlayOpArgs* args,
                                         delta::play::PlayReport* report, cudaStream_t stream) {
  delta::play::playOp<<<1, 1, 0, stream>>>(*args, report);
  return cudaGetLastError();
}

extern "C" cudaError_t deltaPlayLaunchInit(void* buffer, uint64_t bytes, uint64_t stamp,
                                           cudaStream_t stream) {
  delta::play::playInit<<<1, 1, 0, stream>>>(static_cast<unsigned char*>(buffer), bytes, stamp);
  return cudaGetLastError();
}
