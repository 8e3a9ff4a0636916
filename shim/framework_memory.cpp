// The program's own physical memory: a framework that manages virtual memory itself (PyTorch
// with expandable_segments:True) reserves an address range and maps cuMemCreate handles into it,
// one chunk at a time. Each such mapping is paged as a managed buffer is: the unit is what the
// program mapped with one cuMemMap, at the program's address, in the program's reservation.
//
// The shim stands in for every handle of the device's memory the program creates: the program
// holds a value of the shim's (a ProgramHandle's address), and its calls that take a handle are
// translated, because the physical memory behind a handle changes each time its mapping is
// evicted and restored. The program's own cuMemUnmap, cuMemRelease and cuMemAddressFree keep
// working whatever was evicted: an evicted mapping is unmapped already, so the shim unmaps the
// rest and keeps the contents with the handle (a handle keeps its contents while unmapped).
//
// What a kernel reaches through a pointer into the program's memory is not one mapping: the
// framework carves tensors out of its range without regard to its chunks. A pointer reaches the
// extent the framework declared around it (delta_declare_extent), or, without one, everything
// from its mapping to the end of the run of adjoining mappings (tensors start at their pointer
// and grow upwards: PyTorch's strides are not negative). Anything the shim cannot keep the
// program's promises for stays where the program put it, pinned: a handle exported, mapped
// twice or in part, or given access other than read-write for the device.
#include <algorithm>

#include "shim/log.h"
#include "shim/reentry_guard.h"
#include "shim/residency.h"
#include "shim/residency_internal.h"

namespace delta::shim {

using detail::roundUp;

namespace {
constexpr uint32_t kNoBuffer = UINT32_MAX;
}  // namespace

Residency::ProgramHandle* Residency::programHandle(CUmemGenericAllocationHandle handle) {
  auto it = programHandles_.find(handle);
  return it == programHandles_.end() ? nullptr : it->second.get();
}

void Residency::beforeForeignCreate(uint64_t bytes) {
  NoticesAfterUnlock notices{this};
  ReentryGuard guard;
  std::lock_guard lock(mutex_);
  static const std::vector<uint32_t> kNothing;
  if (stats_.foreignHandles == 0)
    logVerbose(1, "the program creates physical memory itself (cuMemCreate: a framework's "
                  "own virtual memory, such as PyTorch's expandable segments): each of its "
                  "mappings is paged like a managed buffer (docs/shim.md, \"The program's own "
                  "physical memory\")");
  makeRoom(roundUp(bytes, granularity_), kNothing, nowNs(), 0);
}

void Residency::adoptProgramHandle(CUmemGenericAllocationHandle real, uint64_t bytes,
                                   const CUmemAllocationProp& prop,
                                   CUmemGenericAllocationHandle* handle) {
  ReentryGuard guard;
  std::lock_guard lock(mutex_);
  auto record = std::make_unique<ProgramHandle>();
  record->real = real;
  record->bytes = bytes;
  record->prop = prop;
  const auto value = static_cast<CUmemGenericAllocationHandle>(reinterpret_cast<uintptr_t>(record.get()));
  programHandles_.emplace(value, std::move(record));
  foreignBytes_ += bytes;
  stats_.foreignHandles++;
  notePeaks();
  if (deviceBytes() > limitLocked()) {
    stats_.overBudgetAllocations++;
    DELTA_WARN_ONCE("the program's own physical memory (cuMemCreate) and what cannot be evicted "
                    "exceed DELTA_BUDGET; running over budget (counted)");
  }
  *handle = value;
}

void Residency::noteForeignCreate(CUmemGenericAllocationHandle handle, uint64_t bytes) {
  ReentryGuard guard;
  std::lock_guard lock(mutex_);
  auto [it, inserted] = foreignHandles_.try_emplace(handle, bytes);
  if (!inserted) return;  // a handle value the driver gave twice: the first release ends both
  foreignBytes_ += bytes;
  stats_.foreignHandles++;
  notePeaks();
}

void Residency::forgetProgramHandle(ProgramHandle* handle) {
  if (handle->real != 0) {
    api_.cuMemRelease(handle->real);
    foreignBytes_ -= handle->bytes;
  }
  host_.give(handle->host, handle->hostPinned);
  programHandles_.erase(
      static_cast<CUmemGenericAllocationHandle>(reinterpret_cast<uintptr_t>(handle)));
}

std::optional<CUresult> Residency::releaseProgramHandle(CUmemGenericAllocationHandle value) {
  ReentryGuard guard;
  std::lock_guard lock(mutex_);
  ProgramHandle* handle = programHandle(value);
  if (handle == nullptr) {
    // Counted only (NCCL's): its memory goes with the driver's release.
    if (auto it = foreignHandles_.find(value); it != foreignHandles_.end()) {
      foreignBytes_ -= it->second;
      foreignHandles_.erase(it);
    }
    return std::nullopt;
  }
  if (handle->references == 0) return CUDA_ERROR_INVALID_VALUE;  // released already
  // As the driver: the memory stays while a mapping uses it.
  if (--handle->references == 0 && handle->mappedAs == kNoBuffer && handle->otherMappings == 0)
    forgetProgramHandle(handle);
  return CUDA_SUCCESS;
}

CUresult Residency::backOnDevice(ProgramHandle& handle) {
  static const std::vector<uint32_t> kNothing;
  if (CUresult room = makeRoom(handle.bytes, kNothing, nowNs(), 0); room != CUDA_SUCCESS) return room;
  CUmemGenericAllocationHandle real = 0;
  CUresult result = acquireOrEvict(handle.bytes, &real, {}, 0, &handle);
  if (result != CUDA_SUCCESS) return result;
  // Its contents go in through a mapping of the shim's own, on the eviction stream.
  CUdeviceptr scratch = 0;
  result = api_.cuMemAddressReserve(&scratch, handle.bytes, granularity_, 0, 0);
  if (result == CUDA_SUCCESS) {
    result = mapAt(scratch, handle.bytes, real);
    if (result == CUDA_SUCCESS) {
      result = ensureEvictStream()
                   ? api_.cuMemcpyHtoDAsync_v2(scratch, handle.host, handle.bytes, evictStream_)
                   : CUDA_ERROR_OUT_OF_MEMORY;
      if (result == CUDA_SUCCESS) result = api_.cuStreamSynchronize(evictStream_);
      api_.cuMemUnmap(scratch, handle.bytes);
    }
    api_.cuMemAddressFree(scratch, handle.bytes);
  }
  if (result != CUDA_SUCCESS) {
    api_.cuMemRelease(real);
    return result;
  }
  handle.real = real;
  foreignBytes_ += handle.bytes;
  notePeaks();
  host_.give(handle.host, handle.hostPinned);
  handle.host = nullptr;
  stats_.restores++;
  stats_.bytesToDevice += handle.bytes;
  return CUDA_SUCCESS;
}

void Residency::pinProgramBuffer(uint32_t id) {
  Buffer& buffer = buffers_[id];
  if (buffer.pinned) return;
  buffer.pinned = true;
  buffer.program->pinned = true;
  stats_.programPinned++;
  policy_->onPinned(id, true);
  if (stats_.programPinned == 1)
    logVerbose(1, "a mapping of the program's own memory is pinned (exported, mapped again or in "
                  "part, or shared beyond the device): it stays where the program put it");
}

std::optional<CUresult> Residency::mapProgramHandle(CUdeviceptr address, uint64_t bytes,
                                                    uint64_t offset,
                                                    CUmemGenericAllocationHandle value,
                                                    unsigned long long flags) {
  NoticesAfterUnlock notices{this};
  ReentryGuard guard;
  std::lock_guard lock(mutex_);
  ProgramHandle* handle = programHandle(value);
  if (handle == nullptr) return std::nullopt;
  if (handle->references == 0) return CUDA_ERROR_INVALID_VALUE;  // released, as the driver says
  if (handle->real == 0 && handle->mappedAs == kNoBuffer)
    if (CUresult r = backOnDevice(*handle); r != CUDA_SUCCESS) return r;
  const bool whole = offset == 0 && bytes == handle->bytes && flags == 0 &&
                     handle->mappedAs == kNoBuffer && !handle->pinned;
  uint32_t id = kNoBuffer;
  if (whole) {
    if (!freeIds_.empty()) {
      id = freeIds_.back();
      freeIds_.pop_back();
    } else if (buffers_.size() < detail::kMaxBuffers) {
      id = static_cast<uint32_t>(buffers_.size());
      buffers_.emplace_back();
    }
  }
  if (id == kNoBuffer) {
    // Left where the program puts it, and its memory never changes again.
    if (handle->mappedAs != kNoBuffer)
      if (CUresult r = makeResidentNow(handle->mappedAs); r != CUDA_SUCCESS) return r;
    CUresult result = api_.cuMemMap(address, bytes, offset, handle->real, flags);
    if (result != CUDA_SUCCESS) return result;
    if (handle->mappedAs != kNoBuffer) pinProgramBuffer(handle->mappedAs);
    if (!handle->pinned) {
      handle->pinned = true;
      stats_.programPinned++;
    }
    handle->otherMappings++;
    programMappings_[address] = ProgramMapping{address + bytes, kNoBuffer, handle};
    return CUDA_SUCCESS;
  }
  CUresult result = api_.cuMemMap(address, bytes, 0, handle->real, 0);
  if (result != CUDA_SUCCESS) {
    freeIds_.push_back(id);
    return result;
  }
  // Its memory counted from cuMemCreate: it moves from the program's column to the resident one.
  foreignBytes_ -= bytes;
  Buffer& buffer = startBuffer(id, address, bytes, bytes, handle->real);
  buffer.program = handle;
  buffer.accessible = false;  // until the program's cuMemSetAccess: copies could not read it
  handle->mappedAs = id;
  programMappings_[address] = ProgramMapping{address + bytes, id, handle};
  programResident_ += bytes;
  notePeaks();
  stats_.programMappings++;
  const int64_t now = nowNs();
  policy_->onAlloc(id, bytes, now);
  if (trace::TraceWriter* trace = trace_.load(std::memory_order_relaxed))
    trace->alloc(trace::AllocRecord{static_cast<uint64_t>(now), buffer.serial, address, bytes, 0,
                                    0, trace::kAllocManaged});
  return CUDA_SUCCESS;
}

// Made resident now, on the eviction stream, and waited for: the calls that need this (an
// export, a second mapping, access changed) are rare, and what follows them is not work the
// shim orders after a restore.
CUresult Residency::makeResidentNow(uint32_t id) {
  Buffer& buffer = buffers_[id];
  if (buffer.evicting) cancelEviction(id, nowNs());
  if (buffer.state == State::kResident) return CUDA_SUCCESS;
  if (!ensureEvictStream()) return CUDA_ERROR_OUT_OF_MEMORY;
  const uint32_t keep[1] = {id};
  CUresult result = restore(id, evictStream_, 0, keep);
  if (result == CUDA_SUCCESS) result = api_.cuStreamSynchronize(evictStream_);
  return result;
}

void Residency::endProgramBuffer(uint32_t id, int64_t now) {
  Buffer& buffer = buffers_[id];
  ProgramHandle* handle = buffer.program;
  if (buffer.table) tables_.erase(buffer.address);
  events_.give(buffer.restoreEvent);
  if (buffer.evicting) evictingBytes_ -= buffer.mappedBytes;
  if (buffer.state == State::kResident) {
    // The handle keeps its memory, unmapped: the program's again until it maps or releases it.
    resident_ -= buffer.mappedBytes;
    programResident_ -= buffer.mappedBytes;
    foreignBytes_ += buffer.mappedBytes;
    handle->real = buffer.handle;
  } else {
    // Evicted: the handle keeps the contents, on the host, in case it is mapped again.
    handle->real = 0;
    handle->host = buffer.host;
    handle->hostPinned = buffer.hostPinned;
  }
  addresses_.erase(buffer.address);
  policy_->onFree(id, now);
  if (trace::TraceWriter* trace = trace_.load(std::memory_order_relaxed))
    trace->free(trace::FreeRecord{static_cast<uint64_t>(now), buffer.serial, buffer.bytes,
                                  buffer.state == State::kResident ? trace::Residency::kResident
                                                                   : trace::Residency::kOnHost});
  handle->mappedAs = kNoBuffer;
  buffer = Buffer{};
  freeIds_.push_back(id);
  if (handle->references == 0 && handle->otherMappings == 0) forgetProgramHandle(handle);
}

std::optional<CUresult> Residency::unmapProgramRange(CUdeviceptr address, uint64_t bytes) {
  NoticesAfterUnlock notices{this};
  ReentryGuard guard;
  std::lock_guard lock(mutex_);
  const CUdeviceptr end = address + bytes;
  auto first = programMappings_.lower_bound(address);
  if (bytes == 0 || first == programMappings_.end() || first->first >= end) return std::nullopt;
  // The shim's own work on them is over first: a restore writing one, an eviction reading it.
  // The program's work it has synchronised with itself, as the driver requires.
  bool anyEvicted = false;
  for (auto m = first; m != programMappings_.end() && m->first < end; ++m) {
    if (m->second.buffer == kNoBuffer) continue;
    Buffer& buffer = buffers_[m->second.buffer];
    while (evictionMayRead(buffer)) reclaimEvictions(true);
    if (buffer.restoreEvent != nullptr) api_.cuEventSynchronize(buffer.restoreEvent);
    anyEvicted |= buffer.state != State::kResident;
  }
  // What is still mapped goes to the driver: the whole range at once when nothing was evicted
  // (its answer is the driver's own), else run by run around the evicted mappings.
  CUresult result = CUDA_SUCCESS;
  if (!anyEvicted) {
    result = api_.cuMemUnmap(address, bytes);
  } else {
    CUdeviceptr runStart = address;
    for (auto m = first; m != programMappings_.end() && m->first < end; ++m) {
      if (m->second.buffer == kNoBuffer || buffers_[m->second.buffer].state == State::kResident)
        continue;
      if (m->first > runStart) result = api_.cuMemUnmap(runStart, m->first - runStart);
      if (result != CUDA_SUCCESS) break;
      runStart = m->second.end;
    }
    if (result == CUDA_SUCCESS && runStart < end) result = api_.cuMemUnmap(runStart, end - runStart);
  }
  if (result != CUDA_SUCCESS) return result;
  const int64_t now = nowNs();
  for (auto m = first; m != programMappings_.end() && m->first < end;) {
    ProgramMapping mapping = m->second;
    m = programMappings_.erase(m);
    if (mapping.buffer != kNoBuffer) {
      endProgramBuffer(mapping.buffer, now);
    } else if (--mapping.handle->otherMappings == 0 && mapping.handle->references == 0 &&
               mapping.handle->mappedAs == kNoBuffer) {
      forgetProgramHandle(mapping.handle);
    }
  }
  // What the framework declared there is gone with the mappings.
  for (auto e = extents_.lower_bound(address); e != extents_.end() && e->first < end;)
    e = extents_.erase(e);
  stats_.programExtents = extents_.size();
  return CUDA_SUCCESS;
}

std::optional<CUresult> Residency::setProgramAccess(CUdeviceptr address, uint64_t bytes,
                                                    const CUmemAccessDesc* desc, size_t count) {
  NoticesAfterUnlock notices{this};
  ReentryGuard guard;
  std::lock_guard lock(mutex_);
  const CUdeviceptr end = address + bytes;
  auto first = programMappings_.lower_bound(address);
  if (bytes == 0 || first == programMappings_.end() || first->first >= end) return std::nullopt;
  // What the shim restores itself: read-write for the managed device, and nothing else.
  const bool plain = desc != nullptr && count == 1 &&
                     desc[0].location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
                     desc[0].location.id == 0 && desc[0].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  for (auto m = first; m != programMappings_.end() && m->first < end; ++m) {
    if (m->second.buffer == kNoBuffer) continue;
    if (CUresult r = makeResidentNow(m->second.buffer); r != CUDA_SUCCESS) return r;
    if (!plain) pinProgramBuffer(m->second.buffer);
  }
  CUresult result = api_.cuMemSetAccess(address, bytes, desc, count);
  if (result == CUDA_SUCCESS)
    for (auto m = first; m != programMappings_.end() && m->first < end; ++m)
      if (m->second.buffer != kNoBuffer) buffers_[m->second.buffer].accessible = true;
  return result;
}

std::optional<CUresult> Residency::exportProgramHandle(void* shareable,
                                                       CUmemGenericAllocationHandle value,
                                                       CUmemAllocationHandleType type,
                                                       unsigned long long flags) {
  NoticesAfterUnlock notices{this};
  ReentryGuard guard;
  std::lock_guard lock(mutex_);
  ProgramHandle* handle = programHandle(value);
  if (handle == nullptr) return std::nullopt;
  if (handle->references == 0) return CUDA_ERROR_INVALID_VALUE;
  // Whoever imports it maps this very memory: it never changes again.
  if (handle->mappedAs != kNoBuffer) {
    if (CUresult r = makeResidentNow(handle->mappedAs); r != CUDA_SUCCESS) return r;
    pinProgramBuffer(handle->mappedAs);
  } else {
    if (handle->real == 0)
      if (CUresult r = backOnDevice(*handle); r != CUDA_SUCCESS) return r;
    if (!handle->pinned) stats_.programPinned++;
    handle->pinned = true;
  }
  return api_.cuMemExportToShareableHandle(shareable, handle->real, type, flags);
}

std::optional<CUresult> Residency::programHandleProperties(CUmemAllocationProp* prop,
                                                           CUmemGenericAllocationHandle value) {
  std::lock_guard lock(mutex_);
  ProgramHandle* handle = programHandle(value);
  if (handle == nullptr) return std::nullopt;
  if (prop == nullptr || handle->references == 0) return CUDA_ERROR_INVALID_VALUE;
  *prop = handle->prop;
  return CUDA_SUCCESS;
}

std::optional<CUresult> Residency::retainProgramHandle(CUmemGenericAllocationHandle* out,
                                                       CUdeviceptr address) {
  std::lock_guard lock(mutex_);
  auto it = programMappings_.upper_bound(address);
  if (it == programMappings_.begin()) return std::nullopt;
  --it;
  if (address >= it->second.end) return std::nullopt;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  it->second.handle->references++;
  *out = static_cast<CUmemGenericAllocationHandle>(reinterpret_cast<uintptr_t>(it->second.handle));
  return CUDA_SUCCESS;
}

int Residency::declareExtent(CUdeviceptr start, uint64_t bytes) {
  std::lock_guard lock(mutex_);
  auto it = programMappings_.upper_bound(start);
  if (it == programMappings_.begin() || start >= std::prev(it)->second.end) return -1;
  // What was declared there before is no more: the framework's blocks do not overlap.
  const CUdeviceptr end = bytes == 0 ? start + 1 : start + bytes;
  auto e = extents_.upper_bound(start);
  if (e != extents_.begin() && std::prev(e)->second > start) --e;
  while (e != extents_.end() && e->first < end) e = extents_.erase(e);
  if (bytes > 0) extents_.emplace(start, start + bytes);
  stats_.programExtents = extents_.size();
  return 0;
}

void Residency::addProgramReach(uint64_t pointer, uint32_t id, std::vector<uint32_t>& ids,
                                int depth) {
  if (!extents_.empty()) {
    auto e = extents_.upper_bound(pointer);
    if (e != extents_.begin() && pointer < std::prev(e)->second) {
      --e;
      addresses_.forEachOverlapping(e->first, e->second - e->first,
                                    [&](uint32_t reached) { addWithLinks(reached, ids, depth); });
      return;
    }
  }
  addWithLinks(id, ids, depth);
  // No extent known: up to the end of the run of adjoining mappings (tensors grow upwards).
  auto m = programMappings_.find(buffers_[id].address);
  if (m == programMappings_.end()) return;
  for (CUdeviceptr reachedEnd = m->second.end; ++m != programMappings_.end() && m->first == reachedEnd;
       reachedEnd = m->second.end)
    if (m->second.buffer != kNoBuffer) addWithLinks(m->second.buffer, ids, depth);
}

}  // namespace delta::shim
