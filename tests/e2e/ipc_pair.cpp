// Two processes sharing a managed buffer through CUDA IPC, as NCCL, UCX and
// torch.multiprocessing do. Run under libdelta.so with a budget smaller than what the
// exporter allocates, so that the shim has to evict around the shared buffer.
//
// The exporter fills a buffer, hands its cudaIpcMemHandle to a fresh child process (CUDA
// cannot be used after fork, so the child is exec'd), which checks the contents and
// overwrites them. The exporter then allocates and touches more memory (pressure), and checks
// that it sees the child's writes: the shared buffer was never evicted from under the child.
// Exit status 0 and "ipc: ok" on success; any failure says what and exits 1.
#include <cuda_runtime_api.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr size_t kShared = 8 << 20;
constexpr size_t kPressure = 8 << 20;
constexpr int kPressureBuffers = 4;

#define CHECK(call)                                                                   \
  do {                                                                                \
    cudaError_t e_ = (call);                                                          \
    if (e_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "ipc-pair: %s failed: %s\n", #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

bool allBytes(const std::vector<unsigned char>& bytes, unsigned char value) {
  for (unsigned char b : bytes)
    if (b != value) return false;
  return true;
}

std::string toHex(const cudaIpcMemHandle_t& handle) {
  std::string text;
  char digits[3];
  for (size_t i = 0; i < sizeof handle.reserved; ++i) {
    std::snprintf(digits, sizeof digits, "%02x", static_cast<unsigned char>(handle.reserved[i]));
    text += digits;
  }
  return text;
}

cudaIpcMemHandle_t fromHex(const char* text) {
  cudaIpcMemHandle_t handle{};
  for (size_t i = 0; i < sizeof handle.reserved && text[2 * i] && text[2 * i + 1]; ++i) {
    char digits[3] = {text[2 * i], text[2 * i + 1], 0};
    handle.reserved[i] = static_cast<char>(std::strtoul(digits, nullptr, 16));
  }
  return handle;
}

int child(const char* hex) {
  void* shared = nullptr;
  CHECK(cudaIpcOpenMemHandle(&shared, fromHex(hex), cudaIpcMemLazyEnablePeerAccess));
  std::vector<unsigned char> seen(kShared);
  CHECK(cudaMemcpy(seen.data(), shared, kShared, cudaMemcpyDeviceToHost));
  if (!allBytes(seen, 0xA5)) {
    std::fprintf(stderr, "ipc-pair: the importer does not see the exporter's bytes\n");
    return 1;
  }
  CHECK(cudaMemset(shared, 0x5A, kShared));
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaIpcCloseMemHandle(shared));
  return 0;
}

void pressure(std::vector<void*>& buffers, int value) {
  for (void* buffer : buffers) CHECK(cudaMemset(buffer, value, kPressure));
  CHECK(cudaDeviceSynchronize());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--import") == 0) return child(argv[2]);

  void* shared = nullptr;
  CHECK(cudaMalloc(&shared, kShared));
  CHECK(cudaMemset(shared, 0xA5, kShared));
  std::vector<void*> others(kPressureBuffers);
  for (void*& buffer : others) CHECK(cudaMalloc(&buffer, kPressure));
  pressure(others, 1);  // the shared buffer is cold now: evicted if the budget is short

  cudaIpcMemHandle_t handle;
  CHECK(cudaIpcGetMemHandle(&handle, shared));
  pid_t pid = fork();
  if (pid == 0) {
    std::string hex = toHex(handle);
    execl("/proc/self/exe", argv[0], "--import", hex.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "ipc-pair: the importer failed (status %d)\n", status);
    return 1;
  }
  pressure(others, 2);  // more pressure: the shared buffer must stay where the child wrote
  std::vector<unsigned char> seen(kShared);
  CHECK(cudaMemcpy(seen.data(), shared, kShared, cudaMemcpyDeviceToHost));
  if (!allBytes(seen, 0x5A)) {
    std::fprintf(stderr, "ipc-pair: the exporter does not see the importer's writes\n");
    return 1;
  }
  for (void* buffer : others) CHECK(cudaFree(buffer));
  CHECK(cudaFree(shared));
  std::printf("ipc: ok\n");
  return 0;
}
