// Finds the values in a launch's parameters that may be device pointers. Each parameter is
// read at 8-byte steps from its start, so pointers inside by-value structs are seen too
// (their members are naturally aligned). The layout of a kernel's parameters comes from
// cuFuncGetParamInfo (cuKernelGetParamInfo for a kernel handle) once per kernel and is
// cached. Pointers stored in device memory are not visible here (the residency manager links
// them through host-to-device copies).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "shim/real_api.h"

namespace delta::shim {

struct ParamLayout {
  bool known = false;  // false: the driver could not describe the parameters
  std::vector<uint32_t> offsets;
  std::vector<uint32_t> sizes;
};

// What a launch names: a function, or a kernel handle (a CUkernel: CUDA 13's <<<>>> launches
// pass the runtime one, which the runtime cannot map to a function before the kernel is loaded,
// and which the driver describes through its own cuKernel* calls).
struct LaunchTarget {
  const void* handle = nullptr;
  bool kernelHandle = false;

  static LaunchTarget function(CUfunction f) { return {f, false}; }
  static LaunchTarget kernel(CUkernel k) { return {k, true}; }
  explicit operator bool() const { return handle != nullptr; }
};

// cuFuncGetParamInfo or cuKernelGetParamInfo, as the target is.
CUresult targetParamInfo(const DriverApi& api, LaunchTarget target, size_t index, size_t* offset,
                         size_t* size);
// The driver's name for the target (cuFuncGetName or cuKernelGetName); nullptr if it has none.
const char* targetName(const DriverApi& api, LaunchTarget target);

// One layout per kernel, described once by the driver. Every launch asks, so each thread keeps
// a small direct-mapped cache of the layouts it used in front of the shared map: a launch takes
// no lock unless its kernel is new to the thread.
class ParamLayoutCache {
 public:
  ParamLayoutCache();
  // Stable reference (entries are never removed).
  const ParamLayout& layout(const DriverApi& api, LaunchTarget target);

 private:
  const ParamLayout& lookupLocked(const DriverApi& api, LaunchTarget target);

  // Tells this cache's entries in the per-thread caches from an earlier cache's (tests make
  // several); never 0, which is what a thread's cache starts with.
  const uint64_t generation_;
  std::mutex mutex_;
  // A CUfunction and a CUkernel are distinct objects: their addresses never collide.
  std::unordered_map<const void*, ParamLayout> layouts_;
};

// Calls onValue(uint64_t) for every 8-byte-aligned 8-byte value of the parameters. Returns
// false when they cannot be read (unknown layout and no packed `extra` buffer).
template <class F>
bool scanParams(const ParamLayout& layout, void** kernelParams, void** extra, F&& onValue) {
  auto scanBytes = [&](const unsigned char* bytes, uint32_t size) {
    for (uint32_t offset = 0; offset + 8 <= size; offset += 8) {
      uint64_t value;
      __builtin_memcpy(&value, bytes + offset, 8);
      onValue(value);
    }
  };
  if (kernelParams != nullptr) {
    if (!layout.known) return false;
    for (size_t i = 0; i < layout.sizes.size(); ++i)
      scanBytes(static_cast<const unsigned char*>(kernelParams[i]), layout.sizes[i]);
    return true;
  }
  if (extra != nullptr) {
    const unsigned char* buffer = nullptr;
    size_t bufferSize = 0;
    for (size_t i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
      if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
        buffer = static_cast<const unsigned char*>(extra[i + 1]);
      else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE)
        bufferSize = *static_cast<const size_t*>(extra[i + 1]);
      else
        return false;
    }
    if (buffer == nullptr) return false;
    if (layout.known) {
      for (size_t i = 0; i < layout.sizes.size(); ++i)
        if (layout.offsets[i] + layout.sizes[i] <= bufferSize)
          scanBytes(buffer + layout.offsets[i], layout.sizes[i]);
    } else {
      // The packed buffer alone is enough: its 8-byte-aligned words are the candidates.
      scanBytes(buffer, static_cast<uint32_t>(bufferSize));
    }
    return true;
  }
  return layout.known && layout.sizes.empty();
}

}  // namespace delta::shim
