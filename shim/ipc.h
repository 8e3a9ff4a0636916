// CUDA IPC for managed buffers. Legacy IPC (cuIpcGetMemHandle) does not work on memory from
// cuMemCreate, which is what managed buffers are; NCCL, UCX and torch.multiprocessing rely on
// it. So the shim answers the IPC calls itself for managed buffers: the exporter pins the
// buffer and shares its physical memory as a POSIX file descriptor, and the handle it gives
// out names that descriptor; an importer under the shim recognises such a handle, opens the
// descriptor through /proc and maps the memory. Other handles and pointers pass through.
// Limitation: the importing process must run under libdelta.so too.
#pragma once

#include <cuda.h>

#include "shim/real_api.h"
#include "shim/residency.h"

namespace delta::shim {

// CUDA_ERROR_NOT_FOUND: not a managed buffer (the caller passes the call through).
CUresult exportIpcHandle(Residency& residency, CUdeviceptr address, CUipcMemHandle* handle);
// CUDA_ERROR_NOT_FOUND: not a handle made by exportIpcHandle.
CUresult openIpcHandle(const DriverApi& api, const CUipcMemHandle& handle, CUdeviceptr* address);
// CUDA_ERROR_NOT_FOUND: not an address openIpcHandle returned.
CUresult closeIpcHandle(const DriverApi& api, CUdeviceptr address);

}  // namespace delta::shim
