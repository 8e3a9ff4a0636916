#include "shim/ipc.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>

#include "shim/log.h"
#include "shim/reentry_guard.h"
#include "shim/residency.h"

namespace delta::shim {
namespace {

constexpr char kMagic[8] = {'D', 'E', 'L', 'T', 'A', 'I', 'P', 'C'};

// What a shim-made CUipcMemHandle holds (64 opaque bytes).
struct SharedBuffer {
  char magic[8];
  int32_t pid;
  int32_t fd;      // the exporter's descriptor for the buffer's physical memory
  uint64_t bytes;  // mapped size
};
static_assert(sizeof(SharedBuffer) <= sizeof(CUipcMemHandle));

std::mutex gImportsMutex;
std::map<CUdeviceptr, uint64_t> gImports;  // address -> mapped bytes

}  // namespace

CUresult exportIpcHandle(Residency& residency, CUdeviceptr address, CUipcMemHandle* handle) {
  CUdeviceptr base = 0;
  uint64_t bytes = 0;
  int fd = -1;
  if (CUresult r = residency.exportBuffer(address, &base, &bytes, &fd); r != CUDA_SUCCESS) return r;
  SharedBuffer shared{};
  std::memcpy(shared.magic, kMagic, sizeof kMagic);
  shared.pid = getpid();
  shared.fd = fd;
  shared.bytes = bytes;
  std::memset(handle, 0, sizeof *handle);
  std::memcpy(handle->reserved, &shared, sizeof shared);
  return CUDA_SUCCESS;
}

CUresult openIpcHandle(const DriverApi& api, const CUipcMemHandle& handle, CUdeviceptr* address) {
  SharedBuffer shared;
  std::memcpy(&shared, handle.reserved, sizeof shared);
  if (std::memcmp(shared.magic, kMagic, sizeof kMagic) != 0) return CUDA_ERROR_NOT_FOUND;
  if (shared.pid == getpid()) return CUDA_ERROR_INVALID_CONTEXT;  // as the driver answers
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/fd/%d", shared.pid, shared.fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_INVALID_VALUE;  // the exporter is gone, or not ours to open
  ReentryGuard guard;
  CUmemGenericAllocationHandle physical = 0;
  CUresult result = api.cuMemImportFromShareableHandle(
      &physical, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  close(fd);
  if (result != CUDA_SUCCESS) return result;
  CUdeviceptr mapped = 0;
  result = api.cuMemAddressReserve(&mapped, shared.bytes, 0, 0, 0);
  if (result == CUDA_SUCCESS) {
    result = api.cuMemMap(mapped, shared.bytes, 0, physical, 0);
    if (result == CUDA_SUCCESS) {
      CUmemAccessDesc access{};
      access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      access.location.id = 0;
      access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      result = api.cuMemSetAccess(mapped, shared.bytes, &access, 1);
      if (result != CUDA_SUCCESS) api.cuMemUnmap(mapped, shared.bytes);
    }
    if (result != CUDA_SUCCESS) api.cuMemAddressFree(mapped, shared.bytes);
  }
  api.cuMemRelease(physical);  // the mapping keeps the memory
  if (result != CUDA_SUCCESS) return result;
  std::lock_guard lock(gImportsMutex);
  gImports[mapped] = shared.bytes;
  *address = mapped;
  return CUDA_SUCCESS;
}

CUresult closeIpcHandle(const DriverApi& api, CUdeviceptr address) {
  uint64_t bytes;
  {
    std::lock_guard lock(gImportsMutex);
    auto it = gImports.find(address);
    if (it == gImports.end()) return CUDA_ERROR_NOT_FOUND;
    bytes = it->second;
    gImports.erase(it);
  }
  ReentryGuard guard;
  // Like cuIpcCloseMemHandle, work that still uses it must be done first.
  api.cuCtxSynchronize();
  api.cuMemUnmap(address, bytes);
  return api.cuMemAddressFree(address, bytes);
}

// ---- re-backing a managed buffer with exportable memory (Residency, residency.h) -----------

CUresult Residency::exportBuffer(CUdeviceptr address, CUdeviceptr* base, uint64_t* bytes, int* fd) {
  NoticesAfterUnlock notices{this};
  ReentryGuard guard;
  std::lock_guard lock(mutex_);
  uint32_t id = addresses_.find(address);
  // The program's own mapping: the driver's answer (it does not share such memory through IPC).
  if (id == AddressMap::kNone || buffers_[id].program != nullptr) return CUDA_ERROR_NOT_FOUND;
  Buffer& buffer = buffers_[id];
  *base = buffer.address;
  *bytes = buffer.mappedBytes;
  if (buffer.exportFd >= 0) {
    *fd = buffer.exportFd;
    return CUDA_SUCCESS;
  }
  if (buffer.registrations > 0) {
    // Exporting needs exportable physical memory under the buffer, hence new memory; NCCL and
    // its peers keep using what they registered. Exporting first, then registering, works.
    logLine("cannot share the buffer at 0x%llx with another process while it is registered "
            "with NCCL (ncclCommRegister): sharing it would put new physical memory under "
            "NCCL's registration; export it before registering it",
            (unsigned long long)buffer.address);
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (buffer.state == State::kDropped || buffer.regenerating) {
    logLine("cannot share the buffer at 0x%llx with another process while its contents are "
            "dropped for recompute; use it (or unregister it) before exporting it",
            (unsigned long long)buffer.address);
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (buffer.evicting) cancelEviction(id, nowNs());
  buffer.pinned = true;
  policy_->onPinned(id, true);
  const std::vector<uint32_t> keep{id};
  const int64_t now = nowNs();
  if (buffer.state != State::kResident) {
    if (CUresult r = makeRoom(buffer.mappedBytes, keep, now, 0); r != CUDA_SUCCESS) return r;
    if (CUresult r = restore(id, nullptr, 0, keep); r != CUDA_SUCCESS) return r;
  }
  // Re-back the buffer with physical memory that can be exported: copy it through a
  // temporary mapping, then swap the mappings at the buffer's address. Export is rare.
  if (CUresult r = makeRoom(buffer.mappedBytes, keep, now, 0); r != CUDA_SUCCESS) return r;
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUmemGenericAllocationHandle exportable = 0;
  CUresult result = api_.cuMemCreate(&exportable, buffer.mappedBytes, &prop, 0);
  if (result != CUDA_SUCCESS) return result;
  CUdeviceptr staging = 0;
  result = api_.cuMemAddressReserve(&staging, buffer.mappedBytes, granularity_, 0, 0);
  if (result == CUDA_SUCCESS) {
    result = mapAt(staging, buffer.mappedBytes, exportable);
    if (result == CUDA_SUCCESS) {
      api_.cuCtxSynchronize();  // every queued use of the buffer, and its restore, is done
      result = api_.cuMemcpyDtoDAsync_v2(staging, buffer.address, buffer.bytes, nullptr);
      api_.cuCtxSynchronize();
      api_.cuMemUnmap(staging, buffer.mappedBytes);
    }
    api_.cuMemAddressFree(staging, buffer.mappedBytes);
  }
  if (result == CUDA_SUCCESS) {
    api_.cuMemUnmap(buffer.address, buffer.mappedBytes);
    api_.cuMemRelease(buffer.handle);
    buffer.handle = exportable;
    result = mapAt(buffer.address, buffer.mappedBytes, exportable);
  } else {
    api_.cuMemRelease(exportable);
    return result;
  }
  if (result != CUDA_SUCCESS) return result;
  int exported = -1;
  result = api_.cuMemExportToShareableHandle(&exported, exportable,
                                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  if (result != CUDA_SUCCESS) return result;
  buffer.exportFd = exported;
  *fd = exported;
  return CUDA_SUCCESS;
}

}  // namespace delta::shim
