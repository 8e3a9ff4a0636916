// TraceWriter: records a job's memory events into a trace file (format.h) at next to no cost to
// the job. Used by the shim; depends on nothing but libc and libstdc++.
//
// How it stays cheap (the record path, e.g. launch(), costs ~tens of ns; bench/bench_trace):
// - each thread encodes its records into its own preallocated buffer (256 KiB by default,
//   allocated when the thread records for the first time), guarded by a spin flag that only
//   the writer's background thread ever contends for (to take a buffer at a flush);
// - a full buffer is handed to the background thread through a bounded queue (a short mutex,
//   never held during I/O); when the queue is full the buffer's records are dropped and counted;
// - the background thread writes chunks with write(2); on any write error (ENOSPC, EIO, ...) it
//   reports one line through the error callback, stops writing and counts every later record as
//   dropped. Nothing on the record path allocates (after a thread's first record), throws,
//   prints or waits for I/O.
// - every flush_interval_ms the background thread also takes the buffers that have data, so a
//   crash loses little and threads' records stay close in time in the file.
//
// Contract:
// - open() once, before recording; record from any thread; close() once at the end (further
//   calls do nothing). close() may run from an atexit handler or a destructor: it takes every
//   thread's pending records (waiting for a thread that is inside a record call), drains the
//   queue, writes the Close record and joins the background thread. Records made after close()
//   started are ignored.
// - after fork(), call onForkChild() in the child: it disables recording there and forgets the
//   parent's thread and buffers without touching them (the child's descriptor is closed; the
//   parent's file and thread are unaffected).
// - the background thread blocks all signals, so a job's signal handlers never run on it
//   (heaptrack learned this when a SIGPROF-based profiler crashed in its writer thread).
// - a write that would pass the process's file size limit (RLIMIT_FSIZE) is not attempted: it
//   fails as EFBIG would, without the SIGXFSZ that would end the job (close() writes from the
//   job's own thread).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <pthread.h>

#include "trace/format.h"

namespace delta::trace {

struct WriterOptions {
  std::string path;             // may contain %p (pid), %r (rank) and %% (a percent sign)
  bool overwrite = false;       // replace an existing file that is not a DELTA trace
  std::size_t buffer_bytes = 256 << 10;
  std::size_t queue_buffers = 64;  // full buffers waiting for the disk before records drop
  std::uint32_t flush_interval_ms = 200;
  // Called once, from the background thread or close(), with a one-line message (no newline)
  // when writing fails. Null: the writer says nothing.
  void (*on_error)(const char* message, void* context) = nullptr;
  void* error_context = nullptr;
};

// Header fields the caller knows; pid and times default to the current process and clocks.
struct TraceInfo {
  std::string producer;
  std::string device_name;
  std::uint64_t device_memory = 0;
  std::uint64_t budget = 0;
  std::string policy;
  std::string options;  // "key=value" lines
  std::uint64_t start_realtime_ns = 0;   // 0: now
  std::uint64_t start_monotonic_ns = 0;  // 0: now
  std::uint32_t pid = 0;                 // 0: getpid()
  std::int32_t rank = -2;                // -2: from RANK, else LOCAL_RANK, else -1 (none)
};

struct WriterCounts {
  std::uint64_t written = 0;  // records in the file (excluding the Close record)
  std::uint64_t dropped = 0;
  bool failed = false;        // a write failed (and on_error has said so)
};

class TraceWriter {
 public:
  TraceWriter() = default;
  ~TraceWriter();  // close() with zero totals if still open
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  // Expands %p, %r and %% in `pattern`; rank is RANK, else LOCAL_RANK, else "0".
  static std::string expandPath(std::string_view pattern, std::uint32_t pid);

  // Creates the file (mode 0600, never through a symbolic link) and starts the background
  // thread. An existing file is replaced only if it is a DELTA trace, empty, or overwrite is
  // set, and never while another process's writer has it open (an flock held while open).
  // Returns "" on success, else one line saying why (nothing is recorded then).
  std::string open(const WriterOptions& options, const TraceInfo& info);
  const std::string& path() const { return path_; }

  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }

  // Name table. internString() is thread-safe (a lock and a hash: call it once per name).
  // internName() is for `const char*` names that stay valid and unchanged for the process's
  // life (kernel names): it is answered from a per-thread cache keyed by the pointer.
  // Both return 0 when the writer is not enabled.
  std::uint32_t internString(std::string_view text);
  std::uint32_t internName(const char* stable_name);
  // Stack table: the return addresses of one call stack (innermost first), optionally with
  // symbol name ids (same length, or empty). Stored once; returns its id (0: none / disabled).
  // More than kMaxStackFrames frames are cut.
  std::uint32_t internStack(std::span<const std::uint64_t> addresses,
                            std::span<const std::uint32_t> names = {});

  // Record calls: cheap, never block on I/O, thread-safe (each thread its own buffer).
  void alloc(const AllocRecord& r);
  void free(const FreeRecord& r);
  void launch(const LaunchRecord& r);  // more than kMaxLaunchBuffers ids: cut, flagged
  void copy(const CopyRecord& r);
  void memset(const MemsetRecord& r);
  void evict(const EvictRecord& r);
  void restore(const RestoreRecord& r);
  void recompute(const RecomputeRecord& r);
  void budgetChange(const BudgetChangeRecord& r);
  void overBudget(const OverBudgetRecord& r);
  void iteration(const IterationRecord& r);
  void plan(const PlanRecord& r);

  // Flushes, writes the Close record (time_ns 0: now) with the caller's totals and the writer's
  // counts, closes the file. Idempotent. Returns the counts.
  WriterCounts close(const CloseTotals& totals, std::uint64_t time_ns = 0);
  // In a forked child: see the file comment.
  void onForkChild();

  // Records dropped so far (queue full, write failed).
  std::uint64_t droppedSoFar() const { return dropped_.load(std::memory_order_relaxed); }

  struct ThreadBuffer;  // per-thread state (trace_writer.cpp)

 private:
  struct Chunk {
    char* data = nullptr;
    std::size_t bytes = 0;
    std::uint32_t records = 0;
    std::uint32_t thread = 0;
  };

  ThreadBuffer* attach();
  ThreadBuffer* threadBuffer();
  template <class Encode>
  void append(std::size_t bytes, Encode encode);
  bool handOff(ThreadBuffer* b, bool drop_if_full);
  char* takeBlock(bool may_allocate);
  void movement(RecordType type, const MovementRecord& r);
  void appendTable(const char* bytes, std::size_t n);
  static void* threadMain(void* self);
  void run();
  void flushThreadBuffers(bool at_close);
  bool writeChunk(const char* payload, std::size_t bytes, std::uint32_t records,
                  std::uint32_t thread);
  bool writeAll(const char* data, std::size_t n);
  // True when writing n more bytes would pass the process's file size limit (RLIMIT_FSIZE).
  bool passesFileSizeLimit(std::size_t n) const;
  void fail(const char* what, int err);

  WriterOptions options_;
  std::string path_;
  int fd_ = -1;
  std::uint64_t generation_ = 0;  // unique per open(): per-thread state from older opens is stale
  std::atomic<bool> enabled_{false};
  bool opened_ = false;
  bool thread_started_ = false;
  bool failed_ = false;  // background thread (and close() after the join) only
  pthread_t thread_{};

  // mutex_ guards everything below it. Lock order: a ThreadBuffer's spin flag, then mutex_.
  std::mutex mutex_;
  std::vector<ThreadBuffer*> threads_;  // owned
  std::vector<char*> free_blocks_;
  std::size_t blocks_ = 0;  // allocated so far
  std::vector<Chunk> queue_;
  // String/Stack records not yet written, in pieces of at most kTablePieceBytes; the
  // background thread writes them before any chunk it takes after them, so a name or stack is
  // always in the file before the first record that uses it.
  struct TablePiece {
    std::string bytes;
    std::uint32_t records = 0;
  };
  std::vector<TablePiece> tables_;
  std::string header_;  // written first by the background thread
  bool stop_ = false;
  std::condition_variable wake_;
  std::unordered_map<std::string, std::uint32_t> strings_;
  std::unordered_map<std::uint64_t, std::vector<std::uint32_t>> stacks_by_hash_;
  std::vector<std::vector<StackFrame>> stacks_;  // index id-1
  std::uint32_t next_thread_ = 1;

  std::atomic<std::uint64_t> dropped_{0};
  std::atomic<std::uint64_t> written_{0};
  std::atomic<bool> closing_{false};
};

}  // namespace delta::trace
