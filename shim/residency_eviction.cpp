// The residency manager's eviction and restore (Residency, residency.h): making room under the
// budget or under a device that holds less, evictions in flight on the eviction stream and their
// end, room made ahead of the next launches, and restores on the stream of the work that needs
// them. residency.cpp has the buffers' life and the launch path.
#include <algorithm>
#include <cstring>

#include "shim/log.h"
#include "shim/reentry_guard.h"
#include "shim/residency.h"
#include "shim/residency_internal.h"

namespace delta::shim {

using detail::kPreferPassedRounds;
using detail::kVictimBatch;
using detail::roundUp;
using detail::thisThread;

// ---- making room --------------------------------------------------------------------------

CUresult Residency::makeRoom(uint64_t bytes, const std::vector<uint32_t>& keep, int64_t now,
                             uint32_t cause, bool onePiece) {
  if (ceiling_ != UINT64_MAX) maybeRaiseCeiling(now);
  if (evictUntil(bytes, roomLimitLocked(), keep, now, cause, onePiece)) return CUDA_SUCCESS;
  // Strict mode fails what the budget cannot hold; below it, the device may still have room
  // that the ceiling, an estimate, does not count.
  if (!config_.strict || deviceBytes() + added(bytes, onePiece) <= config_.budgetBytes)
    return CUDA_SUCCESS;
  return CUDA_ERROR_OUT_OF_MEMORY;
}

bool Residency::evictUntil(uint64_t bytes, uint64_t limit, std::span<const uint32_t> keep,
                           int64_t now, uint32_t cause, bool onePiece) {
  auto fits = [&] { return deviceBytes() + added(bytes, onePiece) <= limit; };
  auto over = [&] { return deviceBytes() + added(bytes, onePiece) - limit; };
  if (fits()) return true;
  // Cheapest first: evictions already done, pooled memory, then freed memory the device is
  // done with (still mapped: an allocation of its size takes it as it is, so only what is
  // needed is unmapped), then freed memory it is not done with yet, the oldest first.
  if (!inFlight_.empty()) reclaimEvictions(false);
  trimPoolFor(bytes, limit, onePiece);
  if (!fits() && !quarantine_.empty()) {
    reclaimQuarantine(false, over());
    trimPoolFor(bytes, limit, onePiece);
  }
  if (!fits() && !quarantine_.empty()) {
    const int64_t waitStart = nowNs();
    reclaimQuarantine(true, over());
    stats_.stallNs += static_cast<uint64_t>(nowNs() - waitStart);
    trimPoolFor(bytes, limit, onePiece);
  }
  // Never the work being prepared; work other threads prepared and have not enqueued yet is
  // found held by evict(), which adds it here.
  keepIds_.assign(keep.begin(), keep.end());
  policy::Victim victims[kVictimBatch];
  beenShort_ |= !fits();
  if (beenShort_ && !linkProbed_) [[unlikely]] probeLink();
  // Victims the device has finished with first. The host runs ahead of the device (up to an
  // iteration, where the program synchronises once per iteration), and a victim that work
  // queued ahead still uses gives its memory back only when the device gets there: the host,
  // needing the room, waits that long, and the queue behind the victim's last use is all the
  // device has left to run meanwhile. Known only with the launch marks read (timedMarks_), and
  // for a few rounds of asking at most: then any victim, as before.
  preferPassedUses_ = timedMarks_;
  int preferRounds = 0;
  while (!fits()) {
    // What the evictions in flight will free counts: only the rest needs new victims.
    if (const uint64_t missingRoom = over(); missingRoom > evictingBytes_) {
      policy::EvictRequest request;
      request.bytes = missingRoom - evictingBytes_;
      request.now_ns = now;
      request.urgent = true;
      fillLinkState(request);
      request.keep = keepIds_;
      const size_t count = policy_->chooseVictims(request, victims);
      const size_t kept = keepIds_.size();
      const bool progress = count > 0 && (evict(victims, count, cause) || keepIds_.size() > kept);
      if (preferPassedUses_ && (!progress || ++preferRounds >= kPreferPassedRounds)) {
        preferPassedUses_ = false;  // none left that the device is done with: any victim
        keepIds_.assign(keep.begin(), keep.end());
        continue;
      }
      if (progress) continue;
    }
    // Nothing more to start: wait for the oldest eviction in flight (a stall), or give up.
    if (inFlight_.empty()) break;
    reclaimEvictions(true);
    trimPoolFor(bytes, limit, onePiece);
  }
  preferPassedUses_ = false;
  return fits();
}

// ---- a device fuller than the budget ------------------------------------------------------

uint64_t Residency::headroom(uint64_t deviceFree) const {
  // Left for what the program allocates unmanaged (small buffers, library workspaces) and the
  // driver's own needs: 1/32 of what is free, at least one granule, at most 512 MiB.
  return roundUp(std::clamp<uint64_t>(deviceFree / 32, granularity_, 512ull << 20), granularity_);
}

uint64_t Residency::limit() {
  std::lock_guard lock(mutex_);
  return limitLocked();
}

void Residency::checkDeviceFree() {
  deviceFreeChecked_ = true;
  ceilingProbedNs_ = nowNs();
  size_t free = 0, total = 0;
  if (api_.cuMemGetInfo_v2 == nullptr || api_.cuMemGetInfo_v2(&free, &total) != CUDA_SUCCESS)
    return;
  // What the shim holds already is the managed buffers' own.
  const uint64_t available = free + deviceBytes();
  const uint64_t spare = headroom(free);
  const uint64_t room = available > spare ? (available - spare) / granularity_ * granularity_ : 0;
  if (room >= config_.budgetBytes) return;
  ceiling_ = room;
  logLine("DELTA_BUDGET is %llu MiB but the device has only %llu MiB free of %llu MiB (other "
          "processes, the CUDA context or allocations made earlier hold the rest): managed buffers "
          "are kept under %llu MiB, the effective ceiling, leaving %llu MiB for the rest",
          (unsigned long long)(config_.budgetBytes >> 20), (unsigned long long)(free >> 20),
          (unsigned long long)(total >> 20), (unsigned long long)(ceiling_ >> 20),
          (unsigned long long)(spare >> 20));
}

void Residency::lowerCeiling(uint64_t refusedAt, uint64_t ceiling) {
  if (ceiling >= ceiling_ || ceiling >= config_.budgetBytes) return;
  ceiling_ = ceiling;
  // Raised too early (the device is fragmented, or others took the memory back): look less often.
  constexpr int64_t kLongestProbeIntervalNs = 64000000000;
  ceilingProbeIntervalNs_ = std::min(2 * ceilingProbeIntervalNs_, kLongestProbeIntervalNs);
  size_t free = 0, total = 0;
  if (api_.cuMemGetInfo_v2 == nullptr || api_.cuMemGetInfo_v2(&free, &total) != CUDA_SUCCESS)
    free = total = 0;
  DELTA_WARN_ONCE("the device ran out of memory with %llu MiB of managed buffers, under DELTA_BUDGET "
                  "(%llu MiB): other processes, the CUDA context or unmanaged allocations hold the "
                  "rest of its %llu MiB (%llu MiB free now). Evicting more; managed buffers are kept "
                  "under %llu MiB, the effective ceiling (DELTA_VERBOSE=1 reports it at exit)",
                  (unsigned long long)(refusedAt >> 20), (unsigned long long)(config_.budgetBytes >> 20),
                  (unsigned long long)((config_.deviceBytes ? config_.deviceBytes : total) >> 20),
                  (unsigned long long)(free >> 20), (unsigned long long)(ceiling_ >> 20));
  logVerbose(2, "effective ceiling lowered to %llu MiB", (unsigned long long)(ceiling_ >> 20));
}

void Residency::maybeRaiseCeiling(int64_t now) {
  // The memory others held may come back (a process ended, the program freed what it held
  // unmanaged): look again now and then, never on every launch.
  if (now - ceilingProbedNs_ < ceilingProbeIntervalNs_) return;
  ceilingProbedNs_ = now;
  size_t free = 0, total = 0;
  if (api_.cuMemGetInfo_v2 == nullptr || api_.cuMemGetInfo_v2(&free, &total) != CUDA_SUCCESS)
    return;
  const uint64_t available = free + deviceBytes();
  const uint64_t spare = headroom(free);
  if (available <= spare) return;
  const uint64_t room = (available - spare) / granularity_ * granularity_;
  if (room <= ceiling_) return;
  ceiling_ = room >= config_.budgetBytes ? UINT64_MAX : room;
  logVerbose(2, "effective ceiling raised to %llu MiB",
             (unsigned long long)(std::min(ceiling_, config_.budgetBytes) >> 20));
}

CUresult Residency::acquirePhysical(uint64_t bytes, CUmemGenericAllocationHandle* handle,
                                    const ProgramHandle* program) {
  if (program == nullptr) return physical_.acquire(bytes, handle);
  return api_.cuMemCreate(handle, bytes, &program->prop, 0);
}

void Residency::releasePhysical(uint64_t bytes, CUmemGenericAllocationHandle handle,
                                const ProgramHandle* program) {
  if (program == nullptr)
    physical_.release(bytes, handle);
  else
    api_.cuMemRelease(handle);
}

CUresult Residency::acquireOrEvict(uint64_t bytes, CUmemGenericAllocationHandle* handle,
                                   std::span<const uint32_t> keep, uint32_t cause,
                                   const ProgramHandle* program) {
  CUresult result = acquirePhysical(bytes, handle, program);
  // Freed buffers kept mapped for reuse hold memory the device has to give now: they go first.
  if (result == CUDA_ERROR_OUT_OF_MEMORY && !quarantine_.empty() && reclaimQuarantine(false)) {
    physical_.trim(UINT64_MAX);
    result = acquirePhysical(bytes, handle, program);
  }
  if (result != CUDA_ERROR_OUT_OF_MEMORY) return result;
  stats_.deviceFull++;
  // Evicting helps only when the device is short of memory by its own account. A refusal with
  // room to spare is about something else, and evicting for it would lose buffers for nothing:
  // their restores would be refused as well.
  auto deviceHasRoom = [&] {
    size_t free = 0, total = 0;
    return api_.cuMemGetInfo_v2 != nullptr &&
           api_.cuMemGetInfo_v2(&free, &total) == CUDA_SUCCESS && free >= bytes + granularity_;
  };
  if (deviceHasRoom()) return result;
  beenShort_ = true;
  if (!linkProbed_) [[unlikely]] probeLink();
  const uint64_t refusedAt = deviceBytes();
  // The device holds less than the budget: evict what the policy chooses, `bytes` at a time,
  // until the memory is there or nothing more can go.
  keepIds_.assign(keep.begin(), keep.end());
  policy::Victim victims[kVictimBatch];
  while (result == CUDA_ERROR_OUT_OF_MEMORY) {
    policy::EvictRequest request;
    request.bytes = bytes;
    request.now_ns = nowNs();
    request.urgent = true;
    fillLinkState(request);
    request.keep = keepIds_;
    const size_t count = policy_->chooseVictims(request, victims);
    if (count == 0) break;
    const size_t kept = keepIds_.size();
    if (!evict(victims, count, cause)) {
      if (keepIds_.size() > kept) continue;  // only held ones: ask again without them
      break;
    }
    while (!inFlight_.empty()) reclaimEvictions(true);  // the device needs the memory now
    // A victim's memory of exactly this size is taken as it is: the device is not asked again
    // (it may refuse new memory for reasons of its own, and what it refuses once it may refuse
    // to the victim's restore too).
    if (program == nullptr && physical_.takeExact(bytes, handle)) {
      result = CUDA_SUCCESS;
      break;
    }
    physical_.trim(UINT64_MAX);
    result = acquirePhysical(bytes, handle, program);
    if (result == CUDA_ERROR_OUT_OF_MEMORY && deviceHasRoom()) break;
  }
  if (result == CUDA_SUCCESS) lowerCeiling(refusedAt, deviceBytes() + bytes);
  return result;
}

bool Residency::relieveDevice(uint64_t bytes) {
  NoticesAfterUnlock notices{this};
  ReentryGuard guard;
  std::lock_guard lock(mutex_);
  const uint64_t before = deviceBytes();
  if (before == 0) return false;
  stats_.deviceFull++;
  evictUntil(roundUp(bytes, granularity_), before, {}, nowNs(), 0);
  if (deviceBytes() >= before) return false;
  // What managed buffers hold now is what the device can spare them.
  lowerCeiling(before, deviceBytes());
  return true;
}

void Residency::probeLink() {
  linkProbed_ = true;
  constexpr uint64_t kProbeBytes = 8ull << 20;  // ~0.3 ms each way at 25 GB/s: latency is noise
  if (!ensureEvictStream()) return;
  LinkProbe& probe = probe_;
  probe.bytes = (kProbeBytes + granularity_ - 1) / granularity_ * granularity_;
  probe.host = host_.take(probe.bytes, &probe.hostPinned);
  // Outside the budget for the probe's few milliseconds; refused when the device is full.
  if (probe.host == nullptr || !probe.hostPinned ||
      physical_.acquire(probe.bytes, &probe.handle) != CUDA_SUCCESS) {
    probe.handle = 0;
    endLinkProbe();
    return;
  }
  if (api_.cuMemAddressReserve(&probe.address, probe.bytes, granularity_, 0, 0) != CUDA_SUCCESS) {
    probe.address = 0;
    endLinkProbe();
    return;
  }
  probe.mapped = mapAt(probe.address, probe.bytes, probe.handle) == CUDA_SUCCESS;
  if (!probe.mapped) {
    endLinkProbe();
    return;
  }
  std::memset(probe.host, 0, probe.bytes);
  // Fresh physical memory's first write is not the link: it is written once untimed. (On
  // cudasim the first touch of a new handle's pages took 4.5 times the copy's modeled time,
  // and a run that only dropped, timing nothing else coming in, priced every swap by that.)
  if (api_.cuMemcpyHtoDAsync_v2(probe.address, probe.host, probe.bytes, evictStream_) != CUDA_SUCCESS) {
    endLinkProbe();
    return;
  }
  for (const bool in : {true, false}) {
    CUevent start = beginWaitTiming(evictStream_);
    const CUresult copied =
        in ? api_.cuMemcpyHtoDAsync_v2(probe.address, probe.host, probe.bytes, evictStream_)
           : api_.cuMemcpyDtoHAsync_v2(probe.host, probe.address, probe.bytes, evictStream_);
    if (copied != CUDA_SUCCESS || start == nullptr) {
      timingEvents_.give(start);
      break;
    }
    endWaitTiming(start, evictStream_, in ? DeviceTiming::Kind::kProbeIn : DeviceTiming::Kind::kProbeOut,
                  probe.bytes);
  }
  // Its memory goes when its last timing is read (pollTimings), or now if none was queued.
  if (!probeTimingQueued()) {
    api_.cuStreamSynchronize(evictStream_);
    endLinkProbe();
  }
}

bool Residency::probeTimingQueued() const {
  return std::any_of(timings_.begin(), timings_.end(), [](const DeviceTiming& t) {
    return t.kind == DeviceTiming::Kind::kProbeIn || t.kind == DeviceTiming::Kind::kProbeOut;
  });
}

void Residency::endLinkProbe() {
  if (probe_.mapped) api_.cuMemUnmap(probe_.address, probe_.bytes);
  // Never counted in the budget: not pooled, where it would count until room is needed.
  if (probe_.handle != 0) physical_.giveBack(probe_.handle);
  if (probe_.address != 0) api_.cuMemAddressFree(probe_.address, probe_.bytes);
  if (probe_.host != nullptr) host_.give(probe_.host, probe_.hostPinned);
  probe_ = LinkProbe{};
}

bool Residency::ensureEvictStream() {
  return evictStream_ != nullptr ||
         api_.cuStreamCreate(&evictStream_, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS;
}

bool Residency::evict(const policy::Victim* victims, size_t count, uint32_t cause) {
  if (!ensureEvictStream()) {
    DELTA_WARN_ONCE("cannot create the eviction stream; running over budget");
    return false;
  }
  // 1. Which victims may go now. Every hold is looked at before any event is recorded below:
  // holds end without the lock (releaseHeld), so a launch whose hold ended after an event was
  // recorded on its stream would not be behind that event, and its buffer would be unmapped
  // under it (the same event serves every victim used on that stream).
  size_t evicting = 0;
  uint32_t chosen[kVictimBatch];
  bool drop[kVictimBatch];
  for (size_t v = 0; v < count; ++v) {
    const uint32_t id = victims[v].id;
    if (id >= buffers_.size()) continue;
    Buffer& buffer = buffers_[id];
    if (!buffer.live || buffer.state != State::kResident || buffer.evicting ||
        buffer.immovable() || !buffer.accessible)
      continue;
    if (isHeld(id) || buffer.regenerating || (preferPassedUses_ && !usesPassed(buffer))) {
      keepIds_.push_back(id);  // not now: the caller asks again without it
      continue;
    }
    // Dropped when the policy says so and the contents can be regenerated; a buffer whose
    // host copy is still valid costs nothing to swap, so it keeps that copy instead.
    drop[evicting] = victims[v].action == policy::Action::kRecompute &&
                     buffer.hook.kind != RecomputeHook::Kind::kNone && !buffer.hostValid &&
                     !buffer.keepContents;
    chosen[evicting++] = id;
  }
  if (evicting == 0) return false;

  // 2. The batch starts after the last work that used each victim. An event waited for is
  // captured at the wait, so the events recorded here go back to the pool at once.
  std::pair<CUstream, CUevent> recorded[kVictimBatch * kMaxStreamUses];
  size_t recordedCount = 0;
  bool syncAll = false;
  for (size_t c = 0; c < evicting && !syncAll; ++c) {
    Buffer& buffer = buffers_[chosen[c]];
    syncAll |= buffer.manyStreams;
    for (int i = 0; i < buffer.useCount && !syncAll; ++i) {
      StreamUse& use = buffer.uses[i];
      if (use.thread != nullptr) {
        // A thread's default stream: only that thread can name it; its fence, recorded after
        // each of its launches there, stands for the use.
        CUevent fence = fenceOf(use.thread);
        if (fence == nullptr) {
          syncAll = true;
          break;
        }
        api_.cuStreamWaitEvent(evictStream_, fence, 0);
        continue;
      }
      if (use.mark != 0) {
        bool passed = false;
        CUevent mark = markEvent(use.stream, use.mark, &passed);
        if (passed) continue;
        if (mark != nullptr) {
          api_.cuStreamWaitEvent(evictStream_, mark, 0);
          continue;
        }
      }
      auto found = std::find_if(recorded, recorded + recordedCount,
                                [&](const auto& r) { return r.first == use.stream; });
      if (found == recorded + recordedCount) {
        CUevent event = events_.take();
        if (event == nullptr || api_.cuEventRecord(event, use.stream) != CUDA_SUCCESS) {
          events_.give(event);
          syncAll = true;
          break;
        }
        api_.cuStreamWaitEvent(evictStream_, event, 0);
        recorded[recordedCount++] = {use.stream, event};
      }
    }
    if (buffer.restoreEvent) api_.cuStreamWaitEvent(evictStream_, buffer.restoreEvent, 0);
  }
  for (size_t r = 0; r < recordedCount; ++r) events_.give(recorded[r].second);
  if (syncAll) api_.cuCtxSynchronize();

  EvictionBatch batch;
  if (!spareBatches_.empty()) {
    batch = std::move(spareBatches_.back());
    spareBatches_.pop_back();
  }
  batch.members.clear();
  batch.sequence = nextBatch_++;
  batch.enqueuedNs = nowNs();
  batch.cause = cause;
  batch.copiedBytes = 0;
  // Timing events around the copies, for what the link really gives (onCopyMeasured).
  batch.start = nullptr;
  if (api_.cuEventCreate(&batch.start, CU_EVENT_DEFAULT) != CUDA_SUCCESS ||
      api_.cuEventRecord(batch.start, evictStream_) != CUDA_SUCCESS) {
    if (batch.start) api_.cuEventDestroy_v2(batch.start);
    batch.start = nullptr;
  }

  // 2. Copy out what the host does not have yet.
  for (size_t i = 0; i < evicting; ++i) {
    Buffer& buffer = buffers_[chosen[i]];
    bool copying = false;
    if (!drop[i] && buffer.hostValid) {
      stats_.cleanEvictions++;
    } else if (!drop[i]) {
      if (buffer.host == nullptr) {
        buffer.host = host_.take(buffer.bytes, &buffer.hostPinned);
        if (buffer.host == nullptr) {
          DELTA_WARN_ONCE("host memory exhausted: cannot evict; running over budget");
          continue;
        }
      }
      CUresult result =
          api_.cuMemcpyDtoHAsync_v2(buffer.host, buffer.address, buffer.bytes, evictStream_);
      if (result != CUDA_SUCCESS) {
        // Once: a driver that refuses copies refuses them all, and each would be one more line.
        DELTA_WARN_ONCE("eviction copy of %llu bytes at 0x%llx failed: %s; the buffer stays "
                        "resident (later failures are not reported)",
                        (unsigned long long)buffer.bytes, (unsigned long long)buffer.address,
                        resultText(api_, result));
        continue;
      }
      batch.copiedBytes += buffer.bytes;
      copying = true;
    }
    buffer.evicting = true;
    buffer.evictingCopy = copying;
    buffer.evictBatch = batch.sequence;
    evictingBytes_ += buffer.mappedBytes;
    batch.members.push_back(EvictionBatch::Member{chosen[i], buffer.serial, drop[i]});
    // The policy sees it gone now; the memory goes when the batch is done.
    policy_->onEvicted(chosen[i], drop[i] ? policy::Action::kRecompute : policy::Action::kSwap);
  }
  stats_.bytesToHost += batch.copiedBytes;
  if (batch.copiedBytes > 0)
    d2hBusyUntilNs_ = std::max(batch.enqueuedNs, d2hBusyUntilNs_) +
                      policy_->costs().transferNs(policy::Direction::kDeviceToHost, batch.copiedBytes);

  // 3. The batch's end: copies done and last uses passed; then, not before, the memory goes.
  if (api_.cuEventCreate(&batch.done, CU_EVENT_DEFAULT) != CUDA_SUCCESS ||
      api_.cuEventRecord(batch.done, evictStream_) != CUDA_SUCCESS) {
    if (batch.done) api_.cuEventDestroy_v2(batch.done);
    batch.done = nullptr;  // reclaimEvictions then waits for the whole stream
  }
  if (batch.members.empty()) {
    // Nothing could go (copies refused, no host memory): nothing is in flight either.
    if (batch.start) api_.cuEventDestroy_v2(batch.start);
    if (batch.done) api_.cuEventDestroy_v2(batch.done);
    batch.start = batch.done = nullptr;
    spareBatches_.push_back(std::move(batch));
    return false;
  }
  inFlight_.push_back(std::move(batch));
  return true;
}

void Residency::finishEviction(Buffer& buffer, uint32_t, bool drop, const EvictionBatch& batch,
                               int64_t endNs) {
  trace::TraceWriter* trace = trace_.load(std::memory_order_relaxed);
  if (trace)
    trace->evict(trace::EvictRecord{static_cast<uint64_t>(batch.enqueuedNs), static_cast<uint64_t>(endNs),
                                    buffer.serial, buffer.bytes, 0,
                                    reinterpret_cast<uint64_t>(evictStream_), batch.cause,
                                    drop ? trace::kEvictDrop : uint8_t(0)});
  api_.cuMemUnmap(buffer.address, buffer.mappedBytes);
  releasePhysical(buffer.mappedBytes, buffer.handle, buffer.program);
  buffer.handle = 0;
  buffer.evicting = false;
  buffer.evictingCopy = false;
  evictingBytes_ -= buffer.mappedBytes;
  resident_ -= buffer.mappedBytes;
  if (buffer.program != nullptr) {
    buffer.program->real = 0;
    programResident_ -= buffer.mappedBytes;
  }
  if (drop) {
    buffer.state = State::kDropped;
    host_.give(buffer.host, buffer.hostPinned);  // a stale copy, if any
    buffer.host = nullptr;
    buffer.hostValid = false;
    stats_.drops++;
    if (buffer.hook.kind == RecomputeHook::Kind::kFramework) {
      detail::queueDropNotice(buffer.address, buffer.bytes);
    }
  } else {
    buffer.state = State::kEvicted;
    buffer.hostValid = true;
    stats_.evictions++;
  }
  buffer.useCount = 0;
  buffer.manyStreams = false;
  events_.give(buffer.restoreEvent);
  buffer.restoreEvent = nullptr;
}

bool Residency::isHeld(uint32_t id) const {
  return heldCounts_[id].load(std::memory_order_acquire) > 0;
}

bool Residency::usesPassed(const Buffer& buffer) const {
  for (int i = 0; i < buffer.useCount; ++i) {
    const StreamUse& use = buffer.uses[i];
    if (use.thread != nullptr || use.mark == 0) continue;
    for (const auto& m : launchMarks_)
      if (m->stream == use.stream && use.mark >= m->read) return false;  // not read as passed yet
  }
  return true;
}

bool Residency::reclaimEvictions(bool wait) {
  bool any = false;
  bool waited = false;
  while (!inFlight_.empty()) {
    EvictionBatch& batch = inFlight_.front();
    CUresult state = batch.done ? api_.cuEventQuery(batch.done) : CUDA_ERROR_NOT_READY;
    if (state == CUDA_ERROR_NOT_READY && wait && !waited) {
      // Nothing else can make room: the host waits for the oldest batch, and says so.
      const int64_t waitStart = nowNs();
      state = batch.done ? api_.cuEventSynchronize(batch.done) : api_.cuStreamSynchronize(evictStream_);
      stats_.stallNs += static_cast<uint64_t>(nowNs() - waitStart);
      waited = true;
    }
    if (state == CUDA_ERROR_NOT_READY) break;
    if (state != CUDA_SUCCESS) {
      // The copies may not have happened: the buffers stay, over budget rather than lost.
      DELTA_WARN_ONCE("eviction copies failed to complete: %s; those buffers stay resident",
                      resultText(api_, state));
      for (const EvictionBatch::Member& m : batch.members) {
        Buffer& buffer = buffers_[m.id];
        if (buffer.live && buffer.serial == m.serial && buffer.evicting &&
            buffer.evictBatch == batch.sequence)
          cancelEviction(m.id, nowNs());
      }
    } else {
      const int64_t end = nowNs();
      if (batch.start != nullptr && batch.copiedBytes > 0) {
        float ms = 0;
        if (api_.cuEventElapsedTime_v2(&ms, batch.start, batch.done) == CUDA_SUCCESS && ms > 0)
          policy_->onCopyMeasured(policy::Direction::kDeviceToHost, batch.copiedBytes,
                                  static_cast<int64_t>(static_cast<double>(ms) * 1e6));
      }
      for (const EvictionBatch::Member& m : batch.members) {
        Buffer& buffer = buffers_[m.id];
        // Freed meanwhile (its memory went to quarantine), taken back by a use, or leaving again
        // in a later batch: not this batch's to finish.
        if (!buffer.live || buffer.serial != m.serial || !buffer.evicting ||
            buffer.evictBatch != batch.sequence)
          continue;
        finishEviction(buffer, m.id, m.drop, batch, end);
        any = true;
      }
    }
    if (batch.start) api_.cuEventDestroy_v2(batch.start);
    if (batch.done) api_.cuEventDestroy_v2(batch.done);
    batch.start = batch.done = nullptr;
    spareBatches_.push_back(std::move(batch));
    inFlight_.pop_front();
  }
  // Every copy out is done: the link is idle, whatever the estimate said.
  if (inFlight_.empty()) d2hBusyUntilNs_ = std::min(d2hBusyUntilNs_, nowNs());
  return any;
}

void Residency::fillLinkState(policy::EvictRequest& request) const {
  request.d2h_busy_until_ns = std::max(request.now_ns, d2hBusyUntilNs_);
  request.h2d_busy_until_ns = std::max(request.now_ns, h2dBusyUntilNs_);
}

bool Residency::evictionMayRead(const Buffer& buffer) const {
  return buffer.evictBatch != 0 && !inFlight_.empty() &&
         buffer.evictBatch >= inFlight_.front().sequence;
}

void Residency::cancelEviction(uint32_t id, int64_t now) {
  Buffer& buffer = buffers_[id];
  if (!buffer.evicting) return;
  buffer.evicting = false;
  // The copy still runs into the host block: not to be trusted, whatever it reads.
  if (buffer.evictingCopy) buffer.hostValid = false;
  buffer.evictingCopy = false;
  evictingBytes_ -= buffer.mappedBytes;
  stats_.cancelledEvictions++;
  policy_->onRestored(id, now);
}

bool Residency::droppingNow(uint32_t id) const {
  const Buffer& buffer = buffers_[id];
  if (!buffer.evicting) return false;
  for (const EvictionBatch& batch : inFlight_) {
    if (batch.sequence != buffer.evictBatch) continue;
    for (const EvictionBatch::Member& m : batch.members)
      if (m.id == id && m.serial == buffer.serial) return m.drop;
  }
  return false;
}

void Residency::waitForEvictionCopy(const Buffer& buffer, CUstream stream) {
  for (const EvictionBatch& batch : inFlight_) {
    if (batch.sequence != buffer.evictBatch) continue;
    // Without its event, or if the wait cannot be queued: the safe, slow way.
    if (batch.done == nullptr)
      api_.cuStreamSynchronize(evictStream_);
    else if (api_.cuStreamWaitEvent(stream, batch.done, 0) != CUDA_SUCCESS)
      api_.cuEventSynchronize(batch.done);
    return;
  }
}

void Residency::makeRoomAhead(int64_t now) {
  if (!beenShort_) return;
  int64_t needAt = 0;
  const uint64_t need = policy_->upcomingBytes(now, needAt);
  if (need == 0) return;
  // Pooled memory is room: what comes next takes it before anything is evicted. So is freed
  // memory the device has not got past yet: it will have when what comes next runs (the host
  // is ahead of it), and an allocation takes it over at once (adoptQuarantined). Counted as
  // taken, it had buffers the replay keeps swapped ahead here: DenseNet-121 held a third of
  // its budget in such memory at 70 %/12 GB/s.
  const uint64_t limit = roomLimitLocked();
  const uint64_t taken = resident_;
  const uint64_t room = limit > taken ? limit - taken : 0;
  if (need <= room + evictingBytes_) return;
  // Never this launch's buffers (evict() passes over what other launches hold); nothing
  // predicted to be needed back before the memory is (the policy sees to that through
  // not_before_ns).
  keepIds_.assign(workingSet_.begin(), workingSet_.end());
  policy::Victim victims[kVictimBatch];
  // Ahead of need, only victims the device is done with (as far as the launch marks tell): a
  // copy out queued behind work the device has not reached holds the eviction stream, and every
  // copy after it, an urgent one included, until the device gets there. The others can go on
  // a later launch, once passed.
  preferPassedUses_ = timedMarks_;
  const int rounds = timedMarks_ ? kPreferPassedRounds : 1;
  for (int round = 0; round < rounds && need > room + evictingBytes_; ++round) {
    policy::EvictRequest request;
    request.bytes = need - room - evictingBytes_;
    request.now_ns = now;
    request.urgent = false;
    fillLinkState(request);
    request.not_before_ns = needAt;
    request.keep = keepIds_;
    const size_t count = policy_->chooseVictims(request, victims);
    if (count == 0) break;
    const size_t kept = keepIds_.size();
    // Counted as they went: evict() passes over victims held by other launches meanwhile.
    if (evict(victims, count, 0))
      stats_.evictionsAhead += inFlight_.back().members.size();
    else if (keepIds_.size() == kept)
      break;  // none could go, and none was passed over to ask again without
  }
  preferPassedUses_ = false;
}

CUresult Residency::restore(uint32_t id, CUstream stream, uint32_t cause,
                            std::span<const uint32_t> keep, bool prefetched, bool perThreadStream) {
  const int64_t start = nowNs();
  Buffer& buffer = buffers_[id];
  CUmemGenericAllocationHandle handle = 0;
  CUresult result = CUDA_ERROR_UNKNOWN;
  // The work that needs the buffer runs whatever we return (CUPTI cannot cancel it), and
  // would fault on the missing memory: a failure that may pass (the device momentarily full
  // because another process took what an eviction gave back, a copy refused once) is worth a
  // second try, after giving the device every byte the shim can spare.
  for (int attempt = 0; attempt < 2 && result != CUDA_SUCCESS; ++attempt) {
    if (attempt > 0) {
      reclaimQuarantine(true);
      physical_.trim(UINT64_MAX);
    }
    // A prefetch never evicts: what it would evict may be needed sooner.
    result = prefetched ? acquirePhysical(buffer.mappedBytes, &handle, buffer.program)
                        : acquireOrEvict(buffer.mappedBytes, &handle, keep, cause, buffer.program);
    if (result != CUDA_SUCCESS) continue;
    result = mapAt(buffer.address, buffer.mappedBytes, handle);
    if (result != CUDA_SUCCESS) {
      releasePhysical(buffer.mappedBytes, handle, buffer.program);
      continue;
    }
    // On the stream of the work that needs it: that work is ordered after the copy, and stands
    // still for as long as the copy takes (measured; a prefetch's, on its own stream, is not a
    // wait). Either way the time tells what the link gives (onCopyMeasured).
    CUevent waitStart = beginWaitTiming(stream);
    result = api_.cuMemcpyHtoDAsync_v2(buffer.address, buffer.host, buffer.bytes, stream);
    if (result != CUDA_SUCCESS) {
      timingEvents_.give(waitStart);
      api_.cuMemUnmap(buffer.address, buffer.mappedBytes);
      releasePhysical(buffer.mappedBytes, handle, buffer.program);
    } else {
      endWaitTiming(waitStart, stream,
                    prefetched ? DeviceTiming::Kind::kPrefetchCopy : DeviceTiming::Kind::kRestoreCopy, buffer.bytes);
      h2dBusyUntilNs_ = std::max(start, h2dBusyUntilNs_) +
                        policy_->costs().transferNs(policy::Direction::kHostToDevice, buffer.bytes);
    }
  }
  if (result != CUDA_SUCCESS) return result;
  // Other streams that use it before this copy is known to be done must wait for it.
  CUevent event = events_.take();
  if (event != nullptr && api_.cuEventRecord(event, stream) == CUDA_SUCCESS) {
    buffer.restoreEvent = event;
    buffer.restoreStream = stream;
    buffer.restoreThread = perThreadStream ? thisThread() : nullptr;
  } else {
    events_.give(event);
    api_.cuStreamSynchronize(stream);
  }
  buffer.handle = handle;
  buffer.state = State::kResident;
  resident_ += buffer.mappedBytes;
  if (buffer.program != nullptr) {
    buffer.program->real = handle;
    programResident_ += buffer.mappedBytes;
  }
  notePeaks();
  stats_.restores++;
  stats_.bytesToDevice += buffer.bytes;
  const int64_t now = nowNs();
  policy_->onRestored(id, now);
  // The copy runs on the stream, ahead of the work: its end is not known here.
  if (trace::TraceWriter* trace = trace_.load(std::memory_order_relaxed))
    trace->restore(trace::RestoreRecord{static_cast<uint64_t>(start), static_cast<uint64_t>(now),
                                        buffer.serial, buffer.bytes, 0,
                                        reinterpret_cast<uint64_t>(stream), cause,
                                        prefetched ? trace::kRestorePrefetched : uint8_t(0)});
  return CUDA_SUCCESS;
}

}  // namespace delta::shim
