// The residency manager's recompute: running the program's callbacks for dropped buffers,
// mapping fresh memory under them, timing them, and the public API's registrations
// (residency.h, "Recompute"). Split from residency.cpp along that job; one class.
#include <cstdlib>
#include <mutex>
#include <vector>

#include "shim/log.h"
#include "shim/reentry_guard.h"
#include "shim/residency.h"
#include "shim/residency_internal.h"

namespace delta::shim {

using detail::kMaxRecomputeDepth;
using detail::thisThread;

namespace {

// Framework-managed buffers dropped by this thread's call, told to the framework once the
// residency lock is released.
struct DropNotice {
  DropNotifier notifier;
  void* context;
  CUdeviceptr address;
  size_t bytes;
};
thread_local std::vector<DropNotice> tDropNotices;
std::mutex gDropNotifierMutex;
DropNotifier gDropNotifier = nullptr;
void* gDropNotifierContext = nullptr;

}  // namespace

void detail::queueDropNotice(CUdeviceptr address, size_t bytes) {
  std::lock_guard notifierLock(gDropNotifierMutex);
  if (gDropNotifier != nullptr)
    tDropNotices.push_back(DropNotice{gDropNotifier, gDropNotifierContext, address, bytes});
}

CUresult Residency::runRecomputes(std::vector<RecomputeCall>& calls, CUstream stream,
                                  bool perThreadStream, const char* what, uint32_t kernel) {
  // The callback's work must land where the touching work will run: a _ptsz call's stream 0
  // is this thread's default stream, which only CU_STREAM_PER_THREAD names everywhere.
  CUstream hookStream = perThreadStream ? CU_STREAM_PER_THREAD : stream;
  CUresult result = CUDA_SUCCESS;
  ++detail::recomputeDepth();
  for (const RecomputeCall& call : calls) {
    if (result != CUDA_SUCCESS) {  // an earlier one failed: the rest are not regenerated
      ReentryGuard guard;
      std::lock_guard lock(mutex_);
      Buffer& buffer = buffers_[call.id];
      if (buffer.live && buffer.serial == call.serial && buffer.pendingRegeneration)
        dropAgain(buffer);
      continue;
    }
    {
      // An earlier callback of this list may have needed this buffer and regenerated it first
      // (prepareLocked runs a pending regeneration where it is used): nothing left to do.
      std::lock_guard lock(mutex_);
      Buffer& buffer = buffers_[call.id];
      if (!buffer.live || buffer.serial != call.serial || !buffer.pendingRegeneration) continue;
      buffer.pendingRegeneration = false;
    }
    CUevent start = nullptr;
    CUevent end = nullptr;
    {
      ReentryGuard guard;
      if (api_.cuEventCreate(&start, CU_EVENT_DEFAULT) != CUDA_SUCCESS ||
          api_.cuEventRecord(start, hookStream) != CUDA_SUCCESS) {
        if (start) api_.cuEventDestroy_v2(start);
        start = nullptr;
      }
    }
    const int64_t hostStart = nowNs();
    // Outside the lock and the reentry guard: the callback's launches are prepared like any,
    // though made inside the call being prepared.
    const int status = [&] {
      ProgramCallsScope programCalls;
      return call.hook.callback(call.hook.context, reinterpret_cast<void*>(call.address),
                                call.bytes, hookStream);
    }();
    ReentryGuard guard;
    if (start != nullptr && (api_.cuEventCreate(&end, CU_EVENT_DEFAULT) != CUDA_SUCCESS ||
                             api_.cuEventRecord(end, hookStream) != CUDA_SUCCESS)) {
      if (end) api_.cuEventDestroy_v2(end);
      end = nullptr;
    }
    std::lock_guard lock(mutex_);
    Buffer& buffer = buffers_[call.id];
    const bool same = buffer.live && buffer.serial == call.serial;  // not freed by the callback
    if (status != 0) {
      stats_.recomputeFailures++;
      logLine("error: the recompute callback of the buffer at 0x%llx (%llu bytes) returned %d; "
              "%s, which needs it, fails (the buffer stays dropped)",
              (unsigned long long)call.address, (unsigned long long)call.bytes, status, what);
      // Whatever it enqueued before failing must finish before the memory goes.
      api_.cuStreamSynchronize(hookStream);
      if (same) dropAgain(buffer);
      if (start) api_.cuEventDestroy_v2(start);
      if (end) api_.cuEventDestroy_v2(end);
      result = CUDA_ERROR_UNKNOWN;
      regenerated_.notify_all();
      continue;
    }
    stats_.recomputes++;
    if (same && buffer.state == State::kDropped) {
      // The callback enqueued no work the shim saw touch the buffer, so it got no memory: the
      // work that needs it must not run on unmapped memory (its contents are the callback's
      // affair).
      DELTA_WARN_ONCE("the recompute callback of the buffer at 0x%llx (%llu bytes) enqueued no "
                      "work that touches it; it is mapped with undefined contents",
                      (unsigned long long)call.address, (unsigned long long)call.bytes);
      const uint32_t keep[] = {call.id};
      if (remap(call.id, keep) != CUDA_SUCCESS) {
        dropAgain(buffer);
        result = CUDA_ERROR_UNKNOWN;
        regenerated_.notify_all();
        if (start) api_.cuEventDestroy_v2(start);
        if (end) api_.cuEventDestroy_v2(end);
        continue;
      }
      policy_->onRestored(call.id, nowNs());
    }
    if (same) {
      buffer.regenerating = false;
      buffer.regeneratingThread = nullptr;
      buffer.hostValid = false;
      // Work on other streams waits for the regeneration as for a restore.
      events_.give(buffer.restoreEvent);
      buffer.restoreEvent = nullptr;
      CUevent ordered = events_.take();
      if (ordered != nullptr && api_.cuEventRecord(ordered, hookStream) == CUDA_SUCCESS) {
        buffer.restoreEvent = ordered;
        buffer.restoreStream = stream;
        buffer.restoreThread = perThreadStream ? thisThread() : nullptr;
      } else {
        events_.give(ordered);
        api_.cuStreamSynchronize(hookStream);
      }
      const int64_t now = nowNs();
      if (trace::TraceWriter* trace = trace_.load(std::memory_order_relaxed))
        trace->recompute(trace::RecomputeRecord{static_cast<uint64_t>(hostStart),
                                                static_cast<uint64_t>(now), call.serial,
                                                call.bytes, 0, reinterpret_cast<uint64_t>(stream),
                                                kernel, 0});
    }
    if (start != nullptr && end != nullptr)
      timings_.push_back(DeviceTiming{DeviceTiming::Kind::kRecompute, call.id, call.serial,
                                      call.hook.estimateNs, start, end,
                                      detail::recomputeDepth()});
    else if (start != nullptr)
      api_.cuEventDestroy_v2(start);
    regenerated_.notify_all();
  }
  --detail::recomputeDepth();
  if (detail::recomputeDepth() == 0) {
    std::lock_guard lock(mutex_);
    recomputeOwner_ = nullptr;
    regenerated_.notify_all();
  }
  return result;
}

CUresult Residency::remap(uint32_t id, std::span<const uint32_t> keep) {
  Buffer& buffer = buffers_[id];
  CUmemGenericAllocationHandle handle = 0;
  CUresult result = acquireOrEvict(buffer.mappedBytes, &handle, keep, 0);
  if (result != CUDA_SUCCESS) return result;
  result = mapAt(buffer.address, buffer.mappedBytes, handle);
  if (result != CUDA_SUCCESS) {
    physical_.release(buffer.mappedBytes, handle);
    return result;
  }
  buffer.handle = handle;
  buffer.state = State::kResident;
  resident_ += buffer.mappedBytes;
  notePeaks();
  return CUDA_SUCCESS;
}

void Residency::dropAgain(Buffer& buffer) {
  // A regeneration that did not happen: the memory goes back, the buffer is dropped as before
  // (after any eviction batch that still reads it).
  while (evictionMayRead(buffer)) reclaimEvictions(true);
  // Not mapped yet (its callback never got to its work): the policy never saw it back.
  const bool mapped = buffer.state == State::kResident;
  if (buffer.state == State::kResident && buffer.handle != 0) {
    api_.cuMemUnmap(buffer.address, buffer.mappedBytes);
    physical_.release(buffer.mappedBytes, buffer.handle);
    buffer.handle = 0;
    resident_ -= buffer.mappedBytes;
  }
  buffer.state = State::kDropped;
  buffer.regenerating = false;
  buffer.regeneratingThread = nullptr;
  buffer.pendingRegeneration = false;
  buffer.useCount = 0;
  buffer.manyStreams = false;
  const uint32_t id = addresses_.find(buffer.address);
  if (id != AddressMap::kNone && mapped) policy_->onEvicted(id, policy::Action::kRecompute);
}

int64_t& Residency::nestedTime(int depth) {
  const size_t at = static_cast<size_t>(std::max(depth, 0));
  if (nestedRecomputeNs_.size() <= at) nestedRecomputeNs_.resize(at + 1, 0);
  return nestedRecomputeNs_[at];
}

void Residency::pollTimings() {
  size_t done = 0;
  for (; done < timings_.size(); ++done) {
    DeviceTiming& timing = timings_[done];
    const CUresult state = api_.cuEventQuery(timing.end);
    if (state == CUDA_ERROR_NOT_READY) break;
    float ms = 0;
    if (state == CUDA_SUCCESS &&
        api_.cuEventElapsedTime_v2(&ms, timing.start, timing.end) == CUDA_SUCCESS && ms >= 0) {
      const auto measured = static_cast<int64_t>(static_cast<double>(ms) * 1e6);
      if (timing.kind == DeviceTiming::Kind::kRecompute) {
        if (timing.depth <= 1) stats_.recomputeNs += static_cast<uint64_t>(measured);
        // The policy is told what regenerating this buffer itself took: without the inputs
        // regenerated or restored inside it, which were each told their own. Charged with them,
        // a buffer would keep the price of a moment when its inputs happened to be dropped
        // (and the estimates' calibration with it), and be swapped ever after; the replay
        // prices a recompute as its own op, its dropped inputs as theirs.
        const int64_t own = measured - nestedTime(timing.depth + 1);
        nestedTime(timing.depth + 1) = 0;
        nestedTime(timing.depth) += measured;
        const Buffer& buffer = buffers_[timing.id];
        if (own > 0)
          policy_->onRecomputeMeasured(
              buffer.live && buffer.serial == timing.serial ? timing.id : policy::kNoBuffer,
              timing.estimateNs, own);
      } else {
        const auto direction = timing.kind == DeviceTiming::Kind::kProbeOut ? policy::Direction::kDeviceToHost
                                                                            : policy::Direction::kHostToDevice;
        if (timing.bytes > 0 && measured > 0) policy_->onCopyMeasured(direction, timing.bytes, measured);
        if (timing.kind == DeviceTiming::Kind::kRestoreWait || timing.kind == DeviceTiming::Kind::kRestoreCopy) {
          stats_.restoreWaitNs += static_cast<uint64_t>(measured);
          // Inside a callback: an input restored for the regeneration, its own swap's cost.
          if (timing.depth > 0) nestedTime(timing.depth + 1) += measured;
        }
      }
    }
    if (timing.kind == DeviceTiming::Kind::kRecompute && state != CUDA_SUCCESS)
      nestedTime(timing.depth + 1) = 0;  // not measured: what ran inside is not subtracted
    if (timing.kind == DeviceTiming::Kind::kRecompute) {
      api_.cuEventDestroy_v2(timing.start);
      api_.cuEventDestroy_v2(timing.end);
    } else {
      timingEvents_.give(timing.start);
      timingEvents_.give(timing.end);
    }
  }
  timings_.erase(timings_.begin(), timings_.begin() + static_cast<std::ptrdiff_t>(done));
  // The link probe's memory goes once its copies are read.
  if (probe_.mapped && !probeTimingQueued()) endLinkProbe();
}

bool Residency::hasDropNotices() { return !tDropNotices.empty(); }

void Residency::deliverDropNotices() {
  // Outside the lock: the framework's notifier may ask the shim questions.
  std::vector<DropNotice> notices;
  notices.swap(tDropNotices);
  for (const DropNotice& notice : notices)
    notice.notifier(notice.context, reinterpret_cast<void*>(notice.address), notice.bytes);
}

// ---- recompute registrations (the public API) ---------------------------------------------

int Residency::setRecompute(CUdeviceptr address, const RecomputeHook& hook) {
  std::lock_guard lock(mutex_);
  const uint32_t id = addresses_.find(address);
  // A mapping of the program's own memory holds several of its tensors, not one: never dropped.
  if (id == AddressMap::kNone || buffers_[id].program != nullptr) return -1;
  // A drop in flight needs the hook it was decided with: without one, the buffer stays. A
  // swap in flight needs no hook, and goes on.
  if (hook.kind == RecomputeHook::Kind::kNone && droppingNow(id)) cancelEviction(id, nowNs());
  buffers_[id].hook = hook;
  if (hook.kind != RecomputeHook::Kind::kNone) anyRecomputable_.store(true, std::memory_order_relaxed);
  policy_->onRecomputable(id, hook.kind == RecomputeHook::Kind::kNone ? policy::kUnknownNs
                                                                      : std::max<int64_t>(hook.estimateNs, 0));
  return 0;
}

int Residency::clearRecompute(CUdeviceptr address) {
  RecomputeHook::Kind kind;
  CUdeviceptr start;
  {
    std::lock_guard lock(mutex_);
    const uint32_t id = addresses_.find(address);
    if (id == AddressMap::kNone) return -1;
    kind = buffers_[id].hook.kind;
    start = buffers_[id].address;
    // A drop in flight would leave it without the hook that can regenerate it: it stays. A
    // swap in flight needs no hook, and goes on (calling it off would waste its copy).
    if (droppingNow(id)) cancelEviction(id, nowNs());
    if (buffers_[id].state != State::kDropped || kind != RecomputeHook::Kind::kCallback) {
      buffers_[id].hook = RecomputeHook{};
      policy_->onRecomputable(id, policy::kUnknownNs);
      return buffers_[id].state == State::kDropped ? 1 : 0;
    }
  }
  // Dropped, with a callback that may not be callable once unregistered: regenerate it now,
  // as a use on the legacy default stream would.
  Touch touch;
  touch.rangeStart = start;
  touch.rangeBytes = 1;
  touch.kind = UseKind::kRead;
  WorkInfo work;
  work.kind = WorkInfo::Kind::kOpaque;
  work.name = "delta_unregister";
  work.program = false;
  const CUresult result = prepare(nullptr, false, &touch, 1, work);
  releaseHeld();
  std::lock_guard lock(mutex_);
  const uint32_t id = addresses_.find(address);
  if (id == AddressMap::kNone) return -1;
  buffers_[id].hook = RecomputeHook{};
  policy_->onRecomputable(id, policy::kUnknownNs);
  return result == CUDA_SUCCESS ? 0 : 1;
}

int Residency::isDropped(CUdeviceptr address) {
  std::lock_guard lock(mutex_);
  const uint32_t id = addresses_.find(address);
  if (id == AddressMap::kNone) return -1;
  return buffers_[id].state == State::kDropped ? 1 : 0;
}

bool Residency::isLeaving(CUdeviceptr address) {
  std::lock_guard lock(mutex_);
  const uint32_t id = addresses_.find(address);
  return id != AddressMap::kNone && buffers_[id].evicting;
}

int Residency::beginRecompute(CUdeviceptr address) {
  NoticesAfterUnlock notices{this};
  ReentryGuard guard;
  std::lock_guard lock(mutex_);
  const uint32_t id = addresses_.find(address);
  if (id == AddressMap::kNone) return -1;
  Buffer& buffer = buffers_[id];
  if (buffer.hook.kind == RecomputeHook::Kind::kFramework) buffer.keepContents = true;
  // Leaving but intact: it stays, as the framework is about to use what it holds.
  if (buffer.evicting) cancelEviction(id, nowNs());
  if (buffer.state != State::kDropped) return 0;
  const int64_t now = nowNs();
  const std::vector<uint32_t> keep{id};
  if (makeRoom(buffer.mappedBytes, keep, now, 0, /*onePiece=*/buffer.program == nullptr) !=
      CUDA_SUCCESS)
    return -1;
  if (CUresult r = remap(id, keep); r != CUDA_SUCCESS) {
    logLine("cannot map memory to regenerate the buffer at 0x%llx (%llu bytes): %s",
            (unsigned long long)buffer.address, (unsigned long long)buffer.bytes,
            resultText(api_, r));
    return -1;
  }
  buffer.regenerating = true;
  buffer.regeneratingThread = nullptr;
  buffer.regenerateStartNs = now;
  buffer.hostValid = false;
  policy_->onRestored(id, now);
  return 1;
}

int Residency::endRecompute(CUdeviceptr address) {
  std::lock_guard lock(mutex_);
  const uint32_t id = addresses_.find(address);
  if (id == AddressMap::kNone) return -1;
  Buffer& buffer = buffers_[id];
  if (!buffer.regenerating || buffer.regeneratingThread != nullptr) return 0;
  buffer.regenerating = false;
  buffer.keepContents = true;  // the regeneration used it; the use it was regenerated for is next
  stats_.recomputes++;
  if (trace::TraceWriter* trace = trace_.load(std::memory_order_relaxed))
    trace->recompute(trace::RecomputeRecord{static_cast<uint64_t>(buffer.regenerateStartNs),
                                            static_cast<uint64_t>(nowNs()), buffer.serial,
                                            buffer.bytes, 0, 0, 0, 0});
  return 0;
}

void Residency::setDropNotifier(DropNotifier notifier, void* context) {
  std::lock_guard lock(gDropNotifierMutex);
  gDropNotifier = notifier;
  gDropNotifierContext = context;
}

}  // namespace delta::shim
