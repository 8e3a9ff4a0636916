/* Memory shared between processes: legacy IPC handles (cuIpc..., cudaIpc...) for cuMemAlloc
 * memory, and POSIX file descriptors (cuMemExportToShareableHandle /
 * cuMemImportFromShareableHandle) for VMM memory, passed over a socketpair with SCM_RIGHTS.
 * The second process is a fresh exec of this binary: both really see the same bytes.
 * Real CUDA API only. */
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "conformance_util.h"

namespace conformance {
namespace {

constexpr size_t kIpcBytes = 1 << 20;

std::string ToHex(const void* p, size_t n) {
  std::string s;
  const auto* b = static_cast<const unsigned char*>(p);
  char buf[3];
  for (size_t i = 0; i < n; ++i) {
    std::snprintf(buf, sizeof buf, "%02x", b[i]);
    s += buf;
  }
  return s;
}

bool FromHex(const std::string& s, void* p, size_t n) {
  if (s.size() != 2 * n) return false;
  auto* b = static_cast<unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<unsigned char>(std::stoi(s.substr(2 * i, 2), nullptr, 16));
  return true;
}

int ChildSetUp() {
  if (CUresult r = cuInit(0); r != CUDA_SUCCESS) return ChildFail("cuInit", r, 0);
  CUdevice dev;
  CUcontext ctx;
  if (CUresult r = cuDeviceGet(&dev, 0); r != CUDA_SUCCESS) return ChildFail("cuDeviceGet", r, 0);
  if (CUresult r = cuDevicePrimaryCtxRetain(&ctx, dev); r != CUDA_SUCCESS)
    return ChildFail("cuDevicePrimaryCtxRetain", r, 0);
  if (CUresult r = cuCtxSetCurrent(ctx); r != CUDA_SUCCESS) return ChildFail("cuCtxSetCurrent", r, 0);
  return 0;
}

// Checks every byte of [p, p+n) is `expected`, then fills it with `replacement`.
int CheckAndRewrite(CUdeviceptr p, size_t n, int expected, int replacement) {
  std::vector<unsigned char> v(n);
  if (CUresult r = cuMemcpyDtoH(v.data(), p, n); r != CUDA_SUCCESS)
    return ChildFail("cuMemcpyDtoH of shared memory", r, 0);
  for (size_t i = 0; i < n; ++i)
    if (v[i] != expected) return ChildFail("shared byte", v[i], expected);
  if (CUresult r = cuMemsetD8(p, static_cast<unsigned char>(replacement), n); r != CUDA_SUCCESS)
    return ChildFail("cuMemsetD8 of shared memory", r, 0);
  if (CUresult r = cuCtxSynchronize(); r != CUDA_SUCCESS) return ChildFail("cuCtxSynchronize", r, 0);
  return 0;
}

// args: handle-hex expected replacement
CONFORMANCE_CHILD(ipc_open_driver) {
  if (args.size() != 3) return ChildFail("argument count", static_cast<long long>(args.size()), 3);
  if (int rc = ChildSetUp(); rc != 0) return rc;
  CUipcMemHandle h;
  if (!FromHex(args[0], &h, sizeof h)) return ChildFail("handle hex", 0, 1);
  CUdeviceptr p = 0;
  if (CUresult r = cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS); r != CUDA_SUCCESS)
    return ChildFail("cuIpcOpenMemHandle", r, 0);
  if (int rc = CheckAndRewrite(p, kIpcBytes, std::stoi(args[1]), std::stoi(args[2])); rc != 0)
    return rc;
  if (CUresult r = cuIpcCloseMemHandle(p); r != CUDA_SUCCESS)
    return ChildFail("cuIpcCloseMemHandle", r, 0);
  return 0;
}

CONFORMANCE_CHILD(ipc_open_runtime) {
  if (args.size() != 3) return ChildFail("argument count", static_cast<long long>(args.size()), 3);
  if (cudaError_t e = cudaSetDevice(0); e != cudaSuccess) return ChildFail("cudaSetDevice", e, 0);
  cudaIpcMemHandle_t h;
  if (!FromHex(args[0], &h, sizeof h)) return ChildFail("handle hex", 0, 1);
  void* p = nullptr;
  if (cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess); e != cudaSuccess)
    return ChildFail("cudaIpcOpenMemHandle", e, 0);
  std::vector<unsigned char> v(kIpcBytes);
  if (cudaError_t e = cudaMemcpy(v.data(), p, kIpcBytes, cudaMemcpyDeviceToHost); e != cudaSuccess)
    return ChildFail("cudaMemcpy", e, 0);
  for (size_t i = 0; i < kIpcBytes; ++i)
    if (v[i] != std::stoi(args[1])) return ChildFail("shared byte", v[i], std::stoi(args[1]));
  if (cudaError_t e = cudaMemset(p, std::stoi(args[2]), kIpcBytes); e != cudaSuccess)
    return ChildFail("cudaMemset", e, 0);
  if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess)
    return ChildFail("cudaDeviceSynchronize", e, 0);
  if (cudaError_t e = cudaIpcCloseMemHandle(p); e != cudaSuccess)
    return ChildFail("cudaIpcCloseMemHandle", e, 0);
  return 0;
}

using Ipc = DriverTest;

TEST_F(Ipc, LegacyHandleSharesCuMemAllocMemoryWithAnotherProcess) {
  CUdeviceptr d = 0;
  ASSERT_CU(cuMemAlloc(&d, kIpcBytes));
  ASSERT_CU(cuMemsetD8(d, 0x5a, kIpcBytes));
  ASSERT_CU(cuCtxSynchronize());  // a memset may return before it is done
  CUipcMemHandle h;
  ASSERT_CU(cuIpcGetMemHandle(&h, d));
  ChildOptions opt;
  opt.args = {ToHex(&h, sizeof h), std::to_string(0x5a), std::to_string(0xa5)};
  ChildResult r = RunChild("ipc_open_driver", opt);
  ASSERT_TRUE(r.exited && r.exit_code == 0) << r.output;
  std::vector<unsigned char> v(kIpcBytes);
  ASSERT_CU(cuMemcpyDtoH(v.data(), d, kIpcBytes));
  EXPECT_EQ(v[0], 0xa5);
  EXPECT_EQ(v[kIpcBytes - 1], 0xa5) << "the other process's writes are visible here";
  ASSERT_CU(cuMemFree(d));
}

TEST_F(Ipc, RuntimeHandleSharesCudaMallocMemoryWithAnotherProcess) {
  ASSERT_RT(cudaSetDevice(0));
  void* d = nullptr;
  ASSERT_RT(cudaMalloc(&d, kIpcBytes));
  ASSERT_RT(cudaMemset(d, 0x3c, kIpcBytes));
  ASSERT_RT(cudaDeviceSynchronize());
  cudaIpcMemHandle_t h;
  ASSERT_RT(cudaIpcGetMemHandle(&h, d));
  ChildOptions opt;
  opt.args = {ToHex(&h, sizeof h), std::to_string(0x3c), std::to_string(0xc3)};
  ChildResult r = RunChild("ipc_open_runtime", opt);
  ASSERT_TRUE(r.exited && r.exit_code == 0) << r.output;
  unsigned char b = 0;
  ASSERT_RT(cudaMemcpy(&b, static_cast<char*>(d) + 4321, 1, cudaMemcpyDeviceToHost));
  EXPECT_EQ(b, 0xc3);
  ASSERT_RT(cudaFree(d));
}

TEST_F(Ipc, GetHandleOfUnknownPointerIsInvalidValue) {
  CUipcMemHandle h;
  int x = 0;
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE, cuIpcGetMemHandle(&h, reinterpret_cast<CUdeviceptr>(&x)));
}

// ---- POSIX file descriptors for VMM memory ----

bool SendFd(int sock, int fd) {
  char byte = 'F';
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  return sendmsg(sock, &msg, 0) == 1;
}

int ReceiveFd(int sock) {
  char byte = 0;
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  if (recvmsg(sock, &msg, 0) != 1) return -1;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  if (c == nullptr || c->cmsg_type != SCM_RIGHTS) return -1;
  int fd = -1;
  std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
  return fd;
}

// args: socket-fd size expected replacement
CONFORMANCE_CHILD(vmm_import_fd) {
  if (args.size() != 4) return ChildFail("argument count", static_cast<long long>(args.size()), 4);
  if (int rc = ChildSetUp(); rc != 0) return rc;
  int fd = ReceiveFd(std::stoi(args[0]));
  if (fd < 0) return ChildFail("receive fd", fd, 0);
  size_t size = std::stoull(args[1]);
  CUmemGenericAllocationHandle h;
  if (CUresult r = cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                                  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      r != CUDA_SUCCESS)
    return ChildFail("cuMemImportFromShareableHandle", r, 0);
  CUdeviceptr va = 0;
  if (CUresult r = cuMemAddressReserve(&va, size, 0, 0, 0); r != CUDA_SUCCESS)
    return ChildFail("cuMemAddressReserve", r, 0);
  if (CUresult r = cuMemMap(va, size, 0, h, 0); r != CUDA_SUCCESS) return ChildFail("cuMemMap", r, 0);
  CUmemAccessDesc d{};
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.location.id = 0;
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (CUresult r = cuMemSetAccess(va, size, &d, 1); r != CUDA_SUCCESS)
    return ChildFail("cuMemSetAccess", r, 0);
  if (int rc = CheckAndRewrite(va, size, std::stoi(args[2]), std::stoi(args[3])); rc != 0) return rc;
  if (CUresult r = cuMemUnmap(va, size); r != CUDA_SUCCESS) return ChildFail("cuMemUnmap", r, 0);
  if (CUresult r = cuMemRelease(h); r != CUDA_SUCCESS) return ChildFail("cuMemRelease", r, 0);
  if (CUresult r = cuMemAddressFree(va, size); r != CUDA_SUCCESS)
    return ChildFail("cuMemAddressFree", r, 0);
  close(fd);
  return 0;
}

TEST_F(Ipc, PosixFdSharesVmmMemoryWithAnotherProcess) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev_;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t gran = 0;
  ASSERT_CU(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  const size_t size = 2 * gran;
  CUmemGenericAllocationHandle h;
  ASSERT_CU(cuMemCreate(&h, size, &prop, 0));
  CUdeviceptr va = 0;
  ASSERT_CU(cuMemAddressReserve(&va, size, 0, 0, 0));
  ASSERT_CU(cuMemMap(va, size, 0, h, 0));
  CUmemAccessDesc d{};
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.location.id = dev_;
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  ASSERT_CU(cuMemSetAccess(va, size, &d, 1));
  ASSERT_CU(cuMemsetD8(va, 0x6b, size));
  ASSERT_CU(cuCtxSynchronize());

  int fd = -1;
  ASSERT_CU(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  ASSERT_GE(fd, 0);
  int sv[2];
  ASSERT_EQ(0, socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv));
  ASSERT_TRUE(SendFd(sv[0], fd));
  close(fd);  // the message holds its own reference
  ChildOptions opt;
  opt.args = {std::to_string(sv[1]), std::to_string(size), std::to_string(0x6b),
              std::to_string(0xb6)};
  opt.keep_fds = {sv[1]};
  ChildResult r = RunChild("vmm_import_fd", opt);
  close(sv[0]);
  close(sv[1]);
  ASSERT_TRUE(r.exited && r.exit_code == 0) << r.output;
  std::vector<unsigned char> v(size);
  ASSERT_CU(cuMemcpyDtoH(v.data(), va, size));
  EXPECT_EQ(v[0], 0xb6);
  EXPECT_EQ(v[size - 1], 0xb6) << "the other process's writes are visible here";
  ASSERT_CU(cuMemUnmap(va, size));
  ASSERT_CU(cuMemRelease(h));
  ASSERT_CU(cuMemAddressFree(va, size));
}

}  // namespace
}  // namespace conformance
