// The state of the simulated driver, shared by its API files.
#pragma once

#include <cuda.h>

#include <atomic>

#include "../common/export_table.h"
#include "device_memory.h"
#include "host_memory.h"
#include "kernel_registry.h"
#include "memory_pool.h"
#include "stream_engine.h"

namespace cudasim {

// Created by the first successful cuInit and never destroyed: worker threads may still be
// running work while the process exits, as on a GPU.
struct Driver {
  explicit Driver(uint64_t capacity) : memory(capacity), pools(memory, streams) {}
  DeviceMemory memory;
  StreamEngine streams;
  MemoryPools pools;  // after what it uses
  HostMemory host;
};

Driver* driver();                // nullptr before cuInit
KernelRegistry& kernels();       // usable before cuInit (programs register at start-up)
CallbackState& callbackState();  // likewise (CUPTI may subscribe before cuInit)
const ExportTable& exportTable();

// The answer of cuGetProcAddress (proc_address.cpp).
CUresult lookupProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                           CUdriverProcAddressQueryResult* status);

}  // namespace cudasim
