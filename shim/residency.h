// The residency manager: owns every managed buffer and keeps the physical memory they hold
// within the budget.
//
// A managed buffer is a reserved device address range that lives as long as the buffer.
// Physical memory (one cuMemCreate handle of the rounded size) is mapped under it while it
// is resident; evicting copies the contents to host memory on a dedicated stream, after the
// last work that used it, then unmaps and releases the physical memory; restoring maps new
// physical memory at the same address and copies the contents back on the stream of the
// work that needs them, so that work is ordered after the copy.
//
// Costs, when nothing must move: a launch takes the lock once, looks each candidate pointer
// up in the address map (O(log n)), and tells the policy (O(buffers of the launch)); no CUDA
// call, no allocation once the per-launch scratch vectors have grown.
//
// Locking: one mutex. It is held across the driver calls that evict and restore, because
// those must be atomic with respect to other launches' view of the buffers. Those calls
// run under ReentryGuard, so the CUPTI callbacks they raise return at once and cannot take
// the lock again.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "policy/policy.h"
#include "shim/address_map.h"
#include "shim/real_api.h"
#include "trace/trace_writer.h"

namespace delta::shim {

struct ResidencyConfig {
  uint64_t budgetBytes = 0;
  uint64_t hostLimitBytes = 0;
  bool strict = false;
  bool prefetch = true;  // restore what the policy predicts, when it fits without evicting
};

struct Stats {
  uint64_t allocations = 0;
  uint64_t frees = 0;
  uint64_t evictions = 0;
  uint64_t restores = 0;
  uint64_t bytesToHost = 0;
  uint64_t bytesToDevice = 0;
  uint64_t cleanEvictions = 0;  // no copy needed: the host copy was still valid
  uint64_t stallNs = 0;         // host time spent waiting for evictions to finish
  uint64_t overBudgetLaunches = 0;
  uint64_t overBudgetAllocations = 0;  // allocations made when nothing more could be evicted
  uint64_t prefetches = 0;             // restores started ahead of the work that needs them
  uint64_t unanalysedLaunches = 0;
  uint64_t residentBytes = 0;
  uint64_t peakResidentBytes = 0;
  uint64_t pageableFallbacks = 0;
  uint64_t liveBuffers = 0;
};

// What the work being prepared is, for messages and the trace.
struct WorkInfo {
  enum class Kind : uint8_t { kKernel, kCopy, kMemset, kOpaque };
  Kind kind = Kind::kKernel;
  const char* name = nullptr;  // kernel name: a pointer that stays valid (CUPTI's, the driver's)
  uint32_t grid[3] = {0, 0, 0};
  uint32_t block[3] = {0, 0, 0};
  trace::CopyKind copyKind = trace::CopyKind::kDefault;
  uint64_t bytes = 0;          // copies and memsets
  uint64_t copyDst = 0;        // copies: the two addresses
  uint64_t copySrc = 0;
};

// What a launch, copy or memset is about to touch.
enum class UseKind : uint8_t {
  kKernel,    // may read and write every buffer it touches
  kRead,      // only reads (source of a copy)
  kWrite,     // writes (destination of a copy or memset)
};

class Residency {
 public:
  Residency(const DriverApi& api, const ResidencyConfig& config,
            std::unique_ptr<policy::Policy> policy, uint64_t granularity);

  // cuMemAlloc for a managed buffer. CUDA_ERROR_OUT_OF_MEMORY when even eviction cannot
  // make room (strict), or the device is really full.
  CUresult allocate(size_t bytes, CUdeviceptr* out);
  // True and frees when `address` is a managed buffer's start; false: not ours.
  bool free(CUdeviceptr address);
  bool owns(CUdeviceptr address);

  // Before work is enqueued on `stream`: makes every managed buffer in the candidate
  // address lists resident, ordered before the work on that stream, and records the use.
  // `perThreadApi`: the call is a _ptsz/_ptds variant, for which stream 0 is the calling
  // thread's default stream (as CU_STREAM_PER_THREAD always is).
  struct Touch {
    const uint64_t* pointers = nullptr;  // candidate values (interior pointers allowed)
    size_t pointerCount = 0;
    uint64_t rangeStart = 0;  // or one address range (copies and memsets)
    uint64_t rangeBytes = 0;
    UseKind kind = UseKind::kKernel;
  };
  //
  // The work is enqueued only after this returns (prepare runs at API_ENTER), so the buffers
  // stay held — never evicted — until the caller calls releaseHeld() once the work is in its
  // stream (API_EXIT). Every prepare() must be paired with one releaseHeld() on the same
  // thread; pairs nest.
  CUresult prepare(CUstream stream, bool perThreadApi, const Touch* touches, size_t count,
                   const WorkInfo& work);
  void releaseHeld();
  // A launch that could not be analysed: every evicted buffer is brought back (over budget
  // if it must be) so that whatever it touches is there.
  void prepareEverything(CUstream stream, bool perThreadStream);
  // A small host-to-device copy into a managed buffer: pointer values found in `source`
  // that fall in managed buffers are linked to the destination, so that a launch touching
  // the destination (a table of pointers) also brings them back.
  void linkPointerTable(CUdeviceptr destination, const void* source, size_t bytes);

  // Never evicted while pinned (IPC exports, collectives, the public API).
  bool pin(CUdeviceptr address, bool pinned);

  // Shares the managed buffer holding `address` with other processes: brings it back if it
  // was evicted, pins it for good (an importer maps its physical memory directly), backs it
  // with exportable physical memory at the same address, and returns a POSIX file
  // descriptor for that memory (owned by the shim, valid until the buffer is freed).
  // CUDA_ERROR_NOT_FOUND: not a managed buffer.
  CUresult exportBuffer(CUdeviceptr address, CUdeviceptr* base, uint64_t* bytes, int* fd);

  Stats stats();
  uint64_t budget() const { return config_.budgetBytes; }

  // Records into `trace` from now on (nullptr: stop). The writer must outlive the calls.
  void setTrace(trace::TraceWriter* trace);
  trace::CloseTotals traceTotals();

 private:
  enum class State : uint8_t { kResident, kEvicted };
  struct StreamUse {
    CUstream stream = nullptr;
    // Per-thread default streams: one handle names a different stream in every thread, so the
    // use is pinned down by an event recorded at use time, and belongs to its thread.
    CUevent event = nullptr;
    const void* thread = nullptr;  // per-thread uses: the using thread; else nullptr
  };
  static constexpr int kMaxStreamUses = 4;
  struct Buffer {
    bool live = false;
    uint64_t serial = 0;       // the buffer's id in the trace: unique for the process's life
    CUdeviceptr address = 0;
    uint64_t bytes = 0;        // as asked
    uint64_t mappedBytes = 0;  // rounded to the granularity
    CUmemGenericAllocationHandle handle = 0;
    State state = State::kResident;
    void* host = nullptr;      // host copy (pinned from the host pool, or pageable)
    bool hostPinned = false;
    bool hostValid = false;    // host copy equals the device contents
    bool pinned = false;
    uint32_t held = 0;         // prepared launches not yet enqueued that touch it
    int exportFd = -1;         // shared with other processes through this file descriptor
    StreamUse uses[kMaxStreamUses];
    int useCount = 0;
    bool manyStreams = false;  // used on more streams than tracked: evicting syncs the device
    CUevent restoreEvent = nullptr;  // restore copy still possibly in flight
    CUstream restoreStream = nullptr;
    const void* restoreThread = nullptr;  // restored on this thread's per-thread stream
    std::vector<uint32_t> linked;  // buffers reached through a pointer table stored in this one
  };
  struct Quarantined {  // freed, but work that used it may still run
    CUdeviceptr address;
    uint64_t mappedBytes;
    CUmemGenericAllocationHandle handle;  // 0 when it was evicted
    void* host;  // its host copy, of mappedBytes
    bool hostPinned;
    std::vector<CUevent> events;
  };

  uint64_t deviceBytes() const { return resident_ + pooled_ + quarantinedBytes_; }
  // `cause`: the trace's name id of the work that needs the room (0: an allocation).
  CUresult makeRoom(uint64_t bytes, const std::vector<uint32_t>& keep, int64_t now,
                    uint32_t cause);
  bool evict(const policy::Victim* victims, size_t count, uint32_t cause);
  CUresult restore(uint32_t id, CUstream stream, uint32_t cause, bool prefetched = false,
                   bool perThreadStream = false);
  void prefetch(int64_t now);
  void traceWork(CUstream stream, const WorkInfo& work, uint32_t kernel, bool analysed, int64_t now);
  CUresult acquirePhysical(uint64_t bytes, CUmemGenericAllocationHandle* handle);
  void releasePhysical(uint64_t bytes, CUmemGenericAllocationHandle handle);
  void trimPool(uint64_t bytes);
  CUresult mapAt(CUdeviceptr address, uint64_t bytes, CUmemGenericAllocationHandle handle);
  bool reclaimQuarantine(bool wait);
  void recordUse(Buffer& buffer, CUstream stream, bool perThreadStream);
  void markPerThreadUse(Buffer& buffer);
  void orderAfterRestore(Buffer& buffer, CUstream stream, bool perThreadStream);
  void* takeHost(uint64_t bytes, bool* pinned);
  void giveHost(void* host, uint64_t bytes, bool pinned);
  CUevent takeEvent();
  void giveEvent(CUevent event);
  void collect(const Touch& touch, std::vector<uint32_t>& ids);
  void addWithLinks(uint32_t id, std::vector<uint32_t>& ids, int depth);

  const DriverApi& api_;
  const ResidencyConfig config_;
  const uint64_t granularity_;
  std::unique_ptr<policy::Policy> policy_;

  std::mutex mutex_;
  AddressMap addresses_;
  std::vector<Buffer> buffers_;    // by policy id
  std::vector<uint32_t> freeIds_;
  uint64_t resident_ = 0;
  uint64_t pooled_ = 0;
  uint64_t quarantinedBytes_ = 0;
  uint64_t pinnedHostBytes_ = 0;
  std::multimap<uint64_t, CUmemGenericAllocationHandle> pool_;  // physical handles to reuse
  std::multimap<uint64_t, CUdeviceptr> addressCache_;            // reservations to reuse
  std::multimap<uint64_t, void*> hostCache_;                     // pinned host blocks to reuse
  std::vector<Quarantined> quarantine_;
  std::vector<CUevent> eventPool_;
  CUstream evictStream_ = nullptr;
  CUstream prefetchStream_ = nullptr;
  Stats stats_;
  uint64_t nextSerial_ = 1;
  std::atomic<trace::TraceWriter*> trace_{nullptr};
  std::vector<uint64_t> traceBuffers_;  // scratch: serials of a launch's buffers

  // Scratch for the launch path, reused so that it does not allocate once grown.
  std::vector<uint32_t> workingSet_;
  std::vector<uint32_t> writtenScratch_;
  std::vector<policy::BufferId> keepIds_;
  std::vector<uint32_t> heldIds_;  // buffers of prepared launches not yet enqueued (repeats kept)
};

int64_t nowNs();

}  // namespace delta::shim
