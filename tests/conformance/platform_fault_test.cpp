/* cudasim faults: memory that is reserved but not mapped, or mapped without access, is
 * inaccessible; a copy, a kernel or host code touching it kills the process with a report
 * on stderr ("cudasim: illegal address 0x...", the call, the kernel's name) and SIGABRT,
 * as a GPU stops on an illegal address. Death tests ("threadsafe" style: re-executed). */
#include <cudasim/cudasim.h>

#include <csignal>
#include <cstdio>
#include <cctype>
#include <cstring>

#include "conformance_util.h"

namespace conformance {
namespace {

void touch_stub(unsigned char*) {}
void TouchBody(void** params, dim3, dim3) {
  volatile unsigned char* p = *static_cast<unsigned char**>(params[0]);
  p[0] = 1;
}
const size_t kTouchSizes[] = {sizeof(void*)};
const bool kRegistered = [] {
  cudasimRegisterKernel(reinterpret_cast<const void*>(&touch_stub), "touch_kernel", TouchBody, 1,
                        kTouchSizes);
  return true;
}();

// Death tests re-execute the binary, where addresses may differ from this process's, so
// they match any address; the Exact* tests below check the exact address in a child process
// that prints it before faulting.

class Faults : public DriverTest {
 protected:
  void SetUp() override {
    ::testing::GTEST_FLAG(death_test_style) = "threadsafe";
    ASSERT_TRUE(kRegistered);
    DriverTest::SetUp();
    if (HasFatalFailure()) return;
    prop_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop_.location.id = dev_;
    ASSERT_CU(cuMemGetAllocationGranularity(&gran_, &prop_, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    ASSERT_CU(cuMemAddressReserve(&va_, 2 * gran_, 0, 0, 0));
  }
  void TearDown() override {
    if (mapped_) {
      EXPECT_CU(cuMemUnmap(va_, gran_));
      EXPECT_CU(cuMemRelease(handle_));
    }
    if (va_ != 0) {
      EXPECT_CU(cuMemAddressFree(va_, 2 * gran_));
    }
    DriverTest::TearDown();
  }
  void MapFirstGranule(bool with_access) {
    ASSERT_CU(cuMemCreate(&handle_, gran_, &prop_, 0));
    ASSERT_CU(cuMemMap(va_, gran_, 0, handle_, 0));
    mapped_ = true;
    if (with_access) {
      CUmemAccessDesc d{};
      d.location = prop_.location;
      d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      ASSERT_CU(cuMemSetAccess(va_, gran_, &d, 1));
    }
  }
  CUfunction TouchFunc() {
    cudaFunction_t f = nullptr;
    EXPECT_RT(cudaGetFuncBySymbol(&f, reinterpret_cast<const void*>(&touch_stub)));
    return reinterpret_cast<CUfunction>(f);
  }
  CUmemAllocationProp prop_{};
  size_t gran_ = 0;
  CUdeviceptr va_ = 0;
  CUmemGenericAllocationHandle handle_{};
  bool mapped_ = false;
};

TEST_F(Faults, AsyncCopyIntoReservedUnmappedRangeDies) {
  CUdeviceptr target = va_ + gran_ + 256;  // the second granule is never mapped
  PinnedBuffer src(64);
  ASSERT_TRUE(src.ok());
  EXPECT_EXIT(
      {
        cuMemcpyHtoDAsync(target, src.data(), 64, nullptr);
        cuCtxSynchronize();
        std::_Exit(0);
      },
      ::testing::KilledBySignal(SIGABRT),
      "cudasim: illegal address 0x[0-9a-f]+.*cuMemcpyHtoDAsync_v2");
}

TEST_F(Faults, SyncCopyFromMappedRangeWithoutAccessDies) {
  MapFirstGranule(/*with_access=*/false);
  unsigned char out[16];
  EXPECT_EXIT(
      {
        cuMemcpyDtoH(out, va_ + 128, sizeof out);
        std::_Exit(0);
      },
      ::testing::KilledBySignal(SIGABRT),
      "cudasim: illegal address 0x[0-9a-f]+.*cuMemcpyDtoH_v2");
}

// Copies reach device memory through its physical pages (cudasim's copy engines), yet fault
// as the device addresses would.
TEST_F(Faults, CopyRunningOffTheEndOfAMappingDies) {
  MapFirstGranule(/*with_access=*/true);
  PinnedBuffer src(4096);
  ASSERT_TRUE(src.ok());
  EXPECT_EXIT(
      {
        cuMemcpyHtoD(va_ + gran_ - 2048, src.data(), 4096);
        std::_Exit(0);
      },
      ::testing::KilledBySignal(SIGABRT), "cudasim: illegal address 0x[0-9a-f]+.*cuMemcpyHtoD_v2");
}

TEST_F(Faults, CopyIntoReadOnlyMemoryDiesAndCopyOutOfItWorks) {
  MapFirstGranule(/*with_access=*/true);
  ASSERT_CU(cuMemsetD8(va_, 7, gran_));
  ASSERT_CU(cuCtxSynchronize());  // the memset writes before the access is lowered
  CUmemAccessDesc d{};
  d.location = prop_.location;
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
  ASSERT_CU(cuMemSetAccess(va_, gran_, &d, 1));
  unsigned char out[64] = {};
  ASSERT_CU(cuMemcpyDtoH(out, va_ + 64, sizeof out));
  EXPECT_EQ(out[0], 7);
  EXPECT_EQ(out[63], 7);
  EXPECT_EXIT(
      {
        cuMemcpyHtoD(va_ + 64, out, sizeof out);
        std::_Exit(0);
      },
      ::testing::KilledBySignal(SIGABRT), "cudasim: illegal address 0x[0-9a-f]+.*cuMemcpyHtoD_v2");
}

TEST_F(Faults, KernelTouchingUnmappedMemoryDiesNamingTheKernel) {
  CUfunction f = TouchFunc();
  CUdeviceptr target = va_ + gran_ + 4096;
  EXPECT_EXIT(
      {
        void* args[] = {&target};
        cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, nullptr, args, nullptr);
        cuCtxSynchronize();
        std::_Exit(0);
      },
      ::testing::KilledBySignal(SIGABRT),
      "cudasim: illegal address 0x[0-9a-f]+.*(cuLaunchKernel.*touch_kernel|touch_kernel.*cuLaunchKernel)");
}

TEST_F(Faults, RuntimeLaunchTouchingMemoryWithoutAccessDiesNamingTheKernel) {
  MapFirstGranule(/*with_access=*/false);
  unsigned char* target = reinterpret_cast<unsigned char*>(va_ + 64);
  EXPECT_EXIT(
      {
        void* args[] = {&target};
        cudaLaunchKernel(reinterpret_cast<const void*>(&touch_stub), dim3(1), dim3(1), args, 0,
                         nullptr);
        cudaDeviceSynchronize();
        std::_Exit(0);
      },
      ::testing::KilledBySignal(SIGABRT),
      "cudasim: illegal address 0x[0-9a-f]+.*touch_kernel");
}

TEST_F(Faults, KernelTouchingEvictedMemoryDies) {
  MapFirstGranule(/*with_access=*/true);
  ASSERT_CU(cuMemUnmap(va_, gran_));
  ASSERT_CU(cuMemRelease(handle_));
  mapped_ = false;
  CUfunction f = TouchFunc();
  CUdeviceptr target = va_ + 8;
  EXPECT_EXIT(
      {
        void* args[] = {&target};
        cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, nullptr, args, nullptr);
        cuCtxSynchronize();
        std::_Exit(0);
      },
      ::testing::KilledBySignal(SIGABRT),
      "cudasim: illegal address 0x[0-9a-f]+.*touch_kernel");
}

TEST_F(Faults, HostCodeTouchingUnmappedDeviceRangeDies) {
  volatile unsigned char* p = reinterpret_cast<unsigned char*>(va_ + gran_ + 12);
  EXPECT_EXIT(
      {
        p[0] = 7;
        std::_Exit(0);
      },
      ::testing::KilledBySignal(SIGABRT),
      "cudasim: illegal address 0x[0-9a-f]+.*host");
}

TEST_F(Faults, MappedMemoryWithAccessDoesNotFault) {
  MapFirstGranule(/*with_access=*/true);
  CUfunction f = TouchFunc();
  CUdeviceptr target = va_ + 8;
  void* args[] = {&target};
  ASSERT_CU(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, nullptr, args, nullptr));
  ASSERT_CU(cuCtxSynchronize());
  unsigned char b = 0;
  ASSERT_CU(cuMemcpyDtoH(&b, target, 1));
  EXPECT_EQ(b, 1);
}

TEST_F(Faults, AccessAfterRemapAndSetAccessWorks) {
  MapFirstGranule(/*with_access=*/true);
  ASSERT_CU(cuMemUnmap(va_, gran_));
  ASSERT_CU(cuMemRelease(handle_));
  mapped_ = false;
  MapFirstGranule(/*with_access=*/true);
  ASSERT_CU(cuMemsetD8(va_, 3, gran_));
  unsigned char b = 0;
  ASSERT_CU(cuMemcpyDtoH(&b, va_ + gran_ - 1, 1));
  EXPECT_EQ(b, 3);
}

// ---- exact addresses: a child faults at an address it prints first ----

int ChildReserve(CUdeviceptr* va, size_t* gran, bool map_without_access) {
  if (CUresult r = cuInit(0); r != CUDA_SUCCESS) return ChildFail("cuInit", r, 0);
  CUdevice dev;
  CUcontext ctx;
  cuDeviceGet(&dev, 0);
  if (CUresult r = cuDevicePrimaryCtxRetain(&ctx, dev); r != CUDA_SUCCESS)
    return ChildFail("retain", r, 0);
  cuCtxSetCurrent(ctx);
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  cuMemGetAllocationGranularity(gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  if (CUresult r = cuMemAddressReserve(va, 2 * *gran, 0, 0, 0); r != CUDA_SUCCESS)
    return ChildFail("reserve", r, 0);
  if (map_without_access) {
    CUmemGenericAllocationHandle h;
    if (CUresult r = cuMemCreate(&h, *gran, &prop, 0); r != CUDA_SUCCESS)
      return ChildFail("create", r, 0);
    if (CUresult r = cuMemMap(*va, *gran, 0, h, 0); r != CUDA_SUCCESS) return ChildFail("map", r, 0);
  }
  return 0;
}

CONFORMANCE_CHILD(fault_kernel) {
  if (!kRegistered) return 2;
  CUdeviceptr va = 0;
  size_t gran = 0;
  if (int rc = ChildReserve(&va, &gran, true); rc != 0) return rc;
  CUdeviceptr target = va + 0x1230;
  cudaFunction_t f = nullptr;
  if (cudaGetFuncBySymbol(&f, reinterpret_cast<const void*>(&touch_stub)) != cudaSuccess) return 3;
  std::fprintf(stderr, "target=0x%llx\n", static_cast<unsigned long long>(target));
  std::fflush(stderr);
  void* kargs[] = {&target};
  cuLaunchKernel(reinterpret_cast<CUfunction>(f), 1, 1, 1, 1, 1, 1, 0, nullptr, kargs, nullptr);
  cuCtxSynchronize();
  return 0;  // not reached on a faithful platform
}

CONFORMANCE_CHILD(fault_host) {
  CUdeviceptr va = 0;
  size_t gran = 0;
  if (int rc = ChildReserve(&va, &gran, false); rc != 0) return rc;
  CUdeviceptr target = va + gran + 0x40;
  std::fprintf(stderr, "target=0x%llx\n", static_cast<unsigned long long>(target));
  std::fflush(stderr);
  *reinterpret_cast<volatile unsigned char*>(target) = 1;
  return 0;
}

// Returns the address the child printed as "target=0x...".
std::string PrintedTarget(const std::string& output) {
  auto at = output.find("target=");
  if (at == std::string::npos) return "";
  auto end = output.find('\n', at);
  return output.substr(at + 7, end - at - 7);
}

// Strips leading zeros after 0x so padded and unpadded reports compare equal.
std::string Normalize(const std::string& hex) {
  if (hex.rfind("0x", 0) != 0) return hex;
  size_t i = 2;
  while (i + 1 < hex.size() && hex[i] == '0') ++i;
  return "0x" + hex.substr(i);
}

std::string ReportedAddress(const std::string& output) {
  const std::string kReport = "cudasim: illegal address ";
  auto at = output.find(kReport);
  if (at == std::string::npos) return "";
  at += kReport.size();
  if (output.compare(at, 2, "0x") != 0) return "";
  size_t end = at + 2;
  while (end < output.size() && std::isxdigit(static_cast<unsigned char>(output[end])) != 0) ++end;
  return Normalize(output.substr(at, end - at));
}

TEST(FaultReport, ExactAddressCallAndKernelNameForAKernel) {
  ChildResult r = RunChild("fault_kernel");
  EXPECT_EQ(r.signal, SIGABRT) << r.output;
  std::string target = PrintedTarget(r.output);
  ASSERT_FALSE(target.empty()) << r.output;
  EXPECT_EQ(ReportedAddress(r.output), Normalize(target)) << r.output;
  auto report = r.output.find("cudasim: illegal address");
  ASSERT_NE(report, std::string::npos) << r.output;
  EXPECT_NE(r.output.find("cuLaunchKernel", report), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("touch_kernel", report), std::string::npos) << r.output;
}

TEST(FaultReport, ExactAddressAndHostCodeForAHostAccess) {
  ChildResult r = RunChild("fault_host");
  EXPECT_EQ(r.signal, SIGABRT) << r.output;
  std::string target = PrintedTarget(r.output);
  ASSERT_FALSE(target.empty()) << r.output;
  EXPECT_EQ(ReportedAddress(r.output), Normalize(target)) << r.output;
  auto report = r.output.find("cudasim: illegal address");
  ASSERT_NE(report, std::string::npos) << r.output;
  EXPECT_NE(r.output.find("host", report), std::string::npos) << r.output;
}

}  // namespace
}  // namespace conformance
