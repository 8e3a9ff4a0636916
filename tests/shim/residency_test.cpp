// The residency manager against a fake driver (tests/common/fake_driver.h): the launch path's
// written rules (residency.h) checked by counting what reaches the driver; holds: a buffer a
// prepared launch holds is never evicted, and the eviction takes the next victim instead; ids:
// the same allocations get the same ids in every iteration (the policy learns by id); launch
// marks, freed memory taken over in stream order, and a chain of drops regenerated in budget.
#include "shim/residency.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <memory>
#include <thread>
#include <vector>

#include "policy/delta_policy.h"
#include "policy/lru_policy.h"
#include "policy/policy_factory.h"
#include "tests/common/fake_driver.h"

namespace delta::shim {
namespace {

using testing::fakeDriver;
using testing::fakeDriverLog;

constexpr uint64_t kBuffer = 2ull << 20;  // one granule
const WorkInfo kWork{WorkInfo::Kind::kKernel, "test_kernel", {1, 1, 1}, {1, 1, 1}};
const CUstream kStream = reinterpret_cast<CUstream>(uintptr_t(0x5100));

std::unique_ptr<Residency> residencyWith(std::unique_ptr<policy::Policy> policy, uint64_t budget,
                                        bool prefetch = false) {
  ResidencyConfig residencyConfig;
  residencyConfig.budgetBytes = budget;
  residencyConfig.hostLimitBytes = 1ull << 30;
  residencyConfig.prefetch = prefetch;  // off unless asked: what moves is what the tests make move
  return std::make_unique<Residency>(fakeDriver(), residencyConfig, std::move(policy), kBuffer);
}

std::unique_ptr<Residency> residencyFor(uint64_t budget, const char* policy = "lru") {
  policy::PolicyConfig config;
  config.max_buffers = 1u << 18;  // as the shim configures it
  policy::PolicyResult made = policy::makePolicy(policy, config);
  EXPECT_EQ(made.error, "");
  return residencyWith(std::move(made.policy), budget);
}

std::vector<CUdeviceptr> allocate(Residency& r, int count) {
  std::vector<CUdeviceptr> buffers;
  for (int i = 0; i < count; ++i) {
    CUdeviceptr address = 0;
    EXPECT_EQ(r.allocate(kBuffer, &address), CUDA_SUCCESS);
    buffers.push_back(address);
  }
  return buffers;
}

// A kernel launch's prepare() with these buffers as its pointer parameters.
CUresult prepare(Residency& r, CUstream stream, const std::vector<CUdeviceptr>& buffers) {
  std::vector<uint64_t> pointers(buffers.begin(), buffers.end());
  Residency::Touch touch;
  touch.pointers = pointers.data();
  touch.pointerCount = pointers.size();
  touch.kind = UseKind::kKernel;
  return r.prepare(stream, false, &touch, 1, kWork);
}

bool copiedOut(CUdeviceptr address) {
  auto& out = fakeDriverLog().copiedOut;
  return std::find(out.begin(), out.end(), address) != out.end();
}

TEST(ResidencyLaunchPath, WhenNothingMovesNoDriverCall) {
  auto r = residencyFor(1ull << 40);
  const std::vector<CUdeviceptr> buffers = allocate(*r, 8);
  fakeDriverLog().reset(true);
  for (int i = 0; i < 100; ++i) {
    ASSERT_EQ(prepare(*r, kStream, buffers), CUDA_SUCCESS);
    r->releaseHeld();
  }
  EXPECT_EQ(fakeDriverLog().calls, 0u);
}

TEST(ResidencyLaunchPath, ADefaultStreamLaunchRecordsOneFenceNotOneEventPerBuffer) {
  auto r = residencyFor(1ull << 40);
  const std::vector<CUdeviceptr> buffers = allocate(*r, 8);
  fakeDriverLog().reset(true);
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(prepare(*r, CU_STREAM_PER_THREAD, buffers), CUDA_SUCCESS);
    r->releaseHeld();
  }
  ASSERT_EQ(fakeDriverLog().eventRecords, 3u);  // one per launch, after it
  for (const auto& [event, stream] : fakeDriverLog().recorded) {
    EXPECT_EQ(stream, CU_STREAM_PER_THREAD);
    EXPECT_EQ(event, fakeDriverLog().recorded.front().first);  // the thread's one fence
  }
}

TEST(ResidencyLaunchPath, AnotherThreadsDefaultStreamUseIsWaitedForThroughItsFence) {
  // Only the using thread can name its default stream: evicting its buffer from another
  // thread waits for that thread's fence on the eviction stream.
  auto r = residencyFor(4 * kBuffer);
  const std::vector<CUdeviceptr> buffers = allocate(*r, 4);
  fakeDriverLog().reset(true);
  std::thread user([&] {
    ASSERT_EQ(prepare(*r, CU_STREAM_PER_THREAD, {buffers[0]}), CUDA_SUCCESS);
    r->releaseHeld();
  });
  user.join();
  ASSERT_EQ(fakeDriverLog().recorded.size(), 1u);
  const CUevent fence = fakeDriverLog().recorded[0].first;
  // Least recently used: buffers[1..3] were used when allocated, buffers[0] after them, so
  // touch the others again to make buffers[0] the victim.
  ASSERT_EQ(prepare(*r, kStream, {buffers[1], buffers[2], buffers[3]}), CUDA_SUCCESS);
  r->releaseHeld();
  CUdeviceptr extra = 0;
  ASSERT_EQ(r->allocate(kBuffer, &extra), CUDA_SUCCESS);
  ASSERT_TRUE(copiedOut(buffers[0]));
  const auto& waited = fakeDriverLog().waited;
  EXPECT_TRUE(std::any_of(waited.begin(), waited.end(), [&](const auto& w) { return w.second == fence; }));
}

TEST(ResidencyEvictionInFlight, WorkThatMayWriteALeavingBufferWaitsOnItsStreamForTheCopy) {
  // Delta learns a loop over six buffers under a budget of four; once memory has been short it
  // evicts ahead of the next launches. With the copies out held in flight (the fake's events
  // stay pending until a host wait), a kernel that touches a buffer evicted ahead calls its
  // eviction off and waits for the copy on its own stream; the host does not wait. Launches
  // are 2 ms apart: a 2 MiB copy at the policy's first estimate of the link (12 GB/s) takes
  // about 0.2 ms, so some buffers' next uses lie beyond what room ahead must cover.
  auto r = residencyFor(4 * kBuffer, "delta");
  const std::vector<CUdeviceptr> b = allocate(*r, 6);
  fakeDriverLog().reset(true);
  fakeDriverLog().eventsPending = true;
  CUdeviceptr leaving = 0;
  for (int iteration = 0; iteration < 8 && leaving == 0; ++iteration) {
    r->markIteration();
    for (CUdeviceptr buffer : b) {
      const uint64_t ahead = r->stats().evictionsAhead;
      const size_t copies = fakeDriverLog().copiedOut.size();
      ASSERT_EQ(prepare(*r, kStream, {buffer}), CUDA_SUCCESS);
      r->releaseHeld();
      // Evicted ahead after this launch: the last copy out is that eviction's.
      if (r->stats().evictionsAhead > ahead && fakeDriverLog().copiedOut.size() > copies) {
        leaving = fakeDriverLog().copiedOut.back();
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  ASSERT_NE(leaving, 0u) << "no eviction ahead: the test needs one in flight";
  const uint64_t cancelled = r->stats().cancelledEvictions;
  const size_t waitsBefore = fakeDriverLog().waited.size();
  ASSERT_EQ(prepare(*r, kStream, {leaving}), CUDA_SUCCESS);  // a kernel: it may write
  r->releaseHeld();
  EXPECT_EQ(r->stats().cancelledEvictions, cancelled + 1);
  const auto& waited = fakeDriverLog().waited;
  EXPECT_TRUE(std::any_of(waited.begin() + static_cast<std::ptrdiff_t>(waitsBefore), waited.end(),
                          [](const auto& w) { return w.first == kStream; }))
      << "the kernel's stream did not wait for the copy out";
  fakeDriverLog().eventsPending = false;
}

int regenerateNothing(void*, void*, size_t, void*) { return 0; }

// `count` buffers, each registered as recomputable, in a loop `r`'s policy learns, the
// eviction batches held in flight (the fake's events pending until a host wait), until one
// buffer is evicted ahead; that one (0: none).
CUdeviceptr evictedAheadOfALearnedLoop(Residency& r, int count) {
  const std::vector<CUdeviceptr> b = allocate(r, count);
  RecomputeHook hook;
  hook.kind = RecomputeHook::Kind::kCallback;
  hook.callback = regenerateNothing;
  hook.estimateNs = 1000;
  for (CUdeviceptr buffer : b) EXPECT_EQ(r.setRecompute(buffer, hook), 0);
  fakeDriverLog().reset(true);
  fakeDriverLog().eventsPending = true;
  for (int iteration = 0; iteration < 8; ++iteration) {
    r.markIteration();
    for (CUdeviceptr buffer : b) {
      const uint64_t ahead = r.stats().evictionsAhead;
      EXPECT_EQ(prepare(r, kStream, {buffer}), CUDA_SUCCESS);
      r.releaseHeld();
      if (r.stats().evictionsAhead > ahead) {
        for (CUdeviceptr other : b)
          if (other != buffer && r.isLeaving(other)) return other;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  return 0;
}

TEST(ResidencyEvictionInFlight, UnregisteringABufferWhoseSwapIsInFlightLetsTheSwapGoOn) {
  // A swap in flight needs no recipe: unregistering its buffer (delta-play does so when the
  // program frees a result others' recipes still keep) lets it go on. It was called off, as a
  // drop in flight must be (without the recipe nothing could bring that one back): the copy
  // was wasted and the buffer had to be evicted again. Loops of 6 buffers under 4 and 5 under 3.
  for (const auto& [count, budget] : {std::pair{6, 4}, std::pair{5, 3}}) {
    SCOPED_TRACE(count);
    auto r = residencyFor(static_cast<uint64_t>(budget) * kBuffer, "swap-only");
    const CUdeviceptr leaving = evictedAheadOfALearnedLoop(*r, count);
    ASSERT_NE(leaving, 0u) << "no eviction ahead: the test needs one in flight";
    ASSERT_TRUE(copiedOut(leaving));
    const uint64_t cancelled = r->stats().cancelledEvictions;
    EXPECT_EQ(r->clearRecompute(leaving), 0);
    EXPECT_EQ(r->stats().cancelledEvictions, cancelled);
    EXPECT_TRUE(r->isLeaving(leaving));
    fakeDriverLog().eventsPending = false;
    // Its batch done, the next allocation that needs room takes its memory: gone to the host,
    // and its next use brings it back.
    allocate(*r, 1);
    EXPECT_FALSE(r->isLeaving(leaving));
    const uint64_t restores = r->stats().restores;
    ASSERT_EQ(prepare(*r, kStream, {leaving}), CUDA_SUCCESS);
    r->releaseHeld();
    EXPECT_EQ(r->stats().restores, restores + 1);
    EXPECT_EQ(r->isDropped(leaving), 0);
    EXPECT_EQ(fakeDriverLog().badMappings, 0u) << "restored where its old mapping still was";
  }
}

TEST(ResidencyHolds, AHeldBufferIsPassedOverAndTheNextVictimTaken) {
  auto r = residencyFor(4 * kBuffer);
  const std::vector<CUdeviceptr> b = allocate(*r, 4);
  // b[0] and b[1] are used first, then b[2] and b[3]: least recently used, b[0] and b[1] would
  // go first, but the first launch is still being enqueued and holds them.
  ASSERT_EQ(prepare(*r, kStream, {b[0], b[1]}), CUDA_SUCCESS);  // held until its release
  std::thread other([&] {
    ASSERT_EQ(prepare(*r, kStream, {b[2], b[3]}), CUDA_SUCCESS);
    r->releaseHeld();
  });
  other.join();
  fakeDriverLog().reset(true);
  std::thread allocator([&] {
    CUdeviceptr extra = 0;
    ASSERT_EQ(r->allocate(kBuffer, &extra), CUDA_SUCCESS);
  });
  allocator.join();
  EXPECT_FALSE(copiedOut(b[0]));
  EXPECT_FALSE(copiedOut(b[1]));
  EXPECT_TRUE(copiedOut(b[2]));  // the next least recently used
  EXPECT_EQ(r->stats().overBudgetAllocations, 0u);
  // Released: they may go now, least recently used first.
  r->releaseHeld();
  fakeDriverLog().reset(true);
  CUdeviceptr another = 0;
  ASSERT_EQ(r->allocate(kBuffer, &another), CUDA_SUCCESS);
  EXPECT_TRUE(copiedOut(b[0]));
  EXPECT_EQ(r->stats().overBudgetAllocations, 0u);
}

TEST(ResidencyHolds, AHoldEndingWhileTheBatchRecordsItsEventsKeepsItsBufferOut) {
  // b[0] and b[1] are the least recently used, both on kStream; b[1] is held by a launch
  // another thread is enqueuing. That launch reaches its stream and releases its hold while the
  // eviction records the event that b[0]'s copy waits for: an event recorded before the launch,
  // which must not be taken to cover b[1] (it was, once: b[1] was unmapped under the launch).
  auto r = residencyFor(4 * kBuffer);
  const std::vector<CUdeviceptr> b = allocate(*r, 4);
  for (CUdeviceptr buffer : b) {
    ASSERT_EQ(prepare(*r, kStream, {buffer}), CUDA_SUCCESS);
    r->releaseHeld();
  }
  std::mutex m;
  std::condition_variable changed;
  bool prepared = false, release = false, released = false;
  std::thread launcher([&] {
    EXPECT_EQ(prepare(*r, kStream, {b[1]}), CUDA_SUCCESS);
    std::unique_lock lock(m);
    prepared = true;
    changed.notify_all();
    changed.wait(lock, [&] { return release; });
    r->releaseHeld();  // the launch is in its stream now, after the event being recorded
    released = true;
    changed.notify_all();
  });
  {
    std::unique_lock lock(m);
    changed.wait(lock, [&] { return prepared; });
  }
  // b[1] was just used again: make b[0] and b[1] the least recent once more.
  for (CUdeviceptr buffer : {b[2], b[3]}) {
    ASSERT_EQ(prepare(*r, kStream, {buffer}), CUDA_SUCCESS);
    r->releaseHeld();
  }
  fakeDriverLog().reset(true);
  fakeDriverLog().onEventRecord = [&](CUstream stream) {
    if (stream != kStream) return;
    std::unique_lock lock(m);
    if (release) return;
    release = true;
    changed.notify_all();
    changed.wait(lock, [&] { return released; });
  };
  CUdeviceptr extra = 0;
  ASSERT_EQ(r->allocate(2 * kBuffer, &extra), CUDA_SUCCESS);
  launcher.join();
  fakeDriverLog().onEventRecord = nullptr;
  EXPECT_TRUE(release) << "no event was recorded on the launches' stream";
  EXPECT_TRUE(copiedOut(b[0]));
  EXPECT_FALSE(copiedOut(b[1])) << "evicted behind an event recorded before its last launch";
  EXPECT_EQ(r->stats().overBudgetAllocations, 0u);
}

TEST(ResidencyHolds, WhenEverythingIsHeldTheAllocationGoesOverBudgetAndSaysSo) {
  auto r = residencyFor(2 * kBuffer);
  const std::vector<CUdeviceptr> b = allocate(*r, 2);
  ASSERT_EQ(prepare(*r, kStream, b), CUDA_SUCCESS);
  fakeDriverLog().reset(true);
  CUdeviceptr extra = 0;
  ASSERT_EQ(r->allocate(kBuffer, &extra), CUDA_SUCCESS);  // not strict: over budget, counted
  EXPECT_FALSE(copiedOut(b[0]) || copiedOut(b[1]));  // (the link probe's copy is its own memory)
  EXPECT_EQ(r->stats().overBudgetAllocations, 1u);
  r->releaseHeld();
}

TEST(ResidencyMarks, OnceMemoryWasShortAnEvictionWaitsForTheVictimsLastLaunchNotTheTail) {
  // Memory short once (a fifth buffer under a budget of four); from then on each launch on a
  // program's stream is followed by its own mark. The victim's last use is the first of four
  // launches: its copy out waits for that launch's mark, and the eviction records nothing on
  // the program's stream (an event recorded there now would stand for all four launches, and
  // a host needing the room would wait for the device to drain its queue).
  auto r = residencyFor(4 * kBuffer);
  const std::vector<CUdeviceptr> b = allocate(*r, 4);
  CUdeviceptr fifth = 0;
  ASSERT_EQ(r->allocate(kBuffer, &fifth), CUDA_SUCCESS);
  ASSERT_EQ(r->stats().evictions + r->stats().cleanEvictions, 1u);
  fakeDriverLog().reset(true);
  for (CUdeviceptr buffer : {b[1], b[2], b[3], fifth}) {
    ASSERT_EQ(prepare(*r, kStream, {buffer}), CUDA_SUCCESS);
    r->releaseHeld();
  }
  ASSERT_EQ(fakeDriverLog().recorded.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(fakeDriverLog().recorded[i].second, kStream);
    for (size_t j = 0; j < i; ++j)
      EXPECT_NE(fakeDriverLog().recorded[i].first, fakeDriverLog().recorded[j].first);
  }
  const CUevent firstMark = fakeDriverLog().recorded[0].first;
  CUdeviceptr sixth = 0;
  ASSERT_EQ(r->allocate(kBuffer, &sixth), CUDA_SUCCESS);
  ASSERT_TRUE(copiedOut(b[1]));  // least recently used
  const auto& waited = fakeDriverLog().waited;
  EXPECT_TRUE(std::any_of(waited.begin(), waited.end(), [&](const auto& w) { return w.second == firstMark; }))
      << "the copy out did not wait for the victim's last launch";
  const auto& recorded = fakeDriverLog().recorded;
  EXPECT_EQ(std::count_if(recorded.begin(), recorded.end(), [](const auto& e) { return e.second == kStream; }), 4)
      << "the eviction recorded an event at the tail of the program's stream";
  // Never short: no marks (ResidencyLaunchPath.WhenNothingMovesNoDriverCall).
}

// An lru that wants the device's times and keeps what it is told of them.
class TimedLru : public policy::LruPolicy {
 public:
  using LruPolicy::LruPolicy;
  bool wantsLaunchTimes() const override { return true; }
  void onLaunchTimed(uint64_t launch, int64_t start, int64_t end, bool gapIsWaits) override {
    timed.push_back({launch, start, end, gapIsWaits});
  }
  struct Timed {
    uint64_t launch;
    int64_t start, end;
    bool gapIsWaits;
  };
  std::vector<Timed> timed;
};

// The fake device runs everything in the order recorded, 1 ms per record.
void runInRecordOrder() {
  fakeDriverLog().eventTimeMs = [](CUevent event) {
    const auto& recorded = fakeDriverLog().recorded;
    for (size_t i = recorded.size(); i-- > 0;)
      if (recorded[i].first == event) return static_cast<double>(i);
    return -1.0;
  };
}

TEST(ResidencyMarks, OnceShortThePolicyLearnsWhenEachLaunchRanOnTheDeviceAndPassedMarksAreNotWaitedFor) {
  for (int launches : {3, 40, 1100}) {  // 1100: more than a ring of marks, read as they pass
    SCOPED_TRACE(launches);
    auto owned = std::make_unique<TimedLru>(policy::PolicyConfig{});
    TimedLru* policy = owned.get();
    auto residency = residencyWith(std::move(owned), 4 * kBuffer);
    Residency& r = *residency;
    const std::vector<CUdeviceptr> b = allocate(r, 4);
    fakeDriverLog().reset(true);
    // A launch's start and its mark are consecutive records: 1 ms apart.
    runInRecordOrder();
    CUdeviceptr fifth = 0;
    ASSERT_EQ(r.allocate(kBuffer, &fifth), CUDA_SUCCESS);  // short from here on
    const CUdeviceptr cycle[] = {b[1], b[2], b[3], fifth};
    fakeDriverLog().eventsPending = true;  // the device runs behind: nothing passed yet
    for (int i = 0; i < launches; ++i) {
      ASSERT_EQ(prepare(r, kStream, {cycle[i % 4]}), CUDA_SUCCESS);
      r.releaseHeld();
    }
    EXPECT_TRUE(policy->timed.empty());
    fakeDriverLog().eventsPending = false;  // it caught up: the next launch reads the marks
    ASSERT_EQ(prepare(r, kStream, {cycle[launches % 4]}), CUDA_SUCCESS);
    r.releaseHeld();
    // The marks of a ring overwritten before they were read are lost, the rest reported in order.
    const size_t expected = std::min<size_t>(launches, Residency::kMarkSlots - 1);
    ASSERT_EQ(policy->timed.size(), expected);
    for (size_t k = 0; k < expected; ++k) {
      const auto& t = policy->timed[k];
      EXPECT_EQ(t.launch, launches - expected + k);
      EXPECT_EQ(t.end - t.start, 1'000'000) << k;  // the start's record to the mark's
      if (k > 0) {
        EXPECT_EQ(t.end - policy->timed[k - 1].end, 2'000'000) << k;
      }
    }
    // Evicting a buffer whose last launch has passed (the least recently used of the four)
    // waits for nothing on the device.
    const size_t waitsBefore = fakeDriverLog().waited.size();
    CUdeviceptr sixth = 0;
    ASSERT_EQ(r.allocate(kBuffer, &sixth), CUDA_SUCCESS);
    EXPECT_EQ(r.stats().evictions + r.stats().cleanEvictions, 2u);
    EXPECT_EQ(fakeDriverLog().waited.size(), waitsBefore) << "the eviction waited for a mark that had passed";
    fakeDriverLog().reset(false);
  }
}

TEST(ResidencyMarks, ALaunchAfterWorkThePolicyIsNotToldOfIsReportedWithAGapThatIsNotAllWaiting) {
  // Work on no managed buffer is not the policy's launch and has no mark, but it runs on the
  // device before the next marked launch: the time before that one's start is partly its run,
  // and the planner must not take it for waiting (the LSTM's small-buffer launches).
  for (int every : {2, 3, 5}) {
    SCOPED_TRACE(every);
    auto owned = std::make_unique<TimedLru>(policy::PolicyConfig{});
    TimedLru* policy = owned.get();
    auto residency = residencyWith(std::move(owned), 4 * kBuffer);
    Residency& r = *residency;
    const std::vector<CUdeviceptr> b = allocate(r, 4);
    fakeDriverLog().reset(true);
    runInRecordOrder();
    // Unseen before it is short: nothing is marked yet, and that is not held against the first
    // marked launch.
    const CUdeviceptr unmanaged = 0x1000;
    ASSERT_EQ(prepare(r, kStream, {unmanaged}), CUDA_SUCCESS);
    r.releaseHeld();
    CUdeviceptr fifth = 0;
    ASSERT_EQ(r.allocate(kBuffer, &fifth), CUDA_SUCCESS);  // short from here on
    const CUdeviceptr cycle[] = {b[1], b[2], b[3], fifth};
    constexpr int kLaunches = 30;
    for (int i = 0; i < kLaunches; ++i) {
      if (i % every == every - 1) {
        ASSERT_EQ(prepare(r, kStream, {unmanaged}), CUDA_SUCCESS);
        r.releaseHeld();
      }
      ASSERT_EQ(prepare(r, kStream, {cycle[i % 4]}), CUDA_SUCCESS);
      r.releaseHeld();
    }
    ASSERT_EQ(prepare(r, kStream, {cycle[0]}), CUDA_SUCCESS);  // reads the marks
    r.releaseHeld();
    ASSERT_GE(policy->timed.size(), static_cast<size_t>(kLaunches));
    for (const auto& t : policy->timed) {
      // The launches are the policy's 0, 1, ...: its own count, unseen work not in it.
      const auto i = static_cast<int>(t.launch);
      if (i >= kLaunches) continue;
      EXPECT_EQ(t.gapIsWaits, i % every != every - 1) << i;
    }
    fakeDriverLog().reset(false);
  }
}

TEST(ResidencyMarks, ALaunchIsTimedFromAfterTheRoomItsHostMadeAhead) {
  // The start event follows the host's own work for the launch (room made ahead here, whose
  // evictions record events and enqueue copies): recorded before it, a device that had caught
  // up would count the host's time there as the launch's run, which the planner replays as
  // compute.
  class AheadLru : public TimedLru {
   public:
    using TimedLru::TimedLru;
    std::uint64_t upcomingBytes(std::int64_t now_ns, std::int64_t& need_at_ns) const override {
      need_at_ns = now_ns + 1'000'000'000;
      return need;
    }
    std::uint64_t need = 0;
  };
  for (int ahead : {1, 2}) {
    SCOPED_TRACE(ahead);
    auto owned = std::make_unique<AheadLru>(policy::PolicyConfig{});
    AheadLru* policy = owned.get();
    auto residency = residencyWith(std::move(owned), 8 * kBuffer);
    Residency& r = *residency;
    const std::vector<CUdeviceptr> b = allocate(r, 8);
    fakeDriverLog().reset(true);
    runInRecordOrder();
    CUdeviceptr ninth = 0;
    ASSERT_EQ(r.allocate(kBuffer, &ninth), CUDA_SUCCESS);  // short from here on
    for (int i = 1; i < 8; ++i) {  // marked uses, passed: the device keeps up
      ASSERT_EQ(prepare(r, kStream, {b[i]}), CUDA_SUCCESS);
      r.releaseHeld();
    }
    const uint64_t before = r.stats().evictionsAhead;
    policy->need = static_cast<uint64_t>(ahead) * kBuffer;
    ASSERT_EQ(prepare(r, kStream, {ninth}), CUDA_SUCCESS);
    r.releaseHeld();
    policy->need = 0;
    ASSERT_GT(r.stats().evictionsAhead, before) << "no room made ahead: nothing to time around";
    ASSERT_EQ(prepare(r, kStream, {b[7]}), CUDA_SUCCESS);  // reads the marks
    r.releaseHeld();
    ASSERT_FALSE(policy->timed.empty());
    for (const auto& t : policy->timed) EXPECT_EQ(t.end - t.start, 1'000'000) << t.launch;
    fakeDriverLog().reset(false);
  }
}

TEST(ResidencyMarks, AVictimTheDeviceIsDoneWithGoesBeforeOneThatWorkQueuedAheadStillUses) {
  // The host runs ahead of the device. A victim that work still queued uses gives its memory
  // back only when the device gets there, and a host that needs the room waits that long; one
  // whose uses have passed costs only its copy. Two streams: the device is stuck behind a long
  // kernel on one (none of its marks passes) and has caught up with the other.
  auto residency = residencyWith(std::make_unique<TimedLru>(policy::PolicyConfig{}), 4 * kBuffer);
  Residency& r = *residency;
  const std::vector<CUdeviceptr> b = allocate(r, 4);
  CUdeviceptr fifth = 0;
  ASSERT_EQ(r.allocate(kBuffer, &fifth), CUDA_SUCCESS);  // short from here on (b[0] goes)
  fakeDriverLog().reset(true);
  const CUstream busy = reinterpret_cast<CUstream>(uintptr_t(0x5200));
  // Pending: what was recorded last on the busy stream.
  fakeDriverLog().eventPending = [busy](CUevent event) {
    const auto& recorded = fakeDriverLog().recorded;
    for (size_t i = recorded.size(); i-- > 0;)
      if (recorded[i].first == event) return recorded[i].second == busy;
    return false;
  };
  auto launch = [&](CUstream stream, CUdeviceptr buffer) {
    ASSERT_EQ(prepare(r, stream, {buffer}), CUDA_SUCCESS);
    r.releaseHeld();
  };
  launch(busy, b[1]);  // least recently used from here: lru's first choice
  for (CUdeviceptr buffer : {b[2], b[3], fifth, fifth}) launch(kStream, buffer);  // the last reads the marks
  // The eviction stream waited for work on the busy stream: for an event recorded there.
  auto waitedForBusy = [busy] {
    const auto& waited = fakeDriverLog().waited;
    const auto& recorded = fakeDriverLog().recorded;
    return std::any_of(waited.begin(), waited.end(), [&](const auto& w) {
      return std::find(recorded.begin(), recorded.end(), std::make_pair(w.second, busy)) != recorded.end();
    });
  };
  CUdeviceptr sixth = 0;
  ASSERT_EQ(r.allocate(kBuffer, &sixth), CUDA_SUCCESS);
  EXPECT_TRUE(copiedOut(b[2])) << "the next least recently used, done with on the device";
  EXPECT_FALSE(copiedOut(b[1])) << "a victim the device has not reached was taken first";
  EXPECT_FALSE(waitedForBusy());
  EXPECT_EQ(r.stats().stallNs, 0u);

  // Every buffer used on the busy stream since: none is done with, and one goes all the same
  // (the least recently used), its copy out behind its last launch.
  for (CUdeviceptr buffer : {b[3], fifth, sixth}) launch(busy, buffer);
  CUdeviceptr seventh = 0;
  ASSERT_EQ(r.allocate(kBuffer, &seventh), CUDA_SUCCESS);
  EXPECT_TRUE(copiedOut(b[1]));
  EXPECT_TRUE(waitedForBusy()) << "the copy out did not wait for the victim's last launch";
  EXPECT_FALSE(copiedOut(b[3]) || copiedOut(fifth) || copiedOut(sixth));
  fakeDriverLog().reset(false);
}

TEST(ResidencyMarks, RoomIsMadeAheadOnlyWithVictimsTheDeviceIsDoneWith) {
  // Delta, told the device's times as the shim tells it, learns a loop over six buffers under a
  // budget of four. While the device runs behind (no mark passes), nothing is evicted ahead: a
  // copy out queued behind work the device has not reached would hold every later copy, urgent
  // ones too. Launches that need room still get it, by evictions on demand, in budget. (Before
  // this rule the same loop evicted 12 buffers ahead.)
  policy::PolicyConfig config;
  config.max_buffers = 1u << 18;
  config.timed_launches = true;
  policy::PolicyResult made = policy::makePolicy("delta", config);
  ASSERT_EQ(made.error, "");
  auto r = residencyWith(std::move(made.policy), 4 * kBuffer);
  const std::vector<CUdeviceptr> b = allocate(*r, 6);
  fakeDriverLog().reset(true);
  fakeDriverLog().eventsPending = true;
  for (int iteration = 0; iteration < 6; ++iteration) {
    r->markIteration();
    for (CUdeviceptr buffer : b) {
      ASSERT_EQ(prepare(*r, kStream, {buffer}), CUDA_SUCCESS);
      r->releaseHeld();
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  EXPECT_GT(r->stats().evictions + r->stats().cleanEvictions, 10u);
  EXPECT_EQ(r->stats().evictionsAhead, 0u);
  EXPECT_LE(r->stats().peakDeviceBytes, 4 * kBuffer);
  fakeDriverLog().reset(false);
}

TEST(ResidencyCosts, WhatTheLinkGivesEachWayIsMeasuredFromTheCopiesTimed) {
  // The policy starts from 12 GB/s each way. The fake device takes 1 ms per copy of a 2 MiB
  // buffer (2.1 GB/s) out and back, whether the buffer is restored on demand or prefetched:
  // both estimates move towards it, each from its own direction's copies.
  for (bool prefetch : {false, true}) {
    SCOPED_TRACE(prefetch);
    auto owned = std::make_unique<policy::LruPolicy>(policy::PolicyConfig{});
    const policy::Policy* policy = owned.get();
    auto residency = residencyWith(std::move(owned), 4 * kBuffer, prefetch);
    Residency& r = *residency;
    const std::vector<CUdeviceptr> b = allocate(r, 4);
    fakeDriverLog().reset(false);
    const double start = policy->costs().bytesPerNs(policy::Direction::kHostToDevice);
    ASSERT_EQ(start, 12.0);
    for (int round = 0; round < 20; ++round) {  // each buffer in turn: one evicted, one restored
      for (CUdeviceptr buffer : b) {
        ASSERT_EQ(prepare(r, kStream, {buffer}), CUDA_SUCCESS);
        r.releaseHeld();
      }
      CUdeviceptr extra = 0;
      ASSERT_EQ(r.allocate(kBuffer, &extra), CUDA_SUCCESS);
      ASSERT_EQ(prepare(r, kStream, {extra}), CUDA_SUCCESS);
      r.releaseHeld();
      ASSERT_TRUE(r.free(extra));
    }
    ASSERT_GT(r.stats().restores, 10u);
    const double linkBytesPerNs = static_cast<double>(kBuffer) / 1e6;
    EXPECT_NEAR(policy->costs().bytesPerNs(policy::Direction::kHostToDevice), linkBytesPerNs, 0.5);
    EXPECT_NEAR(policy->costs().bytesPerNs(policy::Direction::kDeviceToHost), linkBytesPerNs, 0.5);
  }
}

TEST(ResidencyCosts, TheLinkIsProbedOnceWhenMemoryFirstRunsShortBeforeAnyCopyIsTimed) {
  // Before anything is swapped the policy would price every swap, and plan, by its 12 GB/s
  // seed. The first shortage copies a few MiB in and out, once, timed; the fake device takes
  // 1 ms per copy. The probe's memory is written once before its timing begins: a fresh
  // handle's first write is not the link (on cudasim its page faults made a run that only
  // dropped price every swap 4.5 times too high).
  for (int shortages : {1, 3}) {
    auto owned = std::make_unique<policy::LruPolicy>(policy::PolicyConfig{});
    const policy::Policy* policy = owned.get();
    auto residency = residencyWith(std::move(owned), 4 * kBuffer);
    Residency& r = *residency;
    const std::vector<CUdeviceptr> b = allocate(r, 4);
    fakeDriverLog().reset(true);
    std::vector<uint64_t> copiesInAtRecord;
    fakeDriverLog().onEventRecord = [&](CUstream) {
      copiesInAtRecord.push_back(fakeDriverLog().copiesIn.load());
    };
    ASSERT_EQ(policy->costs().bytesPerNs(policy::Direction::kHostToDevice), 12.0);
    for (int i = 0; i < shortages; ++i) {
      CUdeviceptr more = 0;
      ASSERT_EQ(r.allocate(kBuffer, &more), CUDA_SUCCESS);
      ASSERT_EQ(prepare(r, kStream, {more}), CUDA_SUCCESS);  // reads what the device timed
      r.releaseHeld();
    }
    EXPECT_EQ(fakeDriverLog().copiesIn, 2u) << "the probe's memory written, one probe in, and nothing restored";
    ASSERT_FALSE(copiesInAtRecord.empty());
    EXPECT_EQ(copiesInAtRecord.front(), 1u) << "the probe's timing began before its memory was written";
    const uint64_t copiesOut = fakeDriverLog().copiesOut;
    EXPECT_EQ(copiesOut, 1u + static_cast<uint64_t>(r.stats().evictions)) << "one probe out, and the evictions'";
    const double probed = static_cast<double>(8ull << 20) / 1e6;  // 8 MiB in 1 ms
    EXPECT_NEAR(policy->costs().bytesPerNs(policy::Direction::kHostToDevice), probed, 1e-6);
    EXPECT_LT(policy->costs().bytesPerNs(policy::Direction::kDeviceToHost), 12.0);
    fakeDriverLog().reset(false);
  }
}

TEST(ResidencyQuarantine, WhenShortAFreedBuffersMemoryGoesToTheNextAllocationAfterItsLastUse) {
  // A buffer freed while its last launch is still queued (the fake's work stays in flight):
  // under a full budget, the next allocation of its size takes it over at once, its address
  // and memory as they are mapped (no map, access or unmap call), with no copy out and no host
  // wait, and its first use on another stream waits on the device for an event recorded
  // behind that last launch on its stream.
  auto r = residencyFor(4 * kBuffer);
  const std::vector<CUdeviceptr> b = allocate(*r, 4);
  fakeDriverLog().reset(true);
  fakeDriverLog().eventsPending = true;
  ASSERT_EQ(prepare(*r, kStream, {b[0]}), CUDA_SUCCESS);
  r->releaseHeld();
  ASSERT_TRUE(r->free(b[0]));
  const size_t recordsBefore = fakeDriverLog().recorded.size();
  CUdeviceptr fresh = 0;
  ASSERT_EQ(r->allocate(kBuffer, &fresh), CUDA_SUCCESS);
  EXPECT_EQ(r->stats().adoptedFrees, 1u);
  EXPECT_EQ(fresh, b[0]) << "taken over at a new address: mapped again, where the old one still is";
  EXPECT_TRUE(fakeDriverLog().mapped.empty());
  EXPECT_TRUE(fakeDriverLog().unmapped.empty());
  EXPECT_EQ(fakeDriverLog().copiesOut, 0u);
  EXPECT_EQ(r->stats().stallNs, 0u);
  EXPECT_EQ(r->stats().overBudgetAllocations, 0u);
  ASSERT_GT(fakeDriverLog().recorded.size(), recordsBefore);
  const auto [after, onStream] = fakeDriverLog().recorded.back();
  EXPECT_EQ(onStream, kStream);
  const CUstream other = reinterpret_cast<CUstream>(uintptr_t(0x5200));
  ASSERT_EQ(prepare(*r, other, {fresh}), CUDA_SUCCESS);
  r->releaseHeld();
  const auto& waited = fakeDriverLog().waited;
  EXPECT_TRUE(std::any_of(waited.begin(), waited.end(),
                          [&](const auto& w) { return w.first == other && w.second == after; }))
      << "the new buffer's first use on another stream did not wait for the freed one's last";
  EXPECT_EQ(fakeDriverLog().badMappings, 0u) << "mapped where a mapping was";
  fakeDriverLog().eventsPending = false;
  // Not short: a free's memory waits in quarantine, nothing is taken over.
  auto roomy = residencyFor(64 * kBuffer);
  const std::vector<CUdeviceptr> c = allocate(*roomy, 2);
  fakeDriverLog().eventsPending = true;
  ASSERT_EQ(prepare(*roomy, kStream, {c[0]}), CUDA_SUCCESS);
  roomy->releaseHeld();
  ASSERT_TRUE(roomy->free(c[0]));
  ASSERT_EQ(roomy->allocate(kBuffer, &fresh), CUDA_SUCCESS);
  EXPECT_EQ(roomy->stats().adoptedFrees, 0u);
  fakeDriverLog().eventsPending = false;
}

TEST(ResidencyQuarantine, ATakenOverBufferLeavesOrIsFreedOnlyAfterTheFreedOnesLastUse) {
  // The buffer taken over shares its address and memory with the freed one, whose last launch
  // is still queued: evicted, or freed and taken over again, before any use of its own, what
  // unmaps or reuses that memory waits on the device for the event behind that launch (a
  // new address used to keep the old mapping; now only the ordering does). Buffers of one and
  // of three granules.
  for (uint64_t granules : {1ull, 3ull}) {
    for (bool freedAgain : {false, true}) {
      SCOPED_TRACE(::testing::Message() << granules << " granules, freed again " << freedAgain);
      const uint64_t size = granules * kBuffer;
      auto r = residencyFor(4 * size);
      std::vector<CUdeviceptr> b(4);
      for (CUdeviceptr& address : b) ASSERT_EQ(r->allocate(size, &address), CUDA_SUCCESS);
      fakeDriverLog().reset(true);
      fakeDriverLog().eventsPending = true;
      ASSERT_EQ(prepare(*r, kStream, {b[0]}), CUDA_SUCCESS);
      r->releaseHeld();
      ASSERT_TRUE(r->free(b[0]));
      CUdeviceptr taken = 0;
      ASSERT_EQ(r->allocate(size, &taken), CUDA_SUCCESS);
      ASSERT_EQ(taken, b[0]);
      const CUevent after = fakeDriverLog().recorded.back().first;
      auto waitedFor = [&](CUevent event) {
        const auto& waited = fakeDriverLog().waited;
        return std::any_of(waited.begin(), waited.end(), [&](const auto& w) { return w.second == event; });
      };
      ASSERT_FALSE(waitedFor(after));
      if (freedAgain) {
        ASSERT_TRUE(r->free(taken));
        CUdeviceptr again = 0;
        ASSERT_EQ(r->allocate(size, &again), CUDA_SUCCESS);
        EXPECT_EQ(again, taken);
        EXPECT_EQ(r->stats().adoptedFrees, 2u);
        EXPECT_TRUE(waitedFor(after)) << "taken over again before the first freed buffer's last use";
      } else {
        for (size_t i = 1; i < b.size(); ++i) {  // used since: LRU's victim is the one taken over
          ASSERT_EQ(prepare(*r, kStream, {b[i]}), CUDA_SUCCESS);
          r->releaseHeld();
        }
        CUdeviceptr more = 0;
        ASSERT_EQ(r->allocate(size, &more), CUDA_SUCCESS);
        ASSERT_TRUE(copiedOut(taken)) << "LRU did not evict the buffer taken over";
        EXPECT_TRUE(waitedFor(after)) << "its copy out and unmapping were not ordered after the freed buffer's last use";
      }
      EXPECT_EQ(fakeDriverLog().badMappings, 0u);
      fakeDriverLog().eventsPending = false;
    }
  }
}

TEST(ResidencyQuarantine, ATakenOverBuffersHostBlockWaitsForItsLastUseWithoutTheHost) {
  // A buffer that was evicted and restored keeps its host block. Freed with its last launch
  // still queued and taken over, its memory and address go to the new buffer at once, but the
  // block stays its own until that launch passes (a copy it stands for may still use it): the
  // next copy out goes elsewhere. And the host, needing room, does not wait for what holds no
  // device memory any more. Five and six buffers evicted after it: the host pool's lower
  // blocks are taken first, so it takes that many to reach the freed block's place.
  for (int evictions : {5, 6}) {
    SCOPED_TRACE(evictions);
    auto r = residencyFor(4 * kBuffer);
    const std::vector<CUdeviceptr> b = allocate(*r, 4);
    fakeDriverLog().reset(true);
    for (size_t i = 1; i < 4; ++i) {  // b[0] is LRU's first victim
      ASSERT_EQ(prepare(*r, kStream, {b[i]}), CUDA_SUCCESS);
      r->releaseHeld();
    }
    CUdeviceptr extra = 0;
    ASSERT_EQ(r->allocate(kBuffer, &extra), CUDA_SUCCESS);
    const auto& from = fakeDriverLog().copiedOut;
    const auto at = std::find(from.begin(), from.end(), b[0]);
    ASSERT_NE(at, from.end()) << "b[0] was not evicted";
    void* block = fakeDriverLog().copiedOutTo[static_cast<size_t>(at - from.begin())];
    ASSERT_EQ(prepare(*r, kStream, {b[0]}), CUDA_SUCCESS);  // restored: keeps its block
    r->releaseHeld();
    fakeDriverLog().eventsPending = true;
    const size_t recordsBefore = fakeDriverLog().recorded.size();
    ASSERT_TRUE(r->free(b[0]));
    std::vector<CUevent> lastUse;
    for (size_t i = recordsBefore; i < fakeDriverLog().recorded.size(); ++i)
      lastUse.push_back(fakeDriverLog().recorded[i].first);
    ASSERT_FALSE(lastUse.empty());
    CUdeviceptr taken = 0;
    ASSERT_EQ(r->allocate(kBuffer, &taken), CUDA_SUCCESS);
    ASSERT_EQ(taken, b[0]);
    ASSERT_EQ(r->stats().adoptedFrees, 1u);
    const size_t copiesBefore = fakeDriverLog().copiedOutTo.size();
    for (int e = 0; e < evictions; ++e) {
      CUdeviceptr more = 0;
      ASSERT_EQ(r->allocate(kBuffer, &more), CUDA_SUCCESS);
    }
    const auto& to = fakeDriverLog().copiedOutTo;
    ASSERT_GT(to.size(), copiesBefore) << "nothing was copied out";
    for (size_t i = copiesBefore; i < to.size(); ++i)
      EXPECT_NE(to[i], block) << "a copy out went to the freed buffer's host block while its launch was queued";
    const auto& waited = fakeDriverLog().synchronized;
    for (CUevent event : lastUse)
      EXPECT_EQ(std::count(waited.begin(), waited.end(), event), 0)
          << "the host waited for a freed buffer that holds no device memory";
    fakeDriverLog().eventsPending = false;
  }
}

TEST(ResidencyQuarantine, AFreedBufferTheDeviceIsDoneWithIsReusedAsItIsMappedForItsSize) {
  // Never short: a freed buffer whose work has passed keeps its address and memory mapped, and
  // the next allocation of its size takes both as they are (no map, unmap or access call: the
  // Transformer as played, never short, ran 1.5 % slower for them on cudasim). One of another
  // size, or one whose work is still queued, is not taken. Sizes of one and three granules.
  for (uint64_t granules : {1ull, 3ull}) {
    SCOPED_TRACE(granules);
    const uint64_t size = granules * kBuffer;
    auto r = residencyFor(64 * kBuffer);
    CUdeviceptr first = 0;
    ASSERT_EQ(r->allocate(size, &first), CUDA_SUCCESS);
    fakeDriverLog().reset(true);
    ASSERT_EQ(prepare(*r, kStream, {first}), CUDA_SUCCESS);
    r->releaseHeld();
    ASSERT_TRUE(r->free(first));
    CUdeviceptr other = 0;
    ASSERT_EQ(r->allocate(size + kBuffer, &other), CUDA_SUCCESS);
    EXPECT_NE(other, first);
    EXPECT_EQ(r->stats().reusedFrees, 0u);
    const uint64_t callsBefore = fakeDriverLog().calls;
    CUdeviceptr again = 0;
    ASSERT_EQ(r->allocate(size, &again), CUDA_SUCCESS);
    EXPECT_EQ(again, first);
    EXPECT_EQ(r->stats().reusedFrees, 1u);
    // Its one event asked about, nothing mapped.
    EXPECT_LE(fakeDriverLog().calls - callsBefore, 1u);
    // Used and freed with its work still queued: not taken, a new buffer instead.
    fakeDriverLog().eventsPending = true;
    ASSERT_EQ(prepare(*r, kStream, {again}), CUDA_SUCCESS);
    r->releaseHeld();
    ASSERT_TRUE(r->free(again));
    CUdeviceptr fresh = 0;
    ASSERT_EQ(r->allocate(size, &fresh), CUDA_SUCCESS);
    EXPECT_NE(fresh, again);
    EXPECT_EQ(r->stats().reusedFrees, 1u);
    fakeDriverLog().eventsPending = false;
    EXPECT_EQ(r->stats().overBudgetAllocations, 0u);
  }
}

TEST(ResidencyQuarantine, AHostThatNeedsRoomWaitsForTheOldestFreesOnly) {
  // Two buffers of two granules freed with their work still in flight; an allocation of one
  // granule (no freed buffer of its size to take over) needs one granule back: the host waits
  // for the older free only. The newer one is still there for the next allocation of its
  // size to take over; had the host waited for every free, there would be nothing to take.
  auto r = residencyFor(6 * kBuffer);
  std::vector<CUdeviceptr> big;
  for (int i = 0; i < 3; ++i) {
    CUdeviceptr address = 0;
    ASSERT_EQ(r->allocate(2 * kBuffer, &address), CUDA_SUCCESS);
    big.push_back(address);
  }
  fakeDriverLog().reset(true);
  fakeDriverLog().eventsPending = true;
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(prepare(*r, kStream, {big[i]}), CUDA_SUCCESS);
    r->releaseHeld();
    ASSERT_TRUE(r->free(big[i]));
  }
  CUdeviceptr small = 0;
  ASSERT_EQ(r->allocate(kBuffer, &small), CUDA_SUCCESS);
  EXPECT_EQ(r->stats().adoptedFrees, 0u);
  EXPECT_EQ(fakeDriverLog().copiesOut, 0u);
  CUdeviceptr again = 0;
  ASSERT_EQ(r->allocate(2 * kBuffer, &again), CUDA_SUCCESS);
  EXPECT_EQ(r->stats().adoptedFrees, 1u) << "the newer free was waited for too";
  EXPECT_EQ(fakeDriverLog().copiesOut, 0u);
  EXPECT_EQ(r->stats().overBudgetAllocations, 0u);
  fakeDriverLog().eventsPending = false;
}

TEST(ResidencyQuarantine, RoomTakesFromFreedBuffersOnlyWhatItNeedsTheRestStaysMapped) {
  // Two freed buffers the device is done with, of two units and then of one; an allocation of
  // three units needs two back: the older one is unmapped, the newer stays as it is, and the
  // next allocation of its size takes it with its address. Unmapping it too would have cost
  // that allocation a new mapping. Units of one and three granules.
  for (uint64_t granules : {1ull, 3ull}) {
    SCOPED_TRACE(granules);
    const uint64_t unit = granules * kBuffer;
    const uint64_t othersHeld = fakeDriverLog().heldBytes;  // by the tests before
    auto r = residencyFor(7 * unit);
    CUdeviceptr one = 0, two = 0, three = 0;
    ASSERT_EQ(r->allocate(unit, &one), CUDA_SUCCESS);
    ASSERT_EQ(r->allocate(2 * unit, &two), CUDA_SUCCESS);
    ASSERT_EQ(r->allocate(3 * unit, &three), CUDA_SUCCESS);
    fakeDriverLog().reset(true);
    for (CUdeviceptr address : {one, two, three}) {
      ASSERT_EQ(prepare(*r, kStream, {address}), CUDA_SUCCESS);
      r->releaseHeld();
    }
    ASSERT_TRUE(r->free(two));
    ASSERT_TRUE(r->free(one));
    CUdeviceptr big = 0;
    ASSERT_EQ(r->allocate(3 * unit, &big), CUDA_SUCCESS);
    EXPECT_EQ(fakeDriverLog().unmapped.count(two), 1u);
    EXPECT_EQ(fakeDriverLog().unmapped.count(one), 0u) << "unmapped though not needed";
    const uint64_t reused = r->stats().reusedFrees;
    CUdeviceptr again = 0;
    ASSERT_EQ(r->allocate(unit, &again), CUDA_SUCCESS);
    EXPECT_EQ(again, one);
    EXPECT_EQ(r->stats().reusedFrees, reused + 1);
    EXPECT_EQ(r->stats().overBudgetAllocations, 0u);
    EXPECT_LE(fakeDriverLog().peakHeldBytes - othersHeld, 7 * unit);
    fakeDriverLog().reset(false);
  }
}

TEST(ResidencyPool, AVictimsMemoryGoesToTheNextBufferOfItsSizeAsItIs) {
  // Short of memory, each allocation evicts a buffer of its size: once the victim's copy is
  // out, its physical memory is the new buffer's, with no cuMemCreate or cuMemRelease (a
  // caching allocator's reuse), and what the process holds on the device stays within the
  // budget. An allocation of twice the size gives the pooled memory of the wrong size back to
  // the device first, and only then asks for its own. Sizes of one and three granules.
  for (uint64_t granules : {1ull, 3ull}) {
    SCOPED_TRACE(granules);
    const uint64_t size = granules * kBuffer;
    const uint64_t budget = 4 * size;
    const uint64_t othersHeld = fakeDriverLog().heldBytes;  // by the tests before
    auto r = residencyFor(budget);
    auto allocateAndUse = [&](uint64_t bytes) {
      CUdeviceptr address = 0;
      ASSERT_EQ(r->allocate(bytes, &address), CUDA_SUCCESS);
      ASSERT_EQ(prepare(*r, kStream, {address}), CUDA_SUCCESS);
      r->releaseHeld();
    };
    // Past the first shortages: the first probes the link with memory of its own, given back
    // once its copies are timed.
    for (int i = 0; i < 6; ++i) allocateAndUse(size);
    fakeDriverLog().reset(true);
    const Stats before = r->stats();
    for (int i = 0; i < 6; ++i) allocateAndUse(size);
    const Stats after = r->stats();
    EXPECT_EQ(after.evictions - before.evictions, 6u);
    EXPECT_EQ(after.physicalCreates, before.physicalCreates);
    EXPECT_EQ(after.physicalReleases, before.physicalReleases);
    EXPECT_LE(fakeDriverLog().peakHeldBytes - othersHeld, budget);
    allocateAndUse(2 * size);
    const Stats last = r->stats();
    EXPECT_EQ(last.evictions - after.evictions, 2u);
    EXPECT_EQ(last.physicalReleases - after.physicalReleases, 2u);
    EXPECT_EQ(last.physicalCreates - after.physicalCreates, 1u);
    EXPECT_LE(fakeDriverLog().peakHeldBytes - othersHeld, budget);
    EXPECT_EQ(last.overBudgetAllocations, 0u);
    EXPECT_EQ(last.overBudgetLaunches, 0u);
    fakeDriverLog().reset(false);
  }
}

// LRU, and the prefetches a test names (by the order of allocation), each asked for once.
class NamedPrefetches : public policy::LruPolicy {
 public:
  using LruPolicy::LruPolicy;
  void onAlloc(policy::BufferId id, uint64_t bytes, int64_t now) override {
    ids.push_back(id);
    LruPolicy::onAlloc(id, bytes, now);
  }
  size_t choosePrefetches(const policy::PrefetchRequest&, std::span<policy::Prefetch> out) override {
    size_t count = 0;
    for (size_t allocation : wanted)
      if (count < out.size()) out[count++].id = ids[allocation];
    wanted.clear();
    return count;
  }
  std::vector<policy::BufferId> ids;
  std::vector<size_t> wanted;
};

TEST(ResidencyPool, APrefetchFindsRoomInFreedMemoryTheDeviceIsDoneWith) {
  // A buffer of two units is evicted; one unit of the budget is free, and a freed buffer of
  // one unit whose work has passed holds another (kept mapped for an allocation of its size).
  // The prefetch takes that unit back from it and goes ahead, and what the process holds on
  // the device stays within the budget. Units of one and three granules.
  for (uint64_t granules : {1ull, 3ull}) {
    SCOPED_TRACE(granules);
    const uint64_t unit = granules * kBuffer;
    const uint64_t othersHeld = fakeDriverLog().heldBytes;  // by the tests before
    const uint64_t budget = 6 * unit;
    auto owned = std::make_unique<NamedPrefetches>(policy::PolicyConfig{});
    NamedPrefetches& policy = *owned;
    auto r = residencyWith(std::move(owned), budget, /*prefetch=*/true);
    std::vector<CUdeviceptr> b(5);
    const uint64_t sizes[] = {2 * unit, unit, unit, unit, unit};
    for (int i = 0; i < 5; ++i) {  // the first is used first: the least recently used
      ASSERT_EQ(r->allocate(sizes[i], &b[i]), CUDA_SUCCESS);
      ASSERT_EQ(prepare(*r, kStream, {b[i]}), CUDA_SUCCESS);
      r->releaseHeld();
    }
    CUdeviceptr freed = 0;
    ASSERT_EQ(r->allocate(unit, &freed), CUDA_SUCCESS);
    ASSERT_EQ(r->stats().evictions, 1u);
    ASSERT_EQ(prepare(*r, kStream, {freed}), CUDA_SUCCESS);
    r->releaseHeld();
    ASSERT_TRUE(r->free(freed));
    // The first shortage probed the link with memory of its own: given back once timed.
    for (int i = 0; i < 3; ++i) {
      ASSERT_EQ(prepare(*r, kStream, {b[4]}), CUDA_SUCCESS);
      r->releaseHeld();
    }
    fakeDriverLog().reset(true);
    policy.wanted = {0};
    ASSERT_EQ(prepare(*r, kStream, {b[4]}), CUDA_SUCCESS);
    r->releaseHeld();
    EXPECT_EQ(r->stats().prefetches, 1u);
    EXPECT_EQ(fakeDriverLog().copiedIn.size(), 1u);
    EXPECT_EQ(fakeDriverLog().unmapped.count(freed), 1u);
    EXPECT_LE(fakeDriverLog().peakHeldBytes - othersHeld, budget);
    EXPECT_EQ(r->stats().overBudgetAllocations, 0u);
    fakeDriverLog().reset(false);
  }
}

// A chain of results, each computed from the one before; the first is an input (never
// dropped). The callback of each re-runs its producer: one launch over its input and itself.
struct ChainLink {
  Residency* residency;
  CUdeviceptr input;
  CUdeviceptr output;
  bool opaque = false;  // the producer's launch cannot be analysed: it "touches" every buffer
};

int rerunProducer(void* context, void*, size_t, void* stream) {
  const auto& link = *static_cast<const ChainLink*>(context);
  const CUresult prepared =
      link.opaque ? link.residency->prepareEverything(static_cast<CUstream>(stream), false)
                  : prepare(*link.residency, static_cast<CUstream>(stream), {link.input, link.output});
  if (prepared != CUDA_SUCCESS) return -1;
  link.residency->releaseHeld();
  return 0;
}

// Computes an input and `length` results after it, each registered as recomputable by
// re-running its producer (estimated at 1 us); x[0] is the input.
struct Chain {
  std::vector<CUdeviceptr> x;
  std::vector<std::unique_ptr<ChainLink>> links;
};
void computeChain(Residency& r, int length, Chain& chain) {
  chain.x = allocate(r, 1);
  ASSERT_EQ(prepare(r, kStream, {chain.x[0]}), CUDA_SUCCESS);
  r.releaseHeld();
  for (int k = 1; k <= length; ++k) {
    chain.x.push_back(allocate(r, 1)[0]);
    ASSERT_EQ(prepare(r, kStream, {chain.x[k - 1], chain.x[k]}), CUDA_SUCCESS);
    r.releaseHeld();
    chain.links.push_back(std::make_unique<ChainLink>(ChainLink{&r, chain.x[k - 1], chain.x[k]}));
    RecomputeHook hook;
    hook.kind = RecomputeHook::Kind::kCallback;
    hook.callback = rerunProducer;
    hook.context = chain.links.back().get();
    hook.estimateNs = 1000;
    ASSERT_EQ(r.setRecompute(chain.x[k], hook), 0);
  }
}

TEST(ResidencyRecompute, AChainOfDroppedResultsIsRegeneratedWithinTheBudget) {
  // Seven to nine results under a budget of four buffers: most are dropped as the chain is
  // computed. Reading the last dropped one regenerates it and the dropped ones before it, each
  // from the one before.
  // Each result gets its memory when its producer runs, its input there already, and what the
  // chain has passed may be dropped again: never more than input, output and the input of
  // the chain resident. Mapped before their callbacks ran, they would all be resident at once
  // beside the input: over the budget.
  for (int seed = 0; seed < 3; ++seed) {
    SCOPED_TRACE(seed);
    auto r = residencyFor(4 * kBuffer, "recompute-only");
    const int length = 7 + seed;
    Chain chain;
    ASSERT_NO_FATAL_FAILURE(computeChain(*r, length, chain));
    const std::vector<CUdeviceptr>& x = chain.x;
    // The last dropped result, and how many dropped ones lead to it.
    int last = length;
    while (last > 0 && r->isDropped(x[last]) != 1) --last;
    int run = 0;
    while (last - run > 0 && r->isDropped(x[last - run]) == 1) ++run;
    ASSERT_GE(run, 3) << "the chain was not dropped";
    const uint64_t recomputes = r->stats().recomputes;
    ASSERT_EQ(prepare(*r, kStream, {x[last]}), CUDA_SUCCESS);
    r->releaseHeld();
    EXPECT_EQ(r->stats().recomputes - recomputes, static_cast<uint64_t>(run));
    EXPECT_EQ(r->stats().recomputeFailures, 0u);
    EXPECT_EQ(r->stats().overBudgetLaunches, 0u);
    EXPECT_EQ(r->stats().overBudgetAllocations, 0u);
    EXPECT_LE(r->stats().peakResidentBytes, 4 * kBuffer);
  }
}

TEST(ResidencyRecompute, WorkThatCannotBeAnalysedRegeneratesEveryDroppedResultWithoutNesting) {
  // Dropped results whose producers' launches cannot be analysed, then work that cannot be
  // analysed either: it needs every dropped result, and each regeneration's own launch "touches"
  // every buffer too. Nested into one another, each would need every other pending one first,
  // until the depth limit failed a call (an H200 run of opaque launches crashed so). Instead
  // the opaque work takes the pending results' memory and the outer regeneration fills them,
  // oldest first: one level, every result back, no failure.
  for (int length : {9, 80}) {  // 80: more than the nesting limit (64) would allow
    SCOPED_TRACE(length);
    auto r = residencyFor(4 * kBuffer, "recompute-only");
    Chain chain;
    ASSERT_NO_FATAL_FAILURE(computeChain(*r, length, chain));
    for (auto& link : chain.links) link->opaque = true;
    int dropped = 0;
    for (int k = 1; k <= length; ++k) dropped += r->isDropped(chain.x[static_cast<size_t>(k)]) == 1;
    ASSERT_GE(dropped, 3) << "the chain was not dropped";
    const uint64_t recomputes = r->stats().recomputes;
    EXPECT_EQ(r->prepareEverything(kStream, false), CUDA_SUCCESS);
    r->releaseHeld();
    EXPECT_EQ(r->stats().recomputes - recomputes, static_cast<uint64_t>(dropped));
    EXPECT_EQ(r->stats().recomputeFailures, 0u);
    for (int k = 1; k <= length; ++k) EXPECT_EQ(r->isDropped(chain.x[static_cast<size_t>(k)]), 0) << k;
  }
}

// Notes each wait it is told of, how many launches it had seen then, and the buffer's
// recompute and restore times as it then priced them.
template <class Base>
class WaitsRecorded : public Base {
 public:
  using Base::Base;
  void onWaited(policy::BufferId id, std::int64_t ns) override {
    Base::onWaited(id, ns);
    const policy::BufferState& buffer = this->buffers()[id];
    waits.push_back({id, ns, buffer.recompute_ns,
                     this->costs().transferNs(policy::Direction::kHostToDevice, buffer.bytes), launches});
  }
  void onLaunch(const policy::Launch& launch) override {
    Base::onLaunch(launch);
    ++launches;
  }
  struct Wait {
    policy::BufferId id;
    std::int64_t ns, recompute_ns, transfer_ns;
    uint64_t launchesBefore;
  };
  std::vector<Wait> waits;
  uint64_t launches = 0;
};

class WaitRecorder : public WaitsRecorded<policy::DeltaPolicy> {  // recompute-only
 public:
  WaitRecorder() : WaitsRecorded(policy::PolicyConfig{}, policy::DirectorMode::kRecomputeOnly) {}
};

// A chain of `length` results computed recompute-only under a budget of three buffers, and
// its last dropped result.
struct DroppedChain {
  WaitRecorder* policy = nullptr;
  std::unique_ptr<Residency> r;
  Chain chain;
  CUdeviceptr lastDropped = 0;
};
void computeDroppedChain(int length, DroppedChain& out) {
  auto owned = std::make_unique<WaitRecorder>();
  out.policy = owned.get();
  out.r = residencyWith(std::move(owned), 3 * kBuffer);
  ASSERT_NO_FATAL_FAILURE(computeChain(*out.r, length, out.chain));
  for (int k = length; k > 0 && out.lastDropped == 0; --k)
    if (out.r->isDropped(out.chain.x[static_cast<size_t>(k)]) == 1) out.lastDropped = out.chain.x[static_cast<size_t>(k)];
  ASSERT_NE(out.lastDropped, 0u) << "nothing was dropped";
}

TEST(ResidencyRecompute, TheWorkThatWaitsForRegenerationsIsToldTheirCostBeforeItsLaunch) {
  // The work that touches dropped results waits, on its stream, for their regeneration: the
  // policy is told each one's recompute time before that work's onLaunch, as the replay tells
  // it (untold, every drop looked free). Chains of 5 and 7 under a budget of three buffers.
  for (int length : {5, 7}) {
    SCOPED_TRACE(length);
    DroppedChain c;
    ASSERT_NO_FATAL_FAILURE(computeDroppedChain(length, c));
    WaitRecorder* policy = c.policy;
    policy->waits.clear();
    const uint64_t launchesBefore = policy->launches;
    const uint64_t recomputes = c.r->stats().recomputes;
    ASSERT_EQ(prepare(*c.r, kStream, {c.lastDropped}), CUDA_SUCCESS);
    c.r->releaseHeld();
    ASSERT_GT(c.r->stats().recomputes, recomputes);
    // The regenerations the work asked for directly (the last dropped result): told once each,
    // at their cost, before the work's own launch; those inside callbacks are theirs.
    ASSERT_EQ(policy->waits.size(), 1u);
    EXPECT_GT(policy->waits[0].ns, 0);
    EXPECT_EQ(policy->waits[0].ns, policy->waits[0].recompute_ns);
    EXPECT_EQ(policy->waits[0].launchesBefore, launchesBefore);
    EXPECT_EQ(policy->launches, launchesBefore + 1);
  }
}

TEST(ResidencyRecompute, ADroppedBufferRegeneratedBeforeItsHookGoesIsNoLaunchOfTheProgram) {
  // Unregistering a dropped result regenerates it first (the callback may not be callable
  // after). That is the shim's use, not the program's: told to the policy as a launch, it was
  // one in the iterations where the buffer happened to be dropped, and the learned iteration
  // changed shape from one to the next.
  for (int length : {5, 7}) {
    SCOPED_TRACE(length);
    DroppedChain c;
    ASSERT_NO_FATAL_FAILURE(computeDroppedChain(length, c));
    const uint64_t launches = c.policy->launches;
    const uint64_t recomputes = c.r->stats().recomputes;
    EXPECT_EQ(c.r->clearRecompute(c.lastDropped), 0);
    EXPECT_GT(c.r->stats().recomputes, recomputes);  // regenerated: its producer's launch ran
    EXPECT_EQ(c.r->isDropped(c.lastDropped), 0);
    EXPECT_EQ(c.policy->launches, launches) << "the shim's regeneration was told as a launch";
    // The program's next launch is told as ever.
    ASSERT_EQ(prepare(*c.r, kStream, {c.lastDropped}), CUDA_SUCCESS);
    c.r->releaseHeld();
    EXPECT_EQ(c.policy->launches, launches + 1);
  }
}

using SwapWaitRecorder = WaitsRecorded<policy::LruPolicy>;

TEST(ResidencyCosts, TheWorkThatWaitsForARestoreIsToldItsTransferTimeBeforeItsLaunch) {
  // A restore on demand is copied on the work's stream, ahead of it: the work stands still for
  // the whole copy, and the policy is told so before the work's onLaunch, as the replay tells
  // it. Untold, every swap closed with no wait and looked free.
  for (int count : {5, 8}) {
    SCOPED_TRACE(count);
    auto owned = std::make_unique<SwapWaitRecorder>(policy::PolicyConfig{});
    SwapWaitRecorder* policy = owned.get();
    auto residency = residencyWith(std::move(owned), 4 * kBuffer);
    Residency& r = *residency;
    const std::vector<CUdeviceptr> b = allocate(r, count);
    for (CUdeviceptr buffer : b) {
      ASSERT_EQ(prepare(r, kStream, {buffer}), CUDA_SUCCESS);
      r.releaseHeld();
    }
    ASSERT_GT(r.stats().evictions, 0u);  // lru: the first buffer, the least recently used
    policy->waits.clear();
    const uint64_t launchesBefore = policy->launches;
    const uint64_t restores = r.stats().restores;
    ASSERT_EQ(prepare(r, kStream, {b[0]}), CUDA_SUCCESS);
    r.releaseHeld();
    ASSERT_EQ(r.stats().restores, restores + 1);
    ASSERT_EQ(policy->waits.size(), 1u);
    EXPECT_EQ(policy->waits[0].ns, policy->waits[0].transfer_ns);
    EXPECT_GT(policy->waits[0].ns, 0);
    EXPECT_EQ(policy->waits[0].launchesBefore, launchesBefore);
    EXPECT_EQ(policy->launches, launchesBefore + 1);
    // A buffer still resident waits for nothing.
    policy->waits.clear();
    ASSERT_EQ(prepare(r, kStream, {b[0]}), CUDA_SUCCESS);
    r.releaseHeld();
    EXPECT_TRUE(policy->waits.empty());
  }
}

// Records the ids of each launch, per iteration, and counts the boundaries it is told of.
class RecordingPolicy : public policy::Policy {
 public:
  explicit RecordingPolicy(const policy::PolicyConfig& config) : Policy(config) {}
  std::string_view name() const override { return "recording"; }
  void onIteration(std::int64_t now_ns) override {
    Policy::onIteration(now_ns);
    ++boundaries_;
    launches_.emplace_back();
  }
  void onLaunch(const policy::Launch& launch) override {
    Policy::onLaunch(launch);
    if (!launches_.empty()) launches_.back().emplace_back(launch.buffers.begin(), launch.buffers.end());
  }
  std::uint32_t iterationBoundaries() const override { return boundaries_; }
  // Per iteration, each launch's buffer ids.
  const std::vector<std::vector<std::vector<policy::BufferId>>>& launches() const { return launches_; }

 protected:
  Rating rate(policy::BufferId, const policy::BufferState&, const policy::EvictRequest&) const override {
    return {1.0, policy::Action::kSwap, true};
  }

 private:
  std::uint32_t boundaries_ = 0;
  std::vector<std::vector<std::vector<policy::BufferId>>> launches_;
};

TEST(ResidencyIds, TheSameAllocationsGetTheSameIdsEveryIteration) {
  // A loop whose frees interleave with its allocations: b is freed before d is allocated, so
  // with ids handed back in the order buffers were freed, every iteration would name its
  // buffers differently (rotated: 0 1 2, then 1 2 0, ...) and a pattern learned by id would
  // predict nothing. Renumbered at each boundary, each iteration repeats the first.
  policy::PolicyConfig config;
  config.max_buffers = 1u << 18;
  auto owned = std::make_unique<RecordingPolicy>(config);
  RecordingPolicy* recorder = owned.get();
  ResidencyConfig residencyConfig;
  residencyConfig.budgetBytes = 64 * kBuffer;  // never short: ids are all that is looked at
  residencyConfig.hostLimitBytes = 1ull << 30;
  residencyConfig.prefetch = false;
  Residency r(fakeDriver(), residencyConfig, std::move(owned), kBuffer);
  const std::vector<CUdeviceptr> weights = allocate(r, 1);
  for (int iteration = 0; iteration < 5; ++iteration) {
    r.markIteration();
    const std::vector<CUdeviceptr> abc = allocate(r, 3);
    ASSERT_EQ(prepare(r, kStream, {weights[0], abc[0], abc[1], abc[2]}), CUDA_SUCCESS);
    r.releaseHeld();
    ASSERT_TRUE(r.free(abc[1]));
    const std::vector<CUdeviceptr> d = allocate(r, 1);
    ASSERT_EQ(prepare(r, kStream, {weights[0], abc[0], abc[2], d[0]}), CUDA_SUCCESS);
    r.releaseHeld();
    ASSERT_TRUE(r.free(abc[0]));
    ASSERT_TRUE(r.free(abc[2]));
    ASSERT_TRUE(r.free(d[0]));
  }
  const auto& launches = recorder->launches();
  ASSERT_EQ(launches.size(), 5u);
  for (size_t i = 1; i < launches.size(); ++i) {
    ASSERT_EQ(launches[i].size(), 2u);
    EXPECT_EQ(launches[i], launches[0]) << "iteration " << i << " named its buffers differently";
  }
}

// Work that cannot be analysed "touches" every buffer, so each such launch brings back all that
// was evicted. While such work keeps coming, evicting frees memory only until the next one,
// which is over the budget whatever was done before: the shim evicts under what the last one
// needed, not under the budget (all launches opaque, the LSTM at 50 % went from 0.77 s an
// iteration to 18.6 s on dropping and regenerating the same buffers), and a buffer allocated
// right after one is taken as needed by the next.
TEST(ResidencyUnanalysed, WhileSuchWorkKeepsComingNothingIsEvictedThatItWouldBringBack) {
  for (const char* policy : {"lru", "delta"}) {
    SCOPED_TRACE(policy);
    auto r = residencyFor(4 * kBuffer, policy);
    const std::vector<CUdeviceptr> b = allocate(*r, 6);  // two evicted to make room
    ASSERT_GT(r->stats().evictions, 0u);
    r->prepareEverything(kStream, false);  // every buffer back: over the budget, counted
    r->releaseHeld();
    EXPECT_EQ(r->stats().overBudgetLaunches, 1u);
    EXPECT_EQ(r->stats().unanalysedHoldBytes, 6 * kBuffer);
    fakeDriverLog().reset(true);
    const uint64_t evictions = r->stats().evictions;
    const uint64_t overAllocations = r->stats().overBudgetAllocations;
    for (int i = 0; i < 4; ++i) {
      ASSERT_EQ(prepare(*r, kStream, {b[i]}), CUDA_SUCCESS);  // analysed work in between
      r->releaseHeld();
      r->prepareEverything(kStream, false);
      r->releaseHeld();
      allocate(*r, 1);  // right after such work: the next one needs it too
    }
    EXPECT_EQ(r->stats().evictions, evictions);
    EXPECT_TRUE(fakeDriverLog().copiedOut.empty());
    EXPECT_TRUE(fakeDriverLog().copiedIn.empty());
    EXPECT_EQ(r->stats().overBudgetAllocations, overAllocations + 4);
    EXPECT_EQ(r->stats().overBudgetLaunches, 5u);  // each such launch needs more than the budget
    EXPECT_EQ(r->stats().unanalysedHoldBytes, 10 * kBuffer);
    // After analysed work, a buffer is no longer assumed needed by the next opaque launch: it
    // takes room under what the last one needed (here: evicting one).
    ASSERT_EQ(prepare(*r, kStream, {b[0]}), CUDA_SUCCESS);
    r->releaseHeld();
    allocate(*r, 1);
    EXPECT_EQ(fakeDriverLog().copiedOut.size(), 1u);
  }
}

TEST(ResidencyUnanalysed, AnAllocationRightAfterSuchWorkIsTakenAsNeededByTheNext) {
  // Such work within the budget so far: the next one will need the new buffer and every other,
  // so evicting one for it would only bring it back there.
  auto r = residencyFor(4 * kBuffer);
  const std::vector<CUdeviceptr> b = allocate(*r, 4);
  r->prepareEverything(kStream, false);
  r->releaseHeld();
  fakeDriverLog().reset(true);
  allocate(*r, 1);
  EXPECT_TRUE(fakeDriverLog().copiedOut.empty());
  EXPECT_EQ(r->stats().overBudgetAllocations, 1u);
  EXPECT_EQ(r->stats().unanalysedHoldBytes, 5 * kBuffer);
  // After analysed work, the next is not assumed to need it: held at five, the sixth evicts.
  ASSERT_EQ(prepare(*r, kStream, {b[0]}), CUDA_SUCCESS);
  r->releaseHeld();
  allocate(*r, 1);
  EXPECT_TRUE(copiedOut(b[1]));  // the least recently used (the link probe copies its own too)
}

TEST(ResidencyUnanalysed, TheBudgetBindsAgainOnceSuchWorkStopsComing) {
  auto r = residencyFor(4 * kBuffer);
  const std::vector<CUdeviceptr> b = allocate(*r, 6);
  r->prepareEverything(kStream, false);
  r->releaseHeld();
  ASSERT_EQ(r->stats().unanalysedHoldBytes, 6 * kBuffer);
  fakeDriverLog().reset(true);
  for (uint64_t i = 0; i < Residency::kUnanalysedHoldLaunches; ++i) {
    ASSERT_EQ(prepare(*r, kStream, {b[i % b.size()]}), CUDA_SUCCESS);
    r->releaseHeld();
  }
  EXPECT_TRUE(fakeDriverLog().copiedOut.empty());  // within the hold: six fit
  const uint64_t overAllocations = r->stats().overBudgetAllocations;
  allocate(*r, 1);
  EXPECT_EQ(fakeDriverLog().copiedOut.size(), 3u);  // back under the budget of four
  EXPECT_EQ(r->stats().overBudgetAllocations, overAllocations);
}

// Strict mode: no hold. Work a launch interposer prepares (failable) fails; work only CUPTI
// sees cannot be failed and runs anyway, so its buffers come back over the budget (counted),
// and a launch interposer the same call reaches later fails it.
TEST(ResidencyUnanalysed, StrictModeKeepsTheBudgetAndNeverLeavesWorkOnMissingMemory) {
  for (bool failable : {true, false}) {
    SCOPED_TRACE(failable ? "failable" : "seen by CUPTI only");
    policy::PolicyConfig config;
    config.max_buffers = 1u << 18;
    ResidencyConfig residencyConfig;
    residencyConfig.budgetBytes = 4 * kBuffer;
    residencyConfig.hostLimitBytes = 1ull << 30;
    residencyConfig.prefetch = false;
    residencyConfig.strict = true;
    Residency r(fakeDriver(), residencyConfig, policy::makePolicy("lru", config).policy, kBuffer);
    allocate(r, 5);  // one evicted
    fakeDriverLog().reset(true);
    EXPECT_FALSE(Residency::takeStrictOverrun());
    const CUresult prepared = r.prepareEverything(kStream, false, failable);
    r.releaseHeld();
    if (failable) {
      EXPECT_EQ(prepared, CUDA_ERROR_OUT_OF_MEMORY);
      EXPECT_TRUE(fakeDriverLog().copiedIn.empty());  // nothing came back
      EXPECT_FALSE(Residency::takeStrictOverrun());
      EXPECT_EQ(r.stats().overBudgetLaunches, 0u);
    } else {
      EXPECT_EQ(prepared, CUDA_SUCCESS);
      EXPECT_EQ(fakeDriverLog().copiedIn.size(), 1u);  // back, over the budget
      EXPECT_TRUE(Residency::takeStrictOverrun());
      EXPECT_FALSE(Residency::takeStrictOverrun());  // taken once
      EXPECT_EQ(r.stats().overBudgetLaunches, 1u);
    }
    fakeDriverLog().reset(true);
    allocate(r, 1);  // no hold: evicts under the budget
    EXPECT_EQ(fakeDriverLog().copiedOut.size(), failable ? 1u : 2u);
    EXPECT_EQ(r.stats().unanalysedHoldBytes, 0u);
    EXPECT_EQ(r.stats().overBudgetAllocations, 0u);
  }
}

}  // namespace
}  // namespace delta::shim
