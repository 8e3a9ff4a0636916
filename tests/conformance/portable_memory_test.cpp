/* Device memory (cuMemAlloc/cuMemFree, cuMemGetInfo) and pinned host memory
 * (cuMemHostAlloc/cuMemFreeHost/cuMemHostRegister): results and misuse errors.
 * Real CUDA API only. */
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "conformance_util.h"

namespace conformance {
namespace {

using DeviceMemory = DriverTest;

TEST_F(DeviceMemory, AllocReturnsAlignedUsableMemory) {
  CUdeviceptr p = 0;
  ASSERT_CU(cuMemAlloc(&p, 1000));
  EXPECT_NE(p, 0u);
  EXPECT_EQ(p % 256, 0u) << "cuMemAlloc memory is aligned to at least 256 bytes";
  std::vector<unsigned char> in(1000), out(1000, 0);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<unsigned char>(i * 7);
  ASSERT_CU(cuMemcpyHtoD(p, in.data(), in.size()));
  ASSERT_CU(cuMemcpyDtoH(out.data(), p, out.size()));
  EXPECT_EQ(in, out);
  ASSERT_CU(cuMemFree(p));
}

TEST_F(DeviceMemory, DistinctAllocationsDoNotOverlap) {
  CUdeviceptr a = 0, b = 0;
  ASSERT_CU(cuMemAlloc(&a, 4096));
  ASSERT_CU(cuMemAlloc(&b, 4096));
  EXPECT_TRUE(a + 4096 <= b || b + 4096 <= a);
  ASSERT_CU(cuMemFree(a));
  ASSERT_CU(cuMemFree(b));
}

TEST_F(DeviceMemory, ZeroSizeAllocIsInvalidValue) {
  CUdeviceptr p = 0;
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE, cuMemAlloc(&p, 0));
}

TEST_F(DeviceMemory, FreeTwiceIsInvalidValue) {
  CUdeviceptr p = 0;
  ASSERT_CU(cuMemAlloc(&p, 4096));
  ASSERT_CU(cuMemFree(p));
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE, cuMemFree(p));
}

TEST_F(DeviceMemory, FreeUnknownPointerIsInvalidValue) {
  int on_stack = 0;
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE, cuMemFree(reinterpret_cast<CUdeviceptr>(&on_stack)));
}

TEST_F(DeviceMemory, FreeInteriorPointerIsInvalidValue) {
  CUdeviceptr p = 0;
  ASSERT_CU(cuMemAlloc(&p, 1 << 20));
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE, cuMemFree(p + 4096));
  ASSERT_CU(cuMemFree(p));
}

TEST_F(DeviceMemory, GetInfoTotalMatchesDeviceAndFreeDropsWithAllocation) {
  size_t free0 = 0, total = 0;
  ASSERT_CU(cuMemGetInfo(&free0, &total));
  size_t dev_total = 0;
  ASSERT_CU(cuDeviceTotalMem(&dev_total, dev_));
  EXPECT_EQ(total, dev_total);
  EXPECT_LE(free0, total);
  const size_t kBytes = 64u << 20;
  CUdeviceptr p = 0;
  ASSERT_CU(cuMemAlloc(&p, kBytes));
  size_t free1 = 0;
  ASSERT_CU(cuMemGetInfo(&free1, &total));
  EXPECT_LE(free1 + kBytes, free0);
  ASSERT_CU(cuMemFree(p));
  size_t free2 = 0;
  ASSERT_CU(cuMemGetInfo(&free2, &total));
  EXPECT_GE(free2, free1 + kBytes);
}

TEST_F(DeviceMemory, AllocBeyondCapacityIsOutOfMemory) {
  size_t free_b = 0, total = 0;
  ASSERT_CU(cuMemGetInfo(&free_b, &total));
  CUdeviceptr p = 0;
  EXPECT_CU_EQ(CUDA_ERROR_OUT_OF_MEMORY, cuMemAlloc(&p, total + (1ull << 30)));
  // The failure leaves the device usable.
  ASSERT_CU(cuMemAlloc(&p, 4096));
  ASSERT_CU(cuMemFree(p));
}

TEST_F(DeviceMemory, FreedMemoryCanBeAllocatedAgain) {
  size_t free_b = 0, total = 0;
  ASSERT_CU(cuMemGetInfo(&free_b, &total));
  // More than half the free memory, twice: only works if the first is really returned.
  size_t bytes = (free_b / 2 + (1u << 20)) & ~size_t{(1u << 20) - 1};
  for (int i = 0; i < 2; ++i) {
    CUdeviceptr p = 0;
    ASSERT_CU(cuMemAlloc(&p, bytes)) << "round " << i;
    ASSERT_CU(cuMemFree(p));
  }
}

// ---- pinned host memory ----

using PinnedMemory = DriverTest;

TEST_F(PinnedMemory, HostAllocIsHostAccessibleAndFreed) {
  void* p = nullptr;
  ASSERT_CU(cuMemHostAlloc(&p, 1 << 20, 0));
  ASSERT_NE(p, nullptr);
  std::memset(p, 0x5a, 1 << 20);
  CUdeviceptr d = 0;
  ASSERT_CU(cuMemAlloc(&d, 1 << 20));
  ASSERT_CU(cuMemcpyHtoD(d, p, 1 << 20));
  std::memset(p, 0, 1 << 20);
  ASSERT_CU(cuMemcpyDtoH(p, d, 1 << 20));
  EXPECT_EQ(static_cast<unsigned char*>(p)[12345], 0x5a);
  ASSERT_CU(cuMemFree(d));
  ASSERT_CU(cuMemFreeHost(p));
}

TEST_F(PinnedMemory, FreeHostOfUnknownPointerIsInvalidValue) {
  std::vector<char> v(4096);
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE, cuMemFreeHost(v.data()));
}

TEST_F(PinnedMemory, HostRegisterTwiceIsAlreadyRegistered) {
  size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  size_t bytes = 16 * page;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  ASSERT_CU(cuMemHostRegister(p, bytes, 0));
  EXPECT_CU_EQ(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, cuMemHostRegister(p, bytes, 0));
  ASSERT_CU(cuMemHostUnregister(p));
  EXPECT_CU_EQ(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, cuMemHostUnregister(p));
  munmap(p, bytes);
}

TEST_F(PinnedMemory, RegisteredMemoryCopiesBothWays) {
  size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  size_t bytes = 16 * page;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  ASSERT_CU(cuMemHostRegister(p, bytes, 0));
  std::memset(p, 0x33, bytes);
  CUdeviceptr d = 0;
  ASSERT_CU(cuMemAlloc(&d, bytes));
  CUstream s;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuMemcpyHtoDAsync(d, p, bytes, s));
  ASSERT_CU(cuMemsetD8Async(d, 0x44, 16, s));
  ASSERT_CU(cuMemcpyDtoHAsync(p, d, bytes, s));
  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_EQ(static_cast<unsigned char*>(p)[0], 0x44);
  EXPECT_EQ(static_cast<unsigned char*>(p)[16], 0x33);
  ASSERT_CU(cuStreamDestroy(s));
  ASSERT_CU(cuMemFree(d));
  ASSERT_CU(cuMemHostUnregister(p));
  munmap(p, bytes);
}

}  // namespace
}  // namespace conformance
