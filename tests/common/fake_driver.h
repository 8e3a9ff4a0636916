// A fake CUDA driver for the residency manager (shim/real_api.h's DriverApi): every entry point
// the manager calls succeeds at once and does nothing (but, while recording, a mapping where one
// is and an unmap of what is not mapped fail, as a driver's do), addresses and handles are made
// up (2 MiB granules, each reservation followed by a gap), and what matters to the launch path's
// rules is counted: every call, the events recorded and waited for, the addresses copied out
// and back. Used by the residency unit tests (tests/shim/residency_test.cpp) and by
// bench/shim_bench, where only the counters run (recording is off by default).
#pragma once

#include <cuda.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "shim/real_api.h"

namespace delta::testing {

struct FakeDriverLog {
  std::atomic<uint64_t> calls{0};  // every entry point
  std::atomic<uint64_t> eventRecords{0};
  std::atomic<uint64_t> copiesOut{0};
  std::atomic<uint64_t> copiesIn{0};
  bool recording = false;  // keep the lists below (tests)
  // cuEventQuery answers CUDA_ERROR_NOT_READY while set: work stays in flight until a host
  // wait (cuEventSynchronize, cuStreamSynchronize, cuCtxSynchronize) or until it is cleared.
  std::atomic<bool> eventsPending{false};
  // When set (and eventsPending is not): cuEventQuery answers CUDA_ERROR_NOT_READY for the
  // events it names, as a device that has reached some streams' work and not others' would.
  std::function<bool(CUevent)> eventPending;
  std::mutex mutex;
  std::vector<std::pair<CUevent, CUstream>> recorded;  // cuEventRecord
  std::vector<std::pair<CUstream, CUevent>> waited;    // cuStreamWaitEvent
  std::vector<CUdeviceptr> copiedOut;                  // sources of device-to-host copies
  std::vector<void*> copiedOutTo;                      // their destinations, in the same order
  std::vector<CUdeviceptr> copiedIn;                   // destinations of host-to-device copies
  std::vector<CUevent> synchronized;                   // cuEventSynchronize: the host waited
  // Addresses mapped since recording began. As a driver does, mapping where a mapping is
  // already fails (CUDA_ERROR_INVALID_VALUE) and is counted; so is unmapping what is mapped no
  // more (an address mapped before recording began is not known, and passes).
  std::set<CUdeviceptr> mapped;
  std::set<CUdeviceptr> unmapped;
  uint64_t badMappings = 0;
  // Called at each cuEventRecord, after it is noted: lets a test make another thread act at
  // that very moment (as a real one may, between two of the shim's driver calls).
  std::function<void(CUstream)> onEventRecord;
  // When set: the device time (ms) at which an event recorded passed, for cuEventElapsedTime;
  // unset, every interval is 1 ms.
  std::function<double(CUevent)> eventTimeMs;
  // Physical memory the process holds (cuMemCreate less cuMemRelease, at every moment, whether
  // recording or not), and the most it held since the last reset.
  std::map<CUmemGenericAllocationHandle, uint64_t> handleBytes;
  uint64_t heldBytes = 0;
  uint64_t peakHeldBytes = 0;

  void reset(bool record) {
    calls = eventRecords = copiesOut = copiesIn = 0;
    eventsPending = false;
    std::lock_guard lock(mutex);
    recording = record;
    recorded.clear();
    waited.clear();
    copiedOut.clear();
    copiedOutTo.clear();
    copiedIn.clear();
    synchronized.clear();
    mapped.clear();
    unmapped.clear();
    badMappings = 0;
    peakHeldBytes = heldBytes;
    onEventRecord = nullptr;
    eventTimeMs = nullptr;
    eventPending = nullptr;
  }
};

inline FakeDriverLog& fakeDriverLog() {
  static FakeDriverLog* log = new FakeDriverLog;
  return *log;
}

namespace fake {
constexpr uint64_t kGranularity = 2ull << 20;
constexpr uint64_t kBase = 0x7e0000000000;
inline std::atomic<uint64_t> gNextAddress{kBase};
inline std::atomic<uint64_t> gNextHandle{0};
inline std::atomic<uint64_t> gNextObject{0x1000};

inline void count() { fakeDriverLog().calls.fetch_add(1, std::memory_order_relaxed); }
template <class T>
void note(std::vector<T>& list, T value) {
  FakeDriverLog& log = fakeDriverLog();
  if (!log.recording) return;
  std::lock_guard lock(log.mutex);
  list.push_back(value);
}

inline CUresult reserve(CUdeviceptr* out, size_t bytes, size_t, CUdeviceptr, unsigned long long) {
  count();
  const uint64_t rounded = (bytes + kGranularity - 1) / kGranularity * kGranularity;
  *out = gNextAddress.fetch_add(2 * rounded);  // and a gap as large
  return CUDA_SUCCESS;
}
inline CUresult addressFree(CUdeviceptr, size_t) { count(); return CUDA_SUCCESS; }
inline CUresult create(CUmemGenericAllocationHandle* handle, size_t bytes,
                       const CUmemAllocationProp*, unsigned long long) {
  count();
  *handle = ++gNextHandle;
  FakeDriverLog& log = fakeDriverLog();
  std::lock_guard lock(log.mutex);
  log.handleBytes[*handle] = bytes;
  log.heldBytes += bytes;
  log.peakHeldBytes = std::max(log.peakHeldBytes, log.heldBytes);
  return CUDA_SUCCESS;
}
inline CUresult release(CUmemGenericAllocationHandle handle) {
  count();
  FakeDriverLog& log = fakeDriverLog();
  std::lock_guard lock(log.mutex);
  auto it = log.handleBytes.find(handle);
  if (it == log.handleBytes.end()) return CUDA_ERROR_INVALID_VALUE;
  log.heldBytes -= it->second;
  log.handleBytes.erase(it);
  return CUDA_SUCCESS;
}
inline CUresult map(CUdeviceptr address, size_t, size_t, CUmemGenericAllocationHandle,
                    unsigned long long) {
  count();
  FakeDriverLog& log = fakeDriverLog();
  if (!log.recording) return CUDA_SUCCESS;
  std::lock_guard lock(log.mutex);
  if (!log.mapped.insert(address).second) {
    ++log.badMappings;
    return CUDA_ERROR_INVALID_VALUE;
  }
  log.unmapped.erase(address);
  return CUDA_SUCCESS;
}
inline CUresult unmap(CUdeviceptr address, size_t) {
  count();
  FakeDriverLog& log = fakeDriverLog();
  if (!log.recording) return CUDA_SUCCESS;
  std::lock_guard lock(log.mutex);
  log.mapped.erase(address);
  if (!log.unmapped.insert(address).second) {
    ++log.badMappings;
    return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}
inline CUresult setAccess(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) { count(); return CUDA_SUCCESS; }
inline CUresult hostAlloc(void** host, size_t bytes, unsigned) {
  count();
  *host = std::malloc(bytes);
  return *host != nullptr ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
inline CUresult freeHost(void* host) { count(); std::free(host); return CUDA_SUCCESS; }
inline CUresult copyIn(CUdeviceptr dst, const void*, size_t, CUstream) {
  count();
  fakeDriverLog().copiesIn.fetch_add(1, std::memory_order_relaxed);
  note(fakeDriverLog().copiedIn, dst);
  return CUDA_SUCCESS;
}
inline CUresult copyOut(void* dst, CUdeviceptr src, size_t, CUstream) {
  count();
  fakeDriverLog().copiesOut.fetch_add(1, std::memory_order_relaxed);
  FakeDriverLog& log = fakeDriverLog();
  if (log.recording) {
    std::lock_guard lock(log.mutex);  // both lists in the same order
    log.copiedOut.push_back(src);
    log.copiedOutTo.push_back(dst);
  }
  return CUDA_SUCCESS;
}
inline CUresult streamCreate(CUstream* stream, unsigned) {
  count();
  *stream = reinterpret_cast<CUstream>(gNextObject.fetch_add(16));
  return CUDA_SUCCESS;
}
inline CUresult streamWaitEvent(CUstream stream, CUevent event, unsigned) {
  count();
  note(fakeDriverLog().waited, std::make_pair(stream, event));
  return CUDA_SUCCESS;
}
inline CUresult streamSynchronize(CUstream) { count(); return CUDA_SUCCESS; }
inline CUresult eventCreate(CUevent* event, unsigned) {
  count();
  *event = reinterpret_cast<CUevent>(gNextObject.fetch_add(16));
  return CUDA_SUCCESS;
}
inline CUresult eventRecord(CUevent event, CUstream stream) {
  count();
  fakeDriverLog().eventRecords.fetch_add(1, std::memory_order_relaxed);
  note(fakeDriverLog().recorded, std::make_pair(event, stream));
  if (fakeDriverLog().onEventRecord) fakeDriverLog().onEventRecord(stream);
  return CUDA_SUCCESS;
}
inline CUresult eventQuery(CUevent event) {
  count();
  const FakeDriverLog& log = fakeDriverLog();
  const bool pending = log.eventsPending || (log.eventPending && log.eventPending(event));
  return pending ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}
inline CUresult eventSynchronize(CUevent event) {
  count();
  note(fakeDriverLog().synchronized, event);
  return CUDA_SUCCESS;
}
inline CUresult eventDestroy(CUevent) { count(); return CUDA_SUCCESS; }
inline CUresult eventElapsed(float* ms, CUevent start, CUevent end) {
  count();
  const auto& time = fakeDriverLog().eventTimeMs;
  *ms = time ? static_cast<float>(time(end) - time(start)) : 1.0f;
  return CUDA_SUCCESS;
}
inline CUresult ctxSynchronize() { count(); return CUDA_SUCCESS; }
inline CUresult memGetInfo(size_t* free, size_t* total) {
  count();
  *free = *total = size_t(1) << 50;  // never the limit: the budget is
  return CUDA_SUCCESS;
}
// Not the fake's memory: the manager then treats the address as nobody's.
inline CUresult addressRange(CUdeviceptr*, size_t*, CUdeviceptr) { count(); return CUDA_ERROR_INVALID_VALUE; }
inline CUresult pointerAttribute(void*, CUpointer_attribute, CUdeviceptr) { count(); return CUDA_ERROR_INVALID_VALUE; }
}  // namespace fake

inline const shim::DriverApi& fakeDriver() {
  static const shim::DriverApi api = [] {
    shim::DriverApi a;
    a.cuMemAddressReserve = fake::reserve;
    a.cuMemAddressFree = fake::addressFree;
    a.cuMemCreate = fake::create;
    a.cuMemRelease = fake::release;
    a.cuMemMap = fake::map;
    a.cuMemUnmap = fake::unmap;
    a.cuMemSetAccess = fake::setAccess;
    a.cuMemHostAlloc = fake::hostAlloc;
    a.cuMemFreeHost = fake::freeHost;
    a.cuMemcpyHtoDAsync_v2 = fake::copyIn;
    a.cuMemcpyDtoHAsync_v2 = fake::copyOut;
    a.cuStreamCreate = fake::streamCreate;
    a.cuStreamWaitEvent = fake::streamWaitEvent;
    a.cuStreamSynchronize = fake::streamSynchronize;
    a.cuEventCreate = fake::eventCreate;
    a.cuEventRecord = fake::eventRecord;
    a.cuEventQuery = fake::eventQuery;
    a.cuEventSynchronize = fake::eventSynchronize;
    a.cuEventDestroy_v2 = fake::eventDestroy;
    a.cuEventElapsedTime_v2 = fake::eventElapsed;
    a.cuCtxSynchronize = fake::ctxSynchronize;
    a.cuMemGetInfo_v2 = fake::memGetInfo;
    a.cuMemGetAddressRange_v2 = fake::addressRange;
    a.cuPointerGetAttribute = fake::pointerAttribute;
    return a;
  }();
  return api;
}

}  // namespace delta::testing
