#include "shim/residency.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <utility>

#include "shim/log.h"
#include "shim/reentry_guard.h"
#include "shim/residency_internal.h"

namespace delta::shim {

namespace {

// Per thread, the buffers each not-yet-released prepare() holds, innermost last. The vectors
// are kept (only tHeldDepth moves) so that the launch path does not allocate once grown.
struct HeldLaunch {
  std::vector<uint32_t> ids;
  // Recorded on afterStream once the work is in it, before the holds end: on this thread's
  // default stream, the thread's fence; on another, once memory has been short, the launch's
  // mark; else nullptr.
  CUevent after = nullptr;
  CUstream afterStream = nullptr;
  // A mark's: where to say it is recorded (or could not be), and its sequence.
  std::atomic<uint64_t>* recorded = nullptr;
  uint64_t sequence = 0;
};
thread_local std::vector<HeldLaunch> tHeld;
thread_local size_t tHeldDepth = 0;

// Under the residency lock. What a first pass held, while the work's dropped buffers were
// regenerated, is replaced.
void hold(HeldLaunch& launch, const std::vector<uint32_t>& ids, std::atomic<uint32_t>* counts) {
  for (uint32_t id : launch.ids) counts[id].fetch_sub(1, std::memory_order_relaxed);
  launch.ids.assign(ids.begin(), ids.end());
  for (uint32_t id : launch.ids) counts[id].fetch_add(1, std::memory_order_relaxed);
}

thread_local char tThreadToken;
constexpr int kMaxLinkDepth = 4;

// Set when strict mode had to run work over the budget because the call could not be failed
// where it was prepared (a CUPTI callback): a launch interposer the same call then reaches fails
// it (Residency::takeStrictOverrun).
thread_local bool tStrictOverrun = false;
thread_local int tRecomputeDepth = 0;  // detail::recomputeDepth()

}  // namespace

namespace detail {
const void* thisThread() { return &tThreadToken; }
int& recomputeDepth() { return tRecomputeDepth; }
}  // namespace detail

using detail::kMaxBuffers;
using detail::kVictimBatch;
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
      timingEvents_(api, CU_EVENT_DEFAULT),
      heldCounts_(new std::atomic<uint32_t>[kMaxBuffers]()),
      timedMarks_(policy_->wantsLaunchTimes()) {
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
  stats_.mappings++;
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
  // Short or not: a freed buffer of this size the device is done with, as it is. Mapping and
  // unmapping are the dearest calls of an allocation and a free (and on cudasim they stall the
  // simulated device: the Transformer as played, never short, ran 1.5 % slower for them).
  CUdeviceptr reusedAddress = 0;
  CUmemGenericAllocationHandle adopted = 0;
  if (!quarantine_.empty()) reuseQuarantined(mapped, &reusedAddress, &adopted);
  // Memory short, and a buffer of this size freed with work still queued on it: that buffer,
  // as it is mapped, ordered after that work on the device instead of waited for on the host
  // (the program's queue is often far ahead of the device), as a caching allocator reuses a
  // block in stream order.
  CUevent adoptedAfter = nullptr;
  CUstream adoptedStream = nullptr;
  if (adopted == 0 && deviceBytes() + mapped > roomLimitLocked() && !quarantine_.empty())
      [[unlikely]]
    adoptQuarantined(mapped, &reusedAddress, &adopted, &adoptedAfter, &adoptedStream);
  // Right after work that could not be analysed, while they keep coming, the next work is most
  // likely one too, and needs this buffer with all the others: evicting for it frees nothing.
  if (lastProgramWorkOpaque_ && policyLaunches_ < unanalysedHoldUntil_ &&
      deviceBytes() + mapped > std::max(limitLocked(), unanalysedHoldBytes_)) [[unlikely]] {
    unanalysedHoldBytes_ = deviceBytes() + mapped;
    stats_.unanalysedHoldBytes = std::max(stats_.unanalysedHoldBytes, unanalysedHoldBytes_);
  }
  if (adopted == 0) {
    if (CUresult room = makeRoom(mapped, kNothing, now, 0, /*onePiece=*/true);
        room != CUDA_SUCCESS) {
      freeIds_.push_back(id);
      return room;
    }
  }
  // A pooled handle of its size is counted already (one taken over was the quarantine's).
  const uint64_t adds = added(mapped, /*onePiece=*/adopted == 0);
  if (deviceBytes() + adds > config_.budgetBytes) {
    stats_.overBudgetAllocations++;
    if (deviceBytes() + adds <= roomLimitLocked())
      DELTA_WARN_ONCE("an allocation of %llu MiB goes over DELTA_BUDGET because launches that "
                      "cannot be analysed keep needing every buffer resident: memory evicted "
                      "for it would come back at the next of them (counted; DELTA_STRICT=1 "
                      "keeps the budget whatever it costs)",
                      (unsigned long long)(mapped >> 20));
    else
      DELTA_WARN_ONCE("an allocation of %llu MiB does not fit in DELTA_BUDGET even after "
                      "evicting what the policy allows; allocating over budget (counted; "
                      "DELTA_STRICT=1 makes this an out-of-memory error)",
                      (unsigned long long)(mapped >> 20));
  }
  CUdeviceptr address = reusedAddress;
  if (address != 0) {
    // Mapped already, to `adopted`.
  } else if (auto it = addressCache_.find(mapped); it != addressCache_.end()) {
    address = it->second;
    addressCache_.erase(it);
  } else if (CUresult r = api_.cuMemAddressReserve(&address, mapped, granularity_, 0, 0);
             r != CUDA_SUCCESS) {
    freeIds_.push_back(id);
    return r;
  }
  CUmemGenericAllocationHandle handle = adopted;
  CUresult result = adopted != 0 ? CUDA_SUCCESS : acquireOrEvict(mapped, &handle, {}, 0);
  if (result == CUDA_SUCCESS && reusedAddress == 0) {
    result = mapAt(address, mapped, handle);
    if (result != CUDA_SUCCESS) physical_.release(mapped, handle);
  }
  if (result != CUDA_SUCCESS) {
    addressCache_.emplace(mapped, address);
    freeIds_.push_back(id);
    return result;
  }
  Buffer& buffer = startBuffer(id, address, bytes, mapped, handle);
  if (adoptedAfter != nullptr) {
    // Its first use on another stream waits for the freed buffer's last (orderAfterRestore),
    // and so do its eviction and its free.
    buffer.restoreEvent = adoptedAfter;
    buffer.restoreStream = adoptedStream;
    buffer.restoreThread = nullptr;
  }
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

Residency::Buffer& Residency::startBuffer(uint32_t id, CUdeviceptr address, uint64_t bytes,
                                         uint64_t mapped, CUmemGenericAllocationHandle handle) {
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
  return buffer;
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
    const StreamUse& use = buffer.uses[i];
    // At the stream's tail, not at the use's mark: the quarantine is polled, nobody waits for
    // it on the host while the device catches up, and a mark's slot is not this entry's to own.
    CUevent event = events_.take();
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
    entry.events.push_back(event);
    if (use.thread == nullptr) entry.stream = use.stream;
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
  if (entry.events.size() != 1 || synced) entry.stream = nullptr;
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
  reclaimQuarantine(false, UINT64_MAX, /*keepMapped=*/true);
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

bool Residency::reuseQuarantined(uint64_t mapped, CUdeviceptr* address,
                                 CUmemGenericAllocationHandle* handle) {
  // The oldest few of this size only: frees pass in order on each stream, so when these are
  // still in use the newer ones most likely are too, and a long quarantine costs no long scan.
  constexpr int kLooks = 4;
  int looked = 0;
  for (size_t i = 0; i < quarantine_.size() && looked < kLooks; ++i) {
    Quarantined& entry = quarantine_[i];
    if (entry.handle == 0 || entry.mappedBytes != mapped) continue;
    ++looked;
    bool done = true;
    for (CUevent event : entry.events) done = done && api_.cuEventQuery(event) == CUDA_SUCCESS;
    if (!done) continue;
    for (CUevent event : entry.events) events_.give(event);
    host_.give(entry.host, entry.hostPinned);
    quarantinedBytes_ -= mapped;
    *address = entry.address;
    *handle = entry.handle;
    quarantine_.erase(quarantine_.begin() + static_cast<std::ptrdiff_t>(i));
    stats_.reusedFrees++;
    return true;
  }
  return false;
}

bool Residency::adoptQuarantined(uint64_t mapped, CUdeviceptr* address,
                                 CUmemGenericAllocationHandle* handle, CUevent* after,
                                 CUstream* afterStream) {
  for (size_t i = 0; i < quarantine_.size(); ++i) {
    Quarantined& entry = quarantine_[i];
    if (entry.handle == 0 || entry.mappedBytes != mapped) continue;
    // One event for all of the freed buffer's last uses: recorded on their one stream now, or,
    // used on several, on a stream of the shim's that waits for all of them and runs nothing
    // else. The entry's own events can go then: what waits on them is queued.
    CUstream on = entry.stream;
    if (on == nullptr) {
      if (joinStream_ == nullptr &&
          api_.cuStreamCreate(&joinStream_, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
        return false;
      for (CUevent e : entry.events) api_.cuStreamWaitEvent(joinStream_, e, 0);
      on = joinStream_;
    }
    CUevent event = events_.take();
    if (event == nullptr || api_.cuEventRecord(event, on) != CUDA_SUCCESS) {
      events_.give(event);
      return false;
    }
    // The same address and mapping: no driver call to map, set access or unmap (on cudasim,
    // where mappings stall the simulated device and fault again at first touch, mapping the
    // memory at a new address cost the LSTM as played 5-6 % at 50 %/12 GB/s without a single
    // eviction). The device's queued work reaches the memory as the freed buffer, the new
    // buffer's after it.
    *address = entry.address;
    *handle = entry.handle;
    *after = event;
    *afterStream = on;
    quarantinedBytes_ -= mapped;
    stats_.adoptedFrees++;
    if (entry.host != nullptr) {
      // Its host block may still be read by a restore, or written by a copy out, that the
      // events stand for: it stays, with no address and no memory, until they complete.
      entry.address = 0;
      entry.handle = 0;
      entry.stream = nullptr;
      return true;
    }
    for (CUevent e : entry.events) events_.give(e);
    quarantine_.erase(quarantine_.begin() + static_cast<std::ptrdiff_t>(i));
    return true;
  }
  return false;
}

bool Residency::reclaimQuarantine(bool wait, uint64_t enough, bool keepMapped) {
  // In the order of the frees, which is the order the device gets past them: a host that has
  // to wait waits only for the oldest, for as much as it needs. Waiting for the newest would
  // have it wait for the device to drain its whole queue, and the device would then stand
  // idle while the host fills it again.
  bool any = false;
  uint64_t freed = 0;
  size_t kept = 0;
  for (size_t i = 0; i < quarantine_.size(); ++i) {
    Quarantined& entry = quarantine_[i];
    // One with no memory (evicted, or taken over) gives none back: not worth a wait.
    const bool waitHere = wait && freed < enough && entry.handle != 0;
    bool done = true;
    for (CUevent event : entry.events) {
      CUresult state = waitHere ? api_.cuEventSynchronize(event) : api_.cuEventQuery(event);
      if (state == CUDA_ERROR_NOT_READY) {
        done = false;
        break;
      }
    }
    if (!done) {
      if (kept != i) quarantine_[kept] = std::move(entry);
      ++kept;
      continue;
    }
    for (CUevent event : entry.events) events_.give(event);
    entry.events.clear();
    if ((keepMapped || freed >= enough) && entry.handle != 0) {
      // Done with, and kept as it is for the next allocation of its size (reuseQuarantined);
      // its memory counts as the quarantine's until then, and goes when room is needed.
      if (kept != i) quarantine_[kept] = std::move(entry);
      ++kept;
      continue;
    }
    if (entry.handle != 0) {
      api_.cuMemUnmap(entry.address, entry.mappedBytes);
      quarantinedBytes_ -= entry.mappedBytes;
      physical_.release(entry.mappedBytes, entry.handle);
      freed += entry.mappedBytes;
    }
    // Taken over (adoptQuarantined): its address, 0 here, is the new buffer's.
    if (entry.address != 0) addressCache_.emplace(entry.mappedBytes, entry.address);
    host_.give(entry.host, entry.hostPinned);
    any = true;
  }
  quarantine_.resize(kept);
  return any;
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

Residency::StreamUse* Residency::recordUse(Buffer& buffer, CUstream stream, bool perThreadStream) {
  if (buffer.manyStreams) return nullptr;
  const void* thread = perThreadStream ? thisThread() : nullptr;
  StreamUse* use = nullptr;
  for (int i = 0; i < buffer.useCount && use == nullptr; ++i)
    if (buffer.uses[i].stream == stream && buffer.uses[i].thread == thread) use = &buffer.uses[i];
  if (use == nullptr) {
    if (buffer.useCount == kMaxStreamUses) {
      buffer.manyStreams = true;  // evicting or freeing it will synchronise the device
      return nullptr;
    }
    use = &buffer.uses[buffer.useCount++];
    *use = StreamUse{stream, 0, thread};
  }
  return use;
}

CUevent Residency::reserveMark(CUstream stream, uint64_t launch, uint64_t* sequence,
                               std::atomic<uint64_t>** recorded) {
  LaunchMarks* marks = nullptr;
  for (const auto& m : launchMarks_)
    if (m->stream == stream) marks = m.get();
  if (marks == nullptr) {
    if (launchMarks_.size() == kMaxMarkedStreams) return nullptr;
    launchMarks_.push_back(std::make_unique<LaunchMarks>());
    marks = launchMarks_.back().get();
    marks->stream = stream;
  }
  const size_t slot = marks->next % kMarkSlots;
  CUevent& event = marks->events[slot];
  if (event == nullptr) event = timedMarks_ ? timingEvents_.take() : events_.take();
  if (event == nullptr) return nullptr;
  *sequence = marks->next++;
  // The mark this slot held is lost if not read yet.
  if (marks->read + kMarkSlots <= *sequence) marks->read = *sequence - kMarkSlots + 1;
  marks->launch[slot] = launch;
  marks->passed[slot] = 0;
  if (launch != kNoLaunch) {
    marks->gapIsWaits[slot] = !unseenSinceMark_;
    unseenSinceMark_ = false;
  }
  *recorded = &marks->recorded[slot];
  return event;
}

void Residency::recordMarkStart(CUstream stream, uint64_t sequence) {
  for (const auto& m : launchMarks_) {
    if (m->stream != stream) continue;
    const size_t slot = sequence % kMarkSlots;
    if (m->launch[slot] == kNoLaunch) return;
    CUevent& start = m->starts[slot];
    if (start == nullptr) start = timingEvents_.take();
    if (start == nullptr || api_.cuEventRecord(start, stream) != CUDA_SUCCESS) m->launch[slot] = kNoLaunch;
    return;
  }
}

CUevent Residency::markEvent(CUstream stream, uint64_t sequence, bool* passed) const {
  *passed = false;
  for (const auto& m : launchMarks_) {
    if (m->stream != stream) continue;
    const size_t slot = sequence % kMarkSlots;
    *passed = m->passed[slot] == sequence;
    return *passed ? nullptr : m->events[slot];
  }
  return nullptr;
}

void Residency::readLaunchTimes() {
  for (const auto& m : launchMarks_) {
    while (m->read < m->next) {
      const size_t slot = m->read % kMarkSlots;
      const uint64_t recorded = m->recorded[slot].load(std::memory_order_acquire);
      if (recorded == (m->read | kRecordFailed)) {
        ++m->read;
        continue;
      }
      if (recorded != m->read) break;  // its launch is not in the stream yet
      const CUresult state = api_.cuEventQuery(m->events[slot]);
      if (state == CUDA_ERROR_NOT_READY) break;
      if (state == CUDA_SUCCESS) {
        m->passed[slot] = m->read;
        float ranMs = 0;
        int64_t end = 0;
        if (m->launch[slot] != kNoLaunch &&
            api_.cuEventElapsedTime_v2(&ranMs, m->starts[slot], m->events[slot]) == CUDA_SUCCESS &&
            deviceTime(m->events[slot], &end)) {
          policy_->onLaunchTimed(m->launch[slot], end - static_cast<int64_t>(static_cast<double>(ranMs) * 1e6), end,
                                 m->gapIsWaits[slot]);
        }
      }
      ++m->read;
    }
  }
}

bool Residency::deviceTime(CUevent& event, int64_t* ns) {
  // Elapsed times are floats of milliseconds: a new anchor every second keeps them to tens of
  // nanoseconds. The anchor is a mark that has passed, taken out of its ring (the slot gets a
  // fresh event when next reserved; waiting for the old mark would wait for nothing).
  constexpr float kReanchorMs = 1000.0f;
  if (clockAnchor_ == nullptr) {
    clockAnchor_ = event;
    event = nullptr;
    *ns = clockAnchorNs_;
    return true;
  }
  float ms = 0;
  if (api_.cuEventElapsedTime_v2(&ms, clockAnchor_, event) != CUDA_SUCCESS) return false;
  *ns = clockAnchorNs_ + static_cast<int64_t>(static_cast<double>(ms) * 1e6);
  if (ms > kReanchorMs) {
    timingEvents_.give(clockAnchor_);
    clockAnchor_ = event;
    clockAnchorNs_ = *ns;
    event = nullptr;
  }
  return true;
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
  if (sameStream) return;
  // A prefetch (or another stream's restore) still in flight: how long this stream stands
  // still for it is what the prefetch failed to hide.
  CUevent start = beginWaitTiming(stream);
  api_.cuStreamWaitEvent(stream, buffer.restoreEvent, 0);
  endWaitTiming(start, stream);
}

CUevent Residency::beginWaitTiming(CUstream stream) {
  CUevent start = timingEvents_.take();
  if (start != nullptr && api_.cuEventRecord(start, stream) != CUDA_SUCCESS) {
    timingEvents_.give(start);
    return nullptr;
  }
  return start;
}

void Residency::endWaitTiming(CUevent start, CUstream stream, DeviceTiming::Kind kind, uint64_t bytes) {
  if (start == nullptr) return;
  CUevent end = timingEvents_.take();
  if (end == nullptr || api_.cuEventRecord(end, stream) != CUDA_SUCCESS) {
    timingEvents_.give(start);
    timingEvents_.give(end);
    return;
  }
  timings_.push_back(DeviceTiming{kind, 0, 0, 0, start, end, tRecomputeDepth, bytes});
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
  // Nothing to record unless the work gets as far as being prepared (a first pass that only
  // regenerates dropped buffers holds them, and an error after it must not record a stale one).
  tHeld[tHeldDepth].ids.clear();
  tHeld[tHeldDepth++].after = nullptr;
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
  if (calls.empty()) [[likely]] return result;
  return regenerateThenPrepare(calls, stream, perThreadStream, touches, count, work, what, kernel);
}

CUresult Residency::regenerateThenPrepare(std::vector<RecomputeCall>& calls, CUstream stream,
                                          bool perThreadStream, const Touch* touches,
                                          size_t count, const WorkInfo& work, const char* what,
                                          uint32_t kernel) {
  // Dropped buffers to regenerate before this work is prepared; then it is prepared again,
  // from a copy of what it touches: the callers' scratch is reused by the callbacks' work.
  std::vector<uint64_t> ownPointers;
  for (size_t i = 0; i < count; ++i)
    ownPointers.insert(ownPointers.end(), touches[i].pointers,
                       touches[i].pointers + touches[i].pointerCount);
  std::vector<Touch> ownTouches(touches, touches + count);
  size_t at = 0;
  for (Touch& touch : ownTouches) {
    touch.pointers = touch.pointerCount > 0 ? ownPointers.data() + at : nullptr;
    at += touch.pointerCount;
  }
  const WorkInfo ownWork = work;
  for (;;) {
    CUresult result = runRecomputes(calls, stream, perThreadStream, what, kernel);
    if (result != CUDA_SUCCESS) return result;
    {
      ReentryGuard guard;
      std::unique_lock lock(mutex_);
      // The work waits, on its stream, for the regenerations just queued before it: each
      // buffer's recompute time (its hook's estimate, scaled by the times measured so far) is
      // what dropping it cost this work, told before the work's onLaunch as the replay does.
      // Untold, every recompute closed with no wait and drops looked free.
      if (tRecomputeDepth == 0) {
        for (const RecomputeCall& call : calls) {
          const Buffer& buffer = buffers_[call.id];
          if (!buffer.live || buffer.serial != call.serial) continue;
          const int64_t expected = policy_->buffers()[call.id].recompute_ns;
          if (expected > 0) policy_->onWaited(call.id, expected);
        }
      }
      calls.clear();
      result = prepareLocked(lock, stream, perThreadStream, ownTouches.data(), count, ownWork,
                             calls, &what, &kernel);
    }
    if (hasDropNotices()) deliverDropNotices();
    if (calls.empty()) return result;
  }
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
      if (timedMarks_ && beenShort_) unseenSinceMark_ = true;
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
      const bool mine = buffer.regenerating && buffer.regeneratingThread == thisThread();
      // Regenerated by this thread, its callback not run yet: this work needs it first. Unless
      // this work cannot be analysed: it "touches" every buffer, and each of its nested
      // regenerations would be opaque too, needing every other pending one first, nested
      // again, until the depth limit failed the call and a kernel ran on unmapped memory
      // (CUDASIM_FAULTS=paraminfo-fail reproduces it; an H200 run of opaque launches crashed).
      // It gets their memory instead (below, as a regeneration's own work does);
      // the outer regeneration fills them, oldest first (a producer's inputs are older than
      // its result).
      if (mine && buffer.pendingRegeneration && work.kind != WorkInfo::Kind::kOpaque)
        recomputing = true;
      // Its callback running: this is that callback's work, which gets the memory it writes.
      if (buffer.state != State::kDropped || mine) continue;
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
  if (recomputing) [[unlikely]] {
    // Dropped buffers this work needs are regenerated first, by their callbacks, and only then
    // is this work prepared (prepare() comes back): a buffer gets its memory from the
    // regeneration's own work, once that work's inputs are there. Mapped here, before their
    // callbacks ran, the outputs of a chain of dropped producers would all hold memory while the
    // first of them waits for the rest: the replay (policy/simulator.cpp) maps each result
    // only once its inputs are there, and this is the same order.
    for (uint32_t id : workingSet_) {
      Buffer& buffer = buffers_[id];
      if (buffer.state == State::kDropped && !buffer.regenerating) {
        buffer.regenerating = true;
        buffer.regeneratingThread = thisThread();
        buffer.regenerateStartNs = now;
        buffer.pendingRegeneration = true;
      }
      if (buffer.pendingRegeneration && buffer.regeneratingThread == thisThread())
        calls.push_back(RecomputeCall{id, buffer.serial, buffer.hook, buffer.address, buffer.bytes});
    }
    std::sort(calls.begin(), calls.end(),
              [](const RecomputeCall& a, const RecomputeCall& b) { return a.serial < b.serial; });
    recomputeOwner_ = thisThread();
    // Meanwhile the callbacks may not evict what this work uses.
    hold(tHeld[tHeldDepth - 1], workingSet_, heldCounts_.get());
    return CUDA_SUCCESS;
  }
  if (!timings_.empty()) pollTimings();

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
    reclaimEvictions(false);  // their memory waits in the pool for what needs room
  }
  uint64_t missing = 0;
  const Buffer* missingOne = nullptr;  // the last missing: the only one if `missing` is its size
  for (uint32_t id : workingSet_)
    if (buffers_[id].state != State::kResident) {
      missing += buffers_[id].mappedBytes;
      missingOne = &buffers_[id];
    }
  bool countedOverBudget = false;
  CUresult result = CUDA_SUCCESS;
  if (missing > 0) {
    uint64_t workingBytes = 0;
    for (uint32_t id : workingSet_) workingBytes += buffers_[id].mappedBytes;
    // One buffer back, in memory from the pool: a pooled handle of its size is its room.
    const bool onePiece = missing == missingOne->mappedBytes && missingOne->program == nullptr;
    result = makeRoom(missing, workingSet_, now, kernel, onePiece);
    if (result != CUDA_SUCCESS) {  // strict mode, and the budget cannot hold the working set
      if (work.failable) return result;  // the caller fails the call
      // Nothing can stop this work, and on memory that is not there the device faults.
      DELTA_WARN_ONCE("DELTA_STRICT=1: %s needs more than DELTA_BUDGET where only CUPTI sees it, "
                      "which cannot fail a call: its buffers come back over the budget (counted), "
                      "and the call fails only if it reaches the shim's cudaLaunchKernel or "
                      "cuLaunchKernel",
                      what);
      tStrictOverrun = true;
      result = CUDA_SUCCESS;
    }
    const uint64_t adds = added(missing, onePiece);
    if (deviceBytes() + adds > config_.budgetBytes) {
      countedOverBudget = true;
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
        // The work waits, on its stream, for the whole copy: told before its onLaunch, as the
        // replay tells it. Untold, every swap closed with no wait and looked free: the LSTM's
        // recurrent weight, used every few launches, was swapped out and back 53 times in one
        // iteration.
        if (result == CUDA_SUCCESS)
          policy_->onWaited(id, policy_->costs().transferNs(policy::Direction::kHostToDevice, buffer.bytes));
      } else if (buffer.state == State::kDropped) {
        // The work of its own regeneration (its callback running on this thread): the memory it
        // is regenerated into, its inputs there already.
        result = remap(id, workingSet_);
        if (result == CUDA_SUCCESS) policy_->onRestored(id, now);
      }
      if (result != CUDA_SUCCESS) {
        logLine("cannot bring back a buffer of %llu bytes at 0x%llx for %s: %s",
                (unsigned long long)buffer.bytes, (unsigned long long)buffer.address, what,
                resultText(api_, result));
        return result;
      }
    }
  }
  const bool opaque = work.kind == WorkInfo::Kind::kOpaque;
  if (opaque) [[unlikely]] noteUnanalysedDemand(countedOverBudget, now, kernel);
  if (tRecomputeDepth == 0 && work.program) lastProgramWorkOpaque_ = opaque;
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
  // Marked once memory has been short (launchMarks_); a use with no mark is pinned down at
  // eviction time instead, so a use whose mark could not be had loses its older one.
  CUevent mark = nullptr;
  uint64_t markSequence = 0;
  std::atomic<uint64_t>* markRecorded = nullptr;
  if (beenShort_ && !perThreadStream && !workingSet_.empty()) [[unlikely]]
    mark = reserveMark(stream, tRecomputeDepth == 0 && work.program ? policyLaunches_ : kNoLaunch, &markSequence,
                       &markRecorded);
  for (uint32_t id : workingSet_) {
    Buffer& buffer = buffers_[id];
    orderAfterRestore(buffer, stream, perThreadStream);
    if (StreamUse* use = recordUse(buffer, stream, perThreadStream)) use->mark = markSequence;
    buffer.keepContents = false;
  }
  notePeaks();
  tellPolicy(stream, work, now);
  traceWork(stream, work, kernel, work.kind != WorkInfo::Kind::kOpaque, now);
  if (config_.prefetch) prefetch(now);
  makeRoomAhead(now);
  // The launch's start, for the device's times: after everything it waits for on its stream,
  // and after the host's own work for it here. Recorded before that work, a device that had
  // caught up with the host ran this event at once and then stood idle while the host told
  // the policy, prefetched and made room ahead: that idle time was taken for the launch's
  // run, which the planner replays as compute (it takes only waits out of the op times).
  if (mark != nullptr && timedMarks_) [[unlikely]] recordMarkStart(stream, markSequence);
  // Held from here until the work is in its stream: neither this thread's recompute callbacks
  // nor other threads may evict them meanwhile.
  HeldLaunch& launchHeld = tHeld[tHeldDepth - 1];
  launchHeld.after = mark;
  launchHeld.afterStream = stream;
  launchHeld.recorded = markRecorded;
  launchHeld.sequence = markSequence;
  if (perThreadStream && !workingSet_.empty()) {
    launchHeld.after = threadFence();
    launchHeld.afterStream = CU_STREAM_PER_THREAD;
    // Without a fence the uses cannot be told apart from other threads': evicting or freeing
    // these buffers will synchronise the device instead.
    if (launchHeld.after == nullptr)
      for (uint32_t id : workingSet_) buffers_[id].manyStreams = true;
  }
  hold(launchHeld, workingSet_, heldCounts_.get());
  return CUDA_SUCCESS;
}

void Residency::noteUnanalysedDemand(bool countedOverBudget, int64_t now, uint32_t kernel) {
  if (!config_.strict) {
    // Such work keeps coming: an allocation right after it is taken as needed by the next
    // (allocate), over the budget or not yet.
    if (policyLaunches_ >= unanalysedHoldUntil_) unanalysedHoldBytes_ = 0;
    unanalysedHoldUntil_ = policyLaunches_ + kUnanalysedHoldLaunches;
  }
  // What the work holds: the pool and freed memory are not its need.
  const uint64_t needed = resident_ + foreignBytes_;
  if (needed <= config_.budgetBytes) return;
  // Over the budget with nothing to bring back (held there since the last such work): still a
  // launch that needs more than the budget.
  if (!countedOverBudget) {
    stats_.overBudgetLaunches++;
    if (trace::TraceWriter* trace = trace_.load(std::memory_order_relaxed))
      trace->overBudget(trace::OverBudgetRecord{static_cast<uint64_t>(now), kernel, needed,
                                                config_.budgetBytes});
  }
  if (config_.strict) return;
  if (unanalysedHoldBytes_ == 0)
    logVerbose(1, "launches that cannot be analysed need %llu MiB, over DELTA_BUDGET: evictions "
               "make room under that while they keep coming",
               (unsigned long long)(needed >> 20));
  unanalysedHoldBytes_ = std::max(unanalysedHoldBytes_, needed);
  stats_.unanalysedHoldBytes = std::max(stats_.unanalysedHoldBytes, unanalysedHoldBytes_);
}

void Residency::tellPolicy(CUstream stream, const WorkInfo& work, int64_t now) {
  // A recompute callback's own launches are how an eviction is paid back, not the program's
  // iteration (the replay models them inside the restore, policy/simulator.cpp): learned as
  // launches, they would make every iteration a new one, with more launches each time. So is
  // the shim's regeneration of a dropped buffer whose hook goes (clearRecompute): told, it
  // was a launch in the iterations where that buffer happened to be dropped, and the
  // Transformer at 30 % learned iterations of 1,402 and 1,404 launches in turn, each
  // predicting the next from the other (564 of its positions off by one or two).
  if (tRecomputeDepth != 0 || !work.program) [[unlikely]] return;
  policy::Launch launch;
  launch.now_ns = now;
  launch.stream = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(stream));
  launch.buffers = std::span<const policy::BufferId>(workingSet_.data(), workingSet_.size());
  // A plan made meanwhile goes in first: this launch may be the boundary that adopts it.
  if (planner_.ready()) [[unlikely]] deliverPlan(now);
  if (timedMarks_ && beenShort_) [[unlikely]] readLaunchTimes();
  policy_->onLaunch(launch);
  ++policyLaunches_;
  if (policy_->iterationBoundaries() != boundariesSeen_) [[unlikely]] renumberAtBoundary();
  if (policy_->wantsPlan()) [[unlikely]] submitPlan();
}

void Residency::prefetch(int64_t now) {
  // Only into free room: a prefetch never evicts (what it would evict may be needed sooner).
  // Pooled memory is free room, and so is freed memory the device has got past since (unmapped
  // only as far as a prefetch needs it: the rest stays for an allocation of its size).
  const uint64_t limit = limitLocked();
  auto taken = [&] { return deviceBytes() - physical_.bytes(); };
  auto roomFor = [&](uint64_t bytes) {
    if (taken() + bytes > limit && !quarantine_.empty())
      reclaimQuarantine(false, taken() + bytes - limit);
    return taken() + bytes <= limit;
  };
  if (!roomFor(granularity_)) return;
  policy::Prefetch wanted[8];
  policy::PrefetchRequest request;
  request.now_ns = now;
  request.h2d_busy_until_ns = std::max(now, h2dBusyUntilNs_);
  // The free memory (request.free_bytes) is not told: with it, a restore behind a backlog
  // waits while the launches before its transfer need its memory, which the replay gains from
  // (docs/policy.md, *A restore behind a backlog*); online it has not been shown to gain, and
  // DenseNet-121 at 30 %/50 GB/s ran slow in 5 runs of 35 with it against 2 of 25 without (here
  // the clock is the host's, ahead of the device, while the rule reads the learned device
  // times). The replay as played models it untold (SimOptions::prefetch_sees_free_memory).
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
    const uint64_t mapped = buffer.mappedBytes;
    if (!roomFor(mapped)) break;
    trimPoolFor(mapped, limit, /*onePiece=*/true);
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
  // After the work: whoever evicts or frees these buffers waits for this record (or a later
  // one of the same stream) before the hold below is seen to end.
  if (launchHeld.after != nullptr) {
    ReentryGuard guard;
    const bool recorded = api_.cuEventRecord(launchHeld.after, launchHeld.afterStream) == CUDA_SUCCESS;
    if (!recorded) {
      std::lock_guard lock(mutex_);
      for (uint32_t id : held) buffers_[id].manyStreams = true;
    }
    if (launchHeld.recorded != nullptr)
      launchHeld.recorded->store(launchHeld.sequence | (recorded ? 0 : kRecordFailed), std::memory_order_release);
  }
  // Release: a thread that sees the count fall to 0 (acquire, under the lock) sees the work
  // enqueued and the fence recorded.
  for (uint32_t id : held) heldCounts_[id].fetch_sub(1, std::memory_order_release);
  held.clear();
}

bool Residency::takeStrictOverrun() { return std::exchange(tStrictOverrun, false); }

CUresult Residency::prepareEverything(CUstream stream, bool perThreadStream, bool failable) {
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
  work.failable = failable;
  return prepare(stream, perThreadStream, &touch, 1, work);
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
  renumberAtBoundary();
}

void Residency::renumberAtBoundary() {
  const uint32_t boundaries = policy_->iterationBoundaries();
  if (boundaries == boundariesSeen_) return;
  boundariesSeen_ = boundaries;
  // The policy learns the iteration by buffer id, and ids come back to freeIds_ in the order
  // buffers are freed. With the same allocations and frees every iteration they still come out
  // rotated (a buffer freed before another is allocated lends it its id, so each iteration
  // starts from a permutation of the last one's list): the same launch would name other ids in
  // each iteration, and a learned iteration would predict nothing (LSTM under delta-play: 78 %
  // of predicted uses missed).
  // From the same set of free ids in the same order at the same point of each iteration, the
  // same allocations get the same ids. O(f log f) for f free ids, once per iteration.
  std::sort(freeIds_.begin(), freeIds_.end(), std::greater<>());
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
  // Delivered at a launch: every candidate's prediction is put into words only when printed.
  if (verbosity() >= 2)
    logVerbose(2, "plan for the iteration learned (%u launches): %s, predicted %.3f ms per "
               "iteration; %.3f s on the planner thread; every candidate: %s",
               plannedLaunches_, name.c_str(), plan.planned ? plan.chosenNs() / 1e6 : 0.0,
               planningNs / 1e9, plan.planned ? plan.predictions().c_str() : "none replayed");
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
  if (!timings_.empty()) {
    ReentryGuard guard;
    pollTimings();
  }
  Stats copy = stats_;
  copy.pageableFallbacks = host_.pageableFallbacks();
  copy.pinnedHostBytes = host_.pinnedBytes();
  copy.pinnedChunks = host_.pinnedChunks();
  copy.pinnedChunksAhead = host_.chunksPinnedAhead();
  copy.physicalCreates = physical_.creates();
  copy.physicalReleases = physical_.releases();
  copy.ceilingBytes = limitLocked();
  copy.pointerTables = tables_.size();
  copy.residentBytes = resident_;
  copy.foreignBytes = foreignBytes_ + programResident_;
  copy.liveBuffers = addresses_.size();
  copy.planSwitches = policy_->planSwitches();
  return copy;
}

std::string Residency::runningPlan() {
  ReentryGuard guard;
  std::lock_guard lock(mutex_);
  return policy_->runningPlan();
}

}  // namespace delta::shim
