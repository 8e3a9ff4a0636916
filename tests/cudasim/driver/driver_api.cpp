// The driver API entry points of cudasim's libcuda.so.1.
//
// Each entry point builds the real generated *_params struct, raises the CUPTI callbacks
// around its implementation (driverCall), and returns the CUresult the real driver gives
// for the same use or misuse. The implementations live in the classes of this directory;
// this file holds argument checks and the rules of which call waits for what.
// The driver's own build view of cuda.h: declares the legacy (v1) types that
// generated_cuda_meta.h names, and leaves the versioned names unmapped.
#define __CUDA_API_VERSION_INTERNAL 1

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <generated_cuda_meta.h>

#include "../common/callback_scope.h"
#include "driver.h"
#include "fault_handler.h"
#include "faults.h"
#include "per_thread_entries.h"

namespace cudasim {
namespace {

constexpr int kDriverVersion = 13000;
constexpr const char* kDeviceName = "cudasim CPU device";

std::atomic<Driver*> gDriver{nullptr};
std::atomic<bool> gForkedAfterInit{false};
std::atomic<bool> gDriverCallbacksFromRuntime{true};
int gDeviceCount = 1;
thread_local uint32_t tCallCorrelation = 0;
uint32_t* threadCorrelation() { return &tCallCorrelation; }

CallbackState gCallbacks;
const bool gCallbacksWired = (gCallbacks.threadCorrelation = threadCorrelation, true);

struct PrimaryContext {
  int retains = 0;
};
PrimaryContext gPrimary;
std::mutex gPrimaryMutex;
const CUcontext kPrimaryHandle = reinterpret_cast<CUcontext>(&gPrimary);

thread_local CUcontext tContext = nullptr;
thread_local RuntimeOrigin tOrigin;

constexpr bool kPerThread = true;
constexpr bool kLegacy = false;

template <class Body>
CUresult driverCall(CUpti_CallbackId cbid, const char* name, const void* params,
                    const char* symbolName, Body&& body) {
  uint32_t correlationId = 0;
  if (tOrigin.driverCbid == cbid && cbid != 0) {
    // The runtime's own call into the driver: same correlation id as the runtime call.
    correlationId = tOrigin.correlationId;
    tOrigin = RuntimeOrigin{};
    if (!gDriverCallbacksFromRuntime.load(std::memory_order_relaxed)) return body();
  }
  return invokeWithCallbacks<CUresult>(gCallbacks,
                                       CallSite{CUPTI_CB_DOMAIN_DRIVER_API, cbid, name}, params,
                                       symbolName, tContext, correlationId, body);
}

#define DRIVER_CALL(name, symbol, body, ...)                                              \
  name##_params params_{__VA_ARGS__};                                                      \
  return driverCall(CUPTI_DRIVER_TRACE_CBID_##name, #name, &params_, symbol,               \
                    [&]() -> CUresult body)

CUresult initialized() {
  if (gForkedAfterInit.load(std::memory_order_relaxed)) return CUDA_ERROR_NOT_INITIALIZED;
  return gDriver.load(std::memory_order_acquire) ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

// Most calls need cuInit and a current context on the calling thread.
CUresult ready() {
  if (CUresult r = initialized()) return r;
  return tContext != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

#define REQUIRE(check)                        \
  do {                                        \
    if (CUresult r_ = (check)) return r_;     \
  } while (0)

Driver& the() { return *gDriver.load(std::memory_order_relaxed); }

// ---- configuration ------------------------------------------------------------------

[[noreturn]] void badEnvironment(const char* variable, const char* value, const char* accepted) {
  std::fprintf(stderr, "cudasim: %s='%s' is not valid: %s\n", variable, value, accepted);
  std::exit(2);
}

uint64_t sizeFromEnvironment(const char* variable, uint64_t fallback, bool zeroAllowed = false) {
  const char* text = std::getenv(variable);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  unsigned long long value = std::strtoull(text, &end, 10);
  uint64_t scale = 1;
  if (*end == 'K' || *end == 'k') scale = 1ull << 10, ++end;
  else if (*end == 'M' || *end == 'm') scale = 1ull << 20, ++end;
  else if (*end == 'G' || *end == 'g') scale = 1ull << 30, ++end;
  else if (*end == 'T' || *end == 't') scale = 1ull << 40, ++end;
  if (*end == 'i' || *end == 'I') ++end;
  if (*end == 'B' || *end == 'b') ++end;
  if (end == text || *end != '\0' || errno != 0 || text[0] == '-' || (value == 0 && !zeroAllowed) ||
      value > (1ull << 44) / scale)
    badEnvironment(variable, text,
                   zeroAllowed ? "a size in bytes, optionally with K, M, G or T"
                               : "a positive size in bytes, optionally with K, M, G or T");
  return value * scale;
}

bool flagFromEnvironment(const char* variable, bool fallback) {
  const char* text = std::getenv(variable);
  if (text == nullptr || *text == '\0') return fallback;
  if (std::strcmp(text, "1") == 0) return true;
  if (std::strcmp(text, "0") == 0) return false;
  badEnvironment(variable, text, "0 or 1");
}

int countFromEnvironment(const char* variable, int fallback) {
  const char* text = std::getenv(variable);
  if (text == nullptr || *text == '\0') return fallback;
  if (std::strcmp(text, "0") == 0) return 0;
  if (std::strcmp(text, "1") == 0) return 1;
  badEnvironment(variable, text, "0 (no GPU) or 1");
}

void afterForkInChild() {
  // A child of a process that used CUDA cannot use it (the GPU context is not inherited).
  if (gDriver.load(std::memory_order_relaxed)) gForkedAfterInit.store(true);
}

// ---- helpers for copies, memsets and launches ---------------------------------------

CUresult stream(CUstream handle, bool perThread, std::shared_ptr<Stream>* out) {
  return the().streams.resolve(handle, perThread, out);
}

bool deviceRange(CUdeviceptr address, size_t bytes) {
  return the().memory.isDeviceRange(address, bytes);
}

bool isDeviceAddress(uint64_t address) { return the().memory.inAddressSpace(address, 1); }

enum class Wait { kNever, kAlways, kUnlessPinned };

// The shape of a copy: `height` rows of `width` bytes, each side's rows `pitch` bytes apart
// (one row for the linear copies).
struct Shape {
  size_t width;
  size_t height;
  size_t dstPitch;
  size_t srcPitch;
  size_t bytes() const { return width * height; }
  size_t dstSpan() const { return height == 0 ? 0 : (height - 1) * dstPitch + width; }
  size_t srcSpan() const { return height == 0 ? 0 : (height - 1) * srcPitch + width; }
};

void copyRows(void* dst, size_t dstPitch, const void* src, size_t srcPitch, size_t width,
              size_t height) {
  for (size_t row = 0; row < height; ++row)
    std::memcpy(static_cast<std::byte*>(dst) + row * dstPitch,
                static_cast<const std::byte*>(src) + row * srcPitch, width);
}

// A copy as a copy engine runs it: a device side of a host copy through its physical pages
// (DeviceMemory::physicalPieces: no page fault per 4 KiB of a new mapping, which the model does
// not have), and, should access to it have been taken away while the bytes moved, the fault a
// GPU would raise. Device-to-device copies, strided rows and memory outside the pool file go
// through the device addresses, which fault where they must.
void engineCopy(void* dst, size_t dstPitch, const void* src, size_t srcPitch, size_t width,
                size_t height, bool dstDevice, bool srcDevice) {
  const bool contiguous = height == 1 || (dstPitch == width && srcPitch == width);
  if (dstDevice == srcDevice || !contiguous)
    return copyRows(dst, dstPitch, src, srcPitch, width, height);
  const size_t bytes = width * height;
  const uint64_t device = reinterpret_cast<uint64_t>(dstDevice ? dst : src);
  DeviceMemory& memory = the().memory;
  thread_local std::vector<DeviceMemory::Piece> pieces;
  pieces.clear();
  uint64_t epoch = 0;
  if (!memory.physicalPieces(device, bytes, dstDevice, &pieces, &epoch))
    return copyRows(dst, dstPitch, src, srcPitch, width, height);
  size_t done = 0;
  for (const DeviceMemory::Piece& piece : pieces) {
    if (dstDevice)
      std::memcpy(piece.data, static_cast<const std::byte*>(src) + done, piece.bytes);
    else
      std::memcpy(static_cast<std::byte*>(dst) + done, piece.data, piece.bytes);
    done += piece.bytes;
  }
  if (memory.mappingEpoch() == epoch) return;
  // Access to some device memory was taken away while the bytes moved: was it to this?
  thread_local std::vector<DeviceMemory::Piece> now;
  now.clear();
  const auto same = [](const DeviceMemory::Piece& a, const DeviceMemory::Piece& b) {
    return a.data == b.data && a.bytes == b.bytes;
  };
  if (!memory.physicalPieces(device, bytes, dstDevice, &now, &epoch) ||
      !std::equal(pieces.begin(), pieces.end(), now.begin(), now.end(), same))
    reportIllegalAddress(device);
}

// One copy. `dstDevice`/`srcDevice` say which side is device memory (checked); `async`
// says whether the call is an ...Async one. When it returns to the caller follows the CUDA
// documentation on API synchronisation behaviour:
// - host to device: pageable sources are staged at call time; a synchronous call returns
//   when the copy is done;
// - device to host: returns when done, unless async into pinned memory;
// - device to device: never waits for the host.
CUresult copyShaped(const char* call, void* dst, const void* src, Shape shape, bool dstDevice,
                    bool srcDevice, CUstream handle, bool async, bool perThread) {
  REQUIRE(ready());
  const size_t bytes = shape.bytes();
  const size_t dstSpan = shape.dstSpan();
  const size_t srcSpan = shape.srcSpan();
  if (dstDevice && !deviceRange(reinterpret_cast<CUdeviceptr>(dst), dstSpan))
    return CUDA_ERROR_INVALID_VALUE;
  if (srcDevice && !deviceRange(reinterpret_cast<CUdeviceptr>(src), srcSpan))
    return CUDA_ERROR_INVALID_VALUE;
  if ((!dstDevice && dst == nullptr) || (!srcDevice && src == nullptr))
    return CUDA_ERROR_INVALID_VALUE;
  std::shared_ptr<Stream> target;
  REQUIRE(stream(handle, perThread, &target));
  if (bytes == 0) return CUDA_SUCCESS;

  const CopyDirection direction = dstDevice && !srcDevice   ? CopyDirection::kHostToDevice
                                  : srcDevice && !dstDevice ? CopyDirection::kDeviceToHost
                                                            : CopyDirection::kOther;
  if (copyFails(direction)) return CUDA_ERROR_OUT_OF_MEMORY;

  WorkItem item;
  item.call = call;
  item.delayUs = faults().slowCopyUs.load(std::memory_order_relaxed);
  // GPU time (timing.h): host copies on their direction's copy engine, device copies on the
  // compute engine; pageable host memory at half the bandwidth, and waited for.
  const bool pageable = (!srcDevice && !the().host.isPinned(src, srcSpan)) ||
                        (!dstDevice && !the().host.isPinned(dst, dstSpan));
  item.engine = direction == CopyDirection::kHostToDevice   ? Engine::kHostToDevice
                : direction == CopyDirection::kDeviceToHost ? Engine::kDeviceToHost
                : srcDevice && dstDevice                    ? Engine::kCompute
                                                            : Engine::kNone;
  item.durationNs = timing().copyNs(item.engine, bytes, pageable && item.engine != Engine::kCompute);
  if (item.durationNs == 0) item.engine = Engine::kNone;
  const bool waitForPageable = item.durationNs > 0 && pageable;
  bool wait;
  if (!srcDevice && dstDevice && !the().host.isPinned(src, srcSpan)) {
    // The real driver stages pageable sources through small buffers of its own, allocated
    // once; cudasim copies the whole source at call time instead (its rows packed). When the
    // host has no memory for that copy, the real driver would still succeed: copy from the
    // source itself, and return once that is done (the source may be reused at once, as with
    // staging).
    std::shared_ptr<std::vector<std::byte>> staged;
    try {
      staged = std::make_shared<std::vector<std::byte>>(bytes);
      copyRows(staged->data(), shape.width, src, shape.srcPitch, shape.width, shape.height);
      item.run = [dst, staged, shape] {
        engineCopy(dst, shape.dstPitch, staged->data(), shape.width, shape.width, shape.height,
                   /*dstDevice=*/true, /*srcDevice=*/false);
      };
      wait = !async;
    } catch (const std::bad_alloc&) {
      item.run = [dst, src, shape] {
        engineCopy(dst, shape.dstPitch, src, shape.srcPitch, shape.width, shape.height,
                   /*dstDevice=*/true, /*srcDevice=*/false);
      };
      wait = true;
    }
  } else {
    item.run = [dst, src, shape, dstDevice, srcDevice] {
      engineCopy(dst, shape.dstPitch, src, shape.srcPitch, shape.width, shape.height, dstDevice,
                 srcDevice);
    };
    if (srcDevice && dstDevice)
      wait = false;
    else if (srcDevice)
      wait = !async || !the().host.isPinned(dst, dstSpan);
    else if (dstDevice)
      wait = !async;
    else
      wait = true;  // host to host
  }
  if (wait || waitForPageable)
    the().streams.submitAndWait(target, std::move(item));
  else
    the().streams.submit(target, std::move(item));
  return CUDA_SUCCESS;
}

CUresult copy(const char* call, void* dst, const void* src, size_t bytes, bool dstDevice,
              bool srcDevice, CUstream handle, bool async, bool perThread) {
  return copyShaped(call, dst, src, Shape{bytes, 1, bytes, bytes}, dstDevice, srcDevice, handle,
                    async, perThread);
}

// What CU_DEVICE_ATTRIBUTE_MAX_PITCH says.
constexpr size_t kMaxPitch = 2147483647;

// cuMemcpy2D / cuMemcpy2DAsync. cudasim has no CUDA arrays, so an array side is not supported.
CUresult copy2D(const char* call, const CUDA_MEMCPY2D* p, CUstream handle, bool async,
                bool perThread) {
  REQUIRE(ready());
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (p->srcMemoryType == CU_MEMORYTYPE_ARRAY || p->dstMemoryType == CU_MEMORYTYPE_ARRAY)
    return CUDA_ERROR_NOT_SUPPORTED;
  // Every row must fit in its pitch, and pitches stay within what the device allows.
  if (p->srcPitch < p->WidthInBytes || p->dstPitch < p->WidthInBytes || p->srcPitch > kMaxPitch ||
      p->dstPitch > kMaxPitch)
    return CUDA_ERROR_INVALID_VALUE;
  auto side = [](CUmemorytype type, const void* host, CUdeviceptr device, size_t x, size_t y,
                 size_t pitch, const std::byte** at, bool* isDevice) {
    const size_t offset = y * pitch + x;
    switch (type) {
      case CU_MEMORYTYPE_HOST:
        *at = host ? static_cast<const std::byte*>(host) + offset : nullptr;
        *isDevice = false;
        return CUDA_SUCCESS;
      case CU_MEMORYTYPE_DEVICE:
        *at = reinterpret_cast<const std::byte*>(device + offset);
        *isDevice = true;
        return CUDA_SUCCESS;
      case CU_MEMORYTYPE_UNIFIED:  // the address alone tells
        *at = device ? reinterpret_cast<const std::byte*>(device + offset) : nullptr;
        *isDevice = isDeviceAddress(device);
        return CUDA_SUCCESS;
      default:
        return CUDA_ERROR_INVALID_VALUE;
    }
  };
  const std::byte* src = nullptr;
  const std::byte* dst = nullptr;
  bool srcDevice = false, dstDevice = false;
  REQUIRE(side(p->srcMemoryType, p->srcHost, p->srcDevice, p->srcXInBytes, p->srcY, p->srcPitch,
               &src, &srcDevice));
  REQUIRE(side(p->dstMemoryType, p->dstHost, p->dstDevice, p->dstXInBytes, p->dstY, p->dstPitch,
               &dst, &dstDevice));
  return copyShaped(call, const_cast<std::byte*>(dst), src,
                    Shape{p->WidthInBytes, p->Height, p->dstPitch, p->srcPitch}, dstDevice,
                    srcDevice, handle, async, perThread);
}

// cuMemcpy / cuMemcpyAsync: unified addressing tells the direction.
CUresult unifiedCopy(const char* call, CUdeviceptr dst, CUdeviceptr src, size_t bytes,
                     CUstream handle, bool async, bool perThread) {
  REQUIRE(ready());
  return copy(call, reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes,
              isDeviceAddress(dst), isDeviceAddress(src), handle, async, perThread);
}

// Memsets return at once for device memory, synchronous or not (CUDA documents the
// synchronous ones as asynchronous with respect to the host for device memory).
template <class T>
CUresult memset(const char* call, CUdeviceptr dst, T value, size_t count, CUstream handle,
                bool perThread) {
  REQUIRE(ready());
  if (count == 0) return CUDA_SUCCESS;
  if (dst % sizeof(T) != 0 || !deviceRange(dst, count * sizeof(T))) return CUDA_ERROR_INVALID_VALUE;
  std::shared_ptr<Stream> target;
  REQUIRE(stream(handle, perThread, &target));
  WorkItem item;
  item.call = call;
  item.durationNs = timing().copyNs(Engine::kCompute, count * sizeof(T), false);
  item.engine = item.durationNs > 0 ? Engine::kCompute : Engine::kNone;
  item.run = [dst, value, count] {
    T* p = reinterpret_cast<T*>(dst);
    if constexpr (sizeof(T) == 1)
      std::memset(p, value, count);
    else
      for (size_t i = 0; i < count; ++i) p[i] = value;
  };
  the().streams.submit(target, std::move(item));
  return CUDA_SUCCESS;
}

const char* kernelName(CUfunction f) {
  const Function* function = kernels().find(f);
  return function ? function->name.c_str() : nullptr;
}

CUresult launch(const char* call, CUfunction f, dim3 grid, dim3 block, CUstream handle,
                void** kernelParams, void** extra, bool perThread) {
  REQUIRE(ready());
  const Function* function = kernels().find(f);
  if (function == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || block.x == 0 || block.y == 0 ||
      block.z == 0 || block.z > 64 || uint64_t(block.x) * block.y * block.z > 1024 ||
      grid.y > 65535 || grid.z > 65535)
    return CUDA_ERROR_INVALID_VALUE;
  std::shared_ptr<Stream> target;
  REQUIRE(stream(handle, perThread, &target));

  // The parameter values are copied now: the caller may reuse its storage at once.
  auto values = std::make_shared<std::vector<std::byte>>(function->packedBytes);
  const size_t count = function->sizes.size();
  if (kernelParams != nullptr) {
    for (size_t i = 0; i < count; ++i)
      std::memcpy(values->data() + function->offsets[i], kernelParams[i], function->sizes[i]);
  } else if (extra != nullptr) {
    const void* buffer = nullptr;
    const size_t* bufferSize = nullptr;
    for (size_t i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
      if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
        buffer = extra[i + 1];
      else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE)
        bufferSize = static_cast<const size_t*>(extra[i + 1]);
      else
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (buffer == nullptr || bufferSize == nullptr || *bufferSize < function->packedBytes)
      return CUDA_ERROR_INVALID_VALUE;
    std::memcpy(values->data(), buffer, function->packedBytes);
  } else if (count > 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }

  WorkItem item;
  item.call = call;
  item.kernel = function->name.c_str();
  // The compute engine is busy for what the body declares (cudasimKernelTime), if anything.
  item.engine = Engine::kCompute;
  item.durationNs = WorkItem::kDeclared;
  item.run = [function, values, grid, block] {
    std::vector<void*> pointers(function->sizes.size());
    for (size_t i = 0; i < pointers.size(); ++i)
      pointers[i] = values->data() + function->offsets[i];
    function->body(pointers.data(), grid, block);
  };
  the().streams.submit(target, std::move(item));
  return CUDA_SUCCESS;
}

// Host functions run one at a time, whatever their streams, as the real driver runs them (on
// one thread of its own: an H200 with driver 580 held every stream's host functions behind a
// blocked one; the documentation says they "may be serialized").
std::mutex gHostFunctionMutex;

CUresult hostFunc(CUstream handle, CUhostFn fn, void* userData, bool perThread) {
  REQUIRE(ready());
  if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::shared_ptr<Stream> target;
  REQUIRE(stream(handle, perThread, &target));
  WorkItem item;
  item.call = "cuLaunchHostFunc";
  item.run = [fn, userData] {
    std::lock_guard lock(gHostFunctionMutex);
    fn(userData);
  };
  the().streams.submit(target, std::move(item));
  return CUDA_SUCCESS;
}

// cuStreamWaitValue32: the stream holds until the 32-bit word at `address` (device memory, or
// pinned host memory through its device address) meets the condition; the host is not held,
// and no other stream is (unlike a blocked host function, which the real driver's one
// host-function thread serializes with every other stream's). The worker polls the word.
CUresult waitValue32(CUstream handle, CUdeviceptr address, cuuint32_t value, unsigned flags,
                     bool perThread) {
  REQUIRE(ready());
  const unsigned condition = flags & ~static_cast<unsigned>(CU_STREAM_WAIT_VALUE_FLUSH);
  if (address == 0 || address % 4 != 0 || condition > CU_STREAM_WAIT_VALUE_NOR)
    return CUDA_ERROR_INVALID_VALUE;
  std::shared_ptr<Stream> target;
  REQUIRE(stream(handle, perThread, &target));
  WorkItem item;
  item.call = "cuStreamWaitValue32";
  item.run = [address, value, condition] {
    const auto* word = reinterpret_cast<const uint32_t*>(address);
    for (;;) {
      const uint32_t seen = __atomic_load_n(word, __ATOMIC_ACQUIRE);
      // GEQ compares cyclically, as the driver documents.
      const bool met = condition == CU_STREAM_WAIT_VALUE_GEQ
                           ? static_cast<int32_t>(seen - value) >= 0
                       : condition == CU_STREAM_WAIT_VALUE_EQ  ? seen == value
                       : condition == CU_STREAM_WAIT_VALUE_AND ? (seen & value) != 0
                                                               : ~(seen | value) != 0;
      if (met) return;
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  };
  the().streams.submit(target, std::move(item));
  return CUDA_SUCCESS;
}

CUresult streamSynchronize(CUstream handle, bool perThread) {
  REQUIRE(ready());
  std::shared_ptr<Stream> target;
  REQUIRE(stream(handle, perThread, &target));
  target->waitUntil(target->lastSubmitted());
  the().pools.synchronized();  // a point where pools give back what they hold too much of
  return CUDA_SUCCESS;
}

CUresult streamQuery(CUstream handle, bool perThread) {
  REQUIRE(ready());
  std::shared_ptr<Stream> target;
  REQUIRE(stream(handle, perThread, &target));
  return the().streams.query(target);
}

CUresult streamWaitEvent(CUstream handle, CUevent event, unsigned flags, bool perThread) {
  REQUIRE(ready());
  if (flags & ~unsigned(CU_EVENT_WAIT_EXTERNAL)) return CUDA_ERROR_INVALID_VALUE;
  std::shared_ptr<Stream> target;
  REQUIRE(stream(handle, perThread, &target));
  return the().streams.waitEvent(target, event);
}

CUresult eventRecord(CUevent event, CUstream handle, bool perThread) {
  REQUIRE(ready());
  std::shared_ptr<Stream> target;
  REQUIRE(stream(handle, perThread, &target));
  return the().streams.record(event, target);
}

CUresult streamGetFlags(CUstream handle, unsigned* flags, bool perThread) {
  REQUIRE(ready());
  if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::shared_ptr<Stream> target;
  REQUIRE(stream(handle, perThread, &target));
  *flags = target->flags();
  return CUDA_SUCCESS;
}

// A CUmemLocation as cuMemAdvise and cuMemPrefetchAsync take it, as the device ordinal or
// CU_DEVICE_CPU that cuMemRangeGetAttribute reports. cudasim's host has one NUMA node, 0.
CUresult locationOrdinal(const CUmemLocation& location, int* ordinal) {
  switch (location.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
      if (location.id < 0 || location.id >= gDeviceCount) return CUDA_ERROR_INVALID_DEVICE;
      *ordinal = location.id;
      return CUDA_SUCCESS;
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
      if (location.id != 0) return CUDA_ERROR_INVALID_VALUE;
      [[fallthrough]];
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
      *ordinal = CU_DEVICE_CPU;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

// The first versions of cuMemAdvise and cuMemPrefetchAsync name a device or CU_DEVICE_CPU.
CUmemLocation locationOfDevice(CUdevice device) {
  CUmemLocation location{};
  location.type = device == CU_DEVICE_CPU ? CU_MEM_LOCATION_TYPE_HOST : CU_MEM_LOCATION_TYPE_DEVICE;
  location.id = device == CU_DEVICE_CPU ? 0 : device;
  return location;
}

CUresult advise(CUdeviceptr devPtr, size_t count, CUmem_advise advice,
                const CUmemLocation& location) {
  REQUIRE(ready());
  using Attribute = DeviceMemory::RangeAttribute;
  if (!the().memory.isManagedRange(devPtr, count) || count == 0) return CUDA_ERROR_INVALID_VALUE;
  int ordinal = CU_DEVICE_INVALID;
  // A device that does not exist is a bad value here (cuMemAdvise, seen on an H200), where
  // cuMemPrefetchAsync calls it a bad device.
  auto adviseOrdinal = [&](const CUmemLocation& where) {
    const CUresult r = locationOrdinal(where, &ordinal);
    return r == CUDA_ERROR_INVALID_DEVICE ? CUDA_ERROR_INVALID_VALUE : r;
  };
  switch (advice) {
    case CU_MEM_ADVISE_SET_READ_MOSTLY:
    case CU_MEM_ADVISE_UNSET_READ_MOSTLY:
      return the().memory.setRangeAttribute(devPtr, count, Attribute::kReadMostly,
                                             advice == CU_MEM_ADVISE_SET_READ_MOSTLY);
    case CU_MEM_ADVISE_SET_PREFERRED_LOCATION:
      REQUIRE(adviseOrdinal(location));
      return the().memory.setRangeAttribute(devPtr, count, Attribute::kPreferredLocation, ordinal);
    case CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION:
      return the().memory.setRangeAttribute(devPtr, count, Attribute::kPreferredLocation,
                                             CU_DEVICE_INVALID);
    case CU_MEM_ADVISE_SET_ACCESSED_BY:
    case CU_MEM_ADVISE_UNSET_ACCESSED_BY:
      // Only mappings would change, and managed memory is mapped for everyone here already.
      if (location.type != CU_MEM_LOCATION_TYPE_DEVICE && location.type != CU_MEM_LOCATION_TYPE_HOST)
        return CUDA_ERROR_INVALID_VALUE;
      return adviseOrdinal(location);
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult prefetch(const char* call, CUdeviceptr devPtr, size_t count,
                  const CUmemLocation& location, unsigned flags, CUstream handle, bool perThread) {
  REQUIRE(ready());
  if (flags != 0 || count == 0 || !the().memory.isManagedRange(devPtr, count))
    return CUDA_ERROR_INVALID_VALUE;
  int ordinal = CU_DEVICE_INVALID;
  REQUIRE(locationOrdinal(location, &ordinal));
  std::shared_ptr<Stream> target;
  REQUIRE(stream(handle, perThread, &target));
  // The attribute tells what was asked for, not what has happened yet (as documented).
  REQUIRE(the().memory.setRangeAttribute(devPtr, count,
                                         DeviceMemory::RangeAttribute::kLastPrefetchLocation,
                                         ordinal));
  // Nothing moves (see DeviceMemory::allocateManaged), but a prefetch is work in its stream's
  // order like any other: later work waits for it, and it waits for earlier work.
  WorkItem item;
  item.call = call;
  item.run = [] {};
  the().streams.submit(target, std::move(item));
  return CUDA_SUCCESS;
}

// Stream-ordered allocation (memory_pool.h). Calls on the NULL, legacy or per-thread stream
// need a current context; an explicit stream does not (pools belong to no context).
CUresult orderedStream(CUstream handle, bool perThread, std::shared_ptr<Stream>* out) {
  const bool implicit = handle == nullptr || handle == CU_STREAM_LEGACY ||
                        handle == CU_STREAM_PER_THREAD;
  REQUIRE(implicit ? ready() : initialized());
  return stream(handle, perThread, out);
}

CUresult allocAsync(CUdeviceptr* dptr, size_t bytes, CUmemoryPool pool, bool currentPool,
                    CUstream handle, bool perThread) {
  REQUIRE(initialized());
  if (dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::shared_ptr<Stream> target;
  REQUIRE(orderedStream(handle, perThread, &target));
  if (currentPool) pool = the().pools.currentPool();
  return the().pools.allocate(pool, bytes, target, dptr);
}

CUresult freeAsync(CUdeviceptr dptr, CUstream handle, bool perThread) {
  REQUIRE(initialized());
  std::shared_ptr<Stream> target;
  REQUIRE(orderedStream(handle, perThread, &target));
  return the().pools.freeAsync(dptr, target);
}

CUresult validPoolProps(const CUmemPoolProps* props) {
  if (props == nullptr || props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
      props->win32SecurityAttributes != nullptr)
    return CUDA_ERROR_INVALID_VALUE;
  for (unsigned char byte : props->reserved)
    if (byte != 0) return CUDA_ERROR_INVALID_VALUE;
  switch (props->location.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
      if (props->location.id < 0 || props->location.id >= gDeviceCount)
        return CUDA_ERROR_INVALID_VALUE;
      break;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
      // cudasim reports CU_DEVICE_ATTRIBUTE_HOST_MEMORY_POOLS_SUPPORTED 0.
      return CUDA_ERROR_NOT_SUPPORTED;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
  // Pools are not exportable here (CU_DEVICE_ATTRIBUTE_MEMORY_POOL_SUPPORTED_HANDLE_TYPES 0),
  // nor for decompression.
  if (props->handleTypes != CU_MEM_HANDLE_TYPE_NONE) return CUDA_ERROR_NOT_SUPPORTED;
  if (props->usage & ~unsigned(CU_MEM_POOL_CREATE_USAGE_HW_DECOMPRESS)) return CUDA_ERROR_INVALID_VALUE;
  if (props->usage != 0) return CUDA_ERROR_NOT_SUPPORTED;
  return CUDA_SUCCESS;
}

// The real pitch of cuMemAllocPitch: rows start on 512-byte boundaries, as on current GPUs
// (CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT; the texture pitch alignment, 32, is the weaker
// guarantee they also meet).
constexpr size_t kPitchAlignment = 512;

CUresult validAllocationProp(const CUmemAllocationProp* prop) {
  if (prop == nullptr || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
    return CUDA_ERROR_INVALID_VALUE;
  if (prop->location.id < 0 || prop->location.id >= gDeviceCount) return CUDA_ERROR_INVALID_DEVICE;
  return CUDA_SUCCESS;
}

#include "result_names.inc"

CUresult describeResult(CUresult error, const char** text, bool wantName) {
  if (text == nullptr) return CUDA_ERROR_INVALID_VALUE;
  switch (static_cast<int>(error)) {
#define CUDASIM_DESCRIBE(value, name, description) \
  case value:                                     \
    *text = wantName ? name : description;        \
    return CUDA_SUCCESS;
    CUDASIM_DRIVER_RESULTS(CUDASIM_DESCRIBE)
#undef CUDASIM_DESCRIBE
  }
  *text = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

// ---- private services for the runtime and CUPTI (cuGetExportTable) -------------------

void registerKernel(const void* symbol, const char* name, cudasimKernelBody body,
                    int paramCount, const size_t* paramSizes) {
  kernels().add(symbol, name, body, paramCount, paramSizes);
}

CUresult functionForSymbol(const void* symbol, CUfunction* function) {
  return kernels().forSymbol(symbol, function);
}

CUresult kernelForSymbol(const void* symbol, CUkernel* kernel) {
  return kernels().kernelForSymbol(symbol, kernel);
}

// A launch through a kernel handle loads its function into the context.
CUresult functionForKernel(CUkernel kernel, CUfunction* function, bool load) {
  Kernel* found = kernels().findKernel(kernel);
  if (found == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (load) found->function->loaded.store(true, std::memory_order_relaxed);
  *function = reinterpret_cast<CUfunction>(found->function);
  return CUDA_SUCCESS;
}

std::mutex gSubscriberMutex;
std::string gSubscriberName;

bool subscribe(CUpti_CallbackFunc callback, void* userdata, const char* name,
               const char** holder) {
  std::lock_guard lock(gSubscriberMutex);
  if (gCallbacks.subscriber.load() != nullptr) {
    *holder = gSubscriberName.c_str();
    return false;
  }
  gSubscriberName = name ? name : "CUPTI subscriber";
  gCallbacks.userdata.store(userdata);
  gCallbacks.subscriber.store(callback, std::memory_order_release);
  return true;
}

void unsubscribe() {
  std::lock_guard lock(gSubscriberMutex);
  gCallbacks.subscriber.store(nullptr);
  for (auto& enabled : gCallbacks.driverEnabled) enabled.store(0);
  for (auto& enabled : gCallbacks.runtimeEnabled) enabled.store(0);
  gSubscriberName.clear();
}

void setRuntimeOrigin(RuntimeOrigin origin) { tOrigin = origin; }

bool cuptiSubscribeFails() { return faults().cuptiSubscribeFail.load(); }
void kernelTime(int64_t nanoseconds) { declareKernelTime(nanoseconds); }
bool cuptiEnableFails() { return faults().cuptiEnableFail.load(); }
bool foreignStubs() { return faults().foreignStubs.load(); }
uint64_t timingOverruns() { return timing().overruns(); }
int64_t timingOverrunNs() { return timing().overrunNs(); }

const ExportTable kExportTable = {sizeof(ExportTable), registerKernel,      functionForSymbol,
                                  &gCallbacks,          subscribe,           unsubscribe,
                                  setRuntimeOrigin,     setFaults,           cuptiSubscribeFails,
                                  cuptiEnableFails,     kernelTime,          timingOverruns,
                                  kernelForSymbol,      functionForKernel,
                                  foreignStubs,         timingOverrunNs};

}  // namespace

Driver* driver() { return gDriver.load(std::memory_order_acquire); }

KernelRegistry& kernels() {
  static KernelRegistry* registry = new KernelRegistry;  // outlives every worker thread
  return *registry;
}

CallbackState& callbackState() { return gCallbacks; }
const ExportTable& exportTable() { return kExportTable; }

}  // namespace cudasim

using namespace cudasim;

namespace {

// What cuFuncGetParamInfo and cuKernelGetParamInfo answer for the function a handle names
// (nullptr: the handle is unknown).
CUresult describeParam(const Function* function, size_t index, size_t* offset, size_t* size) {
  if (function == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (faults().paramInfoFails(function->name)) return CUDA_ERROR_NOT_SUPPORTED;
  if (index >= function->sizes.size()) return CUDA_ERROR_INVALID_VALUE;
  if (offset) *offset = function->offsets[index];
  if (size) *size = function->sizes[index];
  return CUDA_SUCCESS;
}

// What cuFuncGetName and cuKernelGetName answer, the same way.
CUresult nameFunction(const Function* function, const char** name) {
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (function == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *name = function->name.c_str();
  return CUDA_SUCCESS;
}

const Function* kernelFunction(CUkernel kernel) {
  const Kernel* found = kernels().findKernel(kernel);
  return found != nullptr ? found->function : nullptr;
}

}  // namespace

extern "C" {

// ---- initialisation, devices, contexts -----------------------------------------------

CUresult CUDAAPI cuInit(unsigned int Flags) {
  DRIVER_CALL(cuInit, nullptr, {
    if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (gForkedAfterInit.load()) return CUDA_ERROR_NOT_INITIALIZED;
    static std::once_flag once;
    static CUresult result = CUDA_SUCCESS;
    std::call_once(once, [] {
      gDeviceCount = countFromEnvironment("CUDASIM_DEVICE_COUNT", 1);
      gDriverCallbacksFromRuntime.store(
          flagFromEnvironment("CUDASIM_CUPTI_DRIVER_CALLBACKS", true));
      const uint64_t capacity = sizeFromEnvironment("CUDASIM_DEVICE_MEMORY", 4ull << 30);
      const uint64_t warmBytes = sizeFromEnvironment("CUDASIM_WARM_MEMORY", 0, true);
      const uint64_t warmHostBytes = sizeFromEnvironment("CUDASIM_WARM_HOST_MEMORY", 0, true);
      faults();  // a bad CUDASIM_FAULTS ends the process here, at start
      timing();  // and so do bad CUDASIM_*_GBPS
      if (gDeviceCount == 0) {
        result = CUDA_ERROR_NO_DEVICE;
        return;
      }
      auto* created = new Driver(capacity);
      created->memory.warm(warmBytes);
      created->host.warm(warmHostBytes);
      installFaultHandler(&created->memory);
      pthread_atfork(nullptr, nullptr, afterForkInChild);
      gDriver.store(created, std::memory_order_release);
    });
    return result;
  }, Flags);
}

CUresult CUDAAPI cuDriverGetVersion(int* driverVersion) {
  DRIVER_CALL(cuDriverGetVersion, nullptr, {
    if (driverVersion == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = kDriverVersion;
    return CUDA_SUCCESS;
  }, driverVersion);
}

CUresult CUDAAPI cuDeviceGetCount(int* count) {
  DRIVER_CALL(cuDeviceGetCount, nullptr, {
    REQUIRE(initialized());
    if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *count = gDeviceCount;
    return CUDA_SUCCESS;
  }, count);
}

CUresult CUDAAPI cuDeviceGet(CUdevice* device, int ordinal) {
  DRIVER_CALL(cuDeviceGet, nullptr, {
    REQUIRE(initialized());
    if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= gDeviceCount) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
  }, device, ordinal);
}

CUresult CUDAAPI cuDeviceGetName(char* name, int len, CUdevice dev) {
  DRIVER_CALL(cuDeviceGetName, nullptr, {
    REQUIRE(initialized());
    if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= gDeviceCount) return CUDA_ERROR_INVALID_DEVICE;
    std::snprintf(name, static_cast<size_t>(len), "%s", kDeviceName);
    return CUDA_SUCCESS;
  }, name, len, dev);
}

CUresult CUDAAPI cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  DRIVER_CALL(cuDeviceTotalMem_v2, nullptr, {
    REQUIRE(initialized());
    if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= gDeviceCount) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = the().memory.capacity();
    return CUDA_SUCCESS;
  }, bytes, dev);
}

CUresult CUDAAPI cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev) {
  DRIVER_CALL(cuDeviceGetUuid_v2, nullptr, {
    REQUIRE(initialized());
    if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= gDeviceCount) return CUDA_ERROR_INVALID_DEVICE;
    std::memcpy(uuid->bytes, "cudasim-device-0", 16);
    return CUDA_SUCCESS;
  }, uuid, dev);
}

CUresult CUDAAPI cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib, CUdevice dev) {
  DRIVER_CALL(cuDeviceGetAttribute, nullptr, {
    REQUIRE(initialized());
    if (pi == nullptr || attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX)
      return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= gDeviceCount) return CUDA_ERROR_INVALID_DEVICE;
    // An H100/H200-class device, as far as any program here asks.
    switch (attrib) {
      case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = 1024; break;
      case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: *pi = 1024; break;
      case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: *pi = 1024; break;
      case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: *pi = 64; break;
      case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: *pi = 2147483647; break;
      case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: *pi = 65535; break;
      case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: *pi = 65535; break;
      case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *pi = 32; break;
      case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *pi = 132; break;
      case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *pi = 9; break;
      case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *pi = 0; break;
      case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: *pi = 49152; break;
      case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: *pi = 1980000; break;
      case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: *pi = 2619000; break;
      case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: *pi = 5120; break;
      case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: *pi = 1; break;
      case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: *pi = 1; break;
      case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: *pi = 1; break;
      case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: *pi = 2; break;
      case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: *pi = 1; break;
      case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: *pi = 1; break;
      case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: *pi = 1; break;
      case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: *pi = 1; break;
      case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: *pi = 1; break;
      case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: *pi = 1; break;
      case CU_DEVICE_ATTRIBUTE_MAX_PITCH: *pi = static_cast<int>(kMaxPitch); break;
      case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: *pi = 512; break;
      case CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT: *pi = 32; break;
      default: *pi = 0; break;
    }
    return CUDA_SUCCESS;
  }, pi, attrib, dev);
}

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  DRIVER_CALL(cuDevicePrimaryCtxRetain, nullptr, {
    REQUIRE(initialized());
    if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= gDeviceCount) return CUDA_ERROR_INVALID_DEVICE;
    std::lock_guard lock(gPrimaryMutex);
    gPrimary.retains++;
    *pctx = kPrimaryHandle;
    return CUDA_SUCCESS;
  }, pctx, dev);
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  DRIVER_CALL(cuDevicePrimaryCtxRelease_v2, nullptr, {
    REQUIRE(initialized());
    if (dev < 0 || dev >= gDeviceCount) return CUDA_ERROR_INVALID_DEVICE;
    std::lock_guard lock(gPrimaryMutex);
    if (gPrimary.retains == 0) return CUDA_ERROR_INVALID_CONTEXT;
    // The context's memory and streams stay: nothing here depends on tearing them down.
    gPrimary.retains--;
    return CUDA_SUCCESS;
  }, dev);
}

CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags, int* active) {
  DRIVER_CALL(cuDevicePrimaryCtxGetState, nullptr, {
    REQUIRE(initialized());
    if (flags == nullptr || active == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= gDeviceCount) return CUDA_ERROR_INVALID_DEVICE;
    std::lock_guard lock(gPrimaryMutex);
    *flags = 0;
    *active = gPrimary.retains > 0;
    return CUDA_SUCCESS;
  }, dev, flags, active);
}

CUresult CUDAAPI cuCtxGetCurrent(CUcontext* pctx) {
  DRIVER_CALL(cuCtxGetCurrent, nullptr, {
    REQUIRE(initialized());
    if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *pctx = tContext;
    return CUDA_SUCCESS;
  }, pctx);
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) {
  DRIVER_CALL(cuCtxSetCurrent, nullptr, {
    REQUIRE(initialized());
    if (ctx != nullptr && ctx != kPrimaryHandle) return CUDA_ERROR_INVALID_CONTEXT;
    tContext = ctx;
    return CUDA_SUCCESS;
  }, ctx);
}

CUresult CUDAAPI cuCtxPushCurrent_v2(CUcontext ctx) {
  DRIVER_CALL(cuCtxPushCurrent_v2, nullptr, {
    REQUIRE(initialized());
    if (ctx != kPrimaryHandle) return CUDA_ERROR_INVALID_CONTEXT;
    tContext = ctx;  // one context: the stack never holds anything else
    return CUDA_SUCCESS;
  }, ctx);
}

CUresult CUDAAPI cuCtxPopCurrent_v2(CUcontext* pctx) {
  DRIVER_CALL(cuCtxPopCurrent_v2, nullptr, {
    REQUIRE(ready());
    if (pctx) *pctx = tContext;
    tContext = nullptr;
    return CUDA_SUCCESS;
  }, pctx);
}

CUresult CUDAAPI cuCtxGetDevice(CUdevice* device) {
  DRIVER_CALL(cuCtxGetDevice, nullptr, {
    REQUIRE(ready());
    if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *device = 0;
    return CUDA_SUCCESS;
  }, device);
}

CUresult CUDAAPI cuCtxSynchronize(void) {
  return driverCall(CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize, "cuCtxSynchronize", nullptr,
                    nullptr, []() -> CUresult {
                      REQUIRE(ready());
                      the().streams.synchronizeAll();
                      the().pools.synchronized();
                      return CUDA_SUCCESS;
                    });
}

// ---- memory ---------------------------------------------------------------------------

CUresult CUDAAPI cuMemGetInfo_v2(size_t* free, size_t* total) {
  DRIVER_CALL(cuMemGetInfo_v2, nullptr, {
    REQUIRE(ready());
    if (free == nullptr || total == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *total = the().memory.capacity();
    // Memory another process holds (an injected fault) is not free either.
    const uint64_t unavailable =
        the().memory.used() + faults().deviceTaken.load(std::memory_order_relaxed);
    *free = unavailable < *total ? *total - unavailable : 0;
    return CUDA_SUCCESS;
  }, free, total);
}

CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  DRIVER_CALL(cuMemAlloc_v2, nullptr, {
    REQUIRE(ready());
    if (dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return the().memory.allocate(bytesize, dptr);
  }, dptr, bytesize);
}

CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr) {
  DRIVER_CALL(cuMemFree_v2, nullptr, {
    REQUIRE(ready());
    if (dptr == 0) return CUDA_SUCCESS;
    // Pool memory is freed at once, without synchronisation (documented: the caller makes
    // sure nothing still uses it).
    const CUresult pooled = the().pools.freeNow(dptr);
    if (pooled != CUDA_ERROR_NOT_FOUND) return pooled;
    // The real call synchronises the device first, so that no queued work still uses it.
    the().streams.synchronizeAll();
    return the().memory.free(dptr);
  }, dptr);
}

CUresult CUDAAPI cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pPitch, size_t WidthInBytes,
                                    size_t Height, unsigned int ElementSizeBytes) {
  DRIVER_CALL(cuMemAllocPitch_v2, nullptr, {
    REQUIRE(ready());
    if (dptr == nullptr || pPitch == nullptr || WidthInBytes == 0 || Height == 0 ||
        (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16))
      return CUDA_ERROR_INVALID_VALUE;
    const size_t pitch = (WidthInBytes + kPitchAlignment - 1) / kPitchAlignment * kPitchAlignment;
    if (pitch > kMaxPitch || Height > SIZE_MAX / pitch) return CUDA_ERROR_INVALID_VALUE;
    REQUIRE(the().memory.allocate(pitch * Height, dptr));
    *pPitch = pitch;
    return CUDA_SUCCESS;
  }, dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
}

// ---- stream-ordered allocation and memory pools -----------------------------------------

CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  DRIVER_CALL(cuMemAllocAsync, nullptr, {
    return allocAsync(dptr, bytesize, nullptr, true, hStream, kLegacy);
  }, dptr, bytesize, hStream);
}
CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  DRIVER_CALL(cuMemAllocAsync_ptsz, nullptr, {
    return allocAsync(dptr, bytesize, nullptr, true, hStream, kPerThread);
  }, dptr, bytesize, hStream);
}
CUresult CUDAAPI cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                         CUstream hStream) {
  DRIVER_CALL(cuMemAllocFromPoolAsync, nullptr, {
    return allocAsync(dptr, bytesize, pool, false, hStream, kLegacy);
  }, dptr, bytesize, pool, hStream);
}
CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize,
                                              CUmemoryPool pool, CUstream hStream) {
  DRIVER_CALL(cuMemAllocFromPoolAsync_ptsz, nullptr, {
    return allocAsync(dptr, bytesize, pool, false, hStream, kPerThread);
  }, dptr, bytesize, pool, hStream);
}
CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
  DRIVER_CALL(cuMemFreeAsync, nullptr, { return freeAsync(dptr, hStream, kLegacy); }, dptr, hStream);
}
CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
  DRIVER_CALL(cuMemFreeAsync_ptsz, nullptr, { return freeAsync(dptr, hStream, kPerThread); }, dptr, hStream);
}

CUresult CUDAAPI cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* poolProps) {
  DRIVER_CALL(cuMemPoolCreate, nullptr, {
    REQUIRE(initialized());
    if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
    REQUIRE(validPoolProps(poolProps));
    return the().pools.create(*poolProps, pool);
  }, pool, poolProps);
}

CUresult CUDAAPI cuMemPoolDestroy(CUmemoryPool pool) {
  DRIVER_CALL(cuMemPoolDestroy, nullptr, {
    REQUIRE(initialized());
    return the().pools.destroy(pool);
  }, pool);
}

CUresult CUDAAPI cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  DRIVER_CALL(cuMemPoolSetAttribute, nullptr, {
    REQUIRE(initialized());
    return the().pools.setAttribute(pool, attr, value);
  }, pool, attr, value);
}

CUresult CUDAAPI cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  DRIVER_CALL(cuMemPoolGetAttribute, nullptr, {
    REQUIRE(initialized());
    return the().pools.getAttribute(pool, attr, value);
  }, pool, attr, value);
}

CUresult CUDAAPI cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep) {
  DRIVER_CALL(cuMemPoolTrimTo, nullptr, {
    REQUIRE(initialized());
    return the().pools.trimTo(pool, minBytesToKeep);
  }, pool, minBytesToKeep);
}

// One device: a pool is always accessible, read-write, from the device it lives on, and that
// cannot be changed; there is no other device to grant access to.
CUresult CUDAAPI cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc* map, size_t count) {
  DRIVER_CALL(cuMemPoolSetAccess, nullptr, {
    REQUIRE(initialized());
    if (!the().pools.isPool(pool) || (map == nullptr && count != 0)) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; ++i) {
      if (map[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
      if (map[i].location.id < 0 || map[i].location.id >= gDeviceCount)
        return CUDA_ERROR_INVALID_DEVICE;
      if (map[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
  }, pool, map, count);
}

CUresult CUDAAPI cuMemPoolGetAccess(CUmemAccess_flags* flags, CUmemoryPool memPool,
                                    CUmemLocation* location) {
  DRIVER_CALL(cuMemPoolGetAccess, nullptr, {
    REQUIRE(initialized());
    if (flags == nullptr || location == nullptr || !the().pools.isPool(memPool))
      return CUDA_ERROR_INVALID_VALUE;
    if (location->type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    if (location->id < 0 || location->id >= gDeviceCount) return CUDA_ERROR_INVALID_DEVICE;
    *flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return CUDA_SUCCESS;
  }, flags, memPool, location);
}

CUresult CUDAAPI cuDeviceGetDefaultMemPool(CUmemoryPool* pool_out, CUdevice dev) {
  DRIVER_CALL(cuDeviceGetDefaultMemPool, nullptr, {
    REQUIRE(initialized());
    if (pool_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= gDeviceCount) return CUDA_ERROR_INVALID_DEVICE;
    *pool_out = the().pools.defaultPool();
    return CUDA_SUCCESS;
  }, pool_out, dev);
}

CUresult CUDAAPI cuDeviceGetMemPool(CUmemoryPool* pool, CUdevice dev) {
  DRIVER_CALL(cuDeviceGetMemPool, nullptr, {
    REQUIRE(initialized());
    if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
    // A bad value, not a bad device (seen on an H200), unlike cuDeviceGetDefaultMemPool.
    if (dev < 0 || dev >= gDeviceCount) return CUDA_ERROR_INVALID_VALUE;
    *pool = the().pools.currentPool();
    return CUDA_SUCCESS;
  }, pool, dev);
}

CUresult CUDAAPI cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
  DRIVER_CALL(cuDeviceSetMemPool, nullptr, {
    REQUIRE(initialized());
    if (dev < 0 || dev >= gDeviceCount) return CUDA_ERROR_INVALID_DEVICE;
    return the().pools.setCurrentPool(pool);
  }, dev, pool);
}

// Sharing pools between processes is not simulated (no pool is created exportable).
CUresult CUDAAPI cuMemPoolExportToShareableHandle(void* handle_out, CUmemoryPool pool,
                                                  CUmemAllocationHandleType handleType,
                                                  unsigned long long flags) {
  DRIVER_CALL(cuMemPoolExportToShareableHandle, nullptr, {
    REQUIRE(initialized());
    if (handle_out == nullptr || !the().pools.isPool(pool)) return CUDA_ERROR_INVALID_VALUE;
    return CUDA_ERROR_NOT_SUPPORTED;
  }, handle_out, pool, handleType, flags);
}

CUresult CUDAAPI cuMemPoolImportFromShareableHandle(CUmemoryPool* pool_out, void* handle,
                                                    CUmemAllocationHandleType handleType,
                                                    unsigned long long flags) {
  DRIVER_CALL(cuMemPoolImportFromShareableHandle, nullptr, {
    REQUIRE(initialized());
    if (pool_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return CUDA_ERROR_NOT_SUPPORTED;
  }, pool_out, handle, handleType, flags);
}

CUresult CUDAAPI cuMemPoolExportPointer(CUmemPoolPtrExportData* shareData_out, CUdeviceptr ptr) {
  DRIVER_CALL(cuMemPoolExportPointer, nullptr, {
    REQUIRE(initialized());
    if (shareData_out == nullptr || the().pools.poolOf(ptr) == nullptr)
      return CUDA_ERROR_INVALID_VALUE;
    return CUDA_ERROR_NOT_SUPPORTED;
  }, shareData_out, ptr);
}

CUresult CUDAAPI cuMemPoolImportPointer(CUdeviceptr* ptr_out, CUmemoryPool pool,
                                        CUmemPoolPtrExportData* shareData) {
  DRIVER_CALL(cuMemPoolImportPointer, nullptr, {
    REQUIRE(initialized());
    if (ptr_out == nullptr || shareData == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return CUDA_ERROR_NOT_SUPPORTED;
  }, ptr_out, pool, shareData);
}

// ---- managed memory ---------------------------------------------------------------------

CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  DRIVER_CALL(cuMemAllocManaged, nullptr, {
    REQUIRE(ready());
    if (dptr == nullptr || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
      return CUDA_ERROR_INVALID_VALUE;
    return the().memory.allocateManaged(bytesize, dptr);
  }, dptr, bytesize, flags);
}

CUresult CUDAAPI cuMemAdvise_v2(CUdeviceptr devPtr, size_t count, CUmem_advise advice,
                                CUmemLocation location) {
  DRIVER_CALL(cuMemAdvise_v2, nullptr, { return advise(devPtr, count, advice, location); },
              devPtr, count, advice, location);
}

CUresult CUDAAPI cuMemAdvise(CUdeviceptr devPtr, size_t count, CUmem_advise advice,
                             CUdevice device) {
  DRIVER_CALL(cuMemAdvise, nullptr, {
    return advise(devPtr, count, advice, locationOfDevice(device));
  }, devPtr, count, advice, device);
}

CUresult CUDAAPI cuMemPrefetchAsync_v2(CUdeviceptr devPtr, size_t count, CUmemLocation location,
                                       unsigned int flags, CUstream hStream) {
  DRIVER_CALL(cuMemPrefetchAsync_v2, nullptr, {
    return prefetch("cuMemPrefetchAsync_v2", devPtr, count, location, flags, hStream, kLegacy);
  }, devPtr, count, location, flags, hStream);
}
CUresult CUDAAPI cuMemPrefetchAsync_v2_ptsz(CUdeviceptr devPtr, size_t count,
                                            CUmemLocation location, unsigned int flags,
                                            CUstream hStream) {
  DRIVER_CALL(cuMemPrefetchAsync_v2_ptsz, nullptr, {
    return prefetch("cuMemPrefetchAsync_v2_ptsz", devPtr, count, location, flags, hStream,
                    kPerThread);
  }, devPtr, count, location, flags, hStream);
}
CUresult CUDAAPI cuMemPrefetchAsync(CUdeviceptr devPtr, size_t count, CUdevice dstDevice,
                                    CUstream hStream) {
  DRIVER_CALL(cuMemPrefetchAsync, nullptr, {
    return prefetch("cuMemPrefetchAsync", devPtr, count, locationOfDevice(dstDevice), 0, hStream,
                    kLegacy);
  }, devPtr, count, dstDevice, hStream);
}
CUresult CUDAAPI cuMemPrefetchAsync_ptsz(CUdeviceptr devPtr, size_t count, CUdevice dstDevice,
                                         CUstream hStream) {
  DRIVER_CALL(cuMemPrefetchAsync_ptsz, nullptr, {
    return prefetch("cuMemPrefetchAsync_ptsz", devPtr, count, locationOfDevice(dstDevice), 0,
                    hStream, kPerThread);
  }, devPtr, count, dstDevice, hStream);
}

CUresult CUDAAPI cuMemRangeGetAttribute(void* data, size_t dataSize,
                                        CUmem_range_attribute attribute, CUdeviceptr devPtr,
                                        size_t count) {
  DRIVER_CALL(cuMemRangeGetAttribute, nullptr, {
    REQUIRE(ready());
    using Attribute = DeviceMemory::RangeAttribute;
    Attribute which;
    switch (attribute) {
      case CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY: which = Attribute::kReadMostly; break;
      case CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION: which = Attribute::kPreferredLocation; break;
      case CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION:
        which = Attribute::kLastPrefetchLocation;
        break;
      default:
        return CUDA_ERROR_NOT_SUPPORTED;  // cudasim answers the three above only
    }
    if (data == nullptr || dataSize != 4) return CUDA_ERROR_INVALID_VALUE;
    int value = 0;
    REQUIRE(the().memory.rangeAttribute(devPtr, count, which, &value));
    std::memcpy(data, &value, sizeof value);
    return CUDA_SUCCESS;
  }, data, dataSize, attribute, devPtr, count);
}

CUresult CUDAAPI cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr) {
  DRIVER_CALL(cuMemGetAddressRange_v2, nullptr, {
    REQUIRE(ready());
    return the().memory.addressRange(dptr, pbase, psize);
  }, pbase, psize, dptr);
}

CUresult CUDAAPI cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  DRIVER_CALL(cuPointerGetAttribute, nullptr, {
    REQUIRE(ready());
    if (data == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const bool device = the().memory.isDeviceRange(ptr, 1);
    const bool pinned = !device && the().host.isPinned(reinterpret_cast<void*>(ptr), 1);
    if (!device && !pinned) return CUDA_ERROR_INVALID_VALUE;
    switch (attribute) {
      case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        *static_cast<bool*>(data) = device && the().memory.isManagedRange(ptr, 1);
        return CUDA_SUCCESS;
      case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *static_cast<unsigned*>(data) = device ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
        return CUDA_SUCCESS;
      case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *static_cast<int*>(data) = 0;
        return CUDA_SUCCESS;
      case CU_POINTER_ATTRIBUTE_CONTEXT:
        *static_cast<CUcontext*>(data) = kPrimaryHandle;
        return CUDA_SUCCESS;
      case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
        *static_cast<CUmemoryPool*>(data) = device ? the().pools.poolOf(ptr) : nullptr;
        return CUDA_SUCCESS;
      case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
      case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        *static_cast<CUdeviceptr*>(data) = ptr;
        return CUDA_SUCCESS;
      case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      case CU_POINTER_ATTRIBUTE_RANGE_SIZE: {
        CUdeviceptr base = 0;
        size_t size = 0;
        if (!device) return CUDA_ERROR_INVALID_VALUE;
        REQUIRE(the().memory.addressRange(ptr, &base, &size));
        if (attribute == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR)
          *static_cast<CUdeviceptr*>(data) = base;
        else
          *static_cast<size_t*>(data) = size;
        return CUDA_SUCCESS;
      }
      default:
        return CUDA_ERROR_INVALID_VALUE;
    }
  }, data, attribute, ptr);
}

CUresult CUDAAPI cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                               CUmemAllocationGranularity_flags option) {
  DRIVER_CALL(cuMemGetAllocationGranularity, nullptr, {
    REQUIRE(ready());
    if (granularity == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
        option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
      return CUDA_ERROR_INVALID_VALUE;
    REQUIRE(validAllocationProp(prop));
    *granularity = kGranularity;
    return CUDA_SUCCESS;
  }, granularity, prop, option);
}

CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment,
                                     CUdeviceptr addr, unsigned long long flags) {
  DRIVER_CALL(cuMemAddressReserve, nullptr, {
    REQUIRE(ready());
    if (ptr == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    return the().memory.reserve(size, alignment, addr, ptr);
  }, ptr, size, alignment, addr, flags);
}

CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  DRIVER_CALL(cuMemAddressFree, nullptr, {
    REQUIRE(ready());
    return the().memory.freeReservation(ptr, size);
  }, ptr, size);
}

CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                             const CUmemAllocationProp* prop, unsigned long long flags) {
  DRIVER_CALL(cuMemCreate, nullptr, {
    REQUIRE(ready());
    if (handle == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    REQUIRE(validAllocationProp(prop));
    return the().memory.create(size, prop->requestedHandleTypes, handle);
  }, handle, size, prop, flags);
}

CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
  DRIVER_CALL(cuMemRelease, nullptr, {
    REQUIRE(ready());
    return the().memory.release(handle);
  }, handle);
}

CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                          CUmemGenericAllocationHandle handle, unsigned long long flags) {
  DRIVER_CALL(cuMemMap, nullptr, {
    REQUIRE(ready());
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    return the().memory.map(ptr, size, offset, handle);
  }, ptr, size, offset, handle, flags);
}

CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) {
  DRIVER_CALL(cuMemUnmap, nullptr, {
    REQUIRE(ready());
    // Like the real driver, this does not wait for queued work that still uses the range:
    // such work faults. Callers synchronise first.
    return the().memory.unmap(ptr, size);
  }, ptr, size);
}

CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc,
                                size_t count) {
  DRIVER_CALL(cuMemSetAccess, nullptr, {
    REQUIRE(ready());
    if (desc == nullptr || count != 1) return CUDA_ERROR_INVALID_VALUE;
    if (desc->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    if (desc->location.id < 0 || desc->location.id >= gDeviceCount)
      return CUDA_ERROR_INVALID_DEVICE;
    return the().memory.setAccess(ptr, size, desc->flags);
  }, ptr, size, desc, count);
}

CUresult CUDAAPI cuMemExportToShareableHandle(void* shareableHandle,
                                              CUmemGenericAllocationHandle handle,
                                              CUmemAllocationHandleType handleType,
                                              unsigned long long flags) {
  DRIVER_CALL(cuMemExportToShareableHandle, nullptr, {
    REQUIRE(ready());
    if (shareableHandle == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
    return the().memory.exportToFd(handle, static_cast<int*>(shareableHandle));
  }, shareableHandle, handle, handleType, flags);
}

CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle,
                                                void* osHandle,
                                                CUmemAllocationHandleType shHandleType) {
  DRIVER_CALL(cuMemImportFromShareableHandle, nullptr, {
    REQUIRE(ready());
    if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
    // For POSIX file descriptors the handle is passed by value, cast to a pointer.
    return the().memory.importFromFd(static_cast<int>(reinterpret_cast<intptr_t>(osHandle)),
                                     handle);
  }, handle, osHandle, shHandleType);
}

CUresult CUDAAPI cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop,
                                                        CUmemGenericAllocationHandle handle) {
  DRIVER_CALL(cuMemGetAllocationPropertiesFromHandle, nullptr, {
    REQUIRE(ready());
    if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return the().memory.properties(handle, prop);
  }, prop, handle);
}

CUresult CUDAAPI cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) {
  DRIVER_CALL(cuMemRetainAllocationHandle, nullptr, {
    REQUIRE(ready());
    if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return the().memory.retainHandle(reinterpret_cast<CUdeviceptr>(addr), handle);
  }, handle, addr);
}

CUresult CUDAAPI cuMemHostAlloc(void** pp, size_t bytesize, unsigned int Flags) {
  DRIVER_CALL(cuMemHostAlloc, nullptr, {
    REQUIRE(ready());
    constexpr unsigned kKnown =
        CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
    if (Flags & ~kKnown) return CUDA_ERROR_INVALID_VALUE;
    return the().host.allocate(bytesize, pp);
  }, pp, bytesize, Flags);
}

CUresult CUDAAPI cuMemAllocHost_v2(void** pp, size_t bytesize) {
  DRIVER_CALL(cuMemAllocHost_v2, nullptr, {
    REQUIRE(ready());
    return the().host.allocate(bytesize, pp);
  }, pp, bytesize);
}

CUresult CUDAAPI cuMemFreeHost(void* p) {
  DRIVER_CALL(cuMemFreeHost, nullptr, {
    REQUIRE(ready());
    // Queued copies may still read or write it.
    the().streams.synchronizeAll();
    return the().host.free(p);
  }, p);
}

CUresult CUDAAPI cuMemHostRegister_v2(void* p, size_t bytesize, unsigned int Flags) {
  DRIVER_CALL(cuMemHostRegister_v2, nullptr, {
    REQUIRE(ready());
    return the().host.registerRange(p, bytesize);
  }, p, bytesize, Flags);
}

CUresult CUDAAPI cuMemHostUnregister(void* p) {
  DRIVER_CALL(cuMemHostUnregister, nullptr, {
    REQUIRE(ready());
    the().streams.synchronizeAll();
    return the().host.unregisterRange(p);
  }, p);
}

CUresult CUDAAPI cuMemHostGetDevicePointer_v2(CUdeviceptr* pdptr, void* p, unsigned int Flags) {
  DRIVER_CALL(cuMemHostGetDevicePointer_v2, nullptr, {
    REQUIRE(ready());
    if (pdptr == nullptr || Flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (!the().host.isPinned(p, 1)) return CUDA_ERROR_INVALID_VALUE;
    *pdptr = reinterpret_cast<CUdeviceptr>(p);  // unified addressing: the same address
    return CUDA_SUCCESS;
  }, pdptr, p, Flags);
}

// ---- copies and memsets -----------------------------------------------------------------

#define VOIDP(x) reinterpret_cast<void*>(x)
#define CVOIDP(x) reinterpret_cast<const void*>(x)

CUresult CUDAAPI cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount) {
  DRIVER_CALL(cuMemcpy, nullptr,
              { return unifiedCopy("cuMemcpy", dst, src, ByteCount, nullptr, false, kLegacy); },
              dst, src, ByteCount);
}
CUresult CUDAAPI cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount) {
  DRIVER_CALL(cuMemcpy_ptds, nullptr,
              { return unifiedCopy("cuMemcpy_ptds", dst, src, ByteCount, nullptr, false, kPerThread); },
              dst, src, ByteCount);
}
CUresult CUDAAPI cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream) {
  DRIVER_CALL(cuMemcpyAsync, nullptr,
              { return unifiedCopy("cuMemcpyAsync", dst, src, ByteCount, hStream, true, kLegacy); },
              dst, src, ByteCount, hStream);
}
CUresult CUDAAPI cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream) {
  DRIVER_CALL(cuMemcpyAsync_ptsz, nullptr,
              { return unifiedCopy("cuMemcpyAsync_ptsz", dst, src, ByteCount, hStream, true, kPerThread); },
              dst, src, ByteCount, hStream);
}

CUresult CUDAAPI cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount) {
  DRIVER_CALL(cuMemcpyHtoD_v2, nullptr, {
    return copy("cuMemcpyHtoD_v2", VOIDP(dstDevice), srcHost, ByteCount, true, false, nullptr, false, kLegacy);
  }, dstDevice, srcHost, ByteCount);
}
CUresult CUDAAPI cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount) {
  DRIVER_CALL(cuMemcpyHtoD_v2_ptds, nullptr, {
    return copy("cuMemcpyHtoD_v2_ptds", VOIDP(dstDevice), srcHost, ByteCount, true, false, nullptr, false, kPerThread);
  }, dstDevice, srcHost, ByteCount);
}
CUresult CUDAAPI cuMemcpyDtoH_v2(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
  DRIVER_CALL(cuMemcpyDtoH_v2, nullptr, {
    return copy("cuMemcpyDtoH_v2", dstHost, CVOIDP(srcDevice), ByteCount, false, true, nullptr, false, kLegacy);
  }, dstHost, srcDevice, ByteCount);
}
CUresult CUDAAPI cuMemcpyDtoH_v2_ptds(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
  DRIVER_CALL(cuMemcpyDtoH_v2_ptds, nullptr, {
    return copy("cuMemcpyDtoH_v2_ptds", dstHost, CVOIDP(srcDevice), ByteCount, false, true, nullptr, false, kPerThread);
  }, dstHost, srcDevice, ByteCount);
}
CUresult CUDAAPI cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount) {
  DRIVER_CALL(cuMemcpyDtoD_v2, nullptr, {
    return copy("cuMemcpyDtoD_v2", VOIDP(dstDevice), CVOIDP(srcDevice), ByteCount, true, true, nullptr, false, kLegacy);
  }, dstDevice, srcDevice, ByteCount);
}
CUresult CUDAAPI cuMemcpyDtoD_v2_ptds(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount) {
  DRIVER_CALL(cuMemcpyDtoD_v2_ptds, nullptr, {
    return copy("cuMemcpyDtoD_v2_ptds", VOIDP(dstDevice), CVOIDP(srcDevice), ByteCount, true, true, nullptr, false, kPerThread);
  }, dstDevice, srcDevice, ByteCount);
}
CUresult CUDAAPI cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount, CUstream hStream) {
  DRIVER_CALL(cuMemcpyHtoDAsync_v2, nullptr, {
    return copy("cuMemcpyHtoDAsync_v2", VOIDP(dstDevice), srcHost, ByteCount, true, false, hStream, true, kLegacy);
  }, dstDevice, srcHost, ByteCount, hStream);
}
CUresult CUDAAPI cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount, CUstream hStream) {
  DRIVER_CALL(cuMemcpyHtoDAsync_v2_ptsz, nullptr, {
    return copy("cuMemcpyHtoDAsync_v2_ptsz", VOIDP(dstDevice), srcHost, ByteCount, true, false, hStream, true, kPerThread);
  }, dstDevice, srcHost, ByteCount, hStream);
}
CUresult CUDAAPI cuMemcpyDtoHAsync_v2(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream) {
  DRIVER_CALL(cuMemcpyDtoHAsync_v2, nullptr, {
    return copy("cuMemcpyDtoHAsync_v2", dstHost, CVOIDP(srcDevice), ByteCount, false, true, hStream, true, kLegacy);
  }, dstHost, srcDevice, ByteCount, hStream);
}
CUresult CUDAAPI cuMemcpyDtoHAsync_v2_ptsz(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream) {
  DRIVER_CALL(cuMemcpyDtoHAsync_v2_ptsz, nullptr, {
    return copy("cuMemcpyDtoHAsync_v2_ptsz", dstHost, CVOIDP(srcDevice), ByteCount, false, true, hStream, true, kPerThread);
  }, dstHost, srcDevice, ByteCount, hStream);
}
CUresult CUDAAPI cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream) {
  DRIVER_CALL(cuMemcpyDtoDAsync_v2, nullptr, {
    return copy("cuMemcpyDtoDAsync_v2", VOIDP(dstDevice), CVOIDP(srcDevice), ByteCount, true, true, hStream, true, kLegacy);
  }, dstDevice, srcDevice, ByteCount, hStream);
}
CUresult CUDAAPI cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream) {
  DRIVER_CALL(cuMemcpyDtoDAsync_v2_ptsz, nullptr, {
    return copy("cuMemcpyDtoDAsync_v2_ptsz", VOIDP(dstDevice), CVOIDP(srcDevice), ByteCount, true, true, hStream, true, kPerThread);
  }, dstDevice, srcDevice, ByteCount, hStream);
}

CUresult CUDAAPI cuMemcpy2D_v2(const CUDA_MEMCPY2D* pCopy) {
  DRIVER_CALL(cuMemcpy2D_v2, nullptr,
              { return copy2D("cuMemcpy2D_v2", pCopy, nullptr, false, kLegacy); }, pCopy);
}
CUresult CUDAAPI cuMemcpy2D_v2_ptds(const CUDA_MEMCPY2D* pCopy) {
  DRIVER_CALL(cuMemcpy2D_v2_ptds, nullptr,
              { return copy2D("cuMemcpy2D_v2_ptds", pCopy, nullptr, false, kPerThread); }, pCopy);
}
// Unaligned: the real driver takes a slower path where pitches defeat its fast one; here every
// copy is a CPU copy, so it is the same copy.
CUresult CUDAAPI cuMemcpy2DUnaligned_v2(const CUDA_MEMCPY2D* pCopy) {
  DRIVER_CALL(cuMemcpy2DUnaligned_v2, nullptr,
              { return copy2D("cuMemcpy2DUnaligned_v2", pCopy, nullptr, false, kLegacy); }, pCopy);
}
CUresult CUDAAPI cuMemcpy2DUnaligned_v2_ptds(const CUDA_MEMCPY2D* pCopy) {
  DRIVER_CALL(cuMemcpy2DUnaligned_v2_ptds, nullptr, {
    return copy2D("cuMemcpy2DUnaligned_v2_ptds", pCopy, nullptr, false, kPerThread);
  }, pCopy);
}
CUresult CUDAAPI cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D* pCopy, CUstream hStream) {
  DRIVER_CALL(cuMemcpy2DAsync_v2, nullptr,
              { return copy2D("cuMemcpy2DAsync_v2", pCopy, hStream, true, kLegacy); }, pCopy, hStream);
}
CUresult CUDAAPI cuMemcpy2DAsync_v2_ptsz(const CUDA_MEMCPY2D* pCopy, CUstream hStream) {
  DRIVER_CALL(cuMemcpy2DAsync_v2_ptsz, nullptr,
              { return copy2D("cuMemcpy2DAsync_v2_ptsz", pCopy, hStream, true, kPerThread); },
              pCopy, hStream);
}

CUresult CUDAAPI cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N) {
  DRIVER_CALL(cuMemsetD8_v2, nullptr, { return memset("cuMemsetD8_v2", dstDevice, uc, N, nullptr, kLegacy); }, dstDevice, uc, N);
}
CUresult CUDAAPI cuMemsetD8_v2_ptds(CUdeviceptr dstDevice, unsigned char uc, size_t N) {
  DRIVER_CALL(cuMemsetD8_v2_ptds, nullptr, { return memset("cuMemsetD8_v2_ptds", dstDevice, uc, N, nullptr, kPerThread); }, dstDevice, uc, N);
}
CUresult CUDAAPI cuMemsetD16_v2(CUdeviceptr dstDevice, unsigned short us, size_t N) {
  DRIVER_CALL(cuMemsetD16_v2, nullptr, { return memset("cuMemsetD16_v2", dstDevice, us, N, nullptr, kLegacy); }, dstDevice, us, N);
}
CUresult CUDAAPI cuMemsetD16_v2_ptds(CUdeviceptr dstDevice, unsigned short us, size_t N) {
  DRIVER_CALL(cuMemsetD16_v2_ptds, nullptr, { return memset("cuMemsetD16_v2_ptds", dstDevice, us, N, nullptr, kPerThread); }, dstDevice, us, N);
}
CUresult CUDAAPI cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N) {
  DRIVER_CALL(cuMemsetD32_v2, nullptr, { return memset("cuMemsetD32_v2", dstDevice, ui, N, nullptr, kLegacy); }, dstDevice, ui, N);
}
CUresult CUDAAPI cuMemsetD32_v2_ptds(CUdeviceptr dstDevice, unsigned int ui, size_t N) {
  DRIVER_CALL(cuMemsetD32_v2_ptds, nullptr, { return memset("cuMemsetD32_v2_ptds", dstDevice, ui, N, nullptr, kPerThread); }, dstDevice, ui, N);
}
CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream) {
  DRIVER_CALL(cuMemsetD8Async, nullptr, { return memset("cuMemsetD8Async", dstDevice, uc, N, hStream, kLegacy); }, dstDevice, uc, N, hStream);
}
CUresult CUDAAPI cuMemsetD8Async_ptsz(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream) {
  DRIVER_CALL(cuMemsetD8Async_ptsz, nullptr, { return memset("cuMemsetD8Async_ptsz", dstDevice, uc, N, hStream, kPerThread); }, dstDevice, uc, N, hStream);
}
CUresult CUDAAPI cuMemsetD16Async(CUdeviceptr dstDevice, unsigned short us, size_t N, CUstream hStream) {
  DRIVER_CALL(cuMemsetD16Async, nullptr, { return memset("cuMemsetD16Async", dstDevice, us, N, hStream, kLegacy); }, dstDevice, us, N, hStream);
}
CUresult CUDAAPI cuMemsetD16Async_ptsz(CUdeviceptr dstDevice, unsigned short us, size_t N, CUstream hStream) {
  DRIVER_CALL(cuMemsetD16Async_ptsz, nullptr, { return memset("cuMemsetD16Async_ptsz", dstDevice, us, N, hStream, kPerThread); }, dstDevice, us, N, hStream);
}
CUresult CUDAAPI cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream) {
  DRIVER_CALL(cuMemsetD32Async, nullptr, { return memset("cuMemsetD32Async", dstDevice, ui, N, hStream, kLegacy); }, dstDevice, ui, N, hStream);
}
CUresult CUDAAPI cuMemsetD32Async_ptsz(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream) {
  DRIVER_CALL(cuMemsetD32Async_ptsz, nullptr, { return memset("cuMemsetD32Async_ptsz", dstDevice, ui, N, hStream, kPerThread); }, dstDevice, ui, N, hStream);
}

// ---- streams and events ---------------------------------------------------------------

CUresult CUDAAPI cuStreamCreate(CUstream* phStream, unsigned int Flags) {
  DRIVER_CALL(cuStreamCreate, nullptr, {
    REQUIRE(ready());
    if (phStream == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return the().streams.create(Flags, phStream);
  }, phStream, Flags);
}

CUresult CUDAAPI cuStreamCreateWithPriority(CUstream* phStream, unsigned int flags, int priority) {
  DRIVER_CALL(cuStreamCreateWithPriority, nullptr, {
    REQUIRE(ready());
    if (phStream == nullptr) return CUDA_ERROR_INVALID_VALUE;
    (void)priority;  // clamped by the real driver; every stream is equal here
    return the().streams.create(flags, phStream);
  }, phStream, flags, priority);
}

CUresult CUDAAPI cuStreamDestroy_v2(CUstream hStream) {
  DRIVER_CALL(cuStreamDestroy_v2, nullptr, {
    REQUIRE(ready());
    return the().streams.destroy(hStream);
  }, hStream);
}

CUresult CUDAAPI cuStreamSynchronize(CUstream hStream) {
  DRIVER_CALL(cuStreamSynchronize, nullptr, { return streamSynchronize(hStream, kLegacy); }, hStream);
}
CUresult CUDAAPI cuStreamSynchronize_ptsz(CUstream hStream) {
  DRIVER_CALL(cuStreamSynchronize_ptsz, nullptr, { return streamSynchronize(hStream, kPerThread); }, hStream);
}
CUresult CUDAAPI cuStreamQuery(CUstream hStream) {
  DRIVER_CALL(cuStreamQuery, nullptr, { return streamQuery(hStream, kLegacy); }, hStream);
}
CUresult CUDAAPI cuStreamQuery_ptsz(CUstream hStream) {
  DRIVER_CALL(cuStreamQuery_ptsz, nullptr, { return streamQuery(hStream, kPerThread); }, hStream);
}
CUresult CUDAAPI cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags) {
  DRIVER_CALL(cuStreamWaitEvent, nullptr, { return streamWaitEvent(hStream, hEvent, Flags, kLegacy); }, hStream, hEvent, Flags);
}
CUresult CUDAAPI cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags) {
  DRIVER_CALL(cuStreamWaitEvent_ptsz, nullptr, { return streamWaitEvent(hStream, hEvent, Flags, kPerThread); }, hStream, hEvent, Flags);
}
CUresult CUDAAPI cuStreamGetFlags(CUstream hStream, unsigned int* flags) {
  DRIVER_CALL(cuStreamGetFlags, nullptr, { return streamGetFlags(hStream, flags, kLegacy); }, hStream, flags);
}
CUresult CUDAAPI cuStreamGetFlags_ptsz(CUstream hStream, unsigned int* flags) {
  DRIVER_CALL(cuStreamGetFlags_ptsz, nullptr, { return streamGetFlags(hStream, flags, kPerThread); }, hStream, flags);
}

CUresult CUDAAPI cuEventCreate(CUevent* phEvent, unsigned int Flags) {
  DRIVER_CALL(cuEventCreate, nullptr, {
    REQUIRE(ready());
    if (phEvent == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return the().streams.createEvent(Flags, phEvent);
  }, phEvent, Flags);
}

CUresult CUDAAPI cuEventDestroy_v2(CUevent hEvent) {
  DRIVER_CALL(cuEventDestroy_v2, nullptr, {
    REQUIRE(ready());
    return the().streams.destroyEvent(hEvent);
  }, hEvent);
}

CUresult CUDAAPI cuEventRecord(CUevent hEvent, CUstream hStream) {
  DRIVER_CALL(cuEventRecord, nullptr, { return eventRecord(hEvent, hStream, kLegacy); }, hEvent, hStream);
}
CUresult CUDAAPI cuEventRecord_ptsz(CUevent hEvent, CUstream hStream) {
  DRIVER_CALL(cuEventRecord_ptsz, nullptr, { return eventRecord(hEvent, hStream, kPerThread); }, hEvent, hStream);
}
CUresult CUDAAPI cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags) {
  DRIVER_CALL(cuEventRecordWithFlags, nullptr, {
    if (flags & ~unsigned(CU_EVENT_RECORD_EXTERNAL)) return CUDA_ERROR_INVALID_VALUE;
    return eventRecord(hEvent, hStream, kLegacy);
  }, hEvent, hStream, flags);
}
CUresult CUDAAPI cuEventRecordWithFlags_ptsz(CUevent hEvent, CUstream hStream, unsigned int flags) {
  DRIVER_CALL(cuEventRecordWithFlags_ptsz, nullptr, {
    if (flags & ~unsigned(CU_EVENT_RECORD_EXTERNAL)) return CUDA_ERROR_INVALID_VALUE;
    return eventRecord(hEvent, hStream, kPerThread);
  }, hEvent, hStream, flags);
}

CUresult CUDAAPI cuEventQuery(CUevent hEvent) {
  DRIVER_CALL(cuEventQuery, nullptr, {
    REQUIRE(ready());
    return the().streams.queryEvent(hEvent);
  }, hEvent);
}

CUresult CUDAAPI cuEventSynchronize(CUevent hEvent) {
  DRIVER_CALL(cuEventSynchronize, nullptr, {
    REQUIRE(ready());
    REQUIRE(the().streams.synchronizeEvent(hEvent));
    the().pools.synchronized();
    return CUDA_SUCCESS;
  }, hEvent);
}

CUresult CUDAAPI cuEventElapsedTime_v2(float* pMilliseconds, CUevent hStart, CUevent hEnd) {
  DRIVER_CALL(cuEventElapsedTime_v2, nullptr, {
    REQUIRE(ready());
    return the().streams.elapsed(pMilliseconds, hStart, hEnd);
  }, pMilliseconds, hStart, hEnd);
}

// ---- launches -------------------------------------------------------------------------

CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                unsigned int gridDimZ, unsigned int blockDimX,
                                unsigned int blockDimY, unsigned int blockDimZ,
                                unsigned int sharedMemBytes, CUstream hStream,
                                void** kernelParams, void** extra) {
  DRIVER_CALL(cuLaunchKernel, kernelName(f), {
    return launch("cuLaunchKernel", f, dim3(gridDimX, gridDimY, gridDimZ),
                  dim3(blockDimX, blockDimY, blockDimZ), hStream, kernelParams, extra, kLegacy);
  }, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream,
     kernelParams, extra);
}

CUresult CUDAAPI cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                     unsigned int gridDimZ, unsigned int blockDimX,
                                     unsigned int blockDimY, unsigned int blockDimZ,
                                     unsigned int sharedMemBytes, CUstream hStream,
                                     void** kernelParams, void** extra) {
  DRIVER_CALL(cuLaunchKernel_ptsz, kernelName(f), {
    return launch("cuLaunchKernel_ptsz", f, dim3(gridDimX, gridDimY, gridDimZ),
                  dim3(blockDimX, blockDimY, blockDimZ), hStream, kernelParams, extra, kPerThread);
  }, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream,
     kernelParams, extra);
}

CUresult CUDAAPI cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void** kernelParams,
                                  void** extra) {
  DRIVER_CALL(cuLaunchKernelEx, kernelName(f), {
    if (config == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return launch("cuLaunchKernelEx", f, dim3(config->gridDimX, config->gridDimY, config->gridDimZ),
                  dim3(config->blockDimX, config->blockDimY, config->blockDimZ), config->hStream,
                  kernelParams, extra, kLegacy);
  }, config, f, kernelParams, extra);
}

CUresult CUDAAPI cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f,
                                       void** kernelParams, void** extra) {
  DRIVER_CALL(cuLaunchKernelEx_ptsz, kernelName(f), {
    if (config == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return launch("cuLaunchKernelEx_ptsz", f,
                  dim3(config->gridDimX, config->gridDimY, config->gridDimZ),
                  dim3(config->blockDimX, config->blockDimY, config->blockDimZ), config->hStream,
                  kernelParams, extra, kPerThread);
  }, config, f, kernelParams, extra);
}

CUresult CUDAAPI cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX,
                                           unsigned int gridDimY, unsigned int gridDimZ,
                                           unsigned int blockDimX, unsigned int blockDimY,
                                           unsigned int blockDimZ, unsigned int sharedMemBytes,
                                           CUstream hStream, void** kernelParams) {
  DRIVER_CALL(cuLaunchCooperativeKernel, kernelName(f), {
    return launch("cuLaunchCooperativeKernel", f, dim3(gridDimX, gridDimY, gridDimZ),
                  dim3(blockDimX, blockDimY, blockDimZ), hStream, kernelParams, nullptr, kLegacy);
  }, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream,
     kernelParams);
}

CUresult CUDAAPI cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX,
                                                unsigned int gridDimY, unsigned int gridDimZ,
                                                unsigned int blockDimX, unsigned int blockDimY,
                                                unsigned int blockDimZ,
                                                unsigned int sharedMemBytes, CUstream hStream,
                                                void** kernelParams) {
  DRIVER_CALL(cuLaunchCooperativeKernel_ptsz, kernelName(f), {
    return launch("cuLaunchCooperativeKernel_ptsz", f, dim3(gridDimX, gridDimY, gridDimZ),
                  dim3(blockDimX, blockDimY, blockDimZ), hStream, kernelParams, nullptr, kPerThread);
  }, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream,
     kernelParams);
}

CUresult CUDAAPI cuStreamWaitValue32_v2(CUstream stream, CUdeviceptr addr, cuuint32_t value,
                                        unsigned int flags) {
  DRIVER_CALL(cuStreamWaitValue32_v2, nullptr,
              { return waitValue32(stream, addr, value, flags, kLegacy); }, stream, addr, value,
              flags);
}
CUresult CUDAAPI cuStreamWaitValue32_v2_ptsz(CUstream stream, CUdeviceptr addr, cuuint32_t value,
                                             unsigned int flags) {
  DRIVER_CALL(cuStreamWaitValue32_v2_ptsz, nullptr,
              { return waitValue32(stream, addr, value, flags, kPerThread); }, stream, addr, value,
              flags);
}

CUresult CUDAAPI cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void* userData) {
  DRIVER_CALL(cuLaunchHostFunc, nullptr, { return hostFunc(hStream, fn, userData, kLegacy); }, hStream, fn, userData);
}
CUresult CUDAAPI cuLaunchHostFunc_ptsz(CUstream hStream, CUhostFn fn, void* userData) {
  DRIVER_CALL(cuLaunchHostFunc_ptsz, nullptr, { return hostFunc(hStream, fn, userData, kPerThread); }, hStream, fn, userData);
}

CUresult CUDAAPI cuFuncGetParamInfo(CUfunction func, size_t paramIndex, size_t* paramOffset,
                                    size_t* paramSize) {
  DRIVER_CALL(cuFuncGetParamInfo, nullptr, {
    REQUIRE(initialized());
    return describeParam(kernels().find(func), paramIndex, paramOffset, paramSize);
  }, func, paramIndex, paramOffset, paramSize);
}

CUresult CUDAAPI cuFuncGetName(const char** name, CUfunction hfunc) {
  DRIVER_CALL(cuFuncGetName, nullptr, {
    REQUIRE(initialized());
    return nameFunction(kernels().find(hfunc), name);
  }, name, hfunc);
}

// A CUkernel is not a CUfunction: these take the kernel handle itself, as the real driver's do.
CUresult CUDAAPI cuKernelGetFunction(CUfunction* pFunc, CUkernel kernel) {
  DRIVER_CALL(cuKernelGetFunction, nullptr, {
    REQUIRE(ready());
    if (pFunc == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const Kernel* found = kernels().findKernel(kernel);
    if (found == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    // Lazy loading: no function in this context before the first launch (seen on an H200
    // with driver 580: CUDA_ERROR_NOT_FOUND at the first launch's CUPTI callback).
    if (!found->function->loaded.load(std::memory_order_relaxed)) return CUDA_ERROR_NOT_FOUND;
    *pFunc = reinterpret_cast<CUfunction>(found->function);
    return CUDA_SUCCESS;
  }, pFunc, kernel);
}

CUresult CUDAAPI cuKernelGetParamInfo(CUkernel kernel, size_t paramIndex, size_t* paramOffset,
                                      size_t* paramSize) {
  DRIVER_CALL(cuKernelGetParamInfo, nullptr, {
    REQUIRE(initialized());
    return describeParam(kernelFunction(kernel), paramIndex, paramOffset, paramSize);
  }, kernel, paramIndex, paramOffset, paramSize);
}

CUresult CUDAAPI cuKernelGetName(const char** name, CUkernel hfunc) {
  DRIVER_CALL(cuKernelGetName, nullptr, {
    REQUIRE(initialized());
    return nameFunction(kernelFunction(hfunc), name);
  }, name, hfunc);
}

// ---- IPC ------------------------------------------------------------------------------

CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle* pHandle, CUdeviceptr dptr) {
  DRIVER_CALL(cuIpcGetMemHandle, nullptr, {
    REQUIRE(ready());
    if (pHandle == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return the().memory.ipcExport(dptr, pHandle);
  }, pHandle, dptr);
}

CUresult CUDAAPI cuIpcOpenMemHandle_v2(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int Flags) {
  DRIVER_CALL(cuIpcOpenMemHandle_v2, nullptr, {
    REQUIRE(ready());
    if (pdptr == nullptr || (Flags & ~unsigned(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)))
      return CUDA_ERROR_INVALID_VALUE;
    return the().memory.ipcOpen(handle, pdptr);
  }, pdptr, handle, Flags);
}

CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr dptr) {
  DRIVER_CALL(cuIpcCloseMemHandle, nullptr, {
    REQUIRE(ready());
    return the().memory.ipcClose(dptr);
  }, dptr);
}

// ---- errors and private tables ----------------------------------------------------------

CUresult CUDAAPI cuGetErrorString(CUresult error, const char** pStr) {
  DRIVER_CALL(cuGetErrorString, nullptr, { return describeResult(error, pStr, false); }, error, pStr);
}

CUresult CUDAAPI cuGetErrorName(CUresult error, const char** pStr) {
  DRIVER_CALL(cuGetErrorName, nullptr, { return describeResult(error, pStr, true); }, error, pStr);
}

CUresult CUDAAPI cuGetExportTable(const void** ppExportTable, const CUuuid* pExportTableId) {
  DRIVER_CALL(cuGetExportTable, nullptr, {
    if (ppExportTable == nullptr || pExportTableId == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (std::memcmp(pExportTableId, &kExportTableId, sizeof(CUuuid)) != 0)
      return CUDA_ERROR_INVALID_VALUE;
    *ppExportTable = &exportTable();
    return CUDA_SUCCESS;
  }, ppExportTable, pExportTableId);
}

#undef cuGetProcAddress  // cuda.h maps it to _v2; the first version is exported too

CUresult CUDAAPI cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion,
                                     cuuint64_t flags, CUdriverProcAddressQueryResult* symbolStatus) {
  DRIVER_CALL(cuGetProcAddress_v2, nullptr, {
    return lookupProcAddress(symbol, pfn, cudaVersion, flags, symbolStatus);
  }, symbol, pfn, cudaVersion, flags, symbolStatus);
}

CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) {
  DRIVER_CALL(cuGetProcAddress, nullptr, {
    return lookupProcAddress(symbol, pfn, cudaVersion, flags, nullptr);
  }, symbol, pfn, cudaVersion, flags);
}

}  // extern "C"
