// A one-rank stand-in for NCCL on cudasim (libnccl.so.2), with the property that matters to
// the shim: its kernels reach the user's buffers only through a descriptor in device memory,
// whose pointers are obfuscated (as NCCL's own structures are opaque), never through kernel
// parameters. Grouped calls are enqueued at ncclGroupEnd, as NCCL does. Only what the tests
// use is implemented: comm init/destroy/count, group start/end, all-reduce (one rank: a copy),
// and user-buffer registration (ncclCommRegister/ncclCommDeregister).
//
// Registration, as NCCL does it for memory made with cuMemCreate: the physical memory behind
// the buffer is retained (cuMemRetainAllocationHandle) and would be mapped by the peers. A
// buffer that gets other physical memory while registered, or none, leaves them with the old
// memory: real NCCL then hangs or computes on stale data. The fake checks, at every collective
// and at deregistration, that each registered buffer still has the memory it had, and fails
// the call (ncclSystemError, and one line on stderr) when it has not. Memory that is not a
// cuMemCreate mapping (cudaMalloc's without a shim) is registered by its range alone, as NCCL
// registers it through CUDA IPC.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <vector>

#include "cudasim/cudasim.h"

namespace {

constexpr uint64_t kScramble = 0x5a5a5a5a5a5a5a5aull;
constexpr int kSlots = 64;

struct Descriptor {
  uint64_t send;  // pointer ^ kScramble
  uint64_t recv;
  uint64_t bytes;
};

struct Op {
  const void* send;
  void* recv;
  size_t bytes;
  cudaStream_t stream;
};

struct Comm {
  Descriptor* slots = nullptr;  // device memory, allocated by "NCCL" itself
  int next = 0;
};

struct Registered {
  CUdeviceptr start;
  size_t bytes;
  CUmemGenericAllocationHandle physical;  // retained; 0: not a cuMemCreate mapping
};
std::mutex gRegisteredMutex;
std::vector<Registered*> gRegistered;

// Every registered buffer still has the physical memory it had when it was registered.
ncclResult_t checkRegistered() {
  std::lock_guard lock(gRegisteredMutex);
  for (const Registered* r : gRegistered) {
    if (r->physical == 0) continue;
    CUmemGenericAllocationHandle now = 0;
    const bool mapped = cuMemRetainAllocationHandle(&now, reinterpret_cast<void*>(r->start)) ==
                        CUDA_SUCCESS;
    if (mapped) cuMemRelease(now);
    if (!mapped || now != r->physical) {
      std::fprintf(stderr,
                   "fake-nccl: the registered buffer at 0x%llx %s while registered\n",
                   static_cast<unsigned long long>(r->start),
                   mapped ? "got other physical memory" : "lost its physical memory");
      return ncclSystemError;
    }
  }
  return ncclSuccess;
}

char gKernel;
thread_local int tGroupDepth = 0;
thread_local std::vector<std::pair<Comm*, Op>> tPending;

void allReduceKernel(void** params, dim3, dim3) {
  const Descriptor* d = *static_cast<Descriptor**>(params[0]);
  std::memmove(reinterpret_cast<void*>(d->recv ^ kScramble),
               reinterpret_cast<const void*>(d->send ^ kScramble), d->bytes);
}

size_t typeBytes(ncclDataType_t type) {
  switch (type) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
  }
}

ncclResult_t enqueue(Comm* comm, const Op& op) {
  if (ncclResult_t r = checkRegistered(); r != ncclSuccess) return r;
  Descriptor host{reinterpret_cast<uint64_t>(op.send) ^ kScramble,
                  reinterpret_cast<uint64_t>(op.recv) ^ kScramble, op.bytes};
  Descriptor* slot = comm->slots + (comm->next++ % kSlots);
  if (cudaMemcpyAsync(slot, &host, sizeof host, cudaMemcpyHostToDevice, op.stream) != cudaSuccess)
    return ncclUnhandledCudaError;
  void* args[] = {&slot};
  if (cudaLaunchKernel(&gKernel, dim3(1), dim3(1), args, 0, op.stream) != cudaSuccess)
    return ncclUnhandledCudaError;
  return ncclSuccess;
}

}  // namespace

extern "C" {

ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int*) {
  if (comms == nullptr || ndev != 1) return ncclInvalidArgument;
  static const size_t kSizes[] = {sizeof(Descriptor*)};
  cudasimRegisterKernel(&gKernel, "ncclDevKernel_AllReduce_Sum", allReduceKernel, 1, kSizes);
  auto* comm = new Comm;
  // Big enough that an interposer would manage it if it did not know who asked.
  void* slots = nullptr;
  if (cudaMalloc(&slots, 2 << 20) != cudaSuccess) return ncclUnhandledCudaError;
  comm->slots = static_cast<Descriptor*>(slots);
  *comms = reinterpret_cast<ncclComm_t>(comm);
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  auto* c = reinterpret_cast<Comm*>(comm);
  if (c == nullptr) return ncclInvalidArgument;
  cudaFree(c->slots);
  delete c;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t, int* count) {
  if (count == nullptr) return ncclInvalidArgument;
  *count = 1;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  return result == ncclSuccess ? "no error" : "fake NCCL error";
}

ncclResult_t ncclGroupStart() {
  ++tGroupDepth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (tGroupDepth == 0) return ncclInvalidUsage;
  if (--tGroupDepth > 0) return ncclSuccess;
  std::vector<std::pair<Comm*, Op>> pending;
  pending.swap(tPending);
  for (auto& [comm, op] : pending)
    if (ncclResult_t r = enqueue(comm, op); r != ncclSuccess) return r;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t, ncclComm_t comm,
                           cudaStream_t stream) {
  auto* c = reinterpret_cast<Comm*>(comm);
  if (c == nullptr) return ncclInvalidArgument;
  Op op{sendbuff, recvbuff, count * typeBytes(datatype), stream};
  if (tGroupDepth > 0) {
    tPending.emplace_back(c, op);
    return ncclSuccess;
  }
  return enqueue(c, op);
}

ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  if (comm == nullptr || buff == nullptr || size == 0 || handle == nullptr) return ncclInvalidArgument;
  auto* r = new Registered{reinterpret_cast<CUdeviceptr>(buff), size, 0};
  if (cuMemRetainAllocationHandle(&r->physical, buff) != CUDA_SUCCESS) r->physical = 0;
  std::lock_guard lock(gRegisteredMutex);
  gRegistered.push_back(r);
  *handle = r;
  return ncclSuccess;
}

ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) {
  if (comm == nullptr || handle == nullptr) return ncclInvalidArgument;
  ncclResult_t checked = checkRegistered();
  auto* r = static_cast<Registered*>(handle);
  {
    std::lock_guard lock(gRegisteredMutex);
    auto it = std::find(gRegistered.begin(), gRegistered.end(), r);
    if (it == gRegistered.end()) return ncclInvalidArgument;
    gRegistered.erase(it);
  }
  if (r->physical != 0) cuMemRelease(r->physical);
  delete r;
  return checked;
}

}  // extern "C"
