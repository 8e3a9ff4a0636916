#include "shim/residency.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "shim/log.h"
#include "shim/reentry_guard.h"
#include "shim/residency_internal.h"

namespace delta::shim {

int64_t nowNs() {
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return int64_t(now.tv_sec) * 1000000000 + now.tv_nsec;
}

namespace {

// Per thread, the buffers each not-yet-released prepare() holds, innermost last. The vectors
// are kept (only tHeldDepth moves) so that the launch path does not allocate once grown.
struct HeldLaunch {
  std::vector<uint32_t> ids;
  bool perThreadStream = false;  // the work went to this thread's default stream
  CUevent fence = nullptr;       // then: this thread's fence, recorded once the work is in
};
thread_local std::vector<HeldLaunch> tHeld;
thread_local size_t tHeldDepth = 0;

thread_local char tThreadToken;
constexpr size_t kVictimBatch = 64;
constexpr int kMaxLinkDepth = 4;

thread_local int tRecomputeDepth = 0;  // detail::recomputeDepth()

}  // namespace

namespace detail {
const void* thisThread() { return &tThreadToken; }
int& recomputeDepth() { return tRecomputeDepth; }
}  // namespace detail

using detail::kMaxBuffers;
using detail::kMaxRecomputeDepth;
using detail::roundUp;
using detail::thisThread;

Residency::Residency(const DriverApi& api, const ResidencyConfig& config,
                     std::unique_ptr<policy::Policy> policy, uint64_t granularity)
    : api_(api),
      config_(config),
      granularity_(granularity),
      policy_(std::move(policy)),
      physical_(api),
      host_(api, config.hostLimitBytes),
      events_(api),
      heldCounts_(new std::atomic<uint32_t>[kMaxBuffers]()) {
  buffers_.reserve(1024);
  workingSet_.reserve(64);
  writtenScratch_.reserve(64);
  keepIds_.reserve(64);
  if (config.traceStacks) stacks_ = std::make_unique<CallStacks>();
}

// ---- mapping physical memory -------------------------------------------------------------

CUresult Residency::mapAt(CUdeviceptr address, uint64_t bytes, CUmemGenericAllocationHandle handle) {
  CUresult result = api_.cuMemMap(address, bytes, 0, handle, 0);
  if (result != CUDA_SUCCESS) return result;
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = 0;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  result = api_.cuMemSetAccess(address, bytes, &access, 1);
  if (result != CUDA_SUCCESS) api_.cuMemUnmap(address, bytes);
  return result;
}

// ---- allocation and free -----------------------------------------------------------------

CUresult Residency::allocate(size_t bytes, CUdeviceptr* out) {
  NoticesAfterUnlock notices{this};
  ReentryGuard guard;
  uint32_t stack = 0;  // taken before the lock: other threads need not wait for an unwind
  if (stacks_ != nullptr)
    if (trace::TraceWriter* trace = trace_.load(std::memory_order_relaxed))
      stack = stacks_->capture(*trace);
  std::lock_guard lock(mutex_);
  const uint64_t mapped = roundUp(bytes, granularity_);
  uint32_t id;
  if (!freeIds_.empty()) {
    id = freeIds_.back();
    freeIds_.pop_back();
  } else if (buffers_.size() < kMaxBuffers) {
    id = static_cast<uint32_t>(buffers_.size());
    buffers_.emplace_back();
  } else {
    return CUDA_ERROR_NOT_SUPPORTED;  // the caller falls back to an unmanaged allocation
  }
  static const std::vector<uint32_t> kNothing;
  const int64_t now = nowNs();
  if (!deviceFreeChecked_) checkDeviceFree();
  if (CUresult room = makeRoom(mapped, kNothing, now, 0); room != CUDA_SUCCESS) {
    freeIds_.push_back(id);
    return room;
  }
  if (deviceBytes() + mapped > config_.budgetBytes) {
    stats_.overBudgetAllocations++;
    DELTA_WARN_ONCE("an allocation of %llu MiB does not fit in DELTA_BUDGET even after evicting "
                    "what the policy allows; allocating over budget (counted; DELTA_STRICT=1 "
                    "makes this an out-of-memory error)",
                    (unsigned long long)(mapped >> 20));
  }
  CUdeviceptr address = 0;
  if (auto it = addressCache_.find(mapped); it != addressCache_.end()) {
    address = it->second;
    addressCache_.erase(it);
  } else if (CUresult r = api_.cuMemAddressReserve(&address, mapped, granularity_, 0, 0);
             r != CUDA_SUCCESS) {
    freeIds_.push_back(id);
    return r;
  }
  CUmemGenericAllocationHandle handle = 0;
  CUresult result = acquireOrEvict(mapped, &handle, {}, 0);
  if (result == CUDA_SUCCESS) {
    result = mapAt(address, mapped, handle);
    if (result != CUDA_SUCCESS) physical_.release(mapped, handle);
  }
  if (result != CUDA_SUCCESS) {
    addressCache_.emplace(mapped, address);
    freeIds_.push_back(id);
    return result;
  }
  Buffer& buffer = buffers_[id];
  buffer = Buffer{};
  buffer.live = true;
  buffer.serial = nextSerial_++;
  buffer.address = address;
  buffer.bytes = bytes;
  buffer.mappedBytes = mapped;
  buffer.handle = handle;
  buffer.state = State::kResident;
  addresses_.insert(address, bytes, id);
  resident_ += mapped;
  notePeaks();
  stats_.allocations++;
  policy_->onAlloc(id, mapped, now);
  // Stamped now, not when the call began: evictions that made room come before it.
  if (trace::TraceWriter* trace = trace_.load(std::memory_order_relaxed))
    trace->alloc(trace::AllocRecord{static_cast<uint64_t>(nowNs()), buffer.serial, address, bytes,
                                    0, stack, trace::kAllocManaged});
  *out = address;
  return CUDA_SUCCESS;
}

bool Residency::owns(CUdeviceptr address) {
  std::lock_guard lock(mutex_);
  uint32_t id = addresses_.find(address);
  return id != AddressMap::kNone && buffers_[id].address == address &&
         buffers_[id].program == nullptr;
}

void Residency::noteUnmanagedAllocation(CUdeviceptr address, size_t bytes) {
  std::lock_guard lock(mutex_);
  tables_.addAllocation(address, bytes);
}

bool Residency::free(CUdeviceptr address, CUevent alsoAfter) {
  ReentryGuard guard;
  std::lock_guard lock(mutex_);
  uint32_t id = addresses_.find(address);
  // The program's own mapping is not an allocation: cuMemFree of it is the driver's error.
  if (id != AddressMap::kNone && buffers_[id].program != nullptr) return false;
  if (id == AddressMap::kNone || buffers_[id].address != address) {
    // Not ours: the pointers an unmanaged table held lead nowhere once it is freed.
    if (tables_.allocationCount() > 0 || !tables_.empty()) tables_.removeAllocation(address);
    return false;
  }
  Buffer& buffer = buffers_[id];
  if (buffer.table) tables_.erase(buffer.address);
  // Unlike cudaFree, no device-wide synchronisation: the memory waits in quarantine until
  // the work that used it has finished, and only then is it reused.
  Quarantined entry{buffer.address, buffer.mappedBytes,
                    buffer.state == State::kResident ? buffer.handle : 0,
                    buffer.host, buffer.hostPinned, {}};
  bool synced = buffer.manyStreams;
  for (int i = 0; i < buffer.useCount && !synced; ++i) {
    StreamUse& use = buffer.uses[i];
    CUevent event = use.event;
    if (event == nullptr) {
      event = events_.take();
      // Another thread's default stream cannot be named here: its fence can, and an event
      // recorded behind a wait for it on the eviction stream completes after the use.
      CUevent fence = use.thread != nullptr ? fenceOf(use.thread) : nullptr;
      const bool recorded =
          event != nullptr &&
          (use.thread == nullptr
               ? api_.cuEventRecord(event, use.stream) == CUDA_SUCCESS
               : fence != nullptr && ensureEvictStream() &&
                     api_.cuStreamWaitEvent(evictStream_, fence, 0) == CUDA_SUCCESS &&
                     api_.cuEventRecord(event, evictStream_) == CUDA_SUCCESS);
      if (!recorded) {
        events_.give(event);
        synced = true;
        break;
      }
    }
    use.event = nullptr;
    entry.events.push_back(event);
  }
  if (alsoAfter != nullptr) entry.events.push_back(alsoAfter);
  if (buffer.restoreEvent) {
    entry.events.push_back(buffer.restoreEvent);
    buffer.restoreEvent = nullptr;
  }
  if (evictionMayRead(buffer)) {
    // An eviction batch still reads it (and writes its host block), whether it is leaving or
    // its eviction was called off: the memory and the block wait for that batch too.
    CUevent event = events_.take();
    if (event != nullptr && api_.cuEventRecord(event, evictStream_) == CUDA_SUCCESS)
      entry.events.push_back(event);
    else {
      events_.give(event);
      synced = true;
    }
  }
  if (buffer.evicting) {
    evictingBytes_ -= buffer.mappedBytes;
    buffer.evicting = false;
  }
  if (synced) api_.cuCtxSynchronize();  // untracked uses: the safe, slow way
  if (buffer.exportFd >= 0) close(buffer.exportFd);
  if (buffer.state == State::kResident) {
    resident_ -= buffer.mappedBytes;
    quarantinedBytes_ += buffer.mappedBytes;
  }
  quarantine_.push_back(std::move(entry));
  addresses_.erase(address);
  const int64_t now = nowNs();
  policy_->onFree(id, now);
  if (trace::TraceWriter* trace = trace_.load(std::memory_order_relaxed))
    trace->free(trace::FreeRecord{static_cast<uint64_t>(now), buffer.serial, buffer.bytes,
                                  buffer.state == State::kResident  ? trace::Residency::kResident
                                  : buffer.state == State::kDropped ? trace::Residency::kDropped
                                                                    : trace::Residency::kOnHost});
  buffer = Buffer{};
  freeIds_.push_back(id);
  stats_.frees++;
  reclaimQuarantine(false);
  return true;
}

CUresult Residency::freeOrdered(CUdeviceptr address, CUstream stream, bool perThreadApi) {
  CUevent event = nullptr;
  {
    ReentryGuard guard;
    std::lock_guard lock(mutex_);
    uint32_t id = addresses_.find(address);
    if (id != AddressMap::kNone && buffers_[id].address == address &&
        buffers_[id].program == nullptr) {
      // The uses the shim saw are waited for by free(); this event stands for the rest of the
      // stream's work before the free, which the program may have reached the buffer with
      // unseen (a pinned buffer's pointer in a kernel-built table, say). This thread names its
      // own default stream as a _ptsz call does.
      const bool perThreadStream =
          stream == CU_STREAM_PER_THREAD || (perThreadApi && stream == nullptr);
      event = events_.take();
      CUresult recorded = event == nullptr ? CUDA_ERROR_OUT_OF_MEMORY
                                           : api_.cuEventRecord(event, perThreadStream
                                                                           ? CU_STREAM_PER_THREAD
                                                                           : stream);
      if (recorded == CUDA_ERROR_INVALID_HANDLE || recorded == CUDA_ERROR_INVALID_CONTEXT) {
        events_.give(event);
        return recorded;  // as the real call: a stream it does not know frees nothing
      }
      if (recorded != CUDA_SUCCESS) {
        // No event to be had: the stream's work is waited for now instead.
        events_.give(event);
        event = nullptr;
        api_.cuStreamSynchronize(perThreadStream ? CU_STREAM_PER_THREAD : stream);
      }
    }
  }
  if (free(address, event)) return CUDA_SUCCESS;
  if (event != nullptr) {
    std::lock_guard lock(mutex_);
    events_.give(event);
  }
  return CUDA_ERROR_NOT_FOUND;
}

bool Residency::reclaimQuarantine(bool wait) {
  bool any = false;
  for (size_t i = 0; i < quarantine_.size();) {
    Quarantined& entry = quarantine_[i];
    bool done = true;
    for (CUevent event : entry.events) {
      CUresult state = wait ? api_.cuEventSynchronize(event) : api_.cuEventQuery(event);
      if (state == CUDA_ERROR_NOT_READY) {
        done = false;
        break;
      }
    }
    if (!done) {
      ++i;
      continue;
    }
    for (CUevent event : entry.events) events_.give(event);
    if (entry.handle != 0) {
      api_.cuMemUnmap(entry.address, entry.mappedBytes);
      quarantinedBytes_ -= entry.mappedBytes;
      physical_.release(entry.mappedBytes, entry.handle);
    }
    addressCache_.emplace(entry.mappedBytes, entry.address);
    host_.give(entry.host, entry.mappedBytes, entry.hostPinned);
    quarantine_[i] = std::move(quarantine_.back());
    quarantine_.pop_back();
    any = true;
  }
  return any;
}

// ---- making room --------------------------------------------------------------------------

CUresult Residency::makeRoom(uint64_t bytes, const std::vector<uint32_t>& keep, int64_t now,
                             uint32_t cause) {
  if (ceiling_ != UINT64_MAX) maybeRaiseCeiling(now);
  if (evictUntil(bytes, limitLocked(), keep, now, cause)) return CUDA_SUCCESS;
  // Strict mode fails what the budget cannot hold; below it, the device may still have room
  // that the ceiling, an estimate, does not count.
  if (!config_.strict || deviceBytes() + bytes <= config_.budgetBytes) return CUDA_SUCCESS;
  return CUDA_ERROR_OUT_OF_MEMORY;
}

bool Residency::evictUntil(uint64_t bytes, uint64_t limit, std::span<const uint32_t> keep,
                           int64_t now, uint32_t cause) {
  auto fits = [&] { return deviceBytes() + bytes <= limit; };
  if (fits()) return true;
  // Cheapest first: memory nobody uses any more, and evictions already done.
  if (!inFlight_.empty() && reclaimEvictions(false)) physical_.trim(UINT64_MAX);
  if (!quarantine_.empty()) reclaimQuarantine(false);
  if (!fits() && physical_.bytes() > 0) physical_.trim(deviceBytes() + bytes - limit);
  if (!fits() && !quarantine_.empty()) {
    reclaimQuarantine(true);
    physical_.trim(UINT64_MAX);
  }
  // Never the work being prepared; work other threads prepared and have not enqueued yet is
  // found held by evict(), which adds it here.
  keepIds_.assign(keep.begin(), keep.end());
  policy::Victim victims[kVictimBatch];
  beenShort_ |= !fits();
  while (!fits()) {
    // What the evictions in flight will free counts: only the rest needs new victims.
    const uint64_t over = deviceBytes() + bytes - limit;
    if (over > evictingBytes_) {
      policy::EvictRequest request;
      request.bytes = over - evictingBytes_;
      request.now_ns = now;
      request.urgent = true;
      fillLinkState(request);
      request.keep = keepIds_;
      const size_t count = policy_->chooseVictims(request, victims);
      const size_t kept = keepIds_.size();
      if (count > 0 && (evict(victims, count, cause) || keepIds_.size() > kept)) continue;
    }
    // Nothing more to start: wait for the oldest eviction in flight (a stall), or give up.
    if (inFlight_.empty()) break;
    reclaimEvictions(true);
    physical_.trim(UINT64_MAX);
  }
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
    if (isHeld(id) || buffer.regenerating) {
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
      if (use.event != nullptr) {
        api_.cuStreamWaitEvent(evictStream_, use.event, 0);
        continue;
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
        buffer.host = host_.take(buffer.mappedBytes, &buffer.hostPinned);
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
    host_.give(buffer.host, buffer.mappedBytes, buffer.hostPinned);  // a stale copy, if any
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
  for (int u = 0; u < buffer.useCount; ++u) events_.give(buffer.uses[u].event);
  buffer.useCount = 0;
  buffer.manyStreams = false;
  events_.give(buffer.restoreEvent);
  buffer.restoreEvent = nullptr;
}

bool Residency::isHeld(uint32_t id) const {
  return heldCounts_[id].load(std::memory_order_acquire) > 0;
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
  int64_t horizon = 0;
  const uint64_t need = policy_->upcomingBytes(now, horizon);
  if (need == 0) return;
  // Pooled memory is room: what comes next takes it before anything is evicted.
  const uint64_t limit = limitLocked();
  const uint64_t taken = resident_ + quarantinedBytes_;
  const uint64_t room = limit > taken ? limit - taken : 0;
  if (need <= room + evictingBytes_) return;
  // Never this launch's buffers (evict() passes over what other launches hold); nothing
  // predicted to be used within the horizon (the policy sees to that through not_before_ns).
  keepIds_.assign(workingSet_.begin(), workingSet_.end());
  policy::EvictRequest request;
  request.bytes = need - room - evictingBytes_;
  request.now_ns = now;
  request.urgent = false;
  fillLinkState(request);
  request.not_before_ns = horizon;
  request.keep = keepIds_;
  policy::Victim victims[kVictimBatch];
  const size_t count = policy_->chooseVictims(request, victims);
  if (count > 0 && evict(victims, count, 0)) stats_.evictionsAhead += count;
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
    // On the stream of the work that needs it: that work is ordered after the copy.
    result = api_.cuMemcpyHtoDAsync_v2(buffer.address, buffer.host, buffer.bytes, stream);
    if (result != CUDA_SUCCESS) {
      api_.cuMemUnmap(buffer.address, buffer.mappedBytes);
      releasePhysical(buffer.mappedBytes, handle, buffer.program);
    } else {
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

// ---- the launch path ----------------------------------------------------------------------

void Residency::addWithLinks(uint32_t id, std::vector<uint32_t>& ids, int depth) {
  if (std::find(ids.begin(), ids.end(), id) != ids.end()) return;
  ids.push_back(id);
  if (!buffers_[id].table || depth >= kMaxLinkDepth) return;
  if (const PointerTables::Table* table = tables_.tableAt(buffers_[id].address))
    addTableTargets(*table, ids, depth + 1);
}

void Residency::addTableTargets(const PointerTables::Table& table, std::vector<uint32_t>& ids,
                                int depth) {
  // The values the kernel will dereference, resolved now: whatever buffer lies there today.
  for (uint64_t value : table.values) {
    const uint32_t id = addresses_.find(value);
    if (id != AddressMap::kNone && buffers_[id].program != nullptr) {
      addProgramReach(value, id, ids, depth);
    } else if (id != AddressMap::kNone) {
      addWithLinks(id, ids, depth);
    } else if (depth < kMaxLinkDepth) {
      // A table of tables: an unmanaged table the value leads into.
      const PointerTables::Table* inner = tables_.tableContaining(value);
      if (inner != nullptr && inner != &table) addTableTargets(*inner, ids, depth + 1);
    }
  }
}

void Residency::collect(const Touch& touch, std::vector<uint32_t>& ids) {
  // Only a kernel dereferences what it reaches: a copy or memset moves bytes. Without any table
  // no buffer has links to follow, and the loop is the plain one.
  if (!tables_.empty() && touch.kind == UseKind::kKernel) {
    collectThroughTables(touch, ids);
  } else {
    for (size_t i = 0; i < touch.pointerCount; ++i) {
      const uint32_t id = addresses_.find(touch.pointers[i]);
      if (id == AddressMap::kNone) continue;
      if (buffers_[id].program != nullptr && touch.kind == UseKind::kKernel) [[unlikely]]
        addProgramReach(touch.pointers[i], id, ids, kMaxLinkDepth);  // no tables: no links
      else
        addOnce(id, ids);
    }
  }
  if (touch.rangeBytes > 0)
    addresses_.forEachOverlapping(touch.rangeStart, touch.rangeBytes,
                                  [&](uint32_t id) { addOnce(id, ids); });
}

void Residency::collectThroughTables(const Touch& touch, std::vector<uint32_t>& ids) {
  for (size_t i = 0; i < touch.pointerCount; ++i) {
    const uint64_t value = touch.pointers[i];
    const uint32_t id = addresses_.find(value);
    if (id != AddressMap::kNone && buffers_[id].program != nullptr) {
      addProgramReach(value, id, ids, 0);
    } else if (id != AddressMap::kNone) {
      addWithLinks(id, ids, 0);
    } else if (const PointerTables::Table* table = tables_.tableContaining(value)) {
      addTableTargets(*table, ids, 1);
    }
  }
}

void Residency::addOnce(uint32_t id, std::vector<uint32_t>& ids) {
  if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
}

// ---- pointer tables: what copies and memsets write ----------------------------------------

// Host-to-device copies are scanned for pointers when they are at most this big (larger ones
// are data, and scanning them would cost the copy's time again), or when they land on words
// known to hold pointers (a large table written again).
constexpr uint64_t kPointerTableScanBytes = 64 << 10;

bool Residency::leadsSomewhere(uint64_t value) const {
  return addresses_.find(value) != AddressMap::kNone ||
         tables_.allocationContaining(value).valid() || tables_.tableContaining(value) != nullptr;
}

bool Residency::isDeviceMemory(uint64_t address) {
  if (addresses_.find(address) != AddressMap::kNone || tables_.allocationContaining(address).valid())
    return true;
  if (api_.cuPointerGetAttribute == nullptr) return false;
  unsigned type = 0;
  // Host memory the driver does not know is an error, not a type: it is the host's.
  return api_.cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, address) ==
             CUDA_SUCCESS &&
         (type == CU_MEMORYTYPE_DEVICE || type == CU_MEMORYTYPE_ARRAY || type == CU_MEMORYTYPE_UNIFIED);
}

PointerTables::Range Residency::allocationOf(uint64_t address) {
  const uint32_t id = addresses_.find(address);
  if (id != AddressMap::kNone) return {buffers_[id].address, buffers_[id].bytes};
  if (PointerTables::Range known = tables_.allocationContaining(address); known.valid()) return known;
  if (const PointerTables::Table* table = tables_.tableContaining(address)) return table->range;
  // Memory the shim did not see allocated (before it was active, or another allocation path).
  CUdeviceptr base = 0;
  size_t bytes = 0;
  if (api_.cuMemGetAddressRange_v2 != nullptr &&
      api_.cuMemGetAddressRange_v2(&base, &bytes, address) == CUDA_SUCCESS && bytes > 0)
    return {base, bytes};
  return {};
}

void Residency::refreshTableFlag(uint64_t address) {
  const uint32_t id = addresses_.find(address);
  if (id != AddressMap::kNone)
    buffers_[id].table = tables_.tableAt(buffers_[id].address) != nullptr;
}

void Residency::noteHostTable(uint64_t destination, const void* source, uint64_t bytes) {
  const bool knownTable = tables_.anyEntriesIn(destination, bytes);
  if (bytes > kPointerTableScanBytes && !knownTable) return;
  tableScratch_.clear();
  const auto* host = static_cast<const unsigned char*>(source);
  // Pointers sit at 8-byte aligned device addresses, wherever the host copy starts.
  for (uint64_t offset = (8 - destination % 8) % 8; offset + 8 <= bytes; offset += 8) {
    uint64_t value;
    std::memcpy(&value, host + offset, 8);
    if (value != 0 && leadsSomewhere(value))
      tableScratch_.push_back(PointerTables::Entry{destination + offset, value});
  }
  if (tableScratch_.empty() && !knownTable) return;  // data, as nearly every copy is
  tables_.write(allocationOf(destination), destination, bytes, tableScratch_);
  refreshTableFlag(destination);
}

void Residency::noteWrittenLocked(const WorkInfo& work) {
  ReentryGuard guard;  // isDeviceMemory and allocationOf may ask the driver
  const uint64_t destination = work.copyDst;
  const uint64_t bytes = work.bytes;
  if (bytes == 0) return;
  if (work.kind == WorkInfo::Kind::kMemset) {
    if (!tables_.empty() && tables_.anyEntriesIn(destination, bytes)) {
      tables_.clear(destination, bytes);
      refreshTableFlag(destination);
    }
    return;
  }
  trace::CopyKind kind = work.copyKind;
  if (kind == trace::CopyKind::kDefault) {
    // Unified addressing: the driver infers the direction, and so must we, but only where the
    // answer matters (a small copy that may carry pointers, or any copy once tables exist).
    if (bytes > kPointerTableScanBytes && tables_.empty()) return;
    const bool fromDevice = isDeviceMemory(work.copySrc);
    const bool toDevice = isDeviceMemory(destination);
    kind = !toDevice     ? trace::CopyKind::kDeviceToHost
           : fromDevice ? trace::CopyKind::kDeviceToDevice
                        : trace::CopyKind::kHostToDevice;
  }
  if (kind == trace::CopyKind::kHostToDevice) {
    if (bytes >= 8 || !tables_.empty())
      noteHostTable(destination, reinterpret_cast<const void*>(work.copySrc), bytes);
  } else if (kind == trace::CopyKind::kDeviceToDevice) {
    if (tables_.empty()) return;
    if (!tables_.anyEntriesIn(work.copySrc, bytes) && !tables_.anyEntriesIn(destination, bytes))
      return;
    tables_.copy(work.copySrc, allocationOf(destination), destination, bytes);
    refreshTableFlag(destination);
  }
}

void Residency::recordUse(Buffer& buffer, CUstream stream, bool perThreadStream) {
  if (buffer.manyStreams) return;
  const void* thread = perThreadStream ? thisThread() : nullptr;
  StreamUse* use = nullptr;
  for (int i = 0; i < buffer.useCount && use == nullptr; ++i)
    if (buffer.uses[i].stream == stream && buffer.uses[i].thread == thread) use = &buffer.uses[i];
  if (use == nullptr) {
    if (buffer.useCount == kMaxStreamUses) {
      buffer.manyStreams = true;  // evicting or freeing it will synchronise the device
      return;
    }
    use = &buffer.uses[buffer.useCount++];
    *use = StreamUse{stream, nullptr, thread};
  }
}

CUevent Residency::threadFence() {
  const void* thread = thisThread();
  for (const ThreadFence& f : threadFences_)
    if (f.thread == thread) return f.event;
  CUevent event = events_.take();
  if (event != nullptr) threadFences_.push_back(ThreadFence{thread, event});
  return event;
}

CUevent Residency::fenceOf(const void* thread) const {
  for (const ThreadFence& f : threadFences_)
    if (f.thread == thread) return f.event;
  return nullptr;
}

void Residency::orderAfterRestore(Buffer& buffer, CUstream stream, bool perThreadStream) {
  if (buffer.restoreEvent == nullptr) return;
  if (api_.cuEventQuery(buffer.restoreEvent) == CUDA_SUCCESS) {
    events_.give(buffer.restoreEvent);
    buffer.restoreEvent = nullptr;
    return;
  }
  // Only work on the very stream the restore ran on is ordered after it already.
  const bool sameStream = stream == buffer.restoreStream &&
                          buffer.restoreThread == (perThreadStream ? thisThread() : nullptr);
  if (!sameStream) api_.cuStreamWaitEvent(stream, buffer.restoreEvent, 0);
}

void Residency::traceWork(CUstream stream, const WorkInfo& work, uint32_t kernel, bool analysed,
                          int64_t now) {
  trace::TraceWriter* trace = trace_.load(std::memory_order_relaxed);
  if (trace == nullptr) return;
  const uint64_t streamId = reinterpret_cast<uint64_t>(stream);
  traceBuffers_.clear();
  for (uint32_t id : workingSet_) traceBuffers_.push_back(buffers_[id].serial);
  switch (work.kind) {
    case WorkInfo::Kind::kKernel:
    case WorkInfo::Kind::kOpaque: {
      trace::LaunchRecord record;
      record.time_ns = static_cast<uint64_t>(now);
      record.stream = streamId;
      record.kernel = kernel;
      for (int i = 0; i < 3; ++i) {
        record.grid[i] = work.grid[i];
        record.block[i] = work.block[i];
      }
      record.flags = analysed ? trace::kLaunchAnalysed : 0;
      record.buffers = traceBuffers_;
      trace->launch(record);
      return;
    }
    case WorkInfo::Kind::kCopy: {
      auto serialAt = [this](uint64_t address) -> uint64_t {
        uint32_t id = addresses_.find(address);
        return id == AddressMap::kNone ? 0 : buffers_[id].serial;
      };
      trace->copy(trace::CopyRecord{static_cast<uint64_t>(now), work.bytes, streamId,
                                    serialAt(work.copyDst), serialAt(work.copySrc),
                                    work.copyKind});
      return;
    }
    case WorkInfo::Kind::kMemset:
      trace->memset(trace::MemsetRecord{static_cast<uint64_t>(now),
                                        traceBuffers_.empty() ? 0 : traceBuffers_.front(),
                                        work.bytes, streamId});
      return;
  }
}

CUresult Residency::prepare(CUstream stream, bool perThreadApi, const Touch* touches,
                            size_t count, const WorkInfo& work) {
  // The calling thread's default stream: named explicitly, or as stream 0 by a _ptsz call.
  const bool perThreadStream =
      stream == CU_STREAM_PER_THREAD || (perThreadApi && stream == nullptr);
  // Paired with releaseHeld(), whatever happens below.
  if (tHeld.size() <= tHeldDepth) tHeld.emplace_back();
  tHeld[tHeldDepth].ids.clear();
  tHeld[tHeldDepth++].perThreadStream = false;
  std::vector<RecomputeCall> calls;  // empty (no allocation) unless something was dropped
  const char* what = nullptr;
  uint32_t kernel = 0;
  CUresult result;
  {
    // Inside the shim for as long as the lock is held: a signal handler that calls exit()
    // meanwhile must find the exit handler skipping what would take the lock again.
    ReentryGuard guard;
    std::unique_lock lock(mutex_);
    result = prepareLocked(lock, stream, perThreadStream, touches, count, work, calls, &what,
                           &kernel);
  }
  if (hasDropNotices()) deliverDropNotices();
  if (calls.empty()) return result;
  return runRecomputes(calls, stream, perThreadStream, what, kernel);
}

CUresult Residency::prepareLocked(std::unique_lock<std::mutex>& lock, CUstream stream,
                                  bool perThreadStream, const Touch* touches, size_t count,
                                  const WorkInfo& work, std::vector<RecomputeCall>& calls,
                                  const char** whatOut, uint32_t* kernelOut) {
  trace::TraceWriter* trace = trace_.load(std::memory_order_relaxed);
  const uint32_t kernel = trace && work.name ? trace->internName(work.name) : 0;
  *kernelOut = kernel;
  const char* what = work.name;
  if (what == nullptr) {
    // Copies and memsets have no name (kernels have theirs): they may write pointer tables.
    const bool writes = work.kind == WorkInfo::Kind::kCopy || work.kind == WorkInfo::Kind::kMemset;
    what = work.kind == WorkInfo::Kind::kCopy     ? "a copy"
           : work.kind == WorkInfo::Kind::kMemset ? "a memset"
                                                  : "a launch";
    if (writes) noteWrittenLocked(work);
  }
  *whatOut = what;
  int64_t now = nowNs();
  bool recomputing = false;  // some buffer must be regenerated by a callback, on this thread
  for (;;) {
    workingSet_.clear();
    if (addresses_.size() > 0)
      for (size_t i = 0; i < count; ++i) collect(touches[i], workingSet_);
    if (workingSet_.empty()) {
      traceWork(stream, work, kernel, work.kind != WorkInfo::Kind::kOpaque, now);
      return CUDA_SUCCESS;
    }
    if (!anyRecomputable_.load(std::memory_order_relaxed)) break;
    // Dropped buffers: regenerated here by their callback, or a framework bug. Another thread's
    // regeneration is waited for: its work must be in a stream before this work may use it.
    bool wait = false;
    recomputing = false;
    if (work.kind == WorkInfo::Kind::kOpaque) {
      // Work that could not be analysed "touches" every buffer: a framework-managed buffer it
      // finds dropped is most likely not used by it, and only the framework could regenerate
      // it, so it is left as it is (were it used, the device would fault, not compute on it).
      std::erase_if(workingSet_, [this](uint32_t id) {
        return buffers_[id].state == State::kDropped &&
               buffers_[id].hook.kind != RecomputeHook::Kind::kCallback;
      });
    }
    for (uint32_t id : workingSet_) {
      const Buffer& buffer = buffers_[id];
      const bool callback = buffer.hook.kind == RecomputeHook::Kind::kCallback;
      if (buffer.regenerating && buffer.regeneratingThread != nullptr &&
          buffer.regeneratingThread != thisThread())
        wait = true;
      if (buffer.state != State::kDropped) continue;
      if (!callback) {
        logLine("error: %s touches the managed buffer at 0x%llx (%llu bytes) whose contents were "
                "dropped and not regenerated; %s. The call fails instead of running on lost "
                "contents",
                what, (unsigned long long)buffer.address, (unsigned long long)buffer.bytes,
                buffer.hook.kind == RecomputeHook::Kind::kFramework
                    ? "the framework must call delta_begin_recompute, regenerate it, then "
                      "delta_recomputed before any use"
                    : "it was unregistered while dropped");
        return CUDA_ERROR_UNKNOWN;
      }
      if (recomputeOwner_ != nullptr && recomputeOwner_ != thisThread()) wait = true;
      recomputing = true;
    }
    if (!wait) break;
    regenerated_.wait(lock);  // then look again: buffers may have changed or been freed
    now = nowNs();
  }
  if (recomputing && tRecomputeDepth >= kMaxRecomputeDepth) {
    logLine("error: %s needs a dropped buffer regenerated, but recompute callbacks are already "
            "nested %d deep (do the producers of dropped buffers form a cycle?); the call fails",
            what, kMaxRecomputeDepth);
    return CUDA_ERROR_UNKNOWN;
  }
  if (!recomputeTimings_.empty()) pollRecomputeTimings();

  ReentryGuard guard;
  if (!inFlight_.empty()) {
    // A buffer of this work that is leaving stays (its memory is still there); evictions whose
    // batch is done go now. Work that may write a buffer an eviction batch still reads (leaving,
    // or called back by an earlier use) waits, on its own stream, for that batch (the host
    // never waits); a copy from it reads alongside.
    bool mayWrite = false;
    for (size_t t = 0; t < count; ++t) mayWrite |= touches[t].kind != UseKind::kRead;
    for (uint32_t id : workingSet_) {
      Buffer& buffer = buffers_[id];
      if (mayWrite && evictionMayRead(buffer))
        waitForEvictionCopy(buffer, perThreadStream ? CU_STREAM_PER_THREAD : stream);
      if (buffer.evicting) cancelEviction(id, now);
    }
    if (reclaimEvictions(false)) physical_.trim(UINT64_MAX);
  }
  uint64_t missing = 0;
  for (uint32_t id : workingSet_)
    if (buffers_[id].state != State::kResident) missing += buffers_[id].mappedBytes;
  CUresult result = CUDA_SUCCESS;
  if (missing > 0) {
    uint64_t workingBytes = 0;
    for (uint32_t id : workingSet_) workingBytes += buffers_[id].mappedBytes;
    result = makeRoom(missing, workingSet_, now, kernel);
    if (result != CUDA_SUCCESS) return result;  // strict: the caller fails the call
    if (deviceBytes() + missing > config_.budgetBytes) {
      stats_.overBudgetLaunches++;
      if (trace)
        trace->overBudget(trace::OverBudgetRecord{static_cast<uint64_t>(now), kernel, workingBytes,
                                                  config_.budgetBytes});
      DELTA_WARN_ONCE("%s needs %llu MiB resident at once, more than DELTA_BUDGET allows with "
                      "what cannot be evicted; running it over budget (counted; DELTA_STRICT=1 "
                      "makes this an error)",
                      what, (unsigned long long)(workingBytes >> 20));
    }
    for (uint32_t id : workingSet_) {
      Buffer& buffer = buffers_[id];
      if (buffer.state == State::kEvicted) {
        result = restore(id, stream, kernel, workingSet_, false, perThreadStream);
      } else if (buffer.state == State::kDropped) {
        result = remap(id, workingSet_);
        if (result == CUDA_SUCCESS) {
          policy_->onRestored(id, now);
          buffer.regenerating = true;
          buffer.regeneratingThread = thisThread();
          buffer.regenerateStartNs = now;
          buffer.pendingRegeneration = true;
          calls.push_back(RecomputeCall{id, buffer.serial, buffer.hook, buffer.address, buffer.bytes});
        }
      }
      if (result != CUDA_SUCCESS) {
        logLine("cannot bring back a buffer of %llu bytes at 0x%llx for %s: %s",
                (unsigned long long)buffer.bytes, (unsigned long long)buffer.address, what,
                resultText(api_, result));
        for (const RecomputeCall& call : calls) dropAgain(buffers_[call.id]);
        calls.clear();
        return result;
      }
    }
  }
  // Mapped again for a regeneration this thread has not run yet (an outer callback's work needs
  // this one's result first): it runs here, before this work reads memory not yet regenerated.
  for (uint32_t id : workingSet_) {
    const Buffer& buffer = buffers_[id];
    if (buffer.pendingRegeneration && buffer.regeneratingThread == thisThread() &&
        std::none_of(calls.begin(), calls.end(), [id](const RecomputeCall& c) { return c.id == id; }))
      calls.push_back(RecomputeCall{id, buffer.serial, buffer.hook, buffer.address, buffer.bytes});
  }
  if (!calls.empty()) recomputeOwner_ = thisThread();
  // What the work may write loses its host copy (a kernel may write whatever it reaches).
  for (size_t t = 0; t < count; ++t) {
    if (touches[t].kind == UseKind::kRead) continue;
    if (touches[t].kind == UseKind::kKernel || count == 1) {
      for (uint32_t id : workingSet_) buffers_[id].hostValid = false;
      break;
    }
    writtenScratch_.clear();
    collect(touches[t], writtenScratch_);
    for (uint32_t id : writtenScratch_) buffers_[id].hostValid = false;
  }
  for (uint32_t id : workingSet_) {
    Buffer& buffer = buffers_[id];
    orderAfterRestore(buffer, stream, perThreadStream);
    recordUse(buffer, stream, perThreadStream);
    buffer.keepContents = false;
  }
  notePeaks();
  policy::Launch launch;
  launch.now_ns = now;
  launch.stream = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(stream));
  launch.buffers = std::span<const policy::BufferId>(workingSet_.data(), workingSet_.size());
  // A recompute callback's own launches are how an eviction is paid back, not the program's
  // iteration (the replay models them inside the restore, policy/simulator.cpp): learned as
  // launches, they would make every iteration a new one, with more launches each time.
  if (tRecomputeDepth == 0) [[likely]] {
    // A plan made meanwhile goes in first: this launch may be the boundary that adopts it.
    if (planner_.ready()) [[unlikely]] deliverPlan(now);
    policy_->onLaunch(launch);
    if (policy_->wantsPlan()) [[unlikely]] submitPlan();
  }
  traceWork(stream, work, kernel, work.kind != WorkInfo::Kind::kOpaque, now);
  if (config_.prefetch) prefetch(now);
  makeRoomAhead(now);
  // Held from here until the work is in its stream: neither this thread's recompute callbacks
  // nor other threads may evict them meanwhile.
  HeldLaunch& launchHeld = tHeld[tHeldDepth - 1];
  launchHeld.perThreadStream = perThreadStream;
  launchHeld.fence = nullptr;
  if (perThreadStream && !workingSet_.empty()) {
    launchHeld.fence = threadFence();
    // Without a fence the uses cannot be told apart from other threads': evicting or freeing
    // these buffers will synchronise the device instead.
    if (launchHeld.fence == nullptr)
      for (uint32_t id : workingSet_) buffers_[id].manyStreams = true;
  }
  std::vector<uint32_t>& held = launchHeld.ids;
  held.assign(workingSet_.begin(), workingSet_.end());
  for (uint32_t id : held) heldCounts_[id].fetch_add(1, std::memory_order_relaxed);
  return CUDA_SUCCESS;
}

void Residency::prefetch(int64_t now) {
  // Only into free room: a prefetch never evicts (what it would evict may be needed sooner).
  if (deviceBytes() >= limitLocked()) return;
  policy::Prefetch wanted[8];
  policy::PrefetchRequest request;
  request.now_ns = now;
  request.h2d_busy_until_ns = std::max(now, h2dBusyUntilNs_);
  const size_t count = policy_->choosePrefetches(request, wanted);
  for (size_t i = 0; i < count; ++i) {
    const uint32_t id = wanted[i].id;
    if (id >= buffers_.size()) continue;
    Buffer& buffer = buffers_[id];
    if (buffer.live && buffer.evicting) {
      cancelEviction(id, now);  // still there: wanted back before it even left
      continue;
    }
    if (!buffer.live || buffer.state != State::kEvicted || buffer.host == nullptr) continue;
    if (deviceBytes() + buffer.mappedBytes > limitLocked()) break;
    if (prefetchStream_ == nullptr &&
        api_.cuStreamCreate(&prefetchStream_, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
      return;
    // On its own stream; whoever uses the buffer first waits for it (orderAfterRestore).
    if (restore(id, prefetchStream_, 0, {}, true) != CUDA_SUCCESS) return;
    stats_.prefetches++;
  }
}

void Residency::releaseHeld() {
  // No lock: the holds are counters apart from the buffers' records, and the fence is this
  // thread's own event.
  if (tHeldDepth == 0) return;
  HeldLaunch& launchHeld = tHeld[--tHeldDepth];
  std::vector<uint32_t>& held = launchHeld.ids;
  if (held.empty()) return;
  if (launchHeld.fence != nullptr) {
    // After the work: whoever evicts or frees these buffers waits for this record (or a later
    // one of the same stream) before the hold below is seen to end.
    ReentryGuard guard;
    if (api_.cuEventRecord(launchHeld.fence, CU_STREAM_PER_THREAD) != CUDA_SUCCESS) {
      std::lock_guard lock(mutex_);
      for (uint32_t id : held) buffers_[id].manyStreams = true;
    }
  }
  // Release: a thread that sees the count fall to 0 (acquire, under the lock) sees the work
  // enqueued and the fence recorded.
  for (uint32_t id : held) heldCounts_[id].fetch_sub(1, std::memory_order_release);
  held.clear();
}

void Residency::prepareEverything(CUstream stream, bool perThreadStream) {
  std::vector<uint64_t> all;
  {
    std::lock_guard lock(mutex_);
    stats_.unanalysedLaunches++;
    for (const Buffer& buffer : buffers_)
      if (buffer.live) all.push_back(buffer.address);
  }
  Touch touch;
  touch.pointers = all.data();
  touch.pointerCount = all.size();
  WorkInfo work;
  work.kind = WorkInfo::Kind::kOpaque;
  work.name = "a launch that cannot be analysed";
  prepare(stream, perThreadStream, &touch, 1, work);
}

bool Residency::pin(CUdeviceptr address, bool pinned) {
  std::lock_guard lock(mutex_);
  uint32_t id = addresses_.find(address);
  if (id == AddressMap::kNone) return false;
  if (pinned && buffers_[id].evicting) cancelEviction(id, nowNs());
  buffers_[id].pinned = pinned;
  policy_->onPinned(id, buffers_[id].immovable());
  return true;
}

template <class Visit>
void Residency::forEachBufferIn(CUdeviceptr start, uint64_t bytes, Visit visit) {
  const uint64_t end = start + bytes < start ? UINT64_MAX : start + bytes;
  for (uint64_t at = start; at < end;) {
    const uint32_t id = addresses_.find(at);
    if (id == AddressMap::kNone) {
      // Buffers start on granule boundaries: none is skipped by going to the next one.
      const uint64_t next = (at / granularity_ + 1) * granularity_;
      if (next <= at) break;
      at = next;
      continue;
    }
    Buffer& buffer = buffers_[id];
    visit(id, buffer);
    if (buffer.address + buffer.mappedBytes <= at) break;
    at = buffer.address + buffer.mappedBytes;
  }
}

std::vector<uint64_t> Residency::holdRegistration(CUdeviceptr start, uint64_t bytes) {
  std::vector<uint64_t> serials;
  if (bytes == 0) return serials;
  // Resident first, and held meanwhile (nothing evicts them between prepare and the count).
  Touch touch;
  touch.rangeStart = start;
  touch.rangeBytes = bytes;
  touch.kind = UseKind::kWrite;
  WorkInfo work;
  work.kind = WorkInfo::Kind::kKernel;
  work.name = "an NCCL buffer registration";
  prepare(nullptr, false, &touch, 1, work);
  {
    ReentryGuard guard;
    std::lock_guard lock(mutex_);
    forEachBufferIn(start, bytes, [&](uint32_t id, Buffer& buffer) {
      if (buffer.evicting) cancelEviction(id, nowNs());
      if (buffer.registrations++ == 0) policy_->onPinned(id, true);
      serials.push_back(buffer.serial);
    });
  }
  releaseHeld();
  return serials;
}

void Residency::releaseRegistration(CUdeviceptr start, uint64_t bytes,
                                    const std::vector<uint64_t>& serials) {
  if (bytes == 0 || serials.empty()) return;
  ReentryGuard guard;
  std::lock_guard lock(mutex_);
  forEachBufferIn(start, bytes, [&](uint32_t id, Buffer& buffer) {
    if (buffer.registrations > 0 &&
        std::find(serials.begin(), serials.end(), buffer.serial) != serials.end() &&
        --buffer.registrations == 0)
      policy_->onPinned(id, buffer.pinned);
  });
}


void Residency::setTrace(trace::TraceWriter* trace) { trace_.store(trace); }

trace::CloseTotals Residency::traceTotals() {
  Stats s = stats();
  trace::CloseTotals totals;
  totals.peak_resident = s.peakResidentBytes;
  totals.bytes_h2d = s.bytesToDevice;
  totals.bytes_d2h = s.bytesToHost;
  totals.evictions = s.evictions;
  totals.restores = s.restores;
  totals.recomputes = s.recomputes;
  totals.stall_ns = s.stallNs;
  totals.over_budget_launches = s.overBudgetLaunches;
  return totals;
}

void Residency::markIteration() {
  std::lock_guard lock(mutex_);
  const int64_t now = nowNs();
  if (planner_.ready()) deliverPlan(now);
  policy_->onIteration(now);
  if (policy_->wantsPlan()) submitPlan();
  if (trace::TraceWriter* trace = trace_.load(std::memory_order_relaxed))
    trace->iteration(trace::IterationRecord{static_cast<uint64_t>(now), iterations_});
  ++iterations_;
}

void Residency::submitPlan() {
  const policy::PlanRequest* request = policy_->takePlanRequest();
  if (request == nullptr) return;
  plannedLaunches_ = request->schedule.length();
  if (!planner_.submit(request)) {
    // No thread (the host is out of memory or threads): the policy gets an empty plan (its
    // configured mode), never a wait. Only speed is lost; the summary shows no plans.
    logVerbose(2, "cannot start the planner thread; the policy keeps its configured mode");
    policy_->deliverPlan(policy::Plan{});
  }
}

void Residency::deliverPlan(int64_t now) {
  int64_t planningNs = 0;
  policy::Plan plan = planner_.take(&planningNs);
  ++stats_.plans;
  stats_.planningNs += static_cast<uint64_t>(planningNs);
  const std::string name = plan.planned ? plan.name() : std::string("none");
  snprintf(stats_.planName, sizeof stats_.planName, "%s", name.c_str());
  stats_.planPredictedNs = plan.planned ? plan.chosenNs() : -1;
  logVerbose(2, "plan for the iteration learned (%u launches): %s, predicted %.3f ms per iteration; "
             "%.3f s on the planner thread",
             plannedLaunches_, name.c_str(), plan.planned ? plan.chosenNs() / 1e6 : 0.0, planningNs / 1e9);
  if (trace::TraceWriter* trace = trace_.load(std::memory_order_relaxed)) {
    trace::PlanRecord record;
    record.time_ns = static_cast<uint64_t>(now);
    record.planning_ns = static_cast<uint64_t>(planningNs);
    record.predicted_ns = stats_.planPredictedNs;
    record.launches = plannedLaunches_;
    record.name = trace->internString(name);
    record.flags = plan.planned ? 1 : 0;
    trace->plan(record);
  }
  policy_->deliverPlan(std::move(plan));
}

Stats Residency::stats() {
  ReentryGuard guard;
  std::lock_guard lock(mutex_);
  if (!recomputeTimings_.empty()) {
    ReentryGuard guard;
    pollRecomputeTimings();
  }
  Stats copy = stats_;
  copy.pageableFallbacks = host_.pageableFallbacks();
  copy.ceilingBytes = limitLocked();
  copy.pointerTables = tables_.size();
  copy.residentBytes = resident_;
  copy.foreignBytes = foreignBytes_ + programResident_;
  copy.liveBuffers = addresses_.size();
  return copy;
}

}  // namespace delta::shim
