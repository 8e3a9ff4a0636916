// The DELTA trace file format (version 1): the record structs both the writer (in the shim) and
// the reader (in the tools) use, and their little-endian encoders. The full description, byte by
// byte, is docs/trace-format.md; this comment is the summary a reader of the code needs.
//
// File    = FileHeader, then Chunks until the end of the file.
// Header  = "DELTATRC" (8 bytes), u16 format_version, u16 reserved (must be 0), u32 body_bytes, then
//           body_bytes of fields: u64 start_realtime_ns (since the epoch), u64 start_monotonic_ns
//           (CLOCK_MONOTONIC at start: every record time is on that clock), u64 device_memory,
//           u64 budget, u32 pid, i32 rank (-1: none), four strings (u16 length + bytes):
//           producer version, device name, policy, options ("key=value" lines), and last a u64
//           checksum of the fields before it. A newer minor revision may add fields before the
//           checksum: readers skip what they do not know using body_bytes.
// Chunk   = u32 tag "CHNK", u32 payload_bytes, u32 thread (0: the writer's own tables),
//           u32 record_count, u64 checksum (of payload, thread and count), then the payload:
//           whole records.
//           One chunk is one thread's buffer, written with one write(2): records of one thread
//           are in order; records of different threads interleave by chunk (within the flush
//           interval). A crash leaves whole chunks; a full disk may leave a partial last one.
// Record  = u32 word: type (low 8 bits) | payload_bytes << 8, then the payload. Unknown types are
//           skipped (forward compatibility); a known type shorter than its fixed part is corrupt.
//
// Units: times in ns on CLOCK_MONOTONIC; sizes in bytes; buffer ids are the shim's (u64, never 0;
// 0 means "none"); name ids (u32) refer to String records (0: none); stack ids (u32) to Stack
// records (0: none). Tables come before first use (the writer guarantees it; readers tolerate a
// missing name and show "#id").
//
// Deliberately self-describing: each record carries what a reader needs to update resident and
// host byte counts without knowing the order of other threads' records (Free says where the
// buffer was), so timelines can be derived from events alone.
//
// Header-only, no allocation, no exceptions: the encoders run on the shim's launch path.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

namespace delta::trace {

static_assert(std::endian::native == std::endian::little,
              "the trace encoders copy host integers as they are: little-endian hosts only");

inline constexpr char kMagic[8] = {'D', 'E', 'L', 'T', 'A', 'T', 'R', 'C'};
inline constexpr std::uint16_t kFormatVersion = 1;
inline constexpr std::uint32_t kChunkTag = 0x4b4e4843;  // "CHNK" as bytes on disk
inline constexpr std::size_t kFileHeaderFixed = 16;     // magic + version + reserved + body_bytes
inline constexpr std::size_t kChunkHeaderBytes = 24;
inline constexpr std::size_t kRecordHeaderBytes = 4;
// Readers refuse larger chunks as corrupt; the writer's buffers are far smaller.
inline constexpr std::uint32_t kMaxChunkPayload = 16u << 20;
inline constexpr std::uint32_t kMaxRecordPayload = (1u << 24) - 1;
inline constexpr std::uint32_t kMaxHeaderBody = 1u << 20;
// The writer keeps launches and stacks below these so one record always fits a thread buffer.
inline constexpr std::uint32_t kMaxLaunchBuffers = 8192;
inline constexpr std::uint32_t kMaxStackFrames = 256;

enum class RecordType : std::uint8_t {
  kString = 1,
  kStack = 2,
  kAlloc = 3,
  kFree = 4,
  kLaunch = 5,
  kCopy = 6,
  kMemset = 7,
  kEvict = 8,
  kRestore = 9,
  kRecompute = 10,
  kBudgetChange = 11,
  kOverBudget = 12,
  kIteration = 13,
  kClose = 14,
  kPlan = 15,
};
inline constexpr std::uint8_t kLastRecordType = 15;

const char* recordTypeName(RecordType t);

enum class CopyKind : std::uint8_t {
  kHostToHost = 0,
  kHostToDevice = 1,
  kDeviceToHost = 2,
  kDeviceToDevice = 3,
  kDefault = 4,  // cudaMemcpyDefault: direction inferred by the driver
  kPeer = 5,
};
const char* copyKindName(CopyKind k);

// Where a buffer's contents were when it was freed; kUnmanaged: a buffer the shim did not manage
// (an Alloc without kAllocManaged), always resident.
enum class Residency : std::uint8_t { kResident = 0, kOnHost = 1, kDropped = 2, kUnmanaged = 3 };

// ---- Records. Field order here is the order on disk. ----

struct FileHeader {
  std::uint16_t format_version = kFormatVersion;
  std::uint64_t start_realtime_ns = 0;
  std::uint64_t start_monotonic_ns = 0;
  std::uint64_t device_memory = 0;
  std::uint64_t budget = 0;  // 0: no budget
  std::uint32_t pid = 0;
  std::int32_t rank = -1;
  std::string_view producer;  // e.g. "libdelta 0.1.0"
  std::string_view device_name;
  std::string_view policy;
  std::string_view options;  // "key=value" lines, '\n'-separated
};

struct StringRecord {  // 4 + n bytes
  std::uint32_t id = 0;
  std::string_view text;
};

struct StackFrame {
  std::uint64_t address = 0;  // return address
  std::uint32_t name = 0;     // symbol name id; 0: not resolved (symbolise offline)
};

struct StackRecord {  // 8 + 12n bytes: u32 id, u32 n, n x {u64 address, u32 name}
  std::uint32_t id = 0;
  std::span<const StackFrame> frames;
};

inline constexpr std::uint8_t kAllocManaged = 1;  // the shim manages (may evict) this buffer

struct AllocRecord {  // 45 bytes
  std::uint64_t time_ns = 0;
  std::uint64_t buffer = 0;
  std::uint64_t address = 0;
  std::uint64_t bytes = 0;
  std::uint64_t stream = 0;  // 0: none / legacy default stream
  std::uint32_t stack = 0;
  std::uint8_t flags = 0;    // kAllocManaged
};

struct FreeRecord {  // 25 bytes
  std::uint64_t time_ns = 0;
  std::uint64_t buffer = 0;
  std::uint64_t bytes = 0;
  Residency residency = Residency::kResident;
};

inline constexpr std::uint8_t kLaunchAnalysed = 1;   // the buffers list is complete
inline constexpr std::uint8_t kLaunchTruncated = 2;  // more than kMaxLaunchBuffers: list cut

struct LaunchRecord {  // 49 + 8n bytes
  std::uint64_t time_ns = 0;
  std::uint64_t stream = 0;
  std::uint32_t kernel = 0;  // name id
  std::uint32_t grid[3] = {0, 0, 0};
  std::uint32_t block[3] = {0, 0, 0};
  std::uint8_t flags = 0;                   // kLaunchAnalysed, kLaunchTruncated
  std::span<const std::uint64_t> buffers;   // managed buffers touched (u32 count + ids on disk)
};

struct CopyRecord {  // 41 bytes
  std::uint64_t time_ns = 0;
  std::uint64_t bytes = 0;
  std::uint64_t stream = 0;
  std::uint64_t dst = 0;  // managed buffer id or 0
  std::uint64_t src = 0;  // managed buffer id or 0
  CopyKind kind = CopyKind::kDefault;
};

struct MemsetRecord {  // 32 bytes
  std::uint64_t time_ns = 0;
  std::uint64_t buffer = 0;
  std::uint64_t bytes = 0;
  std::uint64_t stream = 0;
};

// Evict, Restore and Recompute share one layout (53 bytes). The time between start and end is
// the operation; stall is how long the job waited for it (0 when it was hidden); kernel is the
// launch that waited (name id, 0: none); stream is where the copy or recompute ran.
inline constexpr std::uint8_t kEvictDrop = 1;         // Evict: dropped, not copied to host
inline constexpr std::uint8_t kRestorePrefetched = 1;  // Restore: started ahead of the use

struct MovementRecord {
  std::uint64_t start_ns = 0;
  std::uint64_t end_ns = 0;
  std::uint64_t buffer = 0;
  std::uint64_t bytes = 0;
  std::uint64_t stall_ns = 0;
  std::uint64_t stream = 0;
  std::uint32_t kernel = 0;
  std::uint8_t flags = 0;
};
using EvictRecord = MovementRecord;
using RestoreRecord = MovementRecord;
using RecomputeRecord = MovementRecord;

struct BudgetChangeRecord {  // 16 bytes
  std::uint64_t time_ns = 0;
  std::uint64_t budget = 0;
};

struct OverBudgetRecord {  // 28 bytes: a launch whose working set alone exceeds the budget
  std::uint64_t time_ns = 0;
  std::uint32_t kernel = 0;
  std::uint64_t working_set = 0;
  std::uint64_t budget = 0;
};

struct IterationRecord {  // 16 bytes: the start of training iteration `index`
  std::uint64_t time_ns = 0;
  std::uint64_t index = 0;
};

// The policy adopted a plan for the iteration it learned (policy/planner.h), made on the shim's
// planner thread. 33 bytes.
struct PlanRecord {
  std::uint64_t time_ns = 0;       // when it was handed to the policy
  std::uint64_t planning_ns = 0;   // the planner thread's time on it (wall clock)
  std::int64_t predicted_ns = -1;  // the chosen candidate's iteration time in its replay; -1: none
  std::uint32_t launches = 0;      // the iteration planned, in launches
  std::uint32_t name = 0;          // string id: the plan as `delta-trace replay` names it
  std::uint8_t flags = 0;          // 1: planned (else the iteration fits the budget or is unusable)
};

// The job's totals as the shim counted them, plus the writer's own counts. 88 bytes.
struct CloseTotals {
  std::uint64_t peak_resident = 0;
  std::uint64_t bytes_h2d = 0;  // restores
  std::uint64_t bytes_d2h = 0;  // evictions by swap
  std::uint64_t evictions = 0;
  std::uint64_t restores = 0;
  std::uint64_t recomputes = 0;
  std::uint64_t stall_ns = 0;
  std::uint64_t over_budget_launches = 0;
};
struct CloseRecord {
  std::uint64_t time_ns = 0;
  CloseTotals totals;
  std::uint64_t records_written = 0;  // records the writer put in the file before this one
  std::uint64_t records_dropped = 0;  // records lost to a full queue or a failed write
};

inline constexpr std::uint32_t kAllocBytes = 45;
inline constexpr std::uint32_t kFreeBytes = 25;
inline constexpr std::uint32_t kLaunchFixedBytes = 49;
inline constexpr std::uint32_t kCopyBytes = 41;
inline constexpr std::uint32_t kMemsetBytes = 32;
inline constexpr std::uint32_t kMovementBytes = 53;
inline constexpr std::uint32_t kBudgetChangeBytes = 16;
inline constexpr std::uint32_t kOverBudgetBytes = 28;
inline constexpr std::uint32_t kIterationBytes = 16;
inline constexpr std::uint32_t kCloseBytes = 88;
inline constexpr std::uint32_t kPlanBytes = 33;
inline constexpr std::uint32_t kStackFixedBytes = 8;
inline constexpr std::uint32_t kStackFrameBytes = 12;
inline constexpr std::uint32_t kStringFixedBytes = 4;

// ---- Encoding. Each encode*() writes header + payload at p and returns the end. The caller
// reserves recordSize(payload) bytes first. ----

namespace detail {
template <class T>
inline char* put(char* p, T v) {
  std::memcpy(p, &v, sizeof v);
  return p + sizeof v;
}
inline char* putHeader(char* p, RecordType t, std::uint32_t payload) {
  return put<std::uint32_t>(p, static_cast<std::uint32_t>(t) | (payload << 8));
}
}  // namespace detail

constexpr std::size_t recordSize(std::uint32_t payload) { return kRecordHeaderBytes + payload; }

inline std::uint32_t payloadSize(const StringRecord& r) {
  return kStringFixedBytes + static_cast<std::uint32_t>(r.text.size());
}
inline std::uint32_t payloadSize(const StackRecord& r) {
  return kStackFixedBytes + kStackFrameBytes * static_cast<std::uint32_t>(r.frames.size());
}
inline std::uint32_t payloadSize(const LaunchRecord& r) {
  return kLaunchFixedBytes + 8 * static_cast<std::uint32_t>(r.buffers.size());
}

inline char* encode(char* p, const StringRecord& r) {
  using detail::put;
  p = detail::putHeader(p, RecordType::kString, payloadSize(r));
  p = put(p, r.id);
  if (!r.text.empty()) std::memcpy(p, r.text.data(), r.text.size());
  return p + r.text.size();
}

inline char* encode(char* p, const StackRecord& r) {
  using detail::put;
  p = detail::putHeader(p, RecordType::kStack, payloadSize(r));
  p = put(p, r.id);
  p = put(p, static_cast<std::uint32_t>(r.frames.size()));
  for (const StackFrame& f : r.frames) {
    p = put(p, f.address);
    p = put(p, f.name);
  }
  return p;
}

inline char* encode(char* p, const AllocRecord& r) {
  using detail::put;
  p = detail::putHeader(p, RecordType::kAlloc, kAllocBytes);
  p = put(p, r.time_ns);
  p = put(p, r.buffer);
  p = put(p, r.address);
  p = put(p, r.bytes);
  p = put(p, r.stream);
  p = put(p, r.stack);
  return put(p, r.flags);
}

inline char* encode(char* p, const FreeRecord& r) {
  using detail::put;
  p = detail::putHeader(p, RecordType::kFree, kFreeBytes);
  p = put(p, r.time_ns);
  p = put(p, r.buffer);
  p = put(p, r.bytes);
  return put(p, static_cast<std::uint8_t>(r.residency));
}

inline char* encode(char* p, const LaunchRecord& r) {
  using detail::put;
  p = detail::putHeader(p, RecordType::kLaunch, payloadSize(r));
  p = put(p, r.time_ns);
  p = put(p, r.stream);
  p = put(p, r.kernel);
  std::memcpy(p, r.grid, 12);
  std::memcpy(p + 12, r.block, 12);
  p += 24;
  p = put(p, r.flags);
  p = put(p, static_cast<std::uint32_t>(r.buffers.size()));
  if (!r.buffers.empty()) std::memcpy(p, r.buffers.data(), 8 * r.buffers.size());
  return p + 8 * r.buffers.size();
}

inline char* encode(char* p, const CopyRecord& r) {
  using detail::put;
  p = detail::putHeader(p, RecordType::kCopy, kCopyBytes);
  p = put(p, r.time_ns);
  p = put(p, r.bytes);
  p = put(p, r.stream);
  p = put(p, r.dst);
  p = put(p, r.src);
  return put(p, static_cast<std::uint8_t>(r.kind));
}

inline char* encode(char* p, const MemsetRecord& r) {
  using detail::put;
  p = detail::putHeader(p, RecordType::kMemset, kMemsetBytes);
  p = put(p, r.time_ns);
  p = put(p, r.buffer);
  p = put(p, r.bytes);
  return put(p, r.stream);
}

// type: kEvict, kRestore or kRecompute.
inline char* encode(char* p, RecordType type, const MovementRecord& r) {
  using detail::put;
  p = detail::putHeader(p, type, kMovementBytes);
  p = put(p, r.start_ns);
  p = put(p, r.end_ns);
  p = put(p, r.buffer);
  p = put(p, r.bytes);
  p = put(p, r.stall_ns);
  p = put(p, r.stream);
  p = put(p, r.kernel);
  return put(p, r.flags);
}

inline char* encode(char* p, const BudgetChangeRecord& r) {
  using detail::put;
  p = detail::putHeader(p, RecordType::kBudgetChange, kBudgetChangeBytes);
  p = put(p, r.time_ns);
  return put(p, r.budget);
}

inline char* encode(char* p, const OverBudgetRecord& r) {
  using detail::put;
  p = detail::putHeader(p, RecordType::kOverBudget, kOverBudgetBytes);
  p = put(p, r.time_ns);
  p = put(p, r.kernel);
  p = put(p, r.working_set);
  return put(p, r.budget);
}

inline char* encode(char* p, const IterationRecord& r) {
  using detail::put;
  p = detail::putHeader(p, RecordType::kIteration, kIterationBytes);
  p = put(p, r.time_ns);
  return put(p, r.index);
}

inline char* encode(char* p, const PlanRecord& r) {
  using detail::put;
  p = detail::putHeader(p, RecordType::kPlan, kPlanBytes);
  p = put(p, r.time_ns);
  p = put(p, r.planning_ns);
  p = put(p, r.predicted_ns);
  p = put(p, r.launches);
  p = put(p, r.name);
  return put(p, r.flags);
}

inline char* encode(char* p, const CloseRecord& r) {
  using detail::put;
  p = detail::putHeader(p, RecordType::kClose, kCloseBytes);
  p = put(p, r.time_ns);
  const CloseTotals& t = r.totals;
  for (std::uint64_t v : {t.peak_resident, t.bytes_h2d, t.bytes_d2h, t.evictions, t.restores,
                          t.recomputes, t.stall_ns, t.over_budget_launches}) {
    p = put(p, v);
  }
  p = put(p, r.records_written);
  return put(p, r.records_dropped);
}

// The header as bytes (fixed part + body + checksum). Returns the size; writes nothing when
// `out` is null (size query). Strings longer than 65535 bytes are cut.
std::size_t encodeFileHeader(const FileHeader& h, char* out);

// Checksum of chunk payloads and the header: four interleaved multiply-xor lanes over 8-byte
// words (fast enough that the reader's target of 20 M records/s is not limited by it); any
// change of one aligned word changes the result.
std::uint64_t checksum(const void* data, std::size_t n);
// A chunk's checksum also covers its thread and record count (an odd multiplier keeps any
// change of either visible).
inline std::uint64_t chunkChecksum(const void* payload, std::size_t n, std::uint32_t thread,
                                   std::uint32_t records) {
  return checksum(payload, n) ^
         (((static_cast<std::uint64_t>(thread) << 32) | records) * 0xc2b2ae3d27d4eb4full);
}

}  // namespace delta::trace
