/* Stream-ordered allocation and memory pools (cuMemAllocAsync, cuMemFreeAsync, cuMemPool*),
 * and pitched allocations with 2D copies: data survives, freed memory is reused only where
 * stream order allows, the release threshold and cuMemPoolTrimTo decide what the pool keeps,
 * attributes round-trip, and misuse errors. Real CUDA API only. */
#include <cstdint>
#include <cstring>
#include <vector>

#include "conformance_util.h"

namespace conformance {
namespace {

constexpr size_t kMiB = 1 << 20;

class Pools : public DriverTest {
 protected:
  void SetUp() override {
    DriverTest::SetUp();
    if (HasFatalFailure()) return;
    int supported = 0;
    ASSERT_CU(cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, dev_));
    ASSERT_EQ(supported, 1);
    ASSERT_CU(cuStreamCreate(&s1_, CU_STREAM_NON_BLOCKING));
    ASSERT_CU(cuStreamCreate(&s2_, CU_STREAM_NON_BLOCKING));
  }
  void TearDown() override {
    gate_.Open();
    EXPECT_FALSE(gate_.timed_out());
    for (CUstream s : {s1_, s2_}) {
      if (s != nullptr) {
        EXPECT_CU(cuStreamSynchronize(s));
        EXPECT_CU(cuStreamDestroy(s));
      }
    }
    if (pool_ != nullptr) {
      EXPECT_CU(cuMemPoolDestroy(pool_));
    }
    DriverTest::TearDown();
  }
  // A pool of its own, so that what it reserves is this test's alone.
  CUmemoryPool NewPool() {
    CUmemPoolProps props{};
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = dev_;
    EXPECT_CU(cuMemPoolCreate(&pool_, &props));
    return pool_;
  }
  cuuint64_t Attribute(CUmemPool_attribute attribute) {
    cuuint64_t value = 0;
    EXPECT_CU(cuMemPoolGetAttribute(pool_, attribute, &value));
    return value;
  }
  void SetAttribute(CUmemPool_attribute attribute, cuuint64_t value) {
    EXPECT_CU(cuMemPoolSetAttribute(pool_, attribute, &value));
  }
  void SetFlag(CUmemPool_attribute attribute, int value) {
    EXPECT_CU(cuMemPoolSetAttribute(pool_, attribute, &value));
  }
  std::vector<unsigned char> Read(CUdeviceptr p, size_t n) {
    std::vector<unsigned char> v(n);
    EXPECT_CU(cuMemcpyDtoH(v.data(), p, n));
    return v;
  }
  CUstream s1_ = nullptr;
  CUstream s2_ = nullptr;
  CUmemoryPool pool_ = nullptr;
  Gate gate_;
};

TEST_F(Pools, DefaultPoolIsCurrentWithDocumentedDefaults) {
  CUmemoryPool def = nullptr, current = nullptr;
  ASSERT_CU(cuDeviceGetDefaultMemPool(&def, dev_));
  ASSERT_CU(cuDeviceGetMemPool(&current, dev_));
  EXPECT_NE(def, nullptr);
  EXPECT_EQ(def, current);
  int flag = 0;
  for (CUmemPool_attribute a :
       {CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,
        CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES}) {
    ASSERT_CU(cuMemPoolGetAttribute(def, a, &flag));
    EXPECT_EQ(flag, 1) << "reuse attribute " << a << " is enabled by default";
  }
  cuuint64_t threshold = 1;
  ASSERT_CU(cuMemPoolGetAttribute(def, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
  EXPECT_EQ(threshold, 0u);
  CUmemAccess_flags access = CU_MEM_ACCESS_FLAGS_PROT_NONE;
  CUmemLocation location{CU_MEM_LOCATION_TYPE_DEVICE, dev_};
  ASSERT_CU(cuMemPoolGetAccess(&access, def, &location));
  EXPECT_EQ(access, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
}

TEST_F(Pools, AllocAsyncMemoryHoldsDataInStreamOrder) {
  const size_t bytes = 3 * kMiB + 100;
  CUdeviceptr p = 0;
  ASSERT_CU(cuMemAllocAsync(&p, bytes, s1_));
  EXPECT_NE(p, 0u);
  EXPECT_EQ(p % 256, 0u);
  PinnedBuffer in(bytes), out(bytes);
  ASSERT_TRUE(in.ok() && out.ok());
  for (size_t i = 0; i < bytes; ++i) in.data()[i] = static_cast<unsigned char>(i * 31 + 7);
  ASSERT_CU(cuMemcpyHtoDAsync(p, in.data(), bytes, s1_));
  ASSERT_CU(cuMemcpyDtoHAsync(out.data(), p, bytes, s1_));
  ASSERT_CU(cuMemFreeAsync(p, s1_));
  ASSERT_CU(cuStreamSynchronize(s1_));
  EXPECT_EQ(std::memcmp(in.data(), out.data(), bytes), 0);
}

TEST_F(Pools, PoolMemoryIsOrdinaryDeviceMemory) {
  NewPool();
  CUdeviceptr p = 0;
  ASSERT_CU(cuMemAllocFromPoolAsync(&p, 10000, pool_, s1_));
  ASSERT_CU(cuStreamSynchronize(s1_));
  CUdeviceptr base = 0;
  size_t size = 0;
  ASSERT_CU(cuMemGetAddressRange(&base, &size, p + 5000));
  EXPECT_EQ(base, p);
  EXPECT_GE(size, 10000u);
  unsigned type = 0;
  ASSERT_CU(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p));
  EXPECT_EQ(type, static_cast<unsigned>(CU_MEMORYTYPE_DEVICE));
  CUmemoryPool owner = nullptr;
  ASSERT_CU(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, p));
  EXPECT_EQ(owner, pool_);
  ASSERT_CU(cuMemsetD8(p, 0x5a, 10000));
  EXPECT_EQ(Read(p, 10000), std::vector<unsigned char>(10000, 0x5a));
  // cuMemFree takes pool memory too (the caller has made sure nothing uses it any more).
  ASSERT_CU(cuMemFree(p));
}

TEST_F(Pools, AllocationOnOneStreamUsedOnAnotherAfterAnEvent) {
  const size_t bytes = kMiB;
  CUdeviceptr p = 0;
  ASSERT_CU(cuMemAllocAsync(&p, bytes, s1_));
  ASSERT_CU(cuMemsetD8Async(p, 0x42, bytes, s1_));
  CUevent e = nullptr;
  ASSERT_CU(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  ASSERT_CU(cuEventRecord(e, s1_));
  ASSERT_CU(cuStreamWaitEvent(s2_, e, 0));
  PinnedBuffer out(bytes);
  ASSERT_TRUE(out.ok());
  ASSERT_CU(cuMemcpyDtoHAsync(out.data(), p, bytes, s2_));
  ASSERT_CU(cuMemFreeAsync(p, s2_));
  ASSERT_CU(cuStreamSynchronize(s2_));
  EXPECT_EQ(std::vector<unsigned char>(out.data(), out.data() + bytes),
            std::vector<unsigned char>(bytes, 0x42));
  ASSERT_CU(cuEventDestroy(e));
}

TEST_F(Pools, FreedMemoryIsReusedOnTheSameStreamWithoutGrowing) {
  NewPool();
  SetAttribute(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, UINT64_MAX);
  CUdeviceptr a = 0, b = 0;
  ASSERT_CU(cuMemAllocFromPoolAsync(&a, 4 * kMiB, pool_, s1_));
  const cuuint64_t reserved = Attribute(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
  EXPECT_GE(reserved, 4 * kMiB);
  ASSERT_CU(cuMemFreeAsync(a, s1_));
  ASSERT_CU(cuMemAllocFromPoolAsync(&b, 4 * kMiB, pool_, s1_));
  EXPECT_EQ(Attribute(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), reserved)
      << "stream order makes the freed memory reusable at once on the same stream";
  ASSERT_CU(cuMemFreeAsync(b, s1_));
  ASSERT_CU(cuStreamSynchronize(s1_));
}

TEST_F(Pools, ReuseOnAnotherStreamWaitsForTheFree) {
  NewPool();
  // A whole granule: the pool has no other room for the second allocation.
  const size_t kBytes = 2 * kMiB;
  SetAttribute(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, UINT64_MAX);
  CUdeviceptr a = 0, b = 0;
  ASSERT_CU(cuMemAllocFromPoolAsync(&a, kBytes, pool_, s1_));
  ASSERT_CU(cuStreamSynchronize(s1_));
  ASSERT_CU(cuLaunchHostFunc(s1_, Gate::BlockHostFn, &gate_));
  ASSERT_CU(cuMemFreeAsync(a, s1_));  // not reached until the gate opens
  ASSERT_CU(cuMemAllocFromPoolAsync(&b, kBytes, pool_, s2_));
  ASSERT_CU(cuMemsetD8Async(b, 1, kBytes, s2_));
  const bool overlaps = b < a + kBytes && a < b + kBytes;
  if (overlaps) {
    // Allowed (internal dependencies are on by default), but only by making s2 wait.
    std::this_thread::sleep_for(kNegativeWait);
    EXPECT_CU_EQ(CUDA_ERROR_NOT_READY, cuStreamQuery(s2_))
        << "s2 reuses memory freed on s1 before s1 has reached the free";
  }
  gate_.Open();
  ASSERT_CU(cuStreamSynchronize(s2_));
  ASSERT_CU(cuMemFreeAsync(b, s2_));
  ASSERT_CU(cuStreamSynchronize(s2_));
}

TEST_F(Pools, WithoutOpportunisticOrInternalReuseAnotherStreamGetsOtherMemory) {
  NewPool();
  // A whole granule: the pool has no other room for the second allocation.
  const size_t kBytes = 2 * kMiB;
  SetAttribute(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, UINT64_MAX);
  SetFlag(CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, 0);
  SetFlag(CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, 0);
  CUdeviceptr a = 0, b = 0;
  ASSERT_CU(cuMemAllocFromPoolAsync(&a, kBytes, pool_, s1_));
  ASSERT_CU(cuLaunchHostFunc(s1_, Gate::BlockHostFn, &gate_));
  ASSERT_CU(cuMemFreeAsync(a, s1_));
  ASSERT_CU(cuMemAllocFromPoolAsync(&b, kBytes, pool_, s2_));
  EXPECT_TRUE(b >= a + kBytes || a >= b + kBytes);
  ASSERT_CU(cuMemsetD8Async(b, 1, kBytes, s2_));
  ASSERT_CU(cuStreamSynchronize(s2_));  // s2 does not wait for s1
  gate_.Open();
  ASSERT_CU(cuMemFreeAsync(b, s2_));
  ASSERT_CU(cuStreamSynchronize(s1_));
  ASSERT_CU(cuStreamSynchronize(s2_));
}

TEST_F(Pools, ReleaseThresholdAndTrimDecideWhatThePoolKeeps) {
  NewPool();
  CUdeviceptr p = 0;
  ASSERT_CU(cuMemAllocFromPoolAsync(&p, 8 * kMiB, pool_, s1_));
  EXPECT_GE(Attribute(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 8 * kMiB);
  EXPECT_GE(Attribute(CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 8 * kMiB);
  ASSERT_CU(cuMemFreeAsync(p, s1_));
  ASSERT_CU(cuStreamSynchronize(s1_));
  EXPECT_EQ(Attribute(CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0u);
  EXPECT_EQ(Attribute(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0u)
      << "threshold 0: a synchronisation gives everything back";
  EXPECT_GE(Attribute(CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH), 8 * kMiB);
  EXPECT_GE(Attribute(CU_MEMPOOL_ATTR_USED_MEM_HIGH), 8 * kMiB);

  SetAttribute(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, 64 * kMiB);
  EXPECT_EQ(Attribute(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD), 64 * kMiB);
  ASSERT_CU(cuMemAllocFromPoolAsync(&p, 8 * kMiB, pool_, s1_));
  ASSERT_CU(cuMemFreeAsync(p, s1_));
  ASSERT_CU(cuStreamSynchronize(s1_));
  EXPECT_GE(Attribute(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 8 * kMiB)
      << "below the threshold the pool keeps what was freed";
  ASSERT_CU(cuMemPoolTrimTo(pool_, 0));
  EXPECT_EQ(Attribute(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0u);

  // Watermarks reset to the current value; nothing else may be written to them.
  SetAttribute(CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, 0);
  SetAttribute(CU_MEMPOOL_ATTR_USED_MEM_HIGH, 0);
  EXPECT_EQ(Attribute(CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH), 0u);
  EXPECT_EQ(Attribute(CU_MEMPOOL_ATTR_USED_MEM_HIGH), 0u);
  cuuint64_t nonzero = 1;
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE,
               cuMemPoolSetAttribute(pool_, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &nonzero));
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE,
               cuMemPoolSetAttribute(pool_, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &nonzero));
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE,
               cuMemPoolSetAttribute(pool_, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &nonzero));
}

TEST_F(Pools, TrimKeepsAtLeastWhatIsAskedAndNeverWhatIsInUse) {
  NewPool();
  SetAttribute(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, UINT64_MAX);
  CUdeviceptr kept = 0, freed = 0;
  ASSERT_CU(cuMemAllocFromPoolAsync(&kept, 4 * kMiB, pool_, s1_));
  ASSERT_CU(cuMemAllocFromPoolAsync(&freed, 4 * kMiB, pool_, s1_));
  ASSERT_CU(cuMemFreeAsync(freed, s1_));
  ASSERT_CU(cuStreamSynchronize(s1_));
  ASSERT_CU(cuMemPoolTrimTo(pool_, 0));
  EXPECT_GE(Attribute(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 4 * kMiB);
  ASSERT_CU(cuMemsetD8(kept, 9, 4 * kMiB));  // still there
  EXPECT_EQ(Read(kept + 4 * kMiB - 16, 16), std::vector<unsigned char>(16, 9));
  ASSERT_CU(cuMemFreeAsync(kept, s1_));
  ASSERT_CU(cuStreamSynchronize(s1_));
  ASSERT_CU(cuMemPoolTrimTo(pool_, 64 * kMiB));
  EXPECT_GE(Attribute(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 4 * kMiB)
      << "a pool holding less than minBytesToKeep keeps it all";
}

TEST_F(Pools, MemGetInfoCountsWhatPoolsHold) {
  NewPool();
  SetAttribute(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, UINT64_MAX);
  const size_t bytes = 64 * kMiB;
  size_t free0 = 0, free1 = 0, free2 = 0, total = 0;
  ASSERT_CU(cuMemGetInfo(&free0, &total));
  CUdeviceptr p = 0;
  ASSERT_CU(cuMemAllocFromPoolAsync(&p, bytes, pool_, s1_));
  ASSERT_CU(cuMemFreeAsync(p, s1_));
  ASSERT_CU(cuStreamSynchronize(s1_));
  ASSERT_CU(cuMemGetInfo(&free1, &total));
  EXPECT_LE(free1 + bytes, free0) << "freed memory the pool keeps is not free";
  ASSERT_CU(cuMemPoolTrimTo(pool_, 0));
  ASSERT_CU(cuMemGetInfo(&free2, &total));
  EXPECT_GE(free2, free1 + bytes);
}

TEST_F(Pools, CurrentPoolCanBeSetAndFallsBackWhenDestroyed) {
  NewPool();
  CUmemoryPool def = nullptr, current = nullptr;
  ASSERT_CU(cuDeviceGetDefaultMemPool(&def, dev_));
  ASSERT_CU(cuDeviceSetMemPool(dev_, pool_));
  ASSERT_CU(cuDeviceGetMemPool(&current, dev_));
  EXPECT_EQ(current, pool_);
  CUdeviceptr p = 0;
  ASSERT_CU(cuMemAllocAsync(&p, kMiB, s1_));
  CUmemoryPool owner = nullptr;
  ASSERT_CU(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, p));
  EXPECT_EQ(owner, pool_) << "cuMemAllocAsync takes from the device's current pool";
  // Destroying a pool with an allocation outstanding returns at once; the memory stays usable
  // until freed.
  ASSERT_CU(cuMemPoolDestroy(pool_));
  pool_ = nullptr;
  ASSERT_CU(cuDeviceGetMemPool(&current, dev_));
  EXPECT_EQ(current, def);
  ASSERT_CU(cuMemsetD8Async(p, 3, kMiB, s1_));
  ASSERT_CU(cuMemFreeAsync(p, s1_));
  ASSERT_CU(cuStreamSynchronize(s1_));
}

TEST_F(Pools, MisuseIsRejected) {
  CUmemoryPool def = nullptr;
  ASSERT_CU(cuDeviceGetDefaultMemPool(&def, dev_));
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE, cuMemPoolDestroy(def)) << "the default pool stays";
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE, cuMemAllocAsync(nullptr, 1024, s1_));
  CUmemoryPool pool = nullptr;
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE, cuMemPoolCreate(&pool, nullptr));
  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_INVALID;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = dev_;
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE, cuMemPoolCreate(&pool, &props));
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE,
               cuMemPoolGetAttribute(def, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, nullptr));
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_DEVICE, cuDeviceGetDefaultMemPool(&pool, 1 << 20));
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE, cuDeviceGetMemPool(&pool, -1));  // so says the real driver
}

TEST_F(Pools, RuntimeCallsRoundTrip) {
  cudaStream_t s = reinterpret_cast<cudaStream_t>(s1_);
  cudaMemPool_t def = nullptr, current = nullptr;
  ASSERT_RT(cudaDeviceGetDefaultMemPool(&def, 0));
  ASSERT_RT(cudaDeviceGetMemPool(&current, 0));
  EXPECT_EQ(def, current);
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = 0;
  cudaMemPool_t pool = nullptr;
  ASSERT_RT(cudaMemPoolCreate(&pool, &props));
  cuuint64_t threshold = 32 * kMiB, read = 0;
  ASSERT_RT(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  ASSERT_RT(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &read));
  EXPECT_EQ(read, threshold);
  void* a = nullptr;
  void* b = nullptr;
  ASSERT_RT(cudaMallocAsync(&a, 1000, s));
  ASSERT_RT(cudaMallocFromPoolAsync(&b, 1000, pool, s));
  ASSERT_RT(cudaMemsetAsync(a, 7, 1000, s));
  ASSERT_RT(cudaMemcpyAsync(b, a, 1000, cudaMemcpyDeviceToDevice, s));
  std::vector<unsigned char> out(1000);
  ASSERT_RT(cudaMemcpyAsync(out.data(), b, 1000, cudaMemcpyDeviceToHost, s));
  ASSERT_RT(cudaFreeAsync(a, s));
  ASSERT_RT(cudaFreeAsync(b, s));
  ASSERT_RT(cudaStreamSynchronize(s));
  EXPECT_EQ(out, std::vector<unsigned char>(1000, 7));
  ASSERT_RT(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &read));
  EXPECT_GT(read, 0u) << "below its threshold the pool keeps the freed memory";
  ASSERT_RT(cudaMemPoolTrimTo(pool, 0));
  ASSERT_RT(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &read));
  EXPECT_EQ(read, 0u);
  ASSERT_RT(cudaDeviceSetMemPool(0, pool));
  ASSERT_RT(cudaDeviceGetMemPool(&current, 0));
  EXPECT_EQ(current, pool);
  ASSERT_RT(cudaDeviceSetMemPool(0, def));
  ASSERT_RT(cudaMemPoolDestroy(pool));
}

// ---- pitched allocations and 2D copies ----

TEST_F(Pools, PitchIsAlignedAndRowsCopyIn2D) {
  int alignment = 0;
  ASSERT_CU(cuDeviceGetAttribute(&alignment, CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT, dev_));
  ASSERT_GT(alignment, 0);
  const size_t width = 100, height = 37;
  CUdeviceptr d = 0;
  size_t pitch = 0;
  ASSERT_CU(cuMemAllocPitch(&d, &pitch, width, height, 4));
  EXPECT_GE(pitch, width);
  EXPECT_EQ(pitch % static_cast<size_t>(alignment), 0u);
  CUdeviceptr base = 0;
  size_t size = 0;
  ASSERT_CU(cuMemGetAddressRange(&base, &size, d));
  EXPECT_GE(size, pitch * height);

  std::vector<unsigned char> in(width * height), out(width * height, 0);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<unsigned char>(i * 3 + 1);
  ASSERT_CU(cuMemsetD8(d, 0xee, pitch * height));
  CUDA_MEMCPY2D up{};
  up.srcMemoryType = CU_MEMORYTYPE_HOST;
  up.srcHost = in.data();
  up.srcPitch = width;
  up.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  up.dstDevice = d;
  up.dstPitch = pitch;
  up.WidthInBytes = width;
  up.Height = height;
  ASSERT_CU(cuMemcpy2D(&up));
  // The padding between rows is untouched.
  EXPECT_EQ(Read(d + width, pitch - width), std::vector<unsigned char>(pitch - width, 0xee));
  CUDA_MEMCPY2D down{};
  down.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  down.srcDevice = d;
  down.srcPitch = pitch;
  down.dstMemoryType = CU_MEMORYTYPE_HOST;
  down.dstHost = out.data();
  down.dstPitch = width;
  down.WidthInBytes = width;
  down.Height = height;
  ASSERT_CU(cuMemcpy2DAsync(&down, s1_));
  ASSERT_CU(cuStreamSynchronize(s1_));
  EXPECT_EQ(in, out);
  // A sub-rectangle: rows 5..9, bytes 10..29 of each.
  std::vector<unsigned char> part(20 * 5);
  down.srcXInBytes = 10;
  down.srcY = 5;
  down.dstHost = part.data();
  down.dstPitch = 20;
  down.WidthInBytes = 20;
  down.Height = 5;
  ASSERT_CU(cuMemcpy2D(&down));
  for (size_t r = 0; r < 5; ++r)
    for (size_t c = 0; c < 20; ++c) ASSERT_EQ(part[r * 20 + c], in[(r + 5) * width + 10 + c]);

  up.srcPitch = width - 1;  // rows overlapping
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE, cuMemcpy2D(&up));
  size_t p2 = 0;
  CUdeviceptr d2 = 0;
  EXPECT_CU_EQ(CUDA_ERROR_INVALID_VALUE, cuMemAllocPitch(&d2, &p2, width, height, 3));
  ASSERT_CU(cuMemFree(d));
}

TEST_F(Pools, RuntimePitchAnd3DAllocationsAndCopies) {
  const size_t width = 300, height = 10;
  void* d = nullptr;
  size_t pitch = 0;
  ASSERT_RT(cudaMallocPitch(&d, &pitch, width, height));
  EXPECT_GE(pitch, width);
  std::vector<unsigned char> in(width * height), out(width * height, 0);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<unsigned char>(i ^ 0x55);
  ASSERT_RT(cudaMemcpy2D(d, pitch, in.data(), width, width, height, cudaMemcpyHostToDevice));
  ASSERT_RT(cudaMemcpy2DAsync(out.data(), width, d, pitch, width, height, cudaMemcpyDefault,
                              reinterpret_cast<cudaStream_t>(s1_)));
  ASSERT_RT(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(s1_)));
  EXPECT_EQ(in, out);
  EXPECT_RT_EQ(cudaErrorInvalidPitchValue,
               cudaMemcpy2D(d, width - 1, in.data(), width, width, height, cudaMemcpyHostToDevice));
  cudaGetLastError();
  ASSERT_RT(cudaFree(d));

  cudaPitchedPtr p{};
  ASSERT_RT(cudaMalloc3D(&p, cudaExtent{64, 8, 4}));
  EXPECT_NE(p.ptr, nullptr);
  EXPECT_GE(p.pitch, 64u);
  EXPECT_EQ(p.xsize, 64u);
  EXPECT_EQ(p.ysize, 8u);
  // The last byte of the last row of the last slice is inside the allocation.
  ASSERT_RT(cudaMemset(static_cast<char*>(p.ptr) + p.pitch * 8 * 3 + p.pitch * 7 + 63, 1, 1));
  ASSERT_RT(cudaDeviceSynchronize());
  ASSERT_RT(cudaFree(p.ptr));
}

}  // namespace
}  // namespace conformance
