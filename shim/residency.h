// The residency manager: owns every managed buffer and keeps the physical memory they hold
// within the budget.
//
// A managed buffer is a reserved device address range that lives as long as the buffer.
// Physical memory (one cuMemCreate handle of the rounded size) is mapped under it while it
// is resident; evicting copies the contents to host memory on a dedicated stream, after the
// last work that used it, and unmaps and releases the physical memory once that batch is done
// (the host does not wait for it unless nothing else can make room); restoring maps new
// physical memory at the same address and copies the contents back on the stream of the
// work that needs them, so that work is ordered after the copy. The host runs ahead of the
// device: with the launch marks read (below), victims whose last launches the device has
// passed go first, and room made ahead of need is taken from those only (a copy out queued
// behind work the device has not reached holds every later one on the eviction stream).
//
// Costs, when nothing must move: a launch takes the lock once (prepare; releaseHeld takes none:
// holds are atomic counters apart from the buffers' records), looks each candidate pointer up
// in the address map (O(log n)), and tells the policy (O(buffers of the launch)); no CUDA call,
// no allocation once the per-launch scratch vectors have grown. The one exception is a launch
// on the calling thread's default stream (cudaStreamPerThread, _ptsz/_ptds calls): one
// cuEventRecord per launch (the thread's fence, below), because no other thread can name that
// stream. Once memory has been short, a launch on any other stream also records one event
// after it (its launch mark, LaunchMarks below), so that an eviction waits for the victim's
// last launch rather than for the stream's tail; with a policy that wants the device's times
// (delta), also one before it (after its waits), and the marks that passed are read (one
// cuEventQuery per marked stream while none has; two elapsed-time calls per mark read).
// Measured with callgrind (bench/shim_bench, hook/fake/hit8_fixed/1000, instructions per
// launch): releaseHeld 81, the parameter-layout lookup about 30 (thread-local cache), no
// lock but this one (docs/shim.md, Costs).
//
// Pointer tables (pointer_tables.h): what the program writes into device memory that points at
// tracked buffers is remembered per allocation, and a launch that touches such a table gets the
// buffers it leads to as well. Unmanaged allocations made through the shim are remembered too
// (their extent only), so that tables in them are found.
//
// A full device: the budget is a ceiling, not a promise that the device has that much free.
// When the device refuses physical memory, more is evicted and the call retried, and the level
// at which the device said no becomes the effective ceiling (warned about once).
//
// Locking: one mutex. It is held across the driver calls that evict and restore, because
// those must be atomic with respect to other launches' view of the buffers. Those calls
// run under ReentryGuard, so the CUPTI callbacks they raise return at once and cannot take
// the lock again. A launch's buffers are held (never evicted) from prepare() to releaseHeld();
// releaseHeld counts the holds down without the lock, and an eviction that meets a held
// victim passes it over and asks the policy again without it. The planner runs on its own
// thread (planner_thread.h) and takes no lock of ours; the launch path checks one flag.
//
// Recompute: a buffer registered through the public API may be dropped (unmapped, no copy)
// instead of swapped. A callback buffer is regenerated when work touches it: prepare() holds
// the work's buffers, releases the lock, and calls the program's callback, whose own launches
// come back through prepare() (nested, bounded by kMaxRecomputeDepth); the buffer gets fresh
// memory when the callback's work that writes it is prepared, its inputs there by then, and
// the touching work is prepared again (regenerateThenPrepare). One
// thread at a time runs callbacks (recomputeOwner_), so producers that need each other cannot
// deadlock across threads; others wait on regenerated_ only when they need such a buffer.
#pragma once

#include <cuda.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "policy/policy.h"
#include "shim/clock.h"
#include "shim/address_map.h"
#include "shim/call_stacks.h"
#include "shim/planner_thread.h"
#include "shim/pools.h"
#include "shim/pointer_tables.h"
#include "shim/real_api.h"
#include "trace/trace_writer.h"

namespace delta::shim {

struct ResidencyConfig {
  uint64_t budgetBytes = 0;
  uint64_t hostLimitBytes = 0;
  bool strict = false;
  bool prefetch = true;  // restore what the policy predicts, when it fits without evicting
  uint64_t deviceBytes = 0;  // the device's memory, for messages
  bool traceStacks = false;  // DELTA_TRACE_STACKS: managed allocations' call stacks in the trace
};

struct Stats {
  uint64_t allocations = 0;
  uint64_t frees = 0;
  uint64_t evictions = 0;
  uint64_t restores = 0;
  uint64_t bytesToHost = 0;
  uint64_t bytesToDevice = 0;
  uint64_t cleanEvictions = 0;  // no copy needed: the host copy was still valid
  uint64_t cancelledEvictions = 0;  // taken back by a use while their copy was in flight
  uint64_t evictionsAhead = 0;      // started after a launch, for what the next ones need
  // Host time spent waiting for memory: evictions to finish, freed memory the device still used.
  uint64_t stallNs = 0;
  uint64_t overBudgetLaunches = 0;
  uint64_t overBudgetAllocations = 0;  // allocations made when nothing more could be evicted
  uint64_t prefetches = 0;             // restores started ahead of the work that needs them
  uint64_t unanalysedLaunches = 0;
  uint64_t residentBytes = 0;
  uint64_t peakResidentBytes = 0;
  uint64_t pageableFallbacks = 0;
  // Host memory pinned for evicted buffers (pools.h: HostPool), in how many chunks, and how
  // many of those were pinned ahead on the pinning thread rather than by an eviction.
  uint64_t pinnedHostBytes = 0;
  uint64_t pinnedChunks = 0;
  uint64_t pinnedChunksAhead = 0;
  uint64_t liveBuffers = 0;
  uint64_t drops = 0;               // released without a copy, to be recomputed
  uint64_t recomputes = 0;          // dropped buffers regenerated
  uint64_t recomputeFailures = 0;   // callbacks that returned an error
  uint64_t recomputeNs = 0;         // device time of callback recomputes, as measured
  // Device time the streams of the work stood still for restores (their own copy, or a
  // prefetch still in flight), measured with timing events: what swapping cost the job itself,
  // where stallNs is the host's wait.
  uint64_t restoreWaitNs = 0;
  // Allocations given the memory of a freed buffer the device was still using (ordered after
  // that use on the device) instead of waiting for it or evicting.
  uint64_t adoptedFrees = 0;
  // Allocations given a freed buffer's address and memory as they were, still mapped (its work
  // done): no driver call to map, unmap or set access, as a caching allocator reuses a block.
  uint64_t reusedFrees = 0;
  // Driver calls for managed memory: physical memory made and given back (cuMemCreate,
  // cuMemRelease: the pool keeps what it can for the next buffer of its size), and mappings
  // made (cuMemMap with its cuMemSetAccess; each is undone by a cuMemUnmap later).
  uint64_t physicalCreates = 0;
  uint64_t physicalReleases = 0;
  uint64_t mappings = 0;
  uint64_t deviceFull = 0;          // times the device refused memory the budget allowed
  uint64_t ceilingBytes = 0;        // the effective ceiling: the budget, or less (device full)
  // The most memory kept resident over the budget because launches that could not be analysed
  // needed all of it again and again (Residency::noteUnanalysedDemand); 0: never.
  uint64_t unanalysedHoldBytes = 0;
  uint64_t pointerTables = 0;       // allocations holding pointers to tracked buffers now
  // Plans made on the planner thread and handed to the policy (planner_thread.h), their total
  // wall-clock time there, and the last one: its name (Plan::name; "" before any, "none" when
  // the iteration fitted) and its predicted iteration time.
  uint64_t plans = 0;
  uint64_t planningNs = 0;
  int64_t planPredictedNs = -1;
  char planName[48] = "";
  // How many times the policy switched the plan's candidate after measuring it
  // (Policy::planSwitches; runningPlan() names the one running).
  uint64_t planSwitches = 0;
  // Physical memory the program made itself with cuMemCreate (framework_memory.cpp): what of it
  // is on the device now, its peak, how many handles it made; and the peak of that plus managed
  // resident memory, the device memory the budget covers. Of those handles' mappings, how many
  // the shim managed (paged like its own buffers) and how many it left where the program put
  // them (pinned: exported, mapped twice or in part, shared with other devices).
  uint64_t foreignBytes = 0;
  uint64_t foreignPeakBytes = 0;
  uint64_t foreignHandles = 0;
  uint64_t peakDeviceBytes = 0;
  uint64_t programMappings = 0;
  uint64_t programPinned = 0;
  uint64_t programExtents = 0;  // extents the framework declares now (delta_declare_extent)
};

// How a managed buffer's contents can be regenerated (the public API's registrations).
struct RecomputeHook {
  enum class Kind : uint8_t { kNone, kCallback, kFramework };
  using Callback = int (*)(void* context, void* pointer, size_t bytes, void* stream);
  Kind kind = Kind::kNone;
  Callback callback = nullptr;
  void* context = nullptr;
  int64_t estimateNs = 0;  // the program's estimate of the device time it takes
};
using DropNotifier = void (*)(void* context, void* pointer, size_t bytes);

// What the work being prepared is, for messages and the trace.
struct WorkInfo {
  enum class Kind : uint8_t { kKernel, kCopy, kMemset, kOpaque };
  Kind kind = Kind::kKernel;
  const char* name = nullptr;  // kernel name: a pointer that stays valid (CUPTI's, the driver's)
  uint32_t grid[3] = {0, 0, 0};
  uint32_t block[3] = {0, 0, 0};
  trace::CopyKind copyKind = trace::CopyKind::kDefault;
  uint64_t bytes = 0;          // copies and memsets
  uint64_t copyDst = 0;        // copies and memsets: the destination
  uint64_t copySrc = 0;        // copies: the source (a host pointer for host-to-device copies)
  // False for a use of the shim's own (a dropped buffer regenerated before its hook goes):
  // prepared like any, but no launch of the program's iteration, so not told to the policy.
  bool program = true;
  // The caller can fail the call (a launch interposer): in strict mode a working set the budget
  // cannot hold fails it. Otherwise (CUPTI only watches the call) the work runs whatever the
  // shim returns, so its buffers are brought back all the same, over the budget.
  bool failable = false;
};

// What a launch, copy or memset is about to touch.
enum class UseKind : uint8_t {
  kKernel,    // may read and write every buffer it touches
  kRead,      // only reads (source of a copy)
  kWrite,     // writes (destination of a copy or memset)
};

class Residency {
 public:
  // Launch marks kept per stream (launchMarks_): the host may run this many launches ahead of
  // the device before the oldest unread marks are lost. 256 lost a third of the LSTM's marks
  // as played on cudasim (the host thousands of launches ahead); the policy shares the
  // device's time around those lost (policy::AccessPattern).
  static constexpr size_t kMarkSlots = 1024;

  Residency(const DriverApi& api, const ResidencyConfig& config,
            std::unique_ptr<policy::Policy> policy, uint64_t granularity);

  // cuMemAlloc for a managed buffer. CUDA_ERROR_OUT_OF_MEMORY when even eviction cannot
  // make room (strict), or the device is really full.
  CUresult allocate(size_t bytes, CUdeviceptr* out);
  // True and frees when `address` is a managed buffer's start; false: not ours (an unmanaged
  // allocation starting there is forgotten, with any pointer table in it).
  // `alsoAfter`: one more event the memory waits for (from the event pool; it goes back there).
  bool free(CUdeviceptr address, CUevent alsoAfter = nullptr);
  // cuMemFreeAsync on `stream`: as free(), and the memory also waits for the stream's work
  // before this call, as the driver promises. CUDA_ERROR_NOT_FOUND: not a managed buffer's
  // start (forgotten as free() forgets it); the driver's error for a stream it refuses (nothing
  // is freed then).
  CUresult freeOrdered(CUdeviceptr address, CUstream stream, bool perThreadApi);
  // An unmanaged allocation made through the shim (below DELTA_MIN_BYTES, or left to the driver):
  // remembered as a range, so that pointer tables copied into it are found.
  void noteUnmanagedAllocation(CUdeviceptr address, size_t bytes);
  // The device refused an unmanaged allocation of `bytes`: evicts managed buffers (what the
  // policy allows) so that the caller can try again, and lowers the effective ceiling to what
  // managed buffers hold then. False when nothing could be given back.
  bool relieveDevice(uint64_t bytes);
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
  CUresult prepareEverything(CUstream stream, bool perThreadStream, bool failable = false);
  // Whether work this thread prepared since the last call ran over the budget in strict mode
  // because it could not be failed there (WorkInfo::failable); clears it. A launch interposer
  // reached by the same call fails it then: its buffers are there, but the call does not run.
  static bool takeStrictOverrun();

  // Physical memory the program makes itself with cuMemCreate and maps where it chooses (a
  // framework's own virtual memory: PyTorch's expandable segments). framework_memory.cpp and
  // docs/shim.md ("The program's own physical memory") say how it is paged. Before it is
  // created, managed buffers make room for it.
  void beforeForeignCreate(uint64_t bytes);
  // A handle the shim stands in for: the program gets `*handle`, a value of the shim's, and
  // every call that takes a handle translates it (the physical memory behind it changes when
  // its mapping is evicted and restored).
  void adoptProgramHandle(CUmemGenericAllocationHandle real, uint64_t bytes,
                          const CUmemAllocationProp& prop, CUmemGenericAllocationHandle* handle);
  // Memory the program made that the shim counts but does not stand in for (NCCL's).
  void noteForeignCreate(CUmemGenericAllocationHandle handle, uint64_t bytes);
  // The program's cuMemRelease, cuMemMap, cuMemUnmap, cuMemSetAccess,
  // cuMemExportToShareableHandle, cuMemGetAllocationPropertiesFromHandle and
  // cuMemRetainAllocationHandle, for handles and addresses of the shim's; nullopt: none of
  // ours, the driver's call applies as it is.
  std::optional<CUresult> releaseProgramHandle(CUmemGenericAllocationHandle handle);
  std::optional<CUresult> mapProgramHandle(CUdeviceptr address, uint64_t bytes, uint64_t offset,
                                           CUmemGenericAllocationHandle handle,
                                           unsigned long long flags);
  std::optional<CUresult> unmapProgramRange(CUdeviceptr address, uint64_t bytes);
  std::optional<CUresult> setProgramAccess(CUdeviceptr address, uint64_t bytes,
                                           const CUmemAccessDesc* desc, size_t count);
  std::optional<CUresult> exportProgramHandle(void* shareable, CUmemGenericAllocationHandle handle,
                                              CUmemAllocationHandleType type,
                                              unsigned long long flags);
  std::optional<CUresult> programHandleProperties(CUmemAllocationProp* prop,
                                                  CUmemGenericAllocationHandle handle);
  std::optional<CUresult> retainProgramHandle(CUmemGenericAllocationHandle* handle,
                                              CUdeviceptr address);
  // delta_declare_extent: a block of the program's own memory at [start, start + bytes) that a
  // kernel pointer into it reaches no further than (0 bytes: forget what was declared there).
  // -1: not in the program's memory.
  int declareExtent(CUdeviceptr start, uint64_t bytes);

  // Never evicted while pinned (IPC exports, collectives, the public API).
  bool pin(CUdeviceptr address, bool pinned);
  // NCCL user-buffer registration (ncclCommRegister): every managed buffer overlapping
  // [start, start + bytes) is made resident and is never evicted (nor dropped) until the
  // registration is released, because NCCL and its peers keep using the physical memory they
  // found there. Registrations nest (counted per buffer, apart from pin()). Returns the serials
  // of the buffers held, which releaseRegistration() takes back; a buffer freed meanwhile is
  // not another one that took its address.
  std::vector<uint64_t> holdRegistration(CUdeviceptr start, uint64_t bytes);
  void releaseRegistration(CUdeviceptr start, uint64_t bytes, const std::vector<uint64_t>& serials);

  // Shares the managed buffer holding `address` with other processes: brings it back if it
  // was evicted, pins it for good (an importer maps its physical memory directly), backs it
  // with exportable physical memory at the same address, and returns a POSIX file
  // descriptor for that memory (owned by the shim, valid until the buffer is freed).
  // CUDA_ERROR_NOT_FOUND: not a managed buffer.
  CUresult exportBuffer(CUdeviceptr address, CUdeviceptr* base, uint64_t* bytes, int* fd);

  // ---- Recompute (the public API). -1: `address` is not in a managed buffer. ----
  int setRecompute(CUdeviceptr address, const RecomputeHook& hook);
  // 0, or 1 when a framework-managed buffer stays dropped; a dropped callback buffer is
  // regenerated first, on the legacy default stream.
  int clearRecompute(CUdeviceptr address);
  int isDropped(CUdeviceptr address);
  // Whether the managed buffer at `address` is leaving (its eviction batch in flight).
  bool isLeaving(CUdeviceptr address);
  // Framework-managed regeneration: memory back (1) or nothing to do (0); then the end.
  int beginRecompute(CUdeviceptr address);
  int endRecompute(CUdeviceptr address);
  // For the whole process (frameworks set it before the shim is active).
  static void setDropNotifier(DropNotifier notifier, void* context);
  void markIteration();
  // Some buffer was registered as recomputable: launches must be prepared where they can fail.
  bool anyRecomputable() const { return anyRecomputable_.load(std::memory_order_relaxed); }

  Stats stats();
  // The plan's candidate running now (Policy::runningPlan): for the summary, not in stats(),
  // which cudaMemGetInfo reads and which builds no string.
  std::string runningPlan();
  uint64_t budget() const { return config_.budgetBytes; }
  // How many of the program's calls a hold over the budget for work that cannot be analysed
  // lasts after the last such work (unanalysedHoldBytes_).
  static constexpr uint64_t kUnanalysedHoldLaunches = 16;
  // What managed buffers may hold now: the budget, or less where the device has shown that it
  // holds less (cudaMemGetInfo reports it as free room).
  uint64_t limit();

  // Records into `trace` from now on (nullptr: stop). The writer must outlive the calls.
  void setTrace(trace::TraceWriter* trace);
  trace::CloseTotals traceTotals();

 private:
  enum class State : uint8_t {
    kResident,
    kEvicted,  // contents on the host
    kDropped,  // contents gone until regenerated (a recompute hook exists)
  };
  struct StreamUse {
    CUstream stream = nullptr;
    // The launch mark recorded after the last use (LaunchMarks); 0: none, and an eviction
    // records an event at the stream's tail instead.
    uint64_t mark = 0;
    // Per-thread default streams: one handle names a different stream in every thread, so the
    // use belongs to its thread, and that thread's fence stands for it.
    const void* thread = nullptr;  // per-thread uses: the using thread; else nullptr
  };
  static constexpr int kMaxStreamUses = 4;
  // A handle of the program's own physical memory, as the shim stands in for it. The program
  // holds this record's address as its handle value (never a value the driver gives: the driver's
  // are its own live objects or small numbers, and the record lives as long as the handle).
  struct ProgramHandle {
    CUmemGenericAllocationHandle real = 0;  // the physical memory now; 0: on the host, or none
    uint64_t bytes = 0;
    CUmemAllocationProp prop{};
    uint32_t references = 1;  // cuMemCreate's, and each cuMemRetainAllocationHandle's
    uint32_t mappedAs = UINT32_MAX;  // the managed buffer of its one mapping
    uint32_t otherMappings = 0;  // mappings left to the program (pinned)
    bool pinned = false;  // exported, or mapped other than once whole: never moves again
    void* host = nullptr;  // its contents, while unmapped with its memory evicted
    bool hostPinned = false;
  };
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
    bool pinned = false;         // delta_pin, or shared with other processes (IPC)
    uint32_t registrations = 0;  // NCCL registrations covering it: pinned while any
    bool immovable() const { return pinned || registrations > 0; }
    int exportFd = -1;         // shared with other processes through this file descriptor
    StreamUse uses[kMaxStreamUses];
    int useCount = 0;
    bool manyStreams = false;  // used on more streams than tracked: evicting syncs the device
    CUevent restoreEvent = nullptr;  // restore copy still possibly in flight
    CUstream restoreStream = nullptr;
    const void* restoreThread = nullptr;  // restored on this thread's per-thread stream
    bool table = false;  // holds pointers to tracked buffers (tables_ has its entries)
    RecomputeHook hook;
    // Mapped again, contents being regenerated: by a callback on regeneratingThread, or
    // (regeneratingThread nullptr) by the framework until delta_recomputed. Never evicted.
    bool regenerating = false;
    const void* regeneratingThread = nullptr;
    // Mapped again for a callback that has not run yet: a use before that runs it first.
    bool pendingRegeneration = false;
    // Leaving: a batch on the eviction stream copies it out (or waits for its last use, for a
    // drop); its memory goes once that batch is done. Still mapped and intact until then, so a
    // use takes it back at no cost (the copy is then not trusted).
    bool evicting = false;
    bool evictingCopy = false;  // a copy into `host` is in that batch
    uint64_t evictBatch = 0;    // which batch: an earlier one, called off, is not this one
    int64_t regenerateStartNs = 0;
    // The framework checked it (delta_begin_recompute) and will use it: swapped if need be, but
    // not dropped again before that use, or the framework's check would be worthless.
    bool keepContents = false;
    // A mapping of the program's own memory: the address range and the mapping are the
    // program's (cuMemUnmap ends the buffer), the physical memory the handle's.
    ProgramHandle* program = nullptr;
    bool accessible = true;  // a program mapping before its cuMemSetAccess: not evictable
  };
  // A callback to run once the lock is released: the buffer is mapped and held already.
  struct RecomputeCall {
    uint32_t id;
    uint64_t serial;
    RecomputeHook hook;
    CUdeviceptr address;
    uint64_t bytes;
  };
  // Evictions in flight, oldest first (one stream: they complete in order).
  struct EvictionBatch {
    CUevent start = nullptr;  // timing events around the copies (nullptr: none)
    CUevent done = nullptr;   // the batch is over: copies done, last uses passed
    uint64_t sequence = 0;
    int64_t enqueuedNs = 0;
    uint64_t copiedBytes = 0;
    uint32_t cause = 0;
    struct Member {
      uint32_t id;
      uint64_t serial;
      bool drop;
    };
    std::vector<Member> members;
  };
  // Device time between two events, read once they have completed: a callback's recompute
  // (its cost, onRecomputeMeasured), or the time a stream stood still for a buffer's restore
  // (its own copy on demand, or a prefetch still in flight when the work came; restoreWaitNs).
  struct DeviceTiming {
    // kRestoreWait: a stream stood still for a restore on another; kRestoreCopy: for the
    // restore's copy on its own (a wait, and what the link gives); kPrefetchCopy: a prefetch's
    // copy on the shim's stream (what the link gives: onCopyMeasured).
    // kProbeIn, kProbeOut: the link probe's copies each way (probeLink).
    enum class Kind : uint8_t { kRecompute, kRestoreWait, kRestoreCopy, kPrefetchCopy, kProbeIn, kProbeOut };
    Kind kind;
    uint32_t id;         // kRecompute: the buffer regenerated, and its serial
    uint64_t serial;
    int64_t estimateNs;  // kRecompute: the hook's estimate
    CUevent start;
    CUevent end;
    // How deep in recompute callbacks it ran (a callback's own timing: 1 when called for the
    // program's work). A callback's time covers the timings inside it, which end, and are
    // read, before it.
    int depth;
    uint64_t bytes = 0;  // copies: the bytes copied
  };
  // Freed, but work that used it may still run; or done with (no events left) and kept mapped
  // for the next allocation of its size (reuseQuarantined) until room is needed.
  struct Quarantined {
    CUdeviceptr address;  // 0 once another buffer took it over (adoptQuarantined)
    uint64_t mappedBytes;
    CUmemGenericAllocationHandle handle;  // 0 when it was evicted, or taken over
    void* host;  // its host copy, of mappedBytes
    bool hostPinned;
    std::vector<CUevent> events;
    // With one event, recorded on this program stream (else nullptr): a new allocation that
    // takes the buffer over (adoptQuarantined) is ordered after it there.
    CUstream stream = nullptr;
  };

  // A new buffer `id`, resident in `handle`'s memory mapped at `address`, counted and findable.
  Buffer& startBuffer(uint32_t id, CUdeviceptr address, uint64_t bytes, uint64_t mapped,
                      CUmemGenericAllocationHandle handle);
  // The program's own memory (framework_memory.cpp).
  ProgramHandle* programHandle(CUmemGenericAllocationHandle handle);
  // A handle whose contents are on the host gets physical memory and its contents back.
  CUresult backOnDevice(ProgramHandle& handle);
  void pinProgramBuffer(uint32_t id);
  CUresult makeResidentNow(uint32_t id);
  // The program unmapped it: the buffer ends, the handle keeps its memory or contents.
  void endProgramBuffer(uint32_t id, int64_t now);
  void forgetProgramHandle(ProgramHandle* handle);
  // The buffers a kernel's pointer into the program's memory may reach: the declared extent
  // it lies in, or else every mapping from its own to the end of the adjoining run; with the
  // buffers their tables lead to (`depth`: as addWithLinks).
  [[gnu::noinline]] void addProgramReach(uint64_t pointer, uint32_t id, std::vector<uint32_t>& ids,
                                         int depth);

  uint64_t deviceBytes() const {
    return resident_ + physical_.bytes() + quarantinedBytes_ + foreignBytes_;
  }
  // After resident_ or foreignBytes_ grew.
  void notePeaks() {
    stats_.peakResidentBytes = std::max(stats_.peakResidentBytes, resident_);
    stats_.peakDeviceBytes = std::max(stats_.peakDeviceBytes, resident_ + foreignBytes_);
    stats_.foreignPeakBytes = std::max(stats_.foreignPeakBytes, foreignBytes_ + programResident_);
  }
  uint64_t limitLocked() const { return std::min(config_.budgetBytes, ceiling_); }
  // What evictions make room under: the limit, or, while launches that cannot be analysed keep
  // coming and needed more than it, what they needed (never above the device's ceiling).
  uint64_t roomLimitLocked() const {
    const uint64_t limit = limitLocked();
    if (unanalysedHoldBytes_ <= limit || policyLaunches_ >= unanalysedHoldUntil_) return limit;
    return std::min(unanalysedHoldBytes_, ceiling_);
  }
  // After work that could not be analysed was given every buffer (`countedOverBudget`: counted
  // as over the budget already): see unanalysedHoldBytes_.
  void noteUnanalysedDemand(bool countedOverBudget, int64_t now, uint32_t kernel);
  // Calls visit(id, buffer) for every managed buffer overlapping [start, start + bytes), in
  // address order (the lock held).
  template <class Visit>
  void forEachBufferIn(CUdeviceptr start, uint64_t bytes, Visit visit);
  // `cause`: the trace's name id of the work that needs the room (0: an allocation).
  // `onePiece`: the room is for one buffer's memory, taken from the pool (PhysicalPool::acquire)
  // right after: a pooled handle of that size is room already.
  CUresult makeRoom(uint64_t bytes, const std::vector<uint32_t>& keep, int64_t now,
                    uint32_t cause, bool onePiece = false);
  // What `bytes` more take of the device: nothing for one piece (`onePiece`) of a size the pool
  // holds, which PhysicalPool::acquire takes as it is.
  uint64_t added(uint64_t bytes, bool onePiece) const {
    return onePiece && physical_.holds(bytes) ? 0 : bytes;
  }
  // Pooled memory back to the device until `bytes` more fit under `limit` (`onePiece`: as
  // added(); that size goes last): a handle kept is one the next buffer of its size takes
  // without a driver call (cuMemCreate, cuMemRelease: a caching allocator avoids them too).
  void trimPoolFor(uint64_t bytes, uint64_t limit, bool onePiece) {
    const uint64_t held = deviceBytes() + added(bytes, onePiece);
    if (held > limit && physical_.bytes() > 0) physical_.trim(held - limit, onePiece ? bytes : 0);
  }
  // Evicts what the policy chooses, never `keep` nor held buffers, until `bytes` more fit under
  // `limit` or nothing more can go. True when everything fits. Pooled memory goes back to the
  // device first, only as far as needed (`onePiece`: as makeRoom).
  bool evictUntil(uint64_t bytes, uint64_t limit, std::span<const uint32_t> keep, int64_t now,
                  uint32_t cause, bool onePiece = false);
  // Physical memory for a buffer of `bytes`; when the device is full, evicts (never `keep`) and
  // tries again, lowering the ceiling to the level at which the device gave it.
  // `program`: memory for a mapping of the program's, made as the program asked for it (it may
  // be exported later), not from the pool.
  CUresult acquireOrEvict(uint64_t bytes, CUmemGenericAllocationHandle* handle,
                          std::span<const uint32_t> keep, uint32_t cause,
                          const ProgramHandle* program = nullptr);
  // Physical memory of `bytes` from the pool, or made as `program` asks.
  CUresult acquirePhysical(uint64_t bytes, CUmemGenericAllocationHandle* handle,
                           const ProgramHandle* program);
  void releasePhysical(uint64_t bytes, CUmemGenericAllocationHandle handle,
                       const ProgramHandle* program);
  // The device said no with `refusedAt` bytes of managed memory; it holds `ceiling`.
  void lowerCeiling(uint64_t refusedAt, uint64_t ceiling);
  // Once, at the first allocation: a budget above what the device has free is lowered to it.
  void checkDeviceFree();
  // Now and then, when the ceiling binds: has the device got memory back since?
  void maybeRaiseCeiling(int64_t now);
  uint64_t headroom(uint64_t deviceFree) const;
  // Starts evicting `victims` (asynchronously: see Buffer::evicting). False: none could go.
  bool evict(const policy::Victim* victims, size_t count, uint32_t cause);
  // Ends the evictions whose batch is done (`wait`: the oldest one at least, waiting for it on
  // the host, which is counted as a stall). True when some memory went.
  bool reclaimEvictions(bool wait);
  void finishEviction(Buffer& buffer, uint32_t id, bool drop, const EvictionBatch& batch,
                      int64_t endNs);
  // A use of a buffer that is leaving: it stays (the eviction is called off; its batch still
  // runs).
  void cancelEviction(uint32_t id, int64_t now);
  // Whether `id` is leaving by a drop (its batch will leave it to be recomputed), not a swap.
  bool droppingNow(uint32_t id) const;
  // Work on `stream` that may write a leaving buffer waits there for the batch that copies it
  // out (not on the host).
  void waitForEvictionCopy(const Buffer& buffer, CUstream stream);
  // An eviction batch not done yet copies from this buffer (or waits on it): its memory and host
  // block may not go before that batch.
  bool evictionMayRead(const Buffer& buffer) const;
  // After a launch: frees room for what the policy predicts the next launches need.
  void makeRoomAhead(int64_t now);
  // When the copy engines finish what the shim has queued on them, as the replay tells the
  // policy (policy/simulator.cpp): a copy out chosen now waits behind those.
  void fillLinkState(policy::EvictRequest& request) const;
  // `keep`: what restoring may not evict when the device is full (a prefetch never evicts).
  CUresult restore(uint32_t id, CUstream stream, uint32_t cause, std::span<const uint32_t> keep,
                   bool prefetched = false, bool perThreadStream = false);
  void prefetch(int64_t now);
  // Hands a plan made on the planner thread to the policy (it adopts it at the next boundary).
  [[gnu::noinline]] void deliverPlan(int64_t now);
  // The policy asks for a plan: hands its request to the planner thread.
  [[gnu::noinline]] void submitPlan();
  void traceWork(CUstream stream, const WorkInfo& work, uint32_t kernel, bool analysed, int64_t now);
  CUresult mapAt(CUdeviceptr address, uint64_t bytes, CUmemGenericAllocationHandle handle);
  // Gives back the memory of freed buffers whose work has finished; with `wait`, waits for the
  // oldest until `enough` device bytes have come back.
  // What the device is done with is unmapped, its memory to the pool, until `enough` has come
  // back; the rest stays mapped for reuseQuarantined (with `keepMapped`: all of it).
  bool reclaimQuarantine(bool wait, uint64_t enough = UINT64_MAX, bool keepMapped = false);
  // A freed buffer of `mapped` bytes whose uses the device has passed: its address, still
  // mapped to its memory, and that memory, for a new allocation as they are. False: none.
  bool reuseQuarantined(uint64_t mapped, CUdeviceptr* address, CUmemGenericAllocationHandle* handle);
  // When memory is short: a freed buffer of `mapped` bytes that the device may still be
  // using, its address and memory for a new allocation as they are mapped, and an event after
  // those uses (the new buffer's first use elsewhere, its eviction and its free wait for it on
  // the device). False when none can be taken.
  bool adoptQuarantined(uint64_t mapped, CUdeviceptr* address, CUmemGenericAllocationHandle* handle,
                        CUevent* after, CUstream* afterStream);
  // The buffer's record of its use on this stream; nullptr when it has too many to track.
  StreamUse* recordUse(Buffer& buffer, CUstream stream, bool perThreadStream);
  // The next launch mark on `stream`: its event, to be recorded once that launch is in the
  // stream, its sequence number, and where to say it was (the launch's HeldLaunch). `launch`
  // is the policy's index of the launch (kNoLaunch: not reported to the policy). nullptr when
  // the stream cannot have marks.
  CUevent reserveMark(CUstream stream, uint64_t launch, uint64_t* sequence,
                      std::atomic<uint64_t>** recorded);
  // With timedMarks_: the start of the marked launch, recorded once everything it waits for is
  // in its stream (restores, waits for other streams' restores), so that it ran from there to
  // its mark.
  void recordMarkStart(CUstream stream, uint64_t sequence);
  // The event a use's mark was recorded in (or a later mark of the same stream: the ring's slot
  // is reused, never the order); nullptr if the stream has no marks, or if the mark is known
  // to have passed on the device (*passed is then true: nothing to wait for).
  CUevent markEvent(CUstream stream, uint64_t sequence, bool* passed) const;
  // The policy is told when the marked launches that ended since ended (onLaunchTimed), on
  // one clock: the elapsed time from an anchor, a mark read earlier (taken out of its ring).
  void readLaunchTimes();
  // Tells the policy of the launch being prepared (workingSet_), unless it is a recompute
  // callback's or the shim's own; under the lock.
  void tellPolicy(CUstream stream, const WorkInfo& work, int64_t now);

  bool deviceTime(CUevent& event, int64_t* ns);
  // This thread's fence: one event, recorded on its default stream after each of its launches
  // there (releaseHeld), that stands for all its uses of that stream (nullptr: none could be
  // made). Other threads cannot name that stream; they wait for the fence instead.
  CUevent threadFence();
  CUevent fenceOf(const void* thread) const;
  // Held by a launch prepared and not yet enqueued (any thread): not evictable now.
  bool isHeld(uint32_t id) const;
  // Every launch that used the buffer has passed on the device, as far as the launch marks read
  // so far tell (a use without a mark counts as passed).
  bool usesPassed(const Buffer& buffer) const;
  bool ensureEvictStream();
  // What the host link gives each way, measured once (the policy's seed is a guess: 12 GB/s,
  // where a GPU may have 25 or 450): a copy in and a copy out of a few MiB of memory of the
  // probe's own, on the eviction stream, timed; nothing waits for it. Skipped, and the
  // policy prices by its seed until copies are timed, when any of it cannot be had.
  void probeLink();
  bool probeTimingQueued() const;
  // Gives back whatever the probe holds.
  void endLinkProbe();
  void orderAfterRestore(Buffer& buffer, CUstream stream, bool perThreadStream);
  // Timing events around what makes `stream` wait for a restore (its copy, a wait for a
  // prefetch in flight): begin before it, end after it; read by pollTimings.
  CUevent beginWaitTiming(CUstream stream);
  void endWaitTiming(CUevent start, CUstream stream,
                     DeviceTiming::Kind kind = DeviceTiming::Kind::kRestoreWait, uint64_t bytes = 0);
  void collect(const Touch& touch, std::vector<uint32_t>& ids);
  CUresult prepareLocked(std::unique_lock<std::mutex>& lock, CUstream stream,
                         bool perThreadStream, const Touch* touches, size_t count,
                         const WorkInfo& work, std::vector<RecomputeCall>& calls,
                         const char** what, uint32_t* kernel);
  // prepare()'s way when the work touches dropped buffers: their callbacks run, then the work
  // is prepared again (out of line: the launch path without drops stays as lean).
  [[gnu::noinline]] CUresult regenerateThenPrepare(std::vector<RecomputeCall>& calls,
                                                   CUstream stream, bool perThreadStream,
                                                   const Touch* touches, size_t count,
                                                   const WorkInfo& work, const char* what,
                                                   uint32_t kernel);
  CUresult runRecomputes(std::vector<RecomputeCall>& calls, CUstream stream,
                         bool perThreadStream, const char* what, uint32_t kernel);
  // Maps new physical memory under a dropped buffer; its contents are undefined until
  // regenerated.
  CUresult remap(uint32_t id, std::span<const uint32_t> keep);
  void dropAgain(Buffer& buffer);
  // Reads the device timings whose events have completed, oldest first, and stops at the first
  // still running (the rest are read by a later call).
  void pollTimings();
  int64_t& nestedTime(int depth);  // nestedRecomputeNs_[depth], grown as needed
  // At an iteration boundary the policy has seen (marked or found): free ids in one order.
  void renumberAtBoundary();
  void deliverDropNotices();
  // Declared before the lock in the entry points that may drop buffers: delivers the drop
  // notices once the lock is released.
  struct NoticesAfterUnlock {
    Residency* residency;
    ~NoticesAfterUnlock() {
      if (hasDropNotices()) residency->deliverDropNotices();
    }
  };
  static bool hasDropNotices();
  void addWithLinks(uint32_t id, std::vector<uint32_t>& ids, int depth);
  void addTableTargets(const PointerTables::Table& table, std::vector<uint32_t>& ids, int depth);
  void addOnce(uint32_t id, std::vector<uint32_t>& ids);
  // collect()'s pointers of a kernel once tables exist: out of line, so that the loop without
  // them stays as lean.
  [[gnu::noinline]] void collectThroughTables(const Touch& touch, std::vector<uint32_t>& ids);
  // Pointer tables: what a copy or memset writes into device memory (prepareLocked).
  [[gnu::noinline]] void noteWrittenLocked(const WorkInfo& work);
  void noteHostTable(uint64_t destination, const void* source, uint64_t bytes);
  bool leadsSomewhere(uint64_t value) const;
  bool isDeviceMemory(uint64_t address);
  // The allocation `address` lies in, for a table there: a managed buffer, a known unmanaged
  // allocation, or what the driver says; invalid when nobody knows.
  PointerTables::Range allocationOf(uint64_t address);
  void refreshTableFlag(uint64_t address);

  const DriverApi& api_;
  const ResidencyConfig config_;
  const uint64_t granularity_;
  std::unique_ptr<policy::Policy> policy_;

  std::mutex mutex_;
  PhysicalPool physical_;
  HostPool host_;
  EventPool events_;
  EventPool timingEvents_;  // with timing: what work waited for, measured on the device
  AddressMap addresses_;
  PointerTables tables_;
  std::vector<PointerTables::Entry> tableScratch_;
  std::vector<Buffer> buffers_;    // by policy id
  std::vector<uint32_t> freeIds_;
  uint32_t boundariesSeen_ = 0;  // policy_->iterationBoundaries() at the last renumbering
  uint64_t resident_ = 0;
  uint64_t quarantinedBytes_ = 0;
  std::unique_ptr<CallStacks> stacks_;  // DELTA_TRACE_STACKS
  // The program's cuMemCreate: handles counted only (NCCL's), and those the shim stands in for
  // (by the value the program holds). foreignBytes_: their memory on the device and not in a
  // managed buffer (those count in resident_).
  std::map<CUmemGenericAllocationHandle, uint64_t> foreignHandles_;
  std::map<CUmemGenericAllocationHandle, std::unique_ptr<ProgramHandle>> programHandles_;
  // Every mapping the program made of those handles (managed or not), by address: what a
  // pointer into them may reach runs across adjoining ones.
  struct ProgramMapping {
    CUdeviceptr end;
    uint32_t buffer;  // UINT32_MAX: left to the program
    ProgramHandle* handle;
  };
  std::map<CUdeviceptr, ProgramMapping> programMappings_;
  std::map<CUdeviceptr, CUdeviceptr> extents_;  // declared by the framework: start -> end
  uint64_t foreignBytes_ = 0;
  uint64_t programResident_ = 0;  // of resident_: managed mappings of the program's memory
  std::multimap<uint64_t, CUdeviceptr> addressCache_;            // reservations to reuse
  std::vector<Quarantined> quarantine_;
  CUstream evictStream_ = nullptr;
  std::deque<EvictionBatch> inFlight_;
  std::vector<EvictionBatch> spareBatches_;  // their member vectors kept, not to allocate again
  uint64_t evictingBytes_ = 0;               // counted in resident_ until their batch is done
  uint64_t nextBatch_ = 1;
  // Memory has been short at least once: from then on, room is made ahead of each launch (until
  // then the budget never bound, and the look ahead would only cost the launch path).
  bool beenShort_ = false;
  // Set while evictUntil or makeRoomAhead asks for victims the device has finished with
  // (evict() passes the others over, as it does held ones).
  bool preferPassedUses_ = false;
  // Estimated ends of the copies queued on each engine (the policy's cost model, which the
  // measured copies calibrate).
  int64_t d2hBusyUntilNs_ = 0;
  int64_t h2dBusyUntilNs_ = 0;
  CUstream prefetchStream_ = nullptr;
  CUstream joinStream_ = nullptr;  // adoptQuarantined: after a freed buffer's uses on several streams
  Stats stats_;
  PlannerThread planner_;
  uint32_t plannedLaunches_ = 0;  // the iteration submitted, in launches
  uint64_t nextSerial_ = 1;
  std::atomic<trace::TraceWriter*> trace_{nullptr};
  std::vector<uint64_t> traceBuffers_;  // scratch: serials of a launch's buffers

  // Scratch for the launch path, reused so that it does not allocate once grown.
  std::vector<uint32_t> workingSet_;
  std::vector<uint32_t> writtenScratch_;
  std::vector<policy::BufferId> keepIds_;
  // Per buffer id: launches prepared and not yet enqueued that touch it. Apart from buffers_
  // (which moves as it grows) so that releaseHeld() can count down without the lock.
  std::unique_ptr<std::atomic<uint32_t>[]> heldCounts_;
  struct ThreadFence {
    const void* thread;
    CUevent event;
  };
  std::vector<ThreadFence> threadFences_;  // one per thread that used its default stream
  // Once memory has been short, an event is recorded after each launch on a program's stream
  // (one ring of them per stream). Evicting a buffer then waits for its last use, not for all
  // the work queued on its stream: an event recorded at the tail at eviction time would make
  // the host wait for the device to drain its queue whenever it needs room, and the device
  // would then idle while the host fills it again. A slot's event is recorded again a ring
  // later, on the same stream: waiting for it then waits a little longer, never too little.
  // With a policy that wants the device's times (timedMarks_), the marks are timing events,
  // read in order as the device passes them: the policy learns the iteration by the device's
  // clock (policy::AccessPattern), and an eviction waits for no mark known to have passed.
  // Ring size: kMarkSlots (public, for the tests).
  static constexpr size_t kMaxMarkedStreams = 16;
  static constexpr uint64_t kRecordFailed = uint64_t{1} << 63;
  static constexpr uint64_t kNoLaunch = UINT64_MAX;
  struct LaunchMarks {
    CUstream stream = nullptr;
    uint64_t next = 1;  // the next mark's sequence number
    uint64_t read = 1;  // the next mark to read (readLaunchTimes); older ones are read or lost
    CUevent events[kMarkSlots] = {};
    // With timedMarks_, per slot: an event recorded before the marked launch, after what it
    // waits for (its restores, regenerations): the launch ran from there to its mark.
    CUevent starts[kMarkSlots] = {};
    // Per slot: the policy's index of the marked launch (or kNoLaunch); the mark's sequence
    // once its record is in the stream (| kRecordFailed when it could not be recorded); the
    // mark's sequence once read as passed.
    uint64_t launch[kMarkSlots] = {};
    // Per slot: no work the policy is not told of was enqueued since the last marked launch,
    // so that the device's time before this one's start was all waiting (onLaunchTimed).
    bool gapIsWaits[kMarkSlots] = {};
    std::atomic<uint64_t> recorded[kMarkSlots] = {};
    uint64_t passed[kMarkSlots] = {};
  };
  std::vector<std::unique_ptr<LaunchMarks>> launchMarks_;
  const bool timedMarks_;
  // Work was enqueued that the policy is not told of (it touches no managed buffer) since the
  // last marked launch: on the device it runs in the time before the next one starts.
  bool unseenSinceMark_ = false;
  uint64_t policyLaunches_ = 0;  // onLaunch calls so far: the index of the next
  // Work that cannot be analysed needs every buffer resident, so when all of them exceed the
  // budget it runs over it whatever was evicted before. Memory evicted between two such
  // launches comes back at the second: it lowers no peak and costs a copy or a recompute each
  // way (the LSTM at 50 %, every launch opaque: 18.6 s an iteration against 0.77). So while
  // they keep coming (one within the last kUnanalysedHoldLaunches of the program's calls),
  // evictions make room only under what they needed, and an allocation right after one is
  // taken as needed by the next (held, not evicted for); the budget binds again once none has
  // come for that long. Not in strict mode, where the budget is never exceeded.
  uint64_t unanalysedHoldBytes_ = 0;
  uint64_t unanalysedHoldUntil_ = 0;  // policyLaunches_ at which the hold lapses
  bool lastProgramWorkOpaque_ = false;
  CUevent clockAnchor_ = nullptr;
  int64_t clockAnchorNs_ = 0;

  std::atomic<bool> anyRecomputable_{false};
  const void* recomputeOwner_ = nullptr;     // the thread running recompute callbacks
  std::condition_variable regenerated_;      // a regeneration ended, or the owner left
  std::vector<DeviceTiming> timings_;
  // The link probe: memory of its own, copied in and out once, when memory first runs short,
  // before the policy prices its first actions (probeLink); given back once its copies are read.
  struct LinkProbe {
    CUdeviceptr address = 0;
    uint64_t bytes = 0;
    CUmemGenericAllocationHandle handle = 0;
    void* host = nullptr;
    bool hostPinned = false;
    bool mapped = false;
  };
  LinkProbe probe_;
  bool linkProbed_ = false;
  // By depth: the measured time of the regenerations read so far that ran inside the one at
  // the depth above, not yet read itself (pollTimings subtracts it there).
  std::vector<int64_t> nestedRecomputeNs_;
  uint64_t iterations_ = 0;
  uint64_t ceiling_ = UINT64_MAX;  // the device's own limit for managed memory, once known
  int64_t ceilingProbedNs_ = 0;
  int64_t ceilingProbeIntervalNs_ = 1000000000;  // doubles each time the device says no again
  bool deviceFreeChecked_ = false;
};


}  // namespace delta::shim
