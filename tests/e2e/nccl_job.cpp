// A job that all-reduces buffers through NCCL (the fake one-rank NCCL of fake_nccl.cpp)
// while memory is short: the buffers are cold, hence evicted, when the collective is called,
// once plainly and once inside ncclGroupStart/End, and more memory is touched right after
// the call while the collective may still be running. Without the shim's NCCL interposers the
// collective's kernel would touch evicted memory (cudasim aborts with "illegal address").
// Prints "nccl: ok" when every result is right.
//
// `nccl-job register`: the buffers are registered with ncclCommRegister first and stay
// registered through every collective and the pressure between them, then are deregistered.
// Registered buffers must keep their physical memory (the fake NCCL checks it): a shim that
// evicted them while registered makes the collective or the deregistration fail. The job also
// asks for a CUDA IPC handle of a registered buffer and prints `ipc_while_registered: ERROR`
// (the runtime's error name; under the shim the export is refused rather than re-backing the
// buffer under NCCL).
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

constexpr size_t kBytes = 8 << 20;
constexpr int kOthers = 4;

#define CHECK(call)                                                                      \
  do {                                                                                   \
    cudaError_t e_ = (call);                                                             \
    if (e_ != cudaSuccess) {                                                             \
      std::fprintf(stderr, "nccl-job: %s failed: %s\n", #call, cudaGetErrorString(e_));  \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)
#define CHECK_NCCL(call)                                            \
  do {                                                              \
    if ((call) != ncclSuccess) {                                    \
      std::fprintf(stderr, "nccl-job: %s failed\n", #call);         \
      std::exit(1);                                                 \
    }                                                               \
  } while (0)

void touch(std::vector<void*>& buffers, cudaStream_t stream, int value) {
  for (void* b : buffers) CHECK(cudaMemsetAsync(b, value, kBytes, stream));
}

bool holds(void* device, unsigned char value) {
  std::vector<unsigned char> host(kBytes);
  CHECK(cudaMemcpy(host.data(), device, kBytes, cudaMemcpyDeviceToHost));
  for (unsigned char b : host)
    if (b != value) return false;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const bool registered = argc > 1 && std::string(argv[1]) == "register";
  ncclComm_t comm;
  int device = 0;
  CHECK(cudaSetDevice(0));
  CHECK_NCCL(ncclCommInitAll(&comm, 1, &device));
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
  void *send, *recv, *send2, *recv2;
  CHECK(cudaMalloc(&send, kBytes));
  CHECK(cudaMalloc(&recv, kBytes));
  CHECK(cudaMalloc(&send2, kBytes));
  CHECK(cudaMalloc(&recv2, kBytes));
  std::vector<void*> others(kOthers);
  for (void*& b : others) CHECK(cudaMalloc(&b, kBytes));
  CHECK(cudaMemset(send, 0x11, kBytes));
  CHECK(cudaMemset(recv, 0, kBytes));
  CHECK(cudaMemset(send2, 0x22, kBytes));
  CHECK(cudaMemset(recv2, 0, kBytes));
  std::vector<void*> handles;
  if (registered)
    for (void* b : {send, recv, send2, recv2}) {
      void* handle = nullptr;
      CHECK_NCCL(ncclCommRegister(comm, b, kBytes, &handle));
      handles.push_back(handle);
    }
  if (registered) {
    cudaIpcMemHandle_t ipc;
    const cudaError_t shared = cudaIpcGetMemHandle(&ipc, send);
    std::printf("ipc_while_registered: %s\n", cudaGetErrorName(shared));
    cudaGetLastError();  // a refusal is an answer, not a sticky error
  }
  touch(others, stream, 1);  // the collective's buffers go cold: evicted under a tight budget
  CHECK(cudaStreamSynchronize(stream));

  CHECK_NCCL(ncclAllReduce(send, recv, kBytes / 4, ncclFloat, ncclSum, comm, stream));
  touch(others, stream, 2);  // pressure while the collective may still run
  CHECK_NCCL(ncclGroupStart());
  CHECK_NCCL(ncclAllReduce(send2, recv2, kBytes / 4, ncclFloat, ncclSum, comm, stream));
  CHECK_NCCL(ncclGroupEnd());
  touch(others, stream, 3);
  CHECK(cudaStreamSynchronize(stream));
  if (registered) {
    // More pressure while they are still registered, and the collectives again.
    touch(others, stream, 4);
    CHECK(cudaStreamSynchronize(stream));
    CHECK_NCCL(ncclAllReduce(send, recv, kBytes / 4, ncclFloat, ncclSum, comm, stream));
    touch(others, stream, 5);
    CHECK(cudaStreamSynchronize(stream));
    for (void* handle : handles) CHECK_NCCL(ncclCommDeregister(comm, handle));
  }

  if (!holds(recv, 0x11) || !holds(recv2, 0x22)) {
    std::fprintf(stderr, "nccl-job: wrong all-reduce result\n");
    return 1;
  }
  for (void* b : others) CHECK(cudaFree(b));
  CHECK(cudaFree(send));
  CHECK(cudaFree(recv));
  CHECK(cudaFree(send2));
  CHECK(cudaFree(recv2));
  CHECK_NCCL(ncclCommDestroy(comm));
  std::printf("nccl: ok\n");
  return 0;
}
