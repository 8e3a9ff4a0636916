// A one-rank stand-in for NCCL on cudasim (libnccl.so.2), with the property that matters to
// the shim: its kernels reach the user's buffers only through a descriptor in device memory,
// whose pointers are obfuscated (as NCCL's own structures are opaque), never through kernel
// parameters. Grouped calls are enqueued at ncclGroupEnd, as NCCL does. Only what the tests
// use is implemented: comm init/destroy/count, group start/end, all-reduce (one rank: a copy).
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <cstring>
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

}  // extern "C"
