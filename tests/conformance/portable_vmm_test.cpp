/* Virtual memory management: granularity, reserve/create/map/set-access, the evict and
 * restore cycle at one address, and the errors of misuse. Real CUDA API only. */
#include <algorithm>
#include <cstring>
#include <vector>

#include "conformance_util.h"

namespace conformance {
namespace {

class Vmm : public DriverTest {
 protected:
  void SetUp() override {
    DriverTest::SetUp();
    if (HasFatalFailure()) return;
    std::memset(&prop_, 0, sizeof prop_);
    prop_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop_.location.id = dev_;
    ASSERT_CU(cuMemGetAllocationGranularity(&gran_, &prop_, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    ASSERT_GT(gran_, 0u);
  }
  CUmemAccessDesc Access() const {
    CUmemAccessDesc d{};
    d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = dev_;
    d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return d;
  }
  // create + map + set access at va (size bytes)
  void MapNew(CUdeviceptr va, size_t size, CUmemGenericAllocationHandle* h) {
    ASSERT_CU(cuMemCreate(h, size, &prop_, 0));
    ASSERT_CU(cuMemMap(va, size, 0, *h, 0));
    CUmemAccessDesc d = Access();
    ASSERT_CU(cuMemSetAccess(va, size, &d, 1));
  }
  CUmemAllocationProp prop_;
  size_t gran_ = 0;
};

TEST_F(Vmm, GranularityIsPowerOfTwoAndRecommendedAtLeastMinimum) {
  size_t rec = 0;
  ASSERT_CU(cuMemGetAllocationGranularity(&rec, &prop_, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  EXPECT_EQ(gran_ & (gran_ - 1), 0u);
  EXPECT_GE(rec, gran_);
  EXPECT_EQ(rec % gran_, 0u);
}

TEST_F(Vmm, ReserveIsAlignedAndFreed) {
  CUdeviceptr va = 0;
  ASSERT_CU(cuMemAddressReserve(&va, 8 * gran_, 0, 0, 0));
  EXPECT_NE(va, 0u);
  EXPECT_EQ(va % gran_, 0u);
  ASSERT_CU(cuMemAddressFree(va, 8 * gran_));
}

TEST_F(Vmm, ReserveDoesNotConsumeMemoryButCreateDoes) {
  size_t free0 = 0, total = 0;
  ASSERT_CU(cuMemGetInfo(&free0, &total));
  const size_t size = 16 * gran_;
  CUdeviceptr va = 0;
  ASSERT_CU(cuMemAddressReserve(&va, size, 0, 0, 0));
  size_t free1 = 0;
  ASSERT_CU(cuMemGetInfo(&free1, &total));
  EXPECT_GT(free1 + size, free0) << "a reservation alone must not use device memory";
  CUmemGenericAllocationHandle h;
  ASSERT_CU(cuMemCreate(&h, size, &prop_, 0));
  size_t free2 = 0;
  ASSERT_CU(cuMemGetInfo(&free2, &total));
  EXPECT_LE(free2 + size, free1) << "cuMemCreate takes physical memory";
  ASSERT_CU(cuMemRelease(h));
  size_t free3 = 0;
  ASSERT_CU(cuMemGetInfo(&free3, &total));
  EXPECT_GE(free3, free2 + size) << "an unmapped handle is freed by cuMemRelease";
  ASSERT_CU(cuMemAddressFree(va, size));
}

TEST_F(Vmm, MappedMemoryWithAccessHoldsData) {
  const size_t size = 2 * gran_;
  CUdeviceptr va = 0;
  ASSERT_CU(cuMemAddressReserve(&va, size, 0, 0, 0));
  CUmemGenericAllocationHandle h;
  MapNew(va, size, &h);
  std::vector<unsigned char> in(size), out(size);
  for (size_t i = 0; i < size; ++i) in[i] = static_cast<unsigned char>(i ^ (i >> 8));
  ASSERT_CU(cuMemcpyHtoD(va, in.data(), size));
  ASSERT_CU(cuMemcpyDtoH(out.data(), va, size));
  EXPECT_EQ(in, out);
  ASSERT_CU(cuMemUnmap(va, size));
  ASSERT_CU(cuMemRelease(h));
  ASSERT_CU(cuMemAddressFree(va, size));
}

TEST_F(Vmm, CopySpansTwoHandlesMappedSideBySide) {
  CUdeviceptr va = 0;
  ASSERT_CU(cuMemAddressReserve(&va, 2 * gran_, 0, 0, 0));
  CUmemGenericAllocationHandle h1, h2;
  MapNew(va, gran_, &h1);
  MapNew(va + gran_, gran_, &h2);
  std::vector<unsigned char> in(4096, 0xab), out(4096, 0);
  ASSERT_CU(cuMemcpyHtoD(va + gran_ - 2048, in.data(), in.size()));
  ASSERT_CU(cuMemcpyDtoH(out.data(), va + gran_ - 2048, out.size()));
  EXPECT_EQ(in, out);
  ASSERT_CU(cuMemUnmap(va, gran_));
  ASSERT_CU(cuMemUnmap(va + gran_, gran_));
  ASSERT_CU(cuMemRelease(h1));
  ASSERT_CU(cuMemRelease(h2));
  ASSERT_CU(cuMemAddressFree(va, 2 * gran_));
}

// Physical memory out of address order, and a mapping that starts inside its handle: one copy
// in and one out across all of it, with a memset through the device addresses in between.
TEST_F(Vmm, CopiesFollowEachMappingToItsPhysicalMemory) {
  CUdeviceptr va = 0;
  ASSERT_CU(cuMemAddressReserve(&va, 3 * gran_, 0, 0, 0));
  CUmemGenericAllocationHandle later, earlier, wide;
  ASSERT_CU(cuMemCreate(&wide, 2 * gran_, &prop_, 0));
  ASSERT_CU(cuMemCreate(&later, gran_, &prop_, 0));
  ASSERT_CU(cuMemCreate(&earlier, gran_, &prop_, 0));
  ASSERT_CU(cuMemMap(va, gran_, 0, earlier, 0));
  ASSERT_CU(cuMemMap(va + gran_, gran_, 0, later, 0));
  ASSERT_CU(cuMemMap(va + 2 * gran_, gran_, gran_, wide, 0));  // the second half of `wide`
  CUmemAccessDesc d = Access();
  ASSERT_CU(cuMemSetAccess(va, 3 * gran_, &d, 1));
  const size_t size = 3 * gran_;
  std::vector<unsigned char> in(size), out(size);
  for (size_t i = 0; i < size; ++i) in[i] = static_cast<unsigned char>((i * 7) ^ (i >> 12));
  ASSERT_CU(cuMemcpyHtoD(va, in.data(), size));
  ASSERT_CU(cuMemsetD8(va + gran_ - 100, 0x5a, 200));
  ASSERT_CU(cuMemsetD8(va + 2 * gran_ + 50, 0xa5, 100));
  std::memset(in.data() + gran_ - 100, 0x5a, 200);
  std::memset(in.data() + 2 * gran_ + 50, 0xa5, 100);
  ASSERT_CU(cuMemcpyDtoH(out.data(), va, size));
  EXPECT_EQ(in, out);
  // The same bytes through a mapping of the whole of `wide`, elsewhere.
  CUdeviceptr other = 0;
  ASSERT_CU(cuMemAddressReserve(&other, 2 * gran_, 0, 0, 0));
  ASSERT_CU(cuMemMap(other, 2 * gran_, 0, wide, 0));
  ASSERT_CU(cuMemSetAccess(other, 2 * gran_, &d, 1));
  std::vector<unsigned char> half(gran_);
  ASSERT_CU(cuMemcpyDtoH(half.data(), other + gran_, gran_));
  EXPECT_TRUE(std::equal(half.begin(), half.end(), in.begin() + 2 * gran_));
  ASSERT_CU(cuMemUnmap(other, 2 * gran_));
  ASSERT_CU(cuMemAddressFree(other, 2 * gran_));
  ASSERT_CU(cuMemUnmap(va, 3 * gran_));
  for (auto h : {earlier, later, wide}) ASSERT_CU(cuMemRelease(h));
  ASSERT_CU(cuMemAddressFree(va, 3 * gran_));
}

TEST_F(Vmm, ReleasedHandleStaysUsableWhileMapped) {
  CUdeviceptr va = 0;
  ASSERT_CU(cuMemAddressReserve(&va, gran_, 0, 0, 0));
  CUmemGenericAllocationHandle h;
  MapNew(va, gran_, &h);
  ASSERT_CU(cuMemRelease(h));
  ASSERT_CU(cuMemsetD32(va, 0xdeadbeef, gran_ / 4));
  unsigned int v = 0;
  ASSERT_CU(cuMemcpyDtoH(&v, va + gran_ - 4, 4));
  EXPECT_EQ(v, 0xdeadbeefu);
  ASSERT_CU(cuMemUnmap(va, gran_));
  ASSERT_CU(cuMemAddressFree(va, gran_));
}

TEST_F(Vmm, EvictAndRestoreAtTheSameAddress) {
  CUdeviceptr va = 0;
  ASSERT_CU(cuMemAddressReserve(&va, gran_, 0, 0, 0));
  CUmemGenericAllocationHandle h;
  MapNew(va, gran_, &h);
  ASSERT_CU(cuMemsetD8(va, 0x11, gran_));
  std::vector<unsigned char> saved(gran_);
  ASSERT_CU(cuMemcpyDtoH(saved.data(), va, gran_));
  // evict
  ASSERT_CU(cuMemUnmap(va, gran_));
  ASSERT_CU(cuMemRelease(h));
  // restore
  MapNew(va, gran_, &h);
  ASSERT_CU(cuMemcpyHtoD(va, saved.data(), gran_));
  unsigned char b = 0;
  ASSERT_CU(cuMemcpyDtoH(&b, va + gran_ / 2, 1));
  EXPECT_EQ(b, 0x11);
  ASSERT_CU(cuMemUnmap(va, gran_));
  ASSERT_CU(cuMemRelease(h));
  ASSERT_CU(cuMemAddressFree(va, gran_));
}

TEST_F(Vmm, CreateSizeNotMultipleOfGranularityIsInvalidValue) {
  CUmemGenericAllocationHandle h;
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE, cuMemCreate(&h, gran_ + 4096, &prop_, 0));
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE, cuMemCreate(&h, gran_ / 2, &prop_, 0));
}

TEST_F(Vmm, CreateBeyondCapacityIsOutOfMemory) {
  size_t free_b = 0, total = 0;
  ASSERT_CU(cuMemGetInfo(&free_b, &total));
  size_t size = ((total / gran_) + 16) * gran_;
  CUmemGenericAllocationHandle h;
  EXPECT_CU_EQ(CUDA_ERROR_OUT_OF_MEMORY, cuMemCreate(&h, size, &prop_, 0));
}

TEST_F(Vmm, MapOutsideAnyReservationIsInvalidValue) {
  CUdeviceptr va = 0;
  ASSERT_CU(cuMemAddressReserve(&va, 4 * gran_, 0, 0, 0));
  ASSERT_CU(cuMemAddressFree(va, 4 * gran_));  // now unreserved
  CUmemGenericAllocationHandle h;
  ASSERT_CU(cuMemCreate(&h, gran_, &prop_, 0));
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE, cuMemMap(va, gran_, 0, h, 0));
  ASSERT_CU(cuMemRelease(h));
}

TEST_F(Vmm, MapOverMappedRangeIsInvalidValue) {
  CUdeviceptr va = 0;
  ASSERT_CU(cuMemAddressReserve(&va, 2 * gran_, 0, 0, 0));
  CUmemGenericAllocationHandle h1, h2;
  ASSERT_CU(cuMemCreate(&h1, gran_, &prop_, 0));
  ASSERT_CU(cuMemCreate(&h2, 2 * gran_, &prop_, 0));
  ASSERT_CU(cuMemMap(va, gran_, 0, h1, 0));
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE, cuMemMap(va, gran_, 0, h2, 0));
  // partly overlapping
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE, cuMemMap(va, 2 * gran_, 0, h2, 0));
  ASSERT_CU(cuMemUnmap(va, gran_));
  ASSERT_CU(cuMemRelease(h1));
  ASSERT_CU(cuMemRelease(h2));
  ASSERT_CU(cuMemAddressFree(va, 2 * gran_));
}

TEST_F(Vmm, MapLargerThanHandleIsInvalidValue) {
  CUdeviceptr va = 0;
  ASSERT_CU(cuMemAddressReserve(&va, 2 * gran_, 0, 0, 0));
  CUmemGenericAllocationHandle h;
  ASSERT_CU(cuMemCreate(&h, gran_, &prop_, 0));
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE, cuMemMap(va, 2 * gran_, 0, h, 0));
  ASSERT_CU(cuMemRelease(h));
  ASSERT_CU(cuMemAddressFree(va, 2 * gran_));
}

TEST_F(Vmm, UnmapPartOfMappingIsInvalidValue) {
  CUdeviceptr va = 0;
  ASSERT_CU(cuMemAddressReserve(&va, 2 * gran_, 0, 0, 0));
  CUmemGenericAllocationHandle h;
  MapNew(va, 2 * gran_, &h);
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE, cuMemUnmap(va, gran_));
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE, cuMemUnmap(va + gran_, gran_));
  // still mapped and usable
  ASSERT_CU(cuMemsetD8(va, 1, 2 * gran_));
  // cuMemUnmap does not wait for queued work (the memset may still be pending): wait first.
  ASSERT_CU(cuCtxSynchronize());
  ASSERT_CU(cuMemUnmap(va, 2 * gran_));
  ASSERT_CU(cuMemRelease(h));
  ASSERT_CU(cuMemAddressFree(va, 2 * gran_));
}

TEST_F(Vmm, SetAccessOnUnmappedRangeIsInvalidValue) {
  CUdeviceptr va = 0;
  ASSERT_CU(cuMemAddressReserve(&va, gran_, 0, 0, 0));
  CUmemAccessDesc d = Access();
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE, cuMemSetAccess(va, gran_, &d, 1));
  ASSERT_CU(cuMemAddressFree(va, gran_));
}

TEST_F(Vmm, ReleaseUnknownHandleIsInvalidValue) {
  CUmemGenericAllocationHandle h;
  ASSERT_CU(cuMemCreate(&h, gran_, &prop_, 0));
  ASSERT_CU(cuMemRelease(h));
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE, cuMemRelease(h));
}

TEST_F(Vmm, CuMemFreeOfMappedVmmAddressIsInvalidValue) {
  CUdeviceptr va = 0;
  ASSERT_CU(cuMemAddressReserve(&va, gran_, 0, 0, 0));
  CUmemGenericAllocationHandle h;
  MapNew(va, gran_, &h);
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE, cuMemFree(va));
  ASSERT_CU(cuMemUnmap(va, gran_));
  ASSERT_CU(cuMemRelease(h));
  ASSERT_CU(cuMemAddressFree(va, gran_));
}

TEST_F(Vmm, LegacyIpcOnVmmMemoryIsInvalidValue) {
  CUdeviceptr va = 0;
  ASSERT_CU(cuMemAddressReserve(&va, gran_, 0, 0, 0));
  CUmemGenericAllocationHandle h;
  MapNew(va, gran_, &h);
  CUipcMemHandle ipc;
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE, cuIpcGetMemHandle(&ipc, va));
  ASSERT_CU(cuMemUnmap(va, gran_));
  ASSERT_CU(cuMemRelease(h));
  ASSERT_CU(cuMemAddressFree(va, gran_));
}

TEST_F(Vmm, ExportWithoutRequestedHandleTypeFails) {
  CUmemGenericAllocationHandle h;
  ASSERT_CU(cuMemCreate(&h, gran_, &prop_, 0));  // requestedHandleTypes = NONE
  int fd = -1;
  CUresult r = cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  EXPECT_NE(r, CUDA_SUCCESS) << "export of a handle created without POSIX-fd type";
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE, r);
  ASSERT_CU(cuMemRelease(h));
}

}  // namespace
}  // namespace conformance
