// The residency manager's pools (shim/pools.h) against a fake driver that counts its calls and
// can be told to refuse: physical handles reused by size and given back largest first, the
// driver asked again after the pool is emptied when it is out of memory; pinned host blocks
// up to the limit, then pageable memory, counted; events made once and reused.
#include "shim/pools.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <vector>

namespace delta::shim {
namespace {

struct FakeDriver {
  int creates = 0;
  int releases = 0;
  int hostAllocs = 0;
  int eventCreates = 0;
  uint64_t deviceFree = 0;  // cuMemCreate refuses past this
  bool refuseHost = false;
  std::vector<uint64_t> released;  // sizes, in order
  std::set<uint64_t> liveHandles;
  uint64_t nextHandle = 1;
};
FakeDriver* gFake = nullptr;

// Handles encode their size in the high bits, so that a release says what it gives back.
CUresult fakeCreate(CUmemGenericAllocationHandle* handle, size_t bytes, const CUmemAllocationProp*,
                    unsigned long long) {
  if (bytes > gFake->deviceFree) return CUDA_ERROR_OUT_OF_MEMORY;
  gFake->deviceFree -= bytes;
  gFake->creates++;
  *handle = (static_cast<uint64_t>(bytes) << 20) | gFake->nextHandle++;
  gFake->liveHandles.insert(*handle);
  return CUDA_SUCCESS;
}
CUresult fakeRelease(CUmemGenericAllocationHandle handle) {
  const uint64_t bytes = handle >> 20;
  gFake->deviceFree += bytes;
  gFake->releases++;
  gFake->released.push_back(bytes);
  gFake->liveHandles.erase(handle);
  return CUDA_SUCCESS;
}
CUresult fakeHostAlloc(void** host, size_t bytes, unsigned) {
  if (gFake->refuseHost) return CUDA_ERROR_OUT_OF_MEMORY;
  gFake->hostAllocs++;
  *host = std::malloc(bytes);
  return CUDA_SUCCESS;
}
CUresult fakeEventCreate(CUevent* event, unsigned) {
  gFake->eventCreates++;
  *event = reinterpret_cast<CUevent>(static_cast<uintptr_t>(0x1000 + 16 * gFake->eventCreates));
  return CUDA_SUCCESS;
}

class Pools : public ::testing::Test {
 protected:
  void SetUp() override {
    gFake = &fake;
    api.cuMemCreate = fakeCreate;
    api.cuMemRelease = fakeRelease;
    api.cuMemHostAlloc = fakeHostAlloc;
    api.cuEventCreate = fakeEventCreate;
  }
  void TearDown() override { gFake = nullptr; }
  FakeDriver fake;
  DriverApi api;
};

constexpr uint64_t kMiB = 1 << 20;

TEST_F(Pools, PhysicalMemoryIsReusedBySizeAndCountsAsTheDevices) {
  fake.deviceFree = 64 * kMiB;
  PhysicalPool pool(api);
  CUmemGenericAllocationHandle a = 0, b = 0, c = 0;
  ASSERT_EQ(pool.acquire(4 * kMiB, &a), CUDA_SUCCESS);
  ASSERT_EQ(pool.acquire(8 * kMiB, &b), CUDA_SUCCESS);
  EXPECT_EQ(fake.creates, 2);
  pool.release(4 * kMiB, a);
  pool.release(8 * kMiB, b);
  EXPECT_EQ(pool.bytes(), 12 * kMiB);
  EXPECT_EQ(fake.releases, 0);  // kept, not given back
  ASSERT_EQ(pool.acquire(4 * kMiB, &c), CUDA_SUCCESS);
  EXPECT_EQ(c, a);  // the same size comes from the pool
  EXPECT_EQ(fake.creates, 2);
  EXPECT_EQ(pool.bytes(), 8 * kMiB);
  EXPECT_FALSE(pool.takeExact(2 * kMiB, &c));
  EXPECT_TRUE(pool.takeExact(8 * kMiB, &c));
  EXPECT_EQ(c, b);
  EXPECT_EQ(pool.bytes(), 0u);
}

TEST_F(Pools, TrimGivesTheLargestBackFirstAndOnlyWhatIsAsked) {
  fake.deviceFree = 64 * kMiB;
  PhysicalPool pool(api);
  for (uint64_t mib : {2, 16, 4, 8}) {
    CUmemGenericAllocationHandle h = 0;
    ASSERT_EQ(pool.acquire(mib * kMiB, &h), CUDA_SUCCESS);
    pool.release(mib * kMiB, h);
  }
  pool.trim(10 * kMiB);  // 16 alone is enough
  EXPECT_EQ(fake.released, (std::vector<uint64_t>{16 * kMiB}));
  pool.trim(9 * kMiB);  // 8, then 4
  EXPECT_EQ(fake.released, (std::vector<uint64_t>{16 * kMiB, 8 * kMiB, 4 * kMiB}));
  EXPECT_EQ(pool.bytes(), 2 * kMiB);
  pool.trim(UINT64_MAX);
  EXPECT_EQ(pool.bytes(), 0u);
  EXPECT_TRUE(fake.liveHandles.empty());
}

TEST_F(Pools, AFullDeviceGetsThePoolBackBeforeTheDriverIsAskedAgain) {
  fake.deviceFree = 24 * kMiB;
  PhysicalPool pool(api);
  CUmemGenericAllocationHandle a = 0, b = 0, c = 0;
  ASSERT_EQ(pool.acquire(16 * kMiB, &a), CUDA_SUCCESS);
  ASSERT_EQ(pool.acquire(8 * kMiB, &b), CUDA_SUCCESS);
  pool.release(16 * kMiB, a);  // the device is full; 16 MiB sit in the pool
  EXPECT_EQ(pool.acquire(12 * kMiB, &c), CUDA_SUCCESS);  // refused, pool trimmed, asked again
  EXPECT_EQ(fake.releases, 1);
  EXPECT_EQ(pool.bytes(), 0u);
  // Out of memory with nothing pooled: the driver's answer, no retry.
  const int creates = fake.creates;
  EXPECT_EQ(pool.acquire(32 * kMiB, &c), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(fake.creates, creates);
}

TEST_F(Pools, HostMemoryIsPinnedUpToTheLimitThenPageableAndCounted) {
  HostPool host(api, 8 * kMiB);
  bool pinned = false;
  void* a = host.take(4 * kMiB, &pinned);
  ASSERT_NE(a, nullptr);
  EXPECT_TRUE(pinned);
  void* b = host.take(4 * kMiB, &pinned);
  EXPECT_TRUE(pinned);
  EXPECT_EQ(host.pinnedBytes(), 8 * kMiB);
  void* c = host.take(1 * kMiB, &pinned);  // past the limit
  ASSERT_NE(c, nullptr);
  EXPECT_FALSE(pinned);
  EXPECT_EQ(host.pageableFallbacks(), 1u);
  host.give(c, 1 * kMiB, false);  // freed
  host.give(a, 4 * kMiB, true);   // kept for the next of its size
  void* again = host.take(4 * kMiB, &pinned);
  EXPECT_EQ(again, a);
  EXPECT_TRUE(pinned);
  EXPECT_EQ(fake.hostAllocs, 2);
  // The system refusing pinned memory under the limit: pageable as well.
  HostPool refused(api, 64 * kMiB);
  fake.refuseHost = true;
  void* d = refused.take(2 * kMiB, &pinned);
  ASSERT_NE(d, nullptr);
  EXPECT_FALSE(pinned);
  EXPECT_EQ(refused.pageableFallbacks(), 1u);
  refused.give(d, 2 * kMiB, false);
  std::free(again);
  std::free(b);
}

TEST_F(Pools, PinnedBlocksComeInClassesThatBuffersOfNearSizesShare) {
  // Classes: every multiple of 2 MiB up to 16 MiB, then four per doubling.
  for (uint64_t mib = 2; mib <= 16; mib += 2)
    EXPECT_EQ(HostPool::blockBytes(mib * kMiB), mib * kMiB);
  EXPECT_EQ(HostPool::blockBytes(18 * kMiB), 20 * kMiB);
  EXPECT_EQ(HostPool::blockBytes(33 * kMiB), 40 * kMiB);
  EXPECT_EQ(HostPool::blockBytes(64 * kMiB), 64 * kMiB);
  for (uint64_t bytes : {uint64_t{1}, uint64_t{4097}, 3 * kMiB + 1, 100 * kMiB, 5000 * kMiB}) {
    const uint64_t block = HostPool::blockBytes(bytes);
    EXPECT_GE(block, bytes);
    EXPECT_LE(block, bytes + bytes / 4 + 1) << bytes;
    EXPECT_EQ(HostPool::blockBytes(block), block) << bytes;
  }
  HostPool host(api, 64 * kMiB);
  bool pinned = false;
  void* a = host.take(18 * kMiB, &pinned);
  ASSERT_NE(a, nullptr);
  EXPECT_TRUE(pinned);
  EXPECT_EQ(host.pinnedBytes(), 20 * kMiB);  // the limit counts what was pinned
  host.give(a, 18 * kMiB, true);
  EXPECT_EQ(host.take(20 * kMiB, &pinned), a);  // another size of the same class
  EXPECT_EQ(fake.hostAllocs, 1);
  void* b = host.take(22 * kMiB, &pinned);  // the next class: a block of its own
  EXPECT_NE(b, a);
  EXPECT_EQ(fake.hostAllocs, 2);
  std::free(a);
  std::free(b);
}

TEST_F(Pools, EventsAreMadeOnceAndReused) {
  EventPool events(api);
  CUevent a = events.take();
  CUevent b = events.take();
  ASSERT_NE(a, nullptr);
  EXPECT_NE(a, b);
  events.give(a);
  events.give(nullptr);  // ignored
  EXPECT_EQ(events.spare(), 1u);
  EXPECT_EQ(events.take(), a);
  EXPECT_EQ(fake.eventCreates, 2);
}

}  // namespace
}  // namespace delta::shim
