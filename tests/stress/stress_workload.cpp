// stress-workload: a seeded random CUDA program whose every byte is checked against a host
// shadow copy. It is the reliability workload for libdelta.so (run with and without the shim
// by tests/stress/stress_runner.cpp and scripts/soak), and a correct CUDA program on its own.
//
// Each host thread owns its buffers, a few streams (the per-thread default stream and
// non-blocking ones) and a PRNG seeded from --seed and its index, and performs a random
// sequence of: allocations (log-uniform sizes from 1 KiB to --max-bytes, so many are above the
// shim's 1 MiB managed threshold; by cudaMalloc, cudaMallocAsync from the current pool or from
// the thread's own pool on one of its streams, or cudaMallocPitch), frees (of the buffer used
// least recently — the one a budget has most likely evicted —, of the one just touched, of one
// whose restore was just enqueued; stream-ordered, after every use, for what was allocated on a
// stream),
// kernel launches (fill, mix, gather through a pointer table in device memory, digest), async
// copies in the three directions from pinned and pageable host memory, memsets, event waits
// across streams and stream / device synchronisations.
//
// The gather's sources are reached only through a table of device pointers, which lives in a
// large managed buffer or in a small unmanaged allocation (64 B to 4 KiB, kept, written again,
// copied device to device, cleared by a memset, freed), at an offset (the kernel gets an
// interior pointer), as a field of a struct parameter, or behind a table of tables. Small tables
// may keep pointers to buffers freed since: the addresses come back for other buffers.
//
// Why the expected contents are well defined: every buffer's operations are serialised. Each
// buffer remembers the stream of its last use; an operation on another stream first records
// that stream's event and waits for it. So a buffer's operations run in program order, and
// the shadow is updated, at enqueue time, with the same function the kernel or copy applies.
// Host memory handed to an async copy stays untouched until its stream has been synchronised;
// a device-to-host copy's result is checked then, against the shadow as it was at enqueue.
//
// --take-device SIZE: for the middle third of the run, another process (a cudasim fault) holds
// SIZE bytes of the device; the results must not change.
//
// --size-classes N: every allocation is one of N sizes (log-spaced, 1 MiB to --max-bytes), so
// that freed memory fits the next allocations, as in a training loop.
//
// --program-vmm 1: a quarter of the allocations of 1 MiB or more are the program's own virtual
// memory, as a framework's expandable segment: a reservation of their own (one unmapped
// granule after the buffer), physical memory made with cuMemCreate in pieces of 2 or 4 MiB,
// mapped and given access over the whole range at once, half of them declared to the shim
// (delta_declare_extent, when the shim is there); freed by synchronising the buffer's stream
// and unmapping, releasing and freeing the range.
//
// Threads share nothing but the device, so the results do not depend on how they interleave:
// the final `digest:` is a function of the arguments alone, with or without the shim.
//
// Output (stdout): `peak_live_bytes: N` (sum over threads of each thread's peak of live
// device bytes: deterministic, and an upper bound of the program's peak),
// `max_launch_mapped_bytes: N` (the most one kernel touches, each buffer of 1 MiB or more
// rounded up to 2 MiB as the shim maps it: a device must hold two such launches, one per thread
// in flight, for the shim to run the program on it), `live_peak_bytes: N` (the most bytes live
// at once over all threads, as this run's threads interleaved: for sizing devices, not
// deterministic), `digest: HEX`,
// `stress: ok ops=... compared_bytes=...`. A mismatch prints `stress: MISMATCH ...` with the
// buffer, offset, expected and actual byte and the buffer's last operations, and exits 1; a
// failing CUDA call exits 1 too; bad arguments exit 2.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cudasim/cudasim.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/common/mix.h"

namespace {

// ---- the data functions: shared by the kernels (on device memory) and the shadow -------

using delta::testing::kGolden;
using delta::testing::rotl;
using delta::testing::splitmix;

uint64_t load(const uint8_t* p) {
  uint64_t w;
  std::memcpy(&w, p, 8);
  return w;
}
void store(uint8_t* p, uint64_t w) { std::memcpy(p, &w, 8); }

// Byte i of the region is byte i%8 of splitmix(seed + i/8): regions of one fill differ.
void fill_bytes(uint8_t* p, uint64_t n, uint64_t seed) {
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) store(p + i, splitmix(seed + i / 8));
  if (i < n) {
    uint64_t w = splitmix(seed + i / 8);
    std::memcpy(p + i, &w, n - i);
  }
}

// dst = f(dst, src), word by word, then byte by byte for the tail. dst and src do not overlap.
void mix_bytes(uint8_t* dst, const uint8_t* src, uint64_t n) {
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) store(dst + i, rotl(load(dst + i), 13) ^ (load(src + i) + kGolden));
  for (; i < n; ++i) dst[i] = static_cast<uint8_t>((dst[i] * 31u) ^ (src[i] + 7u));
}

// out = XOR over k of a rotation of source k; out does not overlap the sources.
void gather_bytes(uint8_t* out, const uint8_t* const* sources, uint32_t count, uint64_t n) {
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w = 0;
    for (uint32_t k = 0; k < count; ++k) w ^= rotl(load(sources[k] + i), static_cast<int>(2 * k + 1));
    store(out + i, w);
  }
  for (; i < n; ++i) {
    uint8_t b = 0;
    for (uint32_t k = 0; k < count; ++k) b ^= static_cast<uint8_t>(sources[k][i] + k);
    out[i] = b;
  }
}

// The first 8 bytes of dst become a hash of src's n bytes (n >= 1); dst does not overlap src.
void digest_bytes(uint8_t* dst, const uint8_t* src, uint64_t n) {
  uint64_t h = n;
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) h = rotl(h ^ load(src + i), 23) * 0xFF51AFD7ED558CCDull;
  for (; i < n; ++i) h = (h ^ src[i]) * 0x100000001B3ull;
  store(dst, h);
}

// ---- the kernels: host stubs are the symbols, the bodies run on cudasim's stream workers --

[[noreturn]] void stub_called(const char* name) {
  std::fprintf(stderr, "stress: kernel %s was called directly instead of launched\n", name);
  std::abort();
}
void fill_kernel(uint8_t*, uint64_t, uint64_t) { stub_called("fill"); }
void mix_kernel(uint8_t*, const uint8_t*, uint64_t) { stub_called("mix"); }
void gather_kernel(const uint8_t* const*, uint32_t, uint8_t*, uint64_t) { stub_called("gather"); }
struct TableField {  // a struct parameter whose field is the table
  const uint8_t* const* table;
  uint32_t count;
  uint32_t unused;
};
void gather_struct_kernel(TableField, uint8_t*, uint64_t) { stub_called("gather_struct"); }
void gather_nested_kernel(const uint8_t* const* const*, uint32_t, uint8_t*, uint64_t) {
  stub_called("gather_nested");
}
void digest_kernel(uint8_t*, const uint8_t*, uint64_t) { stub_called("digest"); }

template <typename T>
T arg(void** params, int i) {
  return *static_cast<T*>(params[i]);
}

void fill_body(void** p, dim3, dim3) {
  fill_bytes(arg<uint8_t*>(p, 0), arg<uint64_t>(p, 1), arg<uint64_t>(p, 2));
}
void mix_body(void** p, dim3, dim3) {
  mix_bytes(arg<uint8_t*>(p, 0), arg<const uint8_t*>(p, 1), arg<uint64_t>(p, 2));
}
void gather_body(void** p, dim3, dim3) {
  // The table is read from device memory: the sources are reached only through it.
  gather_bytes(arg<uint8_t*>(p, 2), arg<const uint8_t* const*>(p, 0), arg<uint32_t>(p, 1),
               arg<uint64_t>(p, 3));
}
void gather_struct_body(void** p, dim3, dim3) {
  const TableField field = arg<TableField>(p, 0);
  gather_bytes(arg<uint8_t*>(p, 1), field.table, field.count, arg<uint64_t>(p, 2));
}
void gather_nested_body(void** p, dim3, dim3) {
  // The outer table's first word is the table of sources.
  gather_bytes(arg<uint8_t*>(p, 2), arg<const uint8_t* const* const*>(p, 0)[0], arg<uint32_t>(p, 1),
               arg<uint64_t>(p, 3));
}
void digest_body(void** p, dim3, dim3) {
  digest_bytes(arg<uint8_t*>(p, 0), arg<const uint8_t*>(p, 1), arg<uint64_t>(p, 2));
}

void register_kernels() {
  static const size_t three[] = {8, 8, 8};
  static const size_t gather[] = {8, 4, 8, 8};
  static const size_t gatherStruct[] = {sizeof(TableField), 8, 8};
  cudasimRegisterKernel(reinterpret_cast<const void*>(&fill_kernel), "stress_fill", fill_body, 3, three);
  cudasimRegisterKernel(reinterpret_cast<const void*>(&mix_kernel), "stress_mix", mix_body, 3, three);
  cudasimRegisterKernel(reinterpret_cast<const void*>(&gather_kernel), "stress_gather", gather_body, 4,
                        gather);
  cudasimRegisterKernel(reinterpret_cast<const void*>(&digest_kernel), "stress_digest", digest_body, 3,
                        three);
  cudasimRegisterKernel(reinterpret_cast<const void*>(&gather_struct_kernel), "stress_gather_struct",
                        gather_struct_body, 3, gatherStruct);
  cudasimRegisterKernel(reinterpret_cast<const void*>(&gather_nested_kernel), "stress_gather_nested",
                        gather_nested_body, 4, gather);
}

// ---- the generator ----------------------------------------------------------------------

struct Options {
  uint64_t seed = 1;
  uint64_t ops = 2000;
  int threads = 2;
  uint64_t maxBytes = 64ull << 20;
  uint64_t peakHint = 256ull << 20;  // live device bytes, over all threads, at most
  uint64_t checkEvery = 0;           // ops per thread between full checks (0: ops / 4)
  bool perThreadStream = true;       // stream 0 of each thread is cudaStreamPerThread
  uint64_t takeDevice = 0;           // another process takes this much of the device for the
                                     // middle third of the run (thread 0's ops)
  bool programVmm = false;           // some allocations are the program's own virtual memory
  uint64_t sizeClasses = 0;          // > 0: every size one of this many (recurring shapes)
};

constexpr uint64_t kMinBytes = 1 << 10;
constexpr int kStreams = 3;           // per thread: the per-thread default stream + 2 others
constexpr uint64_t kMaxCopyBytes = 4 << 20;   // host copies and their expected snapshots
constexpr uint64_t kMaxPendingBytes = 32 << 20;  // host memory waiting for a stream sync
constexpr uint32_t kMaxGatherSources = 4;
constexpr uint64_t kTableBytes = 1 << 20;  // large pointer tables: managed (>= the shim's 1 MiB)
constexpr uint64_t kSmallTableMin = 64;     // small ones: unmanaged
constexpr uint64_t kSmallTableMax = 4 << 10;
constexpr size_t kSmallTables = 6;          // per thread, at most
constexpr int kHistory = 6;

std::mutex gPrintMutex;
std::atomic<bool> gFailed{false};
std::atomic<uint64_t> gLiveBytes{0};      // over all threads
std::atomic<uint64_t> gLivePeakBytes{0};

void addLive(int64_t bytes) {
  const uint64_t now = gLiveBytes.fetch_add(static_cast<uint64_t>(bytes)) + static_cast<uint64_t>(bytes);
  uint64_t peak = gLivePeakBytes.load();
  while (now > peak && !gLivePeakBytes.compare_exchange_weak(peak, now)) {
  }
}

[[noreturn]] void cuda_failed(const char* call, cudaError_t error, int line) {
  std::lock_guard lock(gPrintMutex);
  std::fprintf(stderr, "stress: %s failed (line %d): %s\n", call, line, cudaGetErrorString(error));
  std::fflush(stderr);
  std::_Exit(1);
}
#define CHECK(call)                                          \
  do {                                                       \
    cudaError_t e_ = (call);                                 \
    if (e_ != cudaSuccess) cuda_failed(#call, e_, __LINE__); \
  } while (0)

[[noreturn]] void fatal(const char* what) {
  std::lock_guard lock(gPrintMutex);
  std::fprintf(stderr, "stress: %s\n", what);
  std::fflush(stderr);
  std::_Exit(1);
}
// Driver calls (the program's own virtual memory), with the driver's error number.
#define CHECK_CU(call)                                                                 \
  do {                                                                                 \
    if (CUresult r_ = (call); r_ != CUDA_SUCCESS) {                                    \
      std::string what_ = std::string(#call) + " failed: CUresult " + std::to_string(static_cast<int>(r_)); \
      fatal(what_.c_str());                                                            \
    }                                                                                  \
  } while (0)

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(splitmix(seed)) {}
  uint64_t next() { return splitmix(state_++ * kGolden); }
  uint64_t below(uint64_t n) { return n == 0 ? 0 : next() % n; }
  bool chance(int percent) { return below(100) < static_cast<uint64_t>(percent); }
  // Log-uniform in [lo, hi].
  uint64_t logUniform(uint64_t lo, uint64_t hi) {
    double u = static_cast<double>(next() >> 11) / static_cast<double>(1ull << 53);
    double v = static_cast<double>(lo) * std::exp(u * std::log(static_cast<double>(hi) / lo));
    return std::clamp<uint64_t>(static_cast<uint64_t>(v), lo, hi);
  }

 private:
  uint64_t state_;
};

// How a buffer was allocated, and so how it is freed.
enum class AllocPath : uint8_t {
  kMalloc,  // cudaMalloc, freed by cudaFree
  kAsync,   // cudaMallocAsync from the device's current pool, freed by cudaFreeAsync
  kPool,    // cudaMallocFromPoolAsync from the thread's own pool, freed by cudaFreeAsync
  kPitch,   // cudaMallocPitch (height 1 to 4, used as one contiguous range), freed by cudaFree
  kVmm,     // cuMemAddressReserve + cuMemCreate + cuMemMap (--program-vmm), freed by cuMemUnmap
};

constexpr uint64_t kGranule = 2 << 20;  // cudasim's allocation granularity

struct Buffer {
  uint32_t id = 0;  // per thread, in allocation order
  uint8_t* device = nullptr;
  uint64_t bytes = 0;
  AllocPath path = AllocPath::kMalloc;
  std::vector<uint8_t> shadow;
  int lastStream = -1;
  uint64_t lastTouch = 0;  // op index
  std::string history[kHistory];  // the last operations that wrote or read it
  int historyNext = 0;
  std::vector<uint64_t> words;  // small pointer tables: what each 8-byte word holds now
  std::vector<CUmemGenericAllocationHandle> handles;  // kVmm: its pieces, in address order
  uint64_t reserved = 0;                              // kVmm: the reservation's size

  void note(const std::string& what) {
    history[historyNext] = what;
    historyNext = (historyNext + 1) % kHistory;
  }
};

// Host memory an async copy uses, kept until its stream is synchronised.
struct PendingHost {
  uint8_t* host = nullptr;
  bool pinned = false;
  uint64_t bytes = 0;
  bool check = false;  // a device-to-host result to compare with `expected`
  uint32_t bufferId = 0;
  uint64_t offset = 0;
  uint64_t op = 0;
  std::vector<uint8_t> expected;
};

struct StreamState {
  cudaStream_t stream = nullptr;
  cudaEvent_t event = nullptr;
  std::vector<PendingHost> pending;
  uint64_t pendingBytes = 0;
};

class Worker {
 public:
  Worker(const Options& options, int index)
      : options_(options),
        index_(index),
        rng_(options.seed * 1000003ull + static_cast<uint64_t>(index)),
        liveLimit_(std::max<uint64_t>(options.peakHint / options.threads, options.maxBytes)) {}

  void run(uint64_t ops) {
    for (int s = 0; s < kStreams; ++s) {
      // Stream 0 is the per-thread default stream: the shim handles its handle specially.
      if (s == 0 && options_.perThreadStream) streams_[s].stream = cudaStreamPerThread;
      else CHECK(cudaStreamCreateWithFlags(&streams_[s].stream, cudaStreamNonBlocking));
      CHECK(cudaEventCreateWithFlags(&streams_[s].event, cudaEventDisableTiming));
    }
    const uint64_t checkEvery = options_.checkEvery ? options_.checkEvery : std::max<uint64_t>(ops / 4, 1);
    for (op_ = 1; op_ <= ops && !gFailed.load(); ++op_) {
      if (index_ == 0 && options_.takeDevice > 0 && (op_ == ops / 3 || op_ == 2 * ops / 3)) {
        // The device shrinks under whatever holds it now, and later grows back: what a real
        // job sees when another process comes and goes.
        const std::string taken =
            op_ == ops / 3 ? "device-taken=" + std::to_string(options_.takeDevice) : std::string();
        if (const char* why = cudasimSetFaults(taken.c_str())) {
          std::fprintf(stderr, "stress: cudasimSetFaults: %s\n", why);
          std::_Exit(1);
        }
      }
      step();
      if (op_ % checkEvery == 0) checkAll();
    }
    if (!gFailed.load()) checkAll();
    while (!buffers_.empty()) freeAt(buffers_.size() - 1);
    while (!tables_.empty()) freeSmallTable(tables_.back().get());
    syncAll();
    if (pool_ != nullptr) CHECK(cudaMemPoolDestroy(pool_));
    for (int s = 0; s < kStreams; ++s) {
      CHECK(cudaEventDestroy(streams_[s].event));
      if (streams_[s].stream != cudaStreamPerThread) CHECK(cudaStreamDestroy(streams_[s].stream));
    }
  }

  uint64_t peak() const { return peak_; }

  uint64_t maxLaunch() const { return maxLaunch_; }
  uint64_t compared() const { return compared_; }
  uint64_t finalDigest() const { return digest_; }

 private:
  void step() {
    const uint64_t roll = rng_.below(100);
    if (buffers_.size() < 2 || roll < 14) return allocate();
    if (roll < 22) return freeOne();
    if (roll < 36) return fill();
    if (roll < 50) return mix();
    if (roll < 58) return gather();
    if (roll < 63) return digestOp();
    if (roll < 71) return hostToDevice();
    if (roll < 79) return deviceToHost();
    if (roll < 85) return deviceToDevice();
    if (roll < 91) return memset();
    if (roll < 94) return touchThenFree();
    if (roll < 96) return extraWait();
    if (roll < 99) return syncStream(static_cast<int>(rng_.below(kStreams)));
    return syncDevice();
  }

  std::string tag(const char* what, int stream) const {
    char text[96];
    std::snprintf(text, sizeof text, "op %" PRIu64 " %s on stream %d", op_, what, stream);
    return text;
  }

  // Orders the coming operation on `stream` after every earlier use of `buffers`.
  void orderOn(int stream, std::initializer_list<Buffer*> buffers) {
    bool recorded[kStreams] = {};
    for (Buffer* b : buffers) {
      if (b->lastStream >= 0 && b->lastStream != stream && !recorded[b->lastStream]) {
        recorded[b->lastStream] = true;
        CHECK(cudaEventRecord(streams_[b->lastStream].event, streams_[b->lastStream].stream));
        CHECK(cudaStreamWaitEvent(streams_[stream].stream, streams_[b->lastStream].event, 0));
      }
    }
    for (Buffer* b : buffers) {
      b->lastStream = stream;
      b->lastTouch = op_;
    }
  }

  // A kernel about to touch `buffers` (repeats allowed): how much of the device it needs at once.
  void noteLaunch(std::initializer_list<const Buffer*> buffers) {
    noteLaunch(std::vector<const Buffer*>(buffers));
  }
  // The same through a small table: the shim cannot know which of its words a kernel reads, so
  // it brings back every buffer the table leads to now (stale pointers included), through
  // tables of tables too.
  void noteTableLaunch(std::vector<const Buffer*> buffers, const Buffer* table) {
    reachThrough(table, buffers, 0);
    noteLaunch(buffers);
  }
  void reachThrough(const Buffer* table, std::vector<const Buffer*>& reached, int depth) {
    for (uint64_t value : table->words) {
      if (value == 0) continue;
      const Buffer* holder = nullptr;
      for (const auto& b : buffers_)
        if (value >= reinterpret_cast<uint64_t>(b->device) &&
            value < reinterpret_cast<uint64_t>(b->device) + b->bytes)
          holder = b.get();
      if (holder != nullptr) {
        reached.push_back(holder);
      } else if (const Buffer* inner = smallTableHolding(value);
                 inner != nullptr && inner != table && depth < 4) {
        reachThrough(inner, reached, depth + 1);
      }
    }
  }
  void noteLaunch(const std::vector<const Buffer*>& buffers) {
    uint64_t total = 0;
    std::vector<const Buffer*> seen;
    for (const Buffer* b : buffers) {
      if (b == nullptr || std::find(seen.begin(), seen.end(), b) != seen.end()) continue;
      seen.push_back(b);
      constexpr uint64_t kGranule = 2 << 20;
      total += b->bytes >= (1 << 20) ? (b->bytes + kGranule - 1) / kGranule * kGranule : b->bytes;
    }
    maxLaunch_ = std::max(maxLaunch_, total);
  }

  Buffer& pick() { return *buffers_[rng_.below(buffers_.size())]; }
  // Another buffer than `not1` (and `not2`), or nullptr when there is none.
  Buffer* pickOther(const Buffer* not1, const Buffer* not2 = nullptr) {
    for (int tries = 0; tries < 8; ++tries) {
      Buffer* b = buffers_[rng_.below(buffers_.size())].get();
      if (b != not1 && b != not2) return b;
    }
    return nullptr;
  }
  size_t leastRecent() const {
    size_t best = 0;
    for (size_t i = 1; i < buffers_.size(); ++i)
      if (buffers_[i]->lastTouch < buffers_[best]->lastTouch) best = i;
    return best;
  }
  size_t mostRecent() const {
    size_t best = 0;
    for (size_t i = 1; i < buffers_.size(); ++i)
      if (buffers_[i]->lastTouch > buffers_[best]->lastTouch) best = i;
    return best;
  }
  int randomStream() { return static_cast<int>(rng_.below(kStreams)); }
  // A region of `b`: the whole buffer half of the time, else a random part of it.
  void region(const Buffer& b, uint64_t maxBytes, uint64_t* offset, uint64_t* bytes) {
    if (b.bytes <= maxBytes && rng_.chance(50)) {
      *offset = 0;
      *bytes = b.bytes;
      return;
    }
    *bytes = 1 + rng_.below(std::min(b.bytes, maxBytes));
    *offset = rng_.below(b.bytes - *bytes + 1);
  }

  // This thread's own memory pool (plain: device memory of device 0), made at first use.
  cudaMemPool_t threadPool() {
    if (pool_ == nullptr) {
      cudaMemPoolProps props{};
      props.allocType = cudaMemAllocationTypePinned;
      props.location.type = cudaMemLocationTypeDevice;
      props.location.id = 0;
      CHECK(cudaMemPoolCreate(&pool_, &props));
    }
    return pool_;
  }

  // Class k of --size-classes: log-spaced from 1 MiB to --max-bytes, the same in every
  // thread and run, as a training loop allocates the same shapes again and again.
  uint64_t sizeClass(uint64_t k) const {
    const uint64_t n = options_.sizeClasses;
    if (n == 1) return options_.maxBytes;
    const double lo = 1 << 20;
    const double ratio = static_cast<double>(options_.maxBytes) / lo;
    return static_cast<uint64_t>(lo * std::pow(ratio, static_cast<double>(k) / static_cast<double>(n - 1)));
  }

  void allocate() {
    const uint64_t bytes = options_.sizeClasses > 0 ? sizeClass(rng_.below(options_.sizeClasses))
                                                    : rng_.logUniform(kMinBytes, options_.maxBytes);
    // Make room under this thread's share of the peak: free the coldest buffers first (a
    // budget has most likely evicted them).
    while (!buffers_.empty() && live_ + bytes > liveLimit_) freeAt(leastRecent());
    auto b = std::make_unique<Buffer>();
    b->id = nextId_++;
    b->bytes = bytes;
    const int s = randomStream();
    const bool vmm = options_.programVmm && bytes >= (1 << 20) && rng_.below(4) == 0;
    const uint64_t how = rng_.below(10);
    void** out = reinterpret_cast<void**>(&b->device);
    if (vmm) {
      mapProgramMemory(*b);
    } else if (how < 6) {
      CHECK(cudaMalloc(out, bytes));
    } else if (how < 8) {
      // Usable by the work that follows on its stream: the fill below, on that stream.
      b->path = AllocPath::kAsync;
      CHECK(cudaMallocAsync(out, bytes, streams_[s].stream));
    } else if (how < 9) {
      b->path = AllocPath::kPool;
      CHECK(cudaMallocFromPoolAsync(out, bytes, threadPool(), streams_[s].stream));
    } else {
      // Rows of a pitched allocation, used as one range: pitch * height covers `bytes`.
      b->path = AllocPath::kPitch;
      const uint64_t height = 1 + rng_.below(4);
      size_t pitch = 0;
      CHECK(cudaMallocPitch(out, &pitch, (bytes + height - 1) / height, height));
    }
    // The allocation's contents are undefined: give it defined ones before anything reads them.
    const uint64_t seed = rng_.next();
    b->shadow.resize(bytes);
    fill_bytes(b->shadow.data(), bytes, seed);
    orderOn(s, {b.get()});
    launchFill(b->device, bytes, seed, s);
    b->note(tag("alloc+fill", s));
    live_ += bytes;
    peak_ = std::max(peak_, live_);
    addLive(static_cast<int64_t>(bytes));
    buffers_.push_back(std::move(b));
  }

  // The program's own virtual memory, as a framework's segment (--program-vmm).
  void mapProgramMemory(Buffer& b) {
    b.path = AllocPath::kVmm;
    const uint64_t mapped = (b.bytes + kGranule - 1) / kGranule * kGranule;
    b.reserved = mapped + kGranule;  // a gap after it: no run of mappings joins another buffer's
    CUdeviceptr base = 0;
    CHECK_CU(cuMemAddressReserve(&base, b.reserved, 0, 0, 0));
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    for (uint64_t at = 0; at < mapped;) {
      const uint64_t piece = mapped - at >= 2 * kGranule && rng_.below(2) == 0 ? 2 * kGranule : kGranule;
      CUmemGenericAllocationHandle handle = 0;
      CHECK_CU(cuMemCreate(&handle, piece, &prop, 0));
      CHECK_CU(cuMemMap(base + at, piece, 0, handle, 0));
      b.handles.push_back(handle);
      at += piece;
    }
    CUmemAccessDesc access{};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CHECK_CU(cuMemSetAccess(base, mapped, &access, 1));
    b.device = reinterpret_cast<uint8_t*>(base);
    using Declare = int (*)(const void*, size_t);
    static const auto declare = reinterpret_cast<Declare>(dlsym(RTLD_DEFAULT, "delta_declare_extent"));
    // Drawn with the shim or without: the run must be the same program either way.
    const bool declared = rng_.below(2) == 0;
    if (declare != nullptr && declared && declare(b.device, b.bytes) != 0)
      fatal("delta_declare_extent refused a mapped buffer");
  }

  void unmapProgramMemory(Buffer& b) {
    // The driver does not wait for work that uses the range: its stream first (every use of a
    // buffer is ordered on its last stream).
    if (b.lastStream >= 0) CHECK(cudaStreamSynchronize(streams_[b.lastStream].stream));
    const CUdeviceptr base = reinterpret_cast<CUdeviceptr>(b.device);
    CHECK_CU(cuMemUnmap(base, b.reserved - kGranule));
    for (CUmemGenericAllocationHandle handle : b.handles) CHECK_CU(cuMemRelease(handle));
    CHECK_CU(cuMemAddressFree(base, b.reserved));
  }

  void freeAt(size_t index) {
    Buffer& b = *buffers_[index];
    if (b.path == AllocPath::kVmm) {
      unmapProgramMemory(b);
    } else if (b.path == AllocPath::kAsync || b.path == AllocPath::kPool) {
      // A stream-ordered free: after every use, on a stream of its own choosing. The memory may
      // be handed out again at once to work ordered after it, and to nothing else.
      const int s = randomStream();
      orderOn(s, {&b});
      CHECK(cudaFreeAsync(b.device, streams_[s].stream));
    } else {
      // cudaFree waits for the work that uses the buffer (implicitly synchronising); under the
      // shim it must not hand the memory out again before that work is done.
      CHECK(cudaFree(b.device));
    }
    live_ -= b.bytes;
    addLive(-static_cast<int64_t>(b.bytes));
    buffers_[index] = std::move(buffers_.back());
    buffers_.pop_back();
  }

  void freeOne() {
    const uint64_t how = rng_.below(10);
    if (how < 4) freeAt(leastRecent());      // likely evicted
    else if (how < 7) freeAt(mostRecent());  // work on it likely still queued
    else freeAt(rng_.below(buffers_.size()));
  }

  void launchFill(uint8_t* device, uint64_t bytes, uint64_t seed, int s) {
    void* args[] = {&device, &bytes, &seed};
    CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(&fill_kernel), dim3(1), dim3(1), args, 0,
                           streams_[s].stream));
  }

  void fill() {
    Buffer& b = pick();
    uint64_t offset, bytes;
    region(b, b.bytes, &offset, &bytes);
    const uint64_t seed = rng_.next();
    const int s = randomStream();
    orderOn(s, {&b});
    launchFill(b.device + offset, bytes, seed, s);
    fill_bytes(b.shadow.data() + offset, bytes, seed);
    b.note(tag("fill", s));
  }

  void mix() {
    Buffer& dst = pick();
    Buffer* src = pickOther(&dst);
    if (src == nullptr) return;
    uint64_t bytes = 1 + rng_.below(std::min(dst.bytes, src->bytes));
    if (rng_.chance(50)) bytes = std::min(dst.bytes, src->bytes);
    uint64_t dstOffset = rng_.below(dst.bytes - bytes + 1), srcOffset = rng_.below(src->bytes - bytes + 1);
    const int s = randomStream();
    orderOn(s, {&dst, src});
    noteLaunch({&dst, src});
    uint8_t* d = dst.device + dstOffset;
    const uint8_t* sp = src->device + srcOffset;
    void* args[] = {&d, &sp, &bytes};
    CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(&mix_kernel), dim3(1), dim3(1), args, 0,
                           streams_[s].stream));
    mix_bytes(dst.shadow.data() + dstOffset, src->shadow.data() + srcOffset, bytes);
    dst.note(tag("mix dst", s));
    src->note(tag("mix src", s));
  }

  // out = gather(sources), where the kernel finds the sources' addresses only in device memory:
  // a table written by a small host-to-device copy (as frameworks pass tensor lists), in a large
  // managed buffer or a small unmanaged one, or copied there from another table, or behind a
  // table of tables.
  void gather() {
    Buffer* out = &pick();
    std::vector<Buffer*> sources;
    const uint32_t want = 1 + static_cast<uint32_t>(rng_.below(kMaxGatherSources));
    for (int tries = 0; tries < 16 && sources.size() < want; ++tries) {
      Buffer* b = pickOther(out);
      if (b != nullptr && std::find(sources.begin(), sources.end(), b) == sources.end())
        sources.push_back(b);
    }
    if (sources.empty()) return;
    uint64_t bytes = std::min<uint64_t>(out->bytes, kMaxCopyBytes * 4);
    for (Buffer* b : sources) bytes = std::min(bytes, b->bytes);
    uint32_t count = static_cast<uint32_t>(sources.size());
    const int s = randomStream();
    std::vector<const uint8_t*> addresses, shadowSources;
    for (Buffer* b : sources) {
      addresses.push_back(b->device);
      shadowSources.push_back(b->shadow.data());
    }
    for (Buffer* b : sources) orderOn(s, {b});
    orderOn(s, {out});
    std::vector<const Buffer*> touched(sources.begin(), sources.end());
    touched.push_back(out);

    const uint64_t how = rng_.below(100);
    if (how < 30) {
      // In a large managed buffer, written from the host or copied from a small table.
      Buffer* table = nullptr;
      for (int tries = 0; tries < 8 && table == nullptr; ++tries) {
        Buffer& b = pick();
        if (b.bytes >= kTableBytes && b.bytes >= 8 * count && &b != out &&
            std::find(sources.begin(), sources.end(), &b) == sources.end())
          table = &b;
      }
      if (table == nullptr) return;
      orderOn(s, {table});
      touched.push_back(table);
      noteLaunch(touched);
      if (how < 20) {
        writeTable(s, table->device, addresses.data(), count);
        table->note(tag("gather table", s));
      } else {
        Buffer* small = smallTable(s, 8 * count);
        writeTable(s, small->device, addresses.data(), count);
        CHECK(cudaMemcpyAsync(table->device, small->device, 8 * count, cudaMemcpyDeviceToDevice,
                              streams_[s].stream));
        table->note(tag("gather table copied from a small one", s));
      }
      std::memcpy(table->shadow.data(), addresses.data(), 8 * count);
      launchGather(s, table->device, count, out->device, bytes);
      // Device addresses differ from run to run (and under the shim): clear the table after use
      // so that no later operation copies them into contents the digest covers.
      CHECK(cudaMemsetAsync(table->device, 0, count * 8, streams_[s].stream));
      std::memset(table->shadow.data(), 0, count * 8);
    } else {
      // In a small unmanaged table, at an 8-byte aligned offset: the kernel gets an interior
      // pointer (or the struct holding it, or a table holding it).
      Buffer* table = smallTable(s, 8 * count);
      if (table == nullptr) return;
      const uint64_t offset = 8 * rng_.below(table->bytes / 8 - count + 1);
      uint8_t* at = table->device + offset;
      if (how < 55) {
        writeTable(s, at, addresses.data(), count);
        noteTableLaunch(touched, table);
        launchGather(s, at, count, out->device, bytes);
      } else if (how < 70) {
        // Written into another small table, then copied device to device.
        Buffer* staging = smallTable(s, 8 * count, table);
        if (staging == nullptr) return;
        writeTable(s, staging->device, addresses.data(), count);
        CHECK(cudaMemcpyAsync(at, staging->device, 8 * count, cudaMemcpyDeviceToDevice,
                              streams_[s].stream));
        std::copy_n(staging->words.begin(), count, table->words.begin() + offset / 8);
        if (rng_.chance(50)) {
          CHECK(cudaMemsetAsync(staging->device, 0, 8 * count, streams_[s].stream));
          std::fill_n(staging->words.begin(), count, 0);
        }
        noteTableLaunch(touched, table);
        launchGather(s, at, count, out->device, bytes);
      } else if (how < 85) {
        writeTable(s, at, addresses.data(), count);
        noteTableLaunch(touched, table);
        TableField field{reinterpret_cast<const uint8_t* const*>(at), count, 0};
        uint8_t* o = out->device;
        void* args[] = {&field, &o, &bytes};
        CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(&gather_struct_kernel), dim3(1), dim3(1),
                               args, 0, streams_[s].stream));
      } else {
        // A table of tables, written inner first or outer first.
        Buffer* outer = smallTable(s, 8, table);
        if (outer == nullptr) return;
        const uint8_t* inner = at;
        if (rng_.chance(50)) {
          writeTable(s, at, addresses.data(), count);
          writeTable(s, outer->device, &inner, 1);
        } else {
          writeTable(s, outer->device, &inner, 1);
          writeTable(s, at, addresses.data(), count);
        }
        noteTableLaunch(touched, outer);
        const uint8_t* const* const* o = reinterpret_cast<const uint8_t* const* const*>(outer->device);
        uint8_t* dst = out->device;
        void* args[] = {&o, &count, &dst, &bytes};
        CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(&gather_nested_kernel), dim3(1), dim3(1),
                               args, 0, streams_[s].stream));
      }
      // Left as it is (its pointers may outlive their buffers), cleared, or freed.
      const uint64_t after = rng_.below(10);
      if (after < 3) {
        CHECK(cudaMemsetAsync(table->device, 0, table->bytes, streams_[s].stream));
        std::fill(table->words.begin(), table->words.end(), 0);
      } else if (after < 4) {
        freeSmallTable(table);
      }
    }
    gather_bytes(out->shadow.data(), shadowSources.data(), count, bytes);
    out->note(tag("gather out", s));
    for (Buffer* b : sources) b->note(tag("gather source", s));
  }

  void launchGather(int s, const uint8_t* table, uint32_t count, uint8_t* out, uint64_t bytes) {
    const uint8_t* const* t = reinterpret_cast<const uint8_t* const*>(table);
    void* args[] = {&t, &count, &out, &bytes};
    CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(&gather_kernel), dim3(1), dim3(1), args, 0,
                           streams_[s].stream));
  }

  // Copies `count` pointers to `table` from host memory kept until the stream is synchronised.
  void writeTable(int s, uint8_t* table, const uint8_t* const* pointers, uint32_t count) {
    PendingHost host = hostBlock(8 * count);
    std::memcpy(host.host, pointers, 8 * count);
    CHECK(cudaMemcpyAsync(table, host.host, 8 * count, cudaMemcpyHostToDevice, streams_[s].stream));
    keep(s, std::move(host));
    if (Buffer* small = smallTableHolding(reinterpret_cast<uint64_t>(table)))
      std::memcpy(small->words.data() + (table - small->device) / 8, pointers, 8 * count);
  }

  Buffer* smallTableHolding(uint64_t address) {
    for (const auto& t : tables_)
      if (address >= reinterpret_cast<uint64_t>(t->device) &&
          address < reinterpret_cast<uint64_t>(t->device) + t->bytes)
        return t.get();
    return nullptr;
  }

  // A small table of at least `bytes`, other than `not1`, ordered on stream `s`: one kept from
  // before, or a new one. nullptr when none can be had.
  Buffer* smallTable(int s, uint64_t bytes, const Buffer* not1 = nullptr) {
    Buffer* table = nullptr;
    if (!tables_.empty() && (tables_.size() >= kSmallTables || rng_.chance(70))) {
      Buffer* b = tables_[rng_.below(tables_.size())].get();
      if (b->bytes >= bytes && b != not1) table = b;
    }
    if (table == nullptr && tables_.size() < kSmallTables + 1) {
      auto b = std::make_unique<Buffer>();
      b->bytes = std::max<uint64_t>(bytes, 8 * (rng_.logUniform(kSmallTableMin, kSmallTableMax) / 8));
      CHECK(cudaMalloc(reinterpret_cast<void**>(&b->device), b->bytes));
      // cudaMalloc's contents are undefined: a table starts cleared, as the shim must see it.
      CHECK(cudaMemsetAsync(b->device, 0, b->bytes, streams_[s].stream));
      b->words.assign(b->bytes / 8, 0);
      table = b.get();
      tables_.push_back(std::move(b));
    }
    if (table != nullptr) orderOn(s, {table});
    return table;
  }

  void freeSmallTable(Buffer* table) {
    CHECK(cudaFree(table->device));
    auto it = std::find_if(tables_.begin(), tables_.end(), [table](const auto& b) { return b.get() == table; });
    *it = std::move(tables_.back());
    tables_.pop_back();
  }

  void digestOp() {
    Buffer& dst = pick();
    Buffer* src = pickOther(&dst);
    if (src == nullptr || dst.bytes < 8) return;
    uint64_t offset, bytes;
    region(*src, src->bytes, &offset, &bytes);
    const int s = randomStream();
    orderOn(s, {&dst, src});
    noteLaunch({&dst, src});
    uint8_t* d = dst.device;
    const uint8_t* sp = src->device + offset;
    void* args[] = {&d, &sp, &bytes};
    CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(&digest_kernel), dim3(1), dim3(1), args, 0,
                           streams_[s].stream));
    digest_bytes(dst.shadow.data(), src->shadow.data() + offset, bytes);
    dst.note(tag("digest dst", s));
    src->note(tag("digest src", s));
  }

  PendingHost hostBlock(uint64_t bytes) {
    PendingHost h;
    h.bytes = bytes;
    h.pinned = rng_.chance(50);
    if (h.pinned) CHECK(cudaMallocHost(reinterpret_cast<void**>(&h.host), bytes));
    else h.host = static_cast<uint8_t*>(std::malloc(bytes));
    return h;
  }
  void keep(int s, PendingHost&& h) {
    streams_[s].pendingBytes += h.bytes;
    streams_[s].pending.push_back(std::move(h));
    if (streams_[s].pendingBytes > kMaxPendingBytes || streams_[s].pending.size() > 64) syncStream(s);
  }

  void hostToDevice() {
    Buffer& b = pick();
    uint64_t offset, bytes;
    region(b, kMaxCopyBytes, &offset, &bytes);
    PendingHost host = hostBlock(bytes);
    fill_bytes(host.host, bytes, rng_.next());
    const int s = randomStream();
    orderOn(s, {&b});
    CHECK(cudaMemcpyAsync(b.device + offset, host.host, bytes, cudaMemcpyHostToDevice, streams_[s].stream));
    std::memcpy(b.shadow.data() + offset, host.host, bytes);
    b.note(tag(host.pinned ? "h2d pinned" : "h2d pageable", s));
    keep(s, std::move(host));
  }

  void deviceToHost() {
    Buffer& b = pick();
    uint64_t offset, bytes;
    region(b, kMaxCopyBytes, &offset, &bytes);
    PendingHost host = hostBlock(bytes);
    const int s = randomStream();
    orderOn(s, {&b});
    CHECK(cudaMemcpyAsync(host.host, b.device + offset, bytes, cudaMemcpyDeviceToHost, streams_[s].stream));
    host.check = true;
    host.bufferId = b.id;
    host.offset = offset;
    host.op = op_;
    host.expected.assign(b.shadow.begin() + static_cast<ptrdiff_t>(offset),
                         b.shadow.begin() + static_cast<ptrdiff_t>(offset + bytes));
    b.note(tag(host.pinned ? "d2h pinned" : "d2h pageable", s));
    keep(s, std::move(host));
  }

  void deviceToDevice() {
    Buffer& dst = pick();
    Buffer* src = pickOther(&dst);
    if (src == nullptr) return;
    const uint64_t bytes = 1 + rng_.below(std::min(dst.bytes, src->bytes));
    const uint64_t dstOffset = rng_.below(dst.bytes - bytes + 1), srcOffset = rng_.below(src->bytes - bytes + 1);
    const int s = randomStream();
    orderOn(s, {&dst, src});
    noteLaunch({&dst, src});
    CHECK(cudaMemcpyAsync(dst.device + dstOffset, src->device + srcOffset, bytes, cudaMemcpyDeviceToDevice,
                          streams_[s].stream));
    std::memcpy(dst.shadow.data() + dstOffset, src->shadow.data() + srcOffset, bytes);
    dst.note(tag("d2d dst", s));
    src->note(tag("d2d src", s));
  }

  void memset() {
    Buffer& b = pick();
    uint64_t offset, bytes;
    region(b, b.bytes, &offset, &bytes);
    const int value = static_cast<int>(rng_.below(256));
    const int s = randomStream();
    orderOn(s, {&b});
    CHECK(cudaMemsetAsync(b.device + offset, value, bytes, streams_[s].stream));
    std::memset(b.shadow.data() + offset, value, bytes);
    b.note(tag("memset", s));
  }

  // Work on the coldest buffer (a restore, under a budget), then free it at once: the free
  // races the restore and the fill still in the stream.
  void touchThenFree() {
    const size_t index = leastRecent();
    Buffer& b = *buffers_[index];
    const int s = randomStream();
    orderOn(s, {&b});
    launchFill(b.device, b.bytes, rng_.next(), s);
    freeAt(index);
  }

  // An event wait with nothing to order: streams wait on each other in patterns of their own.
  void extraWait() {
    const int from = randomStream(), to = randomStream();
    if (from == to) return;
    CHECK(cudaEventRecord(streams_[from].event, streams_[from].stream));
    CHECK(cudaStreamWaitEvent(streams_[to].stream, streams_[from].event, 0));
  }

  void settle(StreamState& st) {
    for (PendingHost& h : st.pending) {
      if (h.check && !gFailed.load()) compare("d2h", h.bufferId, h.offset, h.op, h.expected.data(), h.host,
                                              h.bytes, nullptr);
      if (h.pinned) CHECK(cudaFreeHost(h.host));
      else std::free(h.host);
    }
    st.pending.clear();
    st.pendingBytes = 0;
  }
  void syncStream(int s) {
    CHECK(cudaStreamSynchronize(streams_[s].stream));
    settle(streams_[s]);
  }
  void syncAll() {
    for (int s = 0; s < kStreams; ++s) syncStream(s);
  }
  void syncDevice() {
    CHECK(cudaDeviceSynchronize());
    for (StreamState& st : streams_) settle(st);
  }

  // Copies every live buffer back and compares it with its shadow.
  void checkAll() {
    syncAll();
    std::vector<uint8_t> got;
    for (const auto& b : buffers_) {
      got.resize(b->bytes);
      CHECK(cudaMemcpy(got.data(), b->device, b->bytes, cudaMemcpyDeviceToHost));
      if (!compare("check", b->id, 0, op_, b->shadow.data(), got.data(), b->bytes, b.get())) return;
      // The digest: a function of the arguments only (per buffer, in this thread's order).
      uint8_t h[8];
      digest_bytes(h, got.data(), b->bytes);
      digest_ = splitmix(digest_ ^ load(h) ^ b->id);
    }
  }

  bool compare(const char* where, uint32_t id, uint64_t offset, uint64_t op, const uint8_t* expected,
               const uint8_t* got, uint64_t bytes, const Buffer* buffer) {
    compared_ += bytes;
    if (std::memcmp(expected, got, bytes) == 0) return true;
    uint64_t first = 0, count = 0;
    while (expected[first] == got[first]) ++first;
    for (uint64_t i = first; i < bytes; ++i) count += expected[i] != got[i];
    if (buffer == nullptr)
      for (const auto& b : buffers_)
        if (b->id == id) buffer = b.get();
    gFailed.store(true);
    std::lock_guard lock(gPrintMutex);
    std::printf("stress: MISMATCH %s thread=%d buffer=%u offset=%" PRIu64 " expected=0x%02x got=0x%02x "
                "(%" PRIu64 " of %" PRIu64 " bytes differ from there; compared at op %" PRIu64
                ", seed %" PRIu64 ")\n",
                where, index_, id, offset + first, expected[first], got[first], count, bytes - first, op,
                options_.seed);
    if (buffer != nullptr) {
      std::printf("stress:   buffer %u: %" PRIu64 " bytes at %p; last operations, oldest first:\n", id,
                  buffer->bytes, static_cast<void*>(buffer->device));
      for (int i = 0; i < kHistory; ++i) {
        const std::string& h = buffer->history[(buffer->historyNext + i) % kHistory];
        if (!h.empty()) std::printf("stress:     %s\n", h.c_str());
      }
    }
    std::fflush(stdout);
    return false;
  }

  const Options options_;
  const int index_;
  Rng rng_;
  const uint64_t liveLimit_;
  StreamState streams_[kStreams];
  std::vector<std::unique_ptr<Buffer>> buffers_;
  std::vector<std::unique_ptr<Buffer>> tables_;  // small pointer tables: not checked, no shadow
  uint32_t nextId_ = 0;
  uint64_t op_ = 0;
  uint64_t live_ = 0;
  uint64_t peak_ = 0;
  uint64_t maxLaunch_ = 0;
  cudaMemPool_t pool_ = nullptr;
  uint64_t compared_ = 0;
  uint64_t digest_ = 0;
};

bool parseSize(const char* text, uint64_t* out) {
  char* end = nullptr;
  unsigned long long value = std::strtoull(text, &end, 10);
  if (end == text) return false;
  uint64_t scale = 1;
  if (*end == 'K' || *end == 'k') scale = 1ull << 10, ++end;
  else if (*end == 'M' || *end == 'm') scale = 1ull << 20, ++end;
  else if (*end == 'G' || *end == 'g') scale = 1ull << 30, ++end;
  if (*end == 'i') ++end;
  if (*end == 'B') ++end;
  if (*end != '\0') return false;
  *out = value * scale;
  return true;
}

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "stress-workload: %s\nusage: stress-workload [--seed S] [--ops N] [--threads T] "
               "[--max-bytes SIZE] [--peak-hint SIZE] [--check-every N] [--per-thread-stream 0|1] "
               "[--take-device SIZE] [--program-vmm 0|1] [--size-classes N]\n",
               why);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string name = argv[i];
    if (i + 1 >= argc) usage(("missing value for " + name).c_str());
    const char* value = argv[++i];
    uint64_t number = 0;
    if (!parseSize(value, &number)) usage(("bad value for " + name + ": " + value).c_str());
    if (name == "--seed") options.seed = number;
    else if (name == "--ops") options.ops = number;
    else if (name == "--threads") options.threads = static_cast<int>(number);
    else if (name == "--max-bytes") options.maxBytes = number;
    else if (name == "--peak-hint") options.peakHint = number;
    else if (name == "--check-every") options.checkEvery = number;
    else if (name == "--per-thread-stream") options.perThreadStream = number != 0;
    else if (name == "--take-device") options.takeDevice = number;
    else if (name == "--program-vmm") options.programVmm = number != 0;
    else if (name == "--size-classes") options.sizeClasses = number;
    else usage(("unknown option " + name).c_str());
  }
  if (options.threads < 1 || options.threads > 64) usage("--threads must be 1 to 64");
  if (options.maxBytes < kTableBytes) usage("--max-bytes must be at least 1MiB");
  if (options.ops == 0) usage("--ops must be positive");

  register_kernels();
  std::vector<std::unique_ptr<Worker>> workers;
  std::vector<std::thread> threads;
  const uint64_t perThread = std::max<uint64_t>(options.ops / options.threads, 1);
  for (int t = 0; t < options.threads; ++t) workers.push_back(std::make_unique<Worker>(options, t));
  for (int t = 0; t < options.threads; ++t) threads.emplace_back([&, t] { workers[t]->run(perThread); });
  for (std::thread& t : threads) t.join();
  CHECK(cudaDeviceSynchronize());

  uint64_t peak = 0, compared = 0, digest = 0, maxLaunch = 0;
  for (const auto& w : workers) {
    peak += w->peak();
    maxLaunch = std::max(maxLaunch, w->maxLaunch());
    compared += w->compared();
    digest = splitmix(digest ^ w->finalDigest());
  }
  if (gFailed.load()) return 1;
  std::printf("peak_live_bytes: %" PRIu64 "\n", peak);
  std::printf("max_launch_mapped_bytes: %" PRIu64 "\n", maxLaunch);
  std::printf("live_peak_bytes: %" PRIu64 "\n", gLivePeakBytes.load());
  std::printf("digest: %016" PRIx64 "\n", digest);
  std::printf("stress: ok ops=%" PRIu64 " compared_bytes=%" PRIu64 "\n", perThread * options.threads,
              compared);
  return 0;
}
