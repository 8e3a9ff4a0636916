// Pitched allocations (cuMemAllocPitch_v2, which cudaMallocPitch and cudaMalloc3D reach), and
// the counts of every path in alloc_paths.h. Stream-ordered allocation is in stream_ordered.cpp.
//
// A pitched allocation is managed like cudaMalloc: the shim chooses the pitch (the width
// rounded up to the device's texture alignment, at least 512 bytes: what the real driver
// returns on current GPUs, and never less than it promises, "the alignment requirement for
// texture binding"), and allocates pitch x height bytes as one managed buffer. A program must
// use the pitch it is given, so a pitch other than the driver's own is no error; only the
// addresses differ, as they do between any two runs. What the driver would refuse (an element
// size other than 4, 8 or 16, a zero extent, a pitch above CU_DEVICE_ATTRIBUTE_MAX_PITCH) is
// left to it, so that the program gets the driver's own error.
#include "shim/alloc_paths.h"

#include <dlfcn.h>

#include <atomic>

#include "shim/log.h"
#include "shim/reentry_guard.h"
#include "shim/shim.h"
#include "shim/uvm_mode.h"

#define DELTA_EXPORT extern "C" __attribute__((visibility("default")))

namespace delta::shim {
namespace {

std::atomic<uint64_t> gCounts[static_cast<int>(AllocPath::kCount)];

struct PathName {
  const char* key;  // in the stats line
};
constexpr PathName kPathNames[] = {
    {"pitch_allocations"},          {"async_allocations"},       {"async_frees"},
    {"async_passed_through"},       {"pitch_passed_through"},    {"nccl_registrations"},
    {"nccl_pinned_buffers"},        {"nccl_mem_allocs"},
};
static_assert(sizeof kPathNames / sizeof kPathNames[0] == static_cast<int>(AllocPath::kCount));

// Rows start on this boundary at least (CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT on every GPU
// since Fermi; cudaMallocPitch's pitches are multiples of it there).
constexpr uint64_t kMinPitchAlignment = 512;

struct PitchLimits {
  uint64_t alignment = 0;  // 0: unknown (the driver answers every pitched allocation)
  uint64_t maxPitch = 0;
};

// Asked once, of the device the shim manages (ordinal 0, as Residency maps its memory).
PitchLimits pitchLimits() {
  static const PitchLimits limits = [] {
    PitchLimits found;
    const DriverApi& api = Shim::instance().driver();
    if (api.cuGetProcAddress_v2 == nullptr) return found;
    decltype(&::cuDeviceGetAttribute) attribute = nullptr;
    if (api.cuGetProcAddress_v2("cuDeviceGetAttribute", reinterpret_cast<void**>(&attribute),
                                CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT,
                                nullptr) != CUDA_SUCCESS ||
        attribute == nullptr)
      return found;
    ReentryGuard guard;
    int texture = 0, texturePitch = 0, maxPitch = 0;
    if (attribute(&texture, CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT, 0) != CUDA_SUCCESS ||
        attribute(&texturePitch, CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT, 0) != CUDA_SUCCESS ||
        attribute(&maxPitch, CU_DEVICE_ATTRIBUTE_MAX_PITCH, 0) != CUDA_SUCCESS || maxPitch <= 0)
      return found;
    uint64_t alignment = kMinPitchAlignment;
    for (int a : {texture, texturePitch})
      if (a > 0 && static_cast<uint64_t>(a) > alignment) alignment = static_cast<uint64_t>(a);
    // A power of two on every device; anything else is not something to round to.
    if ((alignment & (alignment - 1)) != 0) return found;
    found.alignment = alignment;
    found.maxPitch = static_cast<uint64_t>(maxPitch);
    return found;
  }();
  return limits;
}

}  // namespace

void notePassedThrough(AllocPath path, const char* what) {
  static std::atomic<bool> said[static_cast<int>(AllocPath::kCount)];
  countAllocPath(path);
  if (!said[static_cast<int>(path)].exchange(true))
    logVerbose(1, "%s (counted: %s in the stats)", what, kPathNames[static_cast<int>(path)].key);
}

void countAllocPath(AllocPath path, uint64_t n) {
  gCounts[static_cast<int>(path)].fetch_add(n, std::memory_order_relaxed);
}

uint64_t allocPathCount(AllocPath path) {
  return gCounts[static_cast<int>(path)].load(std::memory_order_relaxed);
}

std::string allocPathStatsKeys() {
  std::string keys;
  for (int i = 0; i < static_cast<int>(AllocPath::kCount); ++i)
    keys += " " + std::string(kPathNames[i].key) + "=" +
            std::to_string(gCounts[i].load(std::memory_order_relaxed));
  return keys;
}

void printAllocPathSummary() {
  auto n = [](AllocPath path) { return static_cast<unsigned long long>(allocPathCount(path)); };
  if (n(AllocPath::kPitchManaged) + n(AllocPath::kPitchPassedThrough) + n(AllocPath::kAsyncManaged) +
          n(AllocPath::kAsyncPassedThrough) + n(AllocPath::kNcclRegistered) +
          n(AllocPath::kNcclMemAlloc) ==
      0)
    return;
  logLine("summary: %llu pitched and %llu stream-ordered allocations managed (%llu freed on a "
          "stream); left to the driver: %llu pitched, %llu stream-ordered, %llu ncclMemAlloc; "
          "%llu NCCL registrations pinned %llu buffers",
          n(AllocPath::kPitchManaged), n(AllocPath::kAsyncManaged),
          n(AllocPath::kAsyncFreeManaged), n(AllocPath::kPitchPassedThrough),
          n(AllocPath::kAsyncPassedThrough), n(AllocPath::kNcclMemAlloc),
          n(AllocPath::kNcclRegistered), n(AllocPath::kNcclPinnedBuffers));
}

}  // namespace delta::shim

using namespace delta::shim;

DELTA_EXPORT CUresult CUDAAPI cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pPitch,
                                                size_t WidthInBytes, size_t Height,
                                                unsigned int ElementSizeBytes) {
  // The one cuGetProcAddress or dlsym gave out, else the next definition after libdelta.so.
  auto real = nextFunction(interceptedDriver().cuMemAllocPitch_v2, "cuMemAllocPitch_v2");
  if (real == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  auto passThrough = [&] { return real(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes); };
  if (dptr == nullptr || pPitch == nullptr || WidthInBytes == 0 || Height == 0 ||
      (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16) ||
      Height > UINT64_MAX / WidthInBytes || insideShim() || Shim::instance().disabled() ||
      callerIsNccl(__builtin_return_address(0)))
    return passThrough();
  Shim& shim = Shim::instance();
  const uint64_t asked = WidthInBytes * Height;
  auto unmanaged = [&] { return allocateUnmanagedWithRoom(passThrough, asked, dptr); };
  // Below DELTA_MIN_BYTES, as for cudaMalloc, without activating the shim.
  UvmMode* uvm = uvmManaging(asked);  // DELTA_MODE=uvm
  Residency* residency = uvm || asked < shim.minManagedBytes() ? nullptr : shim.active();
  if (uvm == nullptr && residency == nullptr) return unmanaged();
  const PitchLimits limits = pitchLimits();
  if (limits.alignment == 0) return unmanaged();
  const uint64_t pitch = (WidthInBytes + limits.alignment - 1) / limits.alignment * limits.alignment;
  if (pitch > limits.maxPitch || Height > UINT64_MAX / pitch) return passThrough();
  const uint64_t bytes = pitch * Height;
  if (uvm != nullptr) {
    if (uvm->allocate(bytes, dptr) != CUDA_SUCCESS) return passThrough();
    *pPitch = pitch;
    return CUDA_SUCCESS;
  }
  CUcontext context = nullptr;
  // Without a current context the real call fails; so must we, the same way.
  if (shim.driver().cuCtxGetCurrent(&context) != CUDA_SUCCESS || context == nullptr)
    return passThrough();
  CUresult result = residency->allocate(bytes, dptr);
  if (result == CUDA_SUCCESS) {
    *pPitch = pitch;
    countAllocPath(AllocPath::kPitchManaged);
    return CUDA_SUCCESS;
  }
  if (result == CUDA_ERROR_OUT_OF_MEMORY && shim.options().strict) return result;
  // Out of buffer ids, or the device full even after evicting: the driver answers.
  notePassedThrough(AllocPath::kPitchPassedThrough,
                    "cuMemAllocPitch: an allocation the shim could not manage (out of buffer ids, "
                    "or the device full) is left to the driver, unmanaged");
  return unmanaged();
}
