// NCCL's collectives reach their buffers through NCCL's own device structures, not through
// kernel parameters the shim can read: a buffer evicted under a collective would be read or
// written while its memory is gone. So the shim puts itself in front of the NCCL calls that
// take buffers: it makes the buffers resident on the call's stream and records that use (an
// eviction later waits for the collective on that stream), and holds them — never evicted —
// until the work is enqueued: when the call returns, or, inside ncclGroupStart/End, when the
// group ends (NCCL enqueues grouped calls only then).
//
// NCCL's own allocations are left unmanaged (interpose.cpp asks callerIsNccl()): its kernels
// reach them only through its device structures. ncclMemAlloc is NCCL's own memory too:
// passed through, counted.
//
// User buffers registered with NCCL (ncclCommRegister, ncclCommWindowRegister) are mapped by
// NCCL and its peers to the physical memory they found there, for as long as the registration
// lasts: new physical memory under a registered address would leave them with the old one
// (users of same-address remapping report NCCL hangs after that). So every managed buffer in a
// registered range is made resident before NCCL sees it and pinned until it is deregistered.
#include <dlfcn.h>
#include <nccl.h>

#include <cstddef>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "shim/alloc_paths.h"

#include "shim/reentry_guard.h"
#include "shim/residency.h"
#include "shim/shim.h"

#define DELTA_EXPORT extern "C" __attribute__((visibility("default")))

namespace delta::shim {
namespace {

thread_local int tGroupDepth = 0;
thread_local int tHeldInGroup = 0;  // prepare() calls to release when the group ends

size_t typeBytes(ncclDataType_t type) {
  switch (type) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 8;  // unknown (newer) type: assume the widest, so the range covers it
  }
}

template <class F>
F next(const char* name) {
  return reinterpret_cast<F>(realDlsym()(RTLD_NEXT, name));
}

int ranks(ncclComm_t comm) {
  static auto count = next<decltype(&ncclCommCount)>("ncclCommCount");
  int n = 1;
  if (count == nullptr || count(comm, &n) != ncclSuccess || n < 1) n = 1;
  return n;
}

// Prepares the collective's buffers: [send, send + sendBytes) read, [recv, recv + recvBytes)
// written. Returns whether something is held (to release with finish()).
bool prepareCollective(const void* send, size_t sendBytes, const void* recv, size_t recvBytes,
                       cudaStream_t stream) {
  if (insideShim()) return false;
  Residency* residency = Shim::instance().activeIfStarted();
  if (residency == nullptr) return false;
  Residency::Touch touches[2];
  touches[0].rangeStart = reinterpret_cast<uint64_t>(recv);
  touches[0].rangeBytes = recv ? recvBytes : 0;
  touches[0].kind = UseKind::kWrite;
  touches[1].rangeStart = reinterpret_cast<uint64_t>(send);
  touches[1].rangeBytes = send ? sendBytes : 0;
  touches[1].kind = UseKind::kRead;
  WorkInfo work;
  work.kind = WorkInfo::Kind::kKernel;
  work.name = "an NCCL collective";
  // A collective is never failed for the budget: it runs over budget if it must.
  residency->prepare(reinterpret_cast<CUstream>(stream), false, touches, 2, work);
  return true;
}

// After the real call: outside a group the work is enqueued, so the buffers may go (after it).
void finish(bool held) {
  if (!held) return;
  if (tGroupDepth > 0) {
    ++tHeldInGroup;
    return;
  }
  if (Residency* residency = Shim::instance().activeIfStarted()) residency->releaseHeld();
}

// Registrations by their handle (ncclCommRegister's handle, or the window).
struct Registration {
  CUdeviceptr start;
  uint64_t bytes;
  std::vector<uint64_t> serials;
};
std::mutex gRegistrationsMutex;
std::unordered_map<const void*, Registration>& registrations() {
  static auto* all = new std::unordered_map<const void*, Registration>;  // used during exit
  return *all;
}

// Before the real registration: the range's managed buffers resident and pinned.
Registration holdRegistration(const void* buff, size_t size) {
  Registration registration{reinterpret_cast<CUdeviceptr>(buff), size, {}};
  if (insideShim() || buff == nullptr || size == 0) return registration;
  if (Residency* residency = Shim::instance().activeIfStarted())
    registration.serials = residency->holdRegistration(registration.start, size);
  countAllocPath(AllocPath::kNcclRegistered);
  countAllocPath(AllocPath::kNcclPinnedBuffers, registration.serials.size());
  return registration;
}

void releaseRegistration(const Registration& registration) {
  if (registration.serials.empty()) return;
  if (Residency* residency = Shim::instance().activeIfStarted())
    residency->releaseRegistration(registration.start, registration.bytes, registration.serials);
}

// After the real registration: kept under its handle, or given up if NCCL refused it.
void keepRegistration(ncclResult_t result, const void* handle, Registration&& registration) {
  if (result != ncclSuccess || handle == nullptr) {
    releaseRegistration(registration);
    return;
  }
  std::lock_guard lock(gRegistrationsMutex);
  auto [it, added] = registrations().emplace(handle, std::move(registration));
  if (!added) {  // NCCL gave out a handle it still had: the old registration is over
    releaseRegistration(it->second);
    it->second = std::move(registration);
  }
}

// After the real deregistration (NCCL is done with the memory): the buffers may move again.
void endRegistration(ncclResult_t result, const void* handle) {
  if (result != ncclSuccess) return;
  Registration registration;
  {
    std::lock_guard lock(gRegistrationsMutex);
    auto it = registrations().find(handle);
    if (it == registrations().end()) return;
    registration = std::move(it->second);
    registrations().erase(it);
  }
  releaseRegistration(registration);
}

}  // namespace
}  // namespace delta::shim

using namespace delta::shim;

#define NCCL_REAL(name) static auto real = next<decltype(&::name)>(#name)

DELTA_EXPORT ncclResult_t ncclGroupStart() {
  NCCL_REAL(ncclGroupStart);
  if (real == nullptr) return ncclInternalError;
  ncclResult_t result = real();
  if (result == ncclSuccess) ++tGroupDepth;
  return result;
}

DELTA_EXPORT ncclResult_t ncclGroupEnd() {
  NCCL_REAL(ncclGroupEnd);
  if (real == nullptr) return ncclInternalError;
  ncclResult_t result = real();  // the group's calls are enqueued now
  if (tGroupDepth > 0 && --tGroupDepth == 0) {
    Residency* residency = Shim::instance().activeIfStarted();
    for (; tHeldInGroup > 0; --tHeldInGroup)
      if (residency) residency->releaseHeld();
  }
  return result;
}

DELTA_EXPORT ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                        ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                        cudaStream_t stream) {
  NCCL_REAL(ncclAllReduce);
  if (real == nullptr) return ncclInternalError;
  const size_t bytes = count * typeBytes(datatype);
  bool held = prepareCollective(sendbuff, bytes, recvbuff, bytes, stream);
  ncclResult_t result = real(sendbuff, recvbuff, count, datatype, op, comm, stream);
  finish(held);
  return result;
}

DELTA_EXPORT ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                                     ncclDataType_t datatype, ncclRedOp_t op, int root,
                                     ncclComm_t comm, cudaStream_t stream) {
  NCCL_REAL(ncclReduce);
  if (real == nullptr) return ncclInternalError;
  const size_t bytes = count * typeBytes(datatype);
  bool held = prepareCollective(sendbuff, bytes, recvbuff, bytes, stream);
  ncclResult_t result = real(sendbuff, recvbuff, count, datatype, op, root, comm, stream);
  finish(held);
  return result;
}

DELTA_EXPORT ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                        ncclDataType_t datatype, int root, ncclComm_t comm,
                                        cudaStream_t stream) {
  NCCL_REAL(ncclBroadcast);
  if (real == nullptr) return ncclInternalError;
  const size_t bytes = count * typeBytes(datatype);
  bool held = prepareCollective(sendbuff, bytes, recvbuff, bytes, stream);
  ncclResult_t result = real(sendbuff, recvbuff, count, datatype, root, comm, stream);
  finish(held);
  return result;
}

DELTA_EXPORT ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                                    ncclComm_t comm, cudaStream_t stream) {
  NCCL_REAL(ncclBcast);
  if (real == nullptr) return ncclInternalError;
  const size_t bytes = count * typeBytes(datatype);
  bool held = prepareCollective(buff, bytes, buff, bytes, stream);
  ncclResult_t result = real(buff, count, datatype, root, comm, stream);
  finish(held);
  return result;
}

DELTA_EXPORT ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                            ncclDataType_t datatype, ncclRedOp_t op,
                                            ncclComm_t comm, cudaStream_t stream) {
  NCCL_REAL(ncclReduceScatter);
  if (real == nullptr) return ncclInternalError;
  const size_t bytes = recvcount * typeBytes(datatype);
  bool held = prepareCollective(sendbuff, bytes * ranks(comm), recvbuff, bytes, stream);
  ncclResult_t result = real(sendbuff, recvbuff, recvcount, datatype, op, comm, stream);
  finish(held);
  return result;
}

DELTA_EXPORT ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                        ncclDataType_t datatype, ncclComm_t comm,
                                        cudaStream_t stream) {
  NCCL_REAL(ncclAllGather);
  if (real == nullptr) return ncclInternalError;
  const size_t bytes = sendcount * typeBytes(datatype);
  bool held = prepareCollective(sendbuff, bytes, recvbuff, bytes * ranks(comm), stream);
  ncclResult_t result = real(sendbuff, recvbuff, sendcount, datatype, comm, stream);
  finish(held);
  return result;
}

DELTA_EXPORT ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype,
                                   int peer, ncclComm_t comm, cudaStream_t stream) {
  NCCL_REAL(ncclSend);
  if (real == nullptr) return ncclInternalError;
  bool held = prepareCollective(sendbuff, count * typeBytes(datatype), nullptr, 0, stream);
  ncclResult_t result = real(sendbuff, count, datatype, peer, comm, stream);
  finish(held);
  return result;
}

DELTA_EXPORT ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                                   ncclComm_t comm, cudaStream_t stream) {
  NCCL_REAL(ncclRecv);
  if (real == nullptr) return ncclInternalError;
  bool held = prepareCollective(nullptr, 0, recvbuff, count * typeBytes(datatype), stream);
  ncclResult_t result = real(recvbuff, count, datatype, peer, comm, stream);
  finish(held);
  return result;
}

DELTA_EXPORT ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size,
                                           void** handle) {
  NCCL_REAL(ncclCommRegister);
  if (real == nullptr) return ncclInternalError;
  if (handle == nullptr) return real(comm, buff, size, handle);
  Registration registration = holdRegistration(buff, size);
  ncclResult_t result = real(comm, buff, size, handle);
  keepRegistration(result, *handle, std::move(registration));
  return result;
}

DELTA_EXPORT ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) {
  NCCL_REAL(ncclCommDeregister);
  if (real == nullptr) return ncclInternalError;
  ncclResult_t result = real(comm, handle);
  endRegistration(result, handle);
  return result;
}

DELTA_EXPORT ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size,
                                                 ncclWindow_t* win, int winFlags) {
  NCCL_REAL(ncclCommWindowRegister);
  if (real == nullptr) return ncclInternalError;
  if (win == nullptr) return real(comm, buff, size, win, winFlags);
  Registration registration = holdRegistration(buff, size);
  ncclResult_t result = real(comm, buff, size, win, winFlags);
  keepRegistration(result, *win, std::move(registration));
  return result;
}

DELTA_EXPORT ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  NCCL_REAL(ncclCommWindowDeregister);
  if (real == nullptr) return ncclInternalError;
  ncclResult_t result = real(comm, win);
  endRegistration(result, win);
  return result;
}

// NCCL's own memory (its cuMemCreate allocations, which its peers map): left to NCCL.
DELTA_EXPORT ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  NCCL_REAL(ncclMemAlloc);
  if (real == nullptr) return ncclInternalError;
  ncclResult_t result = real(ptr, size);
  if (result == ncclSuccess && !insideShim())
    notePassedThrough(AllocPath::kNcclMemAlloc,
                      "ncclMemAlloc: NCCL's own memory is left to NCCL, unmanaged and never "
                      "evicted");
  return result;
}
