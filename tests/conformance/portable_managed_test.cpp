/* Managed memory (Unified Memory): cuMemAllocManaged, cuMemAdvise, cuMemPrefetchAsync,
 * cuMemRangeGetAttribute and the pointer attribute that tells managed memory apart, as
 * DELTA_MODE=uvm uses them. Real CUDA API only. The sizes stay small: asking a GPU for more
 * managed memory than it has free is not what these tests are about. */
#include <cstring>
#include <vector>

#include "conformance_util.h"

namespace conformance {
namespace {

constexpr size_t kBytes = 1 << 20;

class ManagedMemory : public DriverTest {
 protected:
  void SetUp() override {
    DriverTest::SetUp();
    int concurrent = 0;
    ASSERT_CU(cuDeviceGetAttribute(&concurrent, CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS,
                                   dev_));
    // Everything below (advice to prefer the device, host access while nothing runs) assumes
    // a device that can oversubscribe managed memory, as every Linux GPU since Pascal can.
    ASSERT_EQ(concurrent, 1);
    int managed = 0;
    ASSERT_CU(cuDeviceGetAttribute(&managed, CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, dev_));
    ASSERT_EQ(managed, 1);
  }

  CUmemLocation Device() const {
    CUmemLocation location{};
    location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    location.id = dev_;
    return location;
  }
  static CUmemLocation Host() {
    CUmemLocation location{};
    location.type = CU_MEM_LOCATION_TYPE_HOST;
    return location;
  }
  static int RangeInt(CUmem_range_attribute attribute, CUdeviceptr p, size_t bytes) {
    int value = 12345;
    EXPECT_CU(cuMemRangeGetAttribute(&value, sizeof value, attribute, p, bytes));
    return value;
  }
};

TEST_F(ManagedMemory, HostAndDeviceSeeTheSameBytesThroughOnePointer) {
  CUdeviceptr p = 0;
  ASSERT_CU(cuMemAllocManaged(&p, kBytes, CU_MEM_ATTACH_GLOBAL));
  ASSERT_NE(p, 0u);
  auto* host = reinterpret_cast<unsigned char*>(p);
  for (size_t i = 0; i < kBytes; ++i) host[i] = static_cast<unsigned char>(i * 13);
  std::vector<unsigned char> out(kBytes, 0);
  ASSERT_CU(cuMemcpyDtoH(out.data(), p, kBytes));
  EXPECT_EQ(std::memcmp(out.data(), host, kBytes), 0);
  // A device-side write, seen by the host once the device is done.
  ASSERT_CU(cuMemsetD8(p + 4096, 0xab, 4096));
  ASSERT_CU(cuCtxSynchronize());
  EXPECT_EQ(host[4096], 0xab);
  EXPECT_EQ(host[8191], 0xab);
  EXPECT_EQ(host[8192], static_cast<unsigned char>(8192 * 13));
  ASSERT_CU(cuMemFree(p));
}

TEST_F(ManagedMemory, PointerAttributeTellsManagedFromPlainMemory) {
  CUdeviceptr managed = 0, plain = 0;
  ASSERT_CU(cuMemAllocManaged(&managed, kBytes, CU_MEM_ATTACH_GLOBAL));
  ASSERT_CU(cuMemAlloc(&plain, kBytes));
  unsigned int isManaged = 0;
  ASSERT_CU(cuPointerGetAttribute(&isManaged, CU_POINTER_ATTRIBUTE_IS_MANAGED, managed + 100));
  EXPECT_NE(isManaged, 0u);
  isManaged = 7;
  ASSERT_CU(cuPointerGetAttribute(&isManaged, CU_POINTER_ATTRIBUTE_IS_MANAGED, plain));
  EXPECT_EQ(isManaged & 0xff, 0u);
  CUdeviceptr base = 0;
  size_t size = 0;
  ASSERT_CU(cuMemGetAddressRange(&base, &size, managed + 100));
  EXPECT_EQ(base, managed);
  EXPECT_EQ(size, kBytes);
  ASSERT_CU(cuMemFree(managed));
  ASSERT_CU(cuMemFree(plain));
}

TEST_F(ManagedMemory, ZeroSizeBadFlagsAndDoubleFreeAreInvalidValue) {
  CUdeviceptr p = 0;
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE, cuMemAllocManaged(&p, 0, CU_MEM_ATTACH_GLOBAL));
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE, cuMemAllocManaged(&p, kBytes, 0));
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE, cuMemAllocManaged(&p, kBytes, CU_MEM_ATTACH_SINGLE));
  ASSERT_CU(cuMemAllocManaged(&p, kBytes, CU_MEM_ATTACH_HOST));
  ASSERT_CU(cuMemFree(p));
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE, cuMemFree(p));
}

TEST_F(ManagedMemory, AdviceIsReportedPageByPage) {
  CUdeviceptr p = 0;
  ASSERT_CU(cuMemAllocManaged(&p, kBytes, CU_MEM_ATTACH_GLOBAL));
  EXPECT_EQ(RangeInt(CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION, p, kBytes), CU_DEVICE_INVALID);
  ASSERT_CU(cuMemAdvise(p, kBytes, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, Device()));
  EXPECT_EQ(RangeInt(CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION, p, kBytes), dev_);
  // The second half prefers the host: the whole range has no single preferred location.
  ASSERT_CU(cuMemAdvise(p + kBytes / 2, kBytes / 2, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, Host()));
  EXPECT_EQ(RangeInt(CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION, p, kBytes), CU_DEVICE_INVALID);
  EXPECT_EQ(RangeInt(CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION, p, kBytes / 2), dev_);
  EXPECT_EQ(RangeInt(CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION, p + kBytes / 2, 4096),
            CU_DEVICE_CPU);
  ASSERT_CU(cuMemAdvise(p, kBytes, CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION, Device()));
  EXPECT_EQ(RangeInt(CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION, p, kBytes), CU_DEVICE_INVALID);
  ASSERT_CU(cuMemAdvise(p, kBytes, CU_MEM_ADVISE_SET_READ_MOSTLY, Device()));
  EXPECT_EQ(RangeInt(CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, p, kBytes), 1);
  ASSERT_CU(cuMemAdvise(p, kBytes, CU_MEM_ADVISE_SET_ACCESSED_BY, Device()));
  ASSERT_CU(cuMemFree(p));
}

TEST_F(ManagedMemory, PrefetchRecordsWhereItWasAskedToGo) {
  CUdeviceptr p = 0;
  ASSERT_CU(cuMemAllocManaged(&p, kBytes, CU_MEM_ATTACH_GLOBAL));
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  EXPECT_EQ(RangeInt(CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, p, kBytes), CU_DEVICE_INVALID);
  ASSERT_CU(cuMemPrefetchAsync(p, kBytes, Device(), 0, s));
  EXPECT_EQ(RangeInt(CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, p, kBytes), dev_);
  ASSERT_CU(cuStreamSynchronize(s));
  ASSERT_CU(cuMemPrefetchAsync(p, kBytes / 4, Host(), 0, s));
  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_EQ(RangeInt(CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, p, kBytes / 4), CU_DEVICE_CPU);
  EXPECT_EQ(RangeInt(CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, p, kBytes), CU_DEVICE_INVALID);
  // The contents survive the moves.
  auto* host = reinterpret_cast<unsigned char*>(p);
  std::memset(host, 0x5a, kBytes);
  ASSERT_CU(cuMemPrefetchAsync(p, kBytes, Device(), 0, s));
  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_EQ(host[kBytes - 1], 0x5a);
  ASSERT_CU(cuStreamDestroy(s));
  ASSERT_CU(cuMemFree(p));
}

TEST_F(ManagedMemory, PrefetchIsOrderedInItsStream) {
  CUdeviceptr p = 0;
  ASSERT_CU(cuMemAllocManaged(&p, kBytes, CU_MEM_ATTACH_GLOBAL));
  CUstream s = nullptr;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  Gate gate;
  ASSERT_CU(cuLaunchHostFunc(s, Gate::BlockHostFn, &gate));
  ASSERT_CU(cuMemPrefetchAsync(p, kBytes, Device(), 0, s));
  EXPECT_CU_EQ(CUDA_ERROR_NOT_READY, cuStreamQuery(s));
  gate.Open();
  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_CU(cuStreamQuery(s));
  ASSERT_CU(cuStreamDestroy(s));
  ASSERT_CU(cuMemFree(p));
}

TEST_F(ManagedMemory, HintsOnPlainDeviceMemoryOrBadArgumentsAreRefused) {
  CUdeviceptr plain = 0, managed = 0;
  ASSERT_CU(cuMemAlloc(&plain, kBytes));
  ASSERT_CU(cuMemAllocManaged(&managed, kBytes, CU_MEM_ATTACH_GLOBAL));
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE,
               cuMemAdvise(plain, kBytes, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, Device()));
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE, cuMemPrefetchAsync(plain, kBytes, Device(), 0, nullptr));
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE, cuMemPrefetchAsync(managed, kBytes, Device(), 1, nullptr));
  CUmemLocation noSuchDevice = Device();
  noSuchDevice.id = 1000;
  // cuMemAdvise calls a device that does not exist a bad value, cuMemPrefetchAsync a bad device
  // (the real driver, seen on an H200).
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE,
               cuMemAdvise(managed, kBytes, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, noSuchDevice));
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_DEVICE,
               cuMemPrefetchAsync(managed, kBytes, noSuchDevice, 0, nullptr));
  int value = 0;
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE,
               cuMemRangeGetAttribute(&value, 2, CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION,
                                      managed, kBytes));
  ASSERT_CU(cuMemFree(plain));
  ASSERT_CU(cuMemFree(managed));
}

}  // namespace
}  // namespace conformance
