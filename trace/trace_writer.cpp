// TraceWriter: per-thread record buffers, a bounded hand-off queue and a background thread that
// writes chunks. See trace_writer.h for the contract and the cost of the record path.
//
// Record path rules (it runs inside the job's cudaLaunchKernel): no allocation except a thread's
// first buffer and, rarely, a spare block when a buffer is handed off; no exceptions; no I/O;
// the only lock is the thread's own spin flag, which the background thread holds for a few
// instructions when it takes a buffer at a periodic flush or at close().
#include "trace/trace_writer.h"

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

namespace delta::trace {

struct TraceWriter::ThreadBuffer {
  std::atomic<bool> busy{false};  // spin flag: the owner while recording; a flusher briefly
  bool dead = false;              // close() took it: record nothing more
  char* data = nullptr;           // null when no block could be had (records are dropped)
  std::size_t used = 0;
  std::uint32_t records = 0;
  std::uint32_t index = 0;  // the chunk's thread number
  pthread_t owner{};
};

namespace {

constexpr std::size_t kTablePieceBytes = 1 << 20;
constexpr std::size_t kMaxStringBytes = 1 << 20;
constexpr std::size_t kMaxThreads = 4096;

std::atomic<std::uint64_t> g_generation{0};

struct TlsSlot {
  std::uint64_t generation = 0;
  TraceWriter::ThreadBuffer* buffer = nullptr;
};
thread_local TlsSlot t_slot;

// Direct-mapped cache of internName(): pointer -> id, valid for one writer generation.
struct NameCacheEntry {
  std::uint64_t generation = 0;
  const char* name = nullptr;
  std::uint32_t id = 0;
};
constexpr std::size_t kNameCacheSize = 128;
thread_local NameCacheEntry t_names[kNameCacheSize];

std::uint64_t clockNs(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull +
         static_cast<std::uint64_t>(ts.tv_nsec);
}

void spinLock(std::atomic<bool>& flag) {
  while (flag.exchange(true, std::memory_order_acquire)) {
    while (flag.load(std::memory_order_relaxed)) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
  }
}

void spinUnlock(std::atomic<bool>& flag) { flag.store(false, std::memory_order_release); }

const char* rankFromEnv() {
  if (const char* r = std::getenv("RANK"); r != nullptr && *r != '\0') return r;
  if (const char* r = std::getenv("LOCAL_RANK"); r != nullptr && *r != '\0') return r;
  return nullptr;
}

// Takes the writer's lock on the trace file: an exclusive flock, held as long as the file is
// open (forked children share it; exec'd ones do not inherit the descriptor). A second
// process given the same DELTA_TRACE (an exec'd child, a second job) finds it taken and must
// not truncate or interleave its records into the file.
bool lockForWriting(int fd) {
  int rc;
  do {
    rc = flock(fd, LOCK_EX | LOCK_NB);
  } while (rc != 0 && errno == EINTR);
  return rc == 0 || errno != EWOULDBLOCK;  // a file system without locks: nothing to check
}

std::string inUseMessage(const std::string& path) {
  return "trace file " + path + " is being written by another process; put %p in DELTA_TRACE "
         "to give each process a file of its own";
}

std::uint64_t hashFrames(std::span<const std::uint64_t> a, std::span<const std::uint32_t> n) {
  return checksum(a.data(), a.size_bytes()) ^ (checksum(n.data(), n.size_bytes()) * 31);
}

}  // namespace

TraceWriter::~TraceWriter() {
  if (opened_) close(CloseTotals{});
  for (ThreadBuffer* b : threads_) {
    delete[] b->data;
    delete b;
  }
  for (char* block : free_blocks_) delete[] block;
}

std::string TraceWriter::expandPath(std::string_view pattern, std::uint32_t pid) {
  std::string out;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '%' || i + 1 == pattern.size()) {
      out += pattern[i];
      continue;
    }
    const char c = pattern[++i];
    if (c == 'p') {
      out += std::to_string(pid);
    } else if (c == 'r') {
      const char* r = rankFromEnv();
      out += r != nullptr ? r : "0";
    } else if (c == '%') {
      out += '%';
    } else {
      out += '%';
      out += c;
    }
  }
  return out;
}

std::string TraceWriter::open(const WriterOptions& options, const TraceInfo& info) {
  if (opened_) return "trace: the writer is already open";
  options_ = options;
  if (options_.buffer_bytes < 128 << 10) options_.buffer_bytes = 128 << 10;  // > largest record
  if (options_.buffer_bytes > kMaxChunkPayload) options_.buffer_bytes = kMaxChunkPayload;
  if (options_.queue_buffers < 1) options_.queue_buffers = 1;
  const std::uint32_t pid = info.pid != 0 ? info.pid : static_cast<std::uint32_t>(getpid());
  path_ = expandPath(options.path, pid);
  if (path_.empty()) return "trace: empty file name";

  int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd >= 0 && !lockForWriting(fd)) {
    // Another process opened the file between our creating and locking it, and holds it.
    ::close(fd);
    return inUseMessage(path_);
  }
  if (fd < 0 && errno == EEXIST) {
    struct stat st {};
    if (lstat(path_.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
      return "trace file " + path_ + " is a symbolic link; refusing to write through it";
    }
    fd = ::open(path_.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
      if (errno == ELOOP) {
        return "trace file " + path_ + " is a symbolic link; refusing to write through it";
      }
      return "cannot open trace file " + path_ + ": " + std::strerror(errno);
    }
    if (fstat(fd, &st) != 0) st.st_mode = 0;
    if (S_ISREG(st.st_mode) && !lockForWriting(fd)) {
      ::close(fd);
      return inUseMessage(path_);
    }
    if (S_ISREG(st.st_mode)) {
      char magic[sizeof kMagic] = {};
      const bool is_trace = st.st_size == 0 ||
                            (pread(fd, magic, sizeof magic, 0) == sizeof magic &&
                             std::memcmp(magic, kMagic, sizeof magic) == 0);
      if (!is_trace && !options.overwrite) {
        ::close(fd);
        return "trace file " + path_ + " exists and is not a DELTA trace; not overwriting it";
      }
      if (ftruncate(fd, 0) != 0) {
        const int err = errno;
        ::close(fd);
        return "cannot truncate trace file " + path_ + ": " + std::strerror(err);
      }
      (void)fchmod(fd, 0600);
    } else if (!options.overwrite) {
      ::close(fd);
      return "trace file " + path_ + " exists and is not a regular file; not writing to it";
    }
  } else if (fd < 0) {
    return "cannot create trace file " + path_ + ": " + std::strerror(errno);
  }

  FileHeader h;
  h.start_realtime_ns = info.start_realtime_ns != 0 ? info.start_realtime_ns : clockNs(CLOCK_REALTIME);
  h.start_monotonic_ns =
      info.start_monotonic_ns != 0 ? info.start_monotonic_ns : clockNs(CLOCK_MONOTONIC);
  h.device_memory = info.device_memory;
  h.budget = info.budget;
  h.pid = pid;
  if (info.rank != -2) {
    h.rank = info.rank;
  } else if (const char* r = rankFromEnv()) {
    h.rank = static_cast<std::int32_t>(std::strtol(r, nullptr, 10));
  }
  h.producer = info.producer;
  h.device_name = info.device_name;
  h.policy = info.policy;
  h.options = info.options;
  header_.resize(encodeFileHeader(h, nullptr));
  encodeFileHeader(h, header_.data());

  fd_ = fd;
  generation_ = g_generation.fetch_add(1, std::memory_order_relaxed) + 1;
  stop_ = false;
  failed_ = false;
  // The thread inherits this thread's signal mask: block everything around its creation so no
  // signal meant for the job is ever delivered to it.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  const int rc = pthread_create(&thread_, nullptr, &TraceWriter::threadMain, this);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (rc != 0) {
    ::close(fd_);
    fd_ = -1;
    return "cannot start the trace writer thread: " + std::string(std::strerror(rc));
  }
  thread_started_ = true;
  opened_ = true;
  enabled_.store(true, std::memory_order_release);
  return {};
}

// ---- Tables ----

void TraceWriter::appendTable(const char* bytes, std::size_t n) {
  // mutex_ held.
  if (tables_.empty() || tables_.back().bytes.size() + n > kTablePieceBytes) tables_.emplace_back();
  tables_.back().bytes.append(bytes, n);
  tables_.back().records++;
  wake_.notify_one();
}

std::uint32_t TraceWriter::internString(std::string_view text) {
  if (!enabled()) return 0;
  if (text.size() > kMaxStringBytes) text = text.substr(0, kMaxStringBytes);
  std::lock_guard<std::mutex> lock(mutex_);
  auto [it, inserted] = strings_.try_emplace(std::string(text), 0);
  if (!inserted) return it->second;
  it->second = static_cast<std::uint32_t>(strings_.size());
  StringRecord r{it->second, text};
  std::string bytes(recordSize(payloadSize(r)), '\0');
  encode(bytes.data(), r);
  appendTable(bytes.data(), bytes.size());
  return it->second;
}

std::uint32_t TraceWriter::internName(const char* stable_name) {
  if (stable_name == nullptr || !enabled()) return 0;
  NameCacheEntry& e =
      t_names[(reinterpret_cast<std::uintptr_t>(stable_name) >> 4) % kNameCacheSize];
  if (e.generation == generation_ && e.name == stable_name) return e.id;
  const std::uint32_t id = internString(stable_name);
  e = NameCacheEntry{generation_, stable_name, id};
  return id;
}

std::uint32_t TraceWriter::internStack(std::span<const std::uint64_t> addresses,
                                       std::span<const std::uint32_t> names) {
  if (!enabled() || addresses.empty()) return 0;
  if (addresses.size() > kMaxStackFrames) addresses = addresses.first(kMaxStackFrames);
  if (names.size() != 0 && names.size() < addresses.size()) names = {};
  if (names.size() > addresses.size()) names = names.first(addresses.size());
  const std::uint64_t h = hashFrames(addresses, names);
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::uint32_t>& same_hash = stacks_by_hash_[h];
  for (std::uint32_t id : same_hash) {
    const std::vector<StackFrame>& f = stacks_[id - 1];
    if (f.size() != addresses.size()) continue;
    bool equal = true;
    for (std::size_t i = 0; i < f.size() && equal; ++i) {
      equal = f[i].address == addresses[i] && f[i].name == (names.empty() ? 0 : names[i]);
    }
    if (equal) return id;
  }
  std::vector<StackFrame> frames(addresses.size());
  for (std::size_t i = 0; i < frames.size(); ++i) {
    frames[i] = StackFrame{addresses[i], names.empty() ? 0u : names[i]};
  }
  stacks_.push_back(std::move(frames));
  const auto id = static_cast<std::uint32_t>(stacks_.size());
  same_hash.push_back(id);
  StackRecord r{id, stacks_.back()};
  std::string bytes(recordSize(payloadSize(r)), '\0');
  encode(bytes.data(), r);
  appendTable(bytes.data(), bytes.size());
  return id;
}

// ---- Record path ----

TraceWriter::ThreadBuffer* TraceWriter::attach() {
  // Cold: a thread's first record for this writer (or a thread that alternates writers).
  std::lock_guard<std::mutex> lock(mutex_);
  const pthread_t self = pthread_self();
  for (ThreadBuffer* b : threads_) {
    if (pthread_equal(b->owner, self)) {
      t_slot = TlsSlot{generation_, b};
      return b;
    }
  }
  if (threads_.size() >= kMaxThreads) return nullptr;
  auto* b = new (std::nothrow) ThreadBuffer;
  if (b == nullptr) return nullptr;
  b->owner = self;
  b->index = next_thread_++;
  b->data = takeBlock(true);
  threads_.push_back(b);
  t_slot = TlsSlot{generation_, b};
  return b;
}

inline TraceWriter::ThreadBuffer* TraceWriter::threadBuffer() {
  if (t_slot.generation == generation_) [[likely]] return t_slot.buffer;
  return attach();
}

char* TraceWriter::takeBlock(bool may_allocate) {
  // mutex_ held. Blocks: one per thread, the queue's, one being written: that bound is enough
  // for a hand-off to always find one when the queue has room.
  if (!free_blocks_.empty()) {
    char* b = free_blocks_.back();
    free_blocks_.pop_back();
    return b;
  }
  if (!may_allocate || blocks_ >= threads_.size() + options_.queue_buffers + 2) return nullptr;
  char* b = new (std::nothrow) char[options_.buffer_bytes];
  if (b != nullptr) ++blocks_;
  return b;
}

bool TraceWriter::handOff(ThreadBuffer* b, bool drop_if_full) {
  // b's spin flag held by the caller. Returns false when the buffer's records stayed (queue
  // full and !drop_if_full).
  std::lock_guard<std::mutex> lock(mutex_);
  if (b->used != 0 && b->data != nullptr) {
    const bool room = queue_.size() < options_.queue_buffers || closing_.load();
    char* fresh = room ? takeBlock(true) : nullptr;
    if (fresh == nullptr && !closing_.load()) {
      if (!drop_if_full) return false;
      dropped_.fetch_add(b->records, std::memory_order_relaxed);
    } else {
      queue_.push_back(Chunk{b->data, b->used, b->records, b->index});
      b->data = fresh;
      wake_.notify_one();
    }
    b->used = 0;
    b->records = 0;
  } else if (b->data == nullptr) {
    b->data = takeBlock(true);
  }
  return true;
}

template <class Encode>
void TraceWriter::append(std::size_t bytes, Encode encode_record) {
  if (!enabled_.load(std::memory_order_relaxed)) return;
  ThreadBuffer* b = threadBuffer();
  if (b == nullptr) [[unlikely]] {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  spinLock(b->busy);
  if (b->dead) [[unlikely]] {
    spinUnlock(b->busy);
    return;
  }
  if (b->data == nullptr || options_.buffer_bytes - b->used < bytes) [[unlikely]] {
    handOff(b, true);
    if (b->data == nullptr || options_.buffer_bytes - b->used < bytes) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      spinUnlock(b->busy);
      return;
    }
  }
  encode_record(b->data + b->used);
  b->used += bytes;
  b->records++;
  spinUnlock(b->busy);
}

void TraceWriter::alloc(const AllocRecord& r) {
  append(recordSize(kAllocBytes), [&](char* p) { encode(p, r); });
}
void TraceWriter::free(const FreeRecord& r) {
  append(recordSize(kFreeBytes), [&](char* p) { encode(p, r); });
}
void TraceWriter::launch(const LaunchRecord& r) {
  if (r.buffers.size() > kMaxLaunchBuffers) [[unlikely]] {
    LaunchRecord cut = r;
    cut.buffers = r.buffers.first(kMaxLaunchBuffers);
    cut.flags |= kLaunchTruncated;
    append(recordSize(payloadSize(cut)), [&](char* p) { encode(p, cut); });
    return;
  }
  append(recordSize(payloadSize(r)), [&](char* p) { encode(p, r); });
}
void TraceWriter::copy(const CopyRecord& r) {
  append(recordSize(kCopyBytes), [&](char* p) { encode(p, r); });
}
void TraceWriter::memset(const MemsetRecord& r) {
  append(recordSize(kMemsetBytes), [&](char* p) { encode(p, r); });
}
void TraceWriter::movement(RecordType type, const MovementRecord& r) {
  append(recordSize(kMovementBytes), [&](char* p) { encode(p, type, r); });
}
void TraceWriter::evict(const EvictRecord& r) { movement(RecordType::kEvict, r); }
void TraceWriter::restore(const RestoreRecord& r) { movement(RecordType::kRestore, r); }
void TraceWriter::recompute(const RecomputeRecord& r) { movement(RecordType::kRecompute, r); }
void TraceWriter::budgetChange(const BudgetChangeRecord& r) {
  append(recordSize(kBudgetChangeBytes), [&](char* p) { encode(p, r); });
}
void TraceWriter::overBudget(const OverBudgetRecord& r) {
  append(recordSize(kOverBudgetBytes), [&](char* p) { encode(p, r); });
}
void TraceWriter::iteration(const IterationRecord& r) {
  append(recordSize(kIterationBytes), [&](char* p) { encode(p, r); });
}
void TraceWriter::plan(const PlanRecord& r) {
  append(recordSize(kPlanBytes), [&](char* p) { encode(p, r); });
}

// ---- Background thread ----

void* TraceWriter::threadMain(void* self) {
  static_cast<TraceWriter*>(self)->run();
  return nullptr;
}

void TraceWriter::flushThreadBuffers(bool at_close) {
  std::vector<ThreadBuffer*> threads;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    threads = threads_;
  }
  for (ThreadBuffer* b : threads) {
    spinLock(b->busy);
    if (b->used != 0) handOff(b, false);
    if (at_close) b->dead = true;
    spinUnlock(b->busy);
  }
}

void TraceWriter::run() {
  if (!writeAll(header_.data(), header_.size())) fail("write failed", errno);
  std::vector<Chunk> chunks;
  std::vector<TablePiece> tables;
  const auto interval = std::chrono::milliseconds(
      options_.flush_interval_ms == 0 ? 200 : options_.flush_interval_ms);
  for (;;) {
    bool stop = false;
    bool timed_out = false;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (queue_.empty() && tables_.empty() && !stop_) {
        timed_out = !wake_.wait_for(lock, interval, [&] {
          return !queue_.empty() || !tables_.empty() || stop_;
        });
      }
      chunks.swap(queue_);
      tables.swap(tables_);
      stop = stop_;
    }
    if (timed_out && options_.flush_interval_ms != 0) {
      flushThreadBuffers(false);
      continue;
    }
    for (const TablePiece& t : tables) {
      writeChunk(t.bytes.data(), t.bytes.size(), t.records, 0);
    }
    tables.clear();
    for (const Chunk& c : chunks) writeChunk(c.data, c.bytes, c.records, c.thread);
    if (!chunks.empty()) {
      std::lock_guard<std::mutex> lock(mutex_);
      for (const Chunk& c : chunks) free_blocks_.push_back(c.data);
    }
    chunks.clear();
    if (stop) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (queue_.empty() && tables_.empty()) return;
    }
  }
}

bool TraceWriter::passesFileSizeLimit(std::size_t n) const {
  // A write past RLIMIT_FSIZE raises SIGXFSZ, whose default action ends the process: the
  // job's. The background thread blocks it, but close() writes from the job's thread. So the
  // limit is checked first, and a write that would pass it fails with EFBIG, unwritten.
  rlimit limit{};
  if (getrlimit(RLIMIT_FSIZE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return false;
  struct stat st {};
  if (fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) return false;
  const off_t offset = lseek(fd_, 0, SEEK_CUR);
  return offset < 0 || static_cast<std::uint64_t>(offset) + n > limit.rlim_cur;
}

bool TraceWriter::writeAll(const char* data, std::size_t n) {
  if (passesFileSizeLimit(n)) {
    errno = EFBIG;
    return false;
  }
  while (n != 0) {
    const ssize_t w = ::write(fd_, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (w == 0) {
      errno = ENOSPC;
      return false;
    }
    data += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

bool TraceWriter::writeChunk(const char* payload, std::size_t bytes, std::uint32_t records,
                             std::uint32_t thread) {
  if (failed_) {
    dropped_.fetch_add(records, std::memory_order_relaxed);
    return false;
  }
  char header[kChunkHeaderBytes];
  char* p = header;
  p = detail::put<std::uint32_t>(p, kChunkTag);
  p = detail::put<std::uint32_t>(p, static_cast<std::uint32_t>(bytes));
  p = detail::put<std::uint32_t>(p, thread);
  p = detail::put<std::uint32_t>(p, records);
  detail::put<std::uint64_t>(p, chunkChecksum(payload, bytes, thread, records));
  // One writev: a chunk is either wholly in the file or (disk full, crash mid-write) its tail
  // is missing, which the reader reports as truncation.
  iovec iov[2] = {{header, sizeof header}, {const_cast<char*>(payload), bytes}};
  std::size_t total = sizeof header + bytes;
  ssize_t w;
  if (passesFileSizeLimit(total)) {
    w = -1;
    errno = EFBIG;
  } else {
    do {
      w = ::writev(fd_, iov, 2);
    } while (w < 0 && errno == EINTR);
  }
  bool ok = w >= 0 && static_cast<std::size_t>(w) == total;
  if (!ok && w > 0) {
    // Short write: finish it by hand.
    const std::size_t done = static_cast<std::size_t>(w);
    if (done < sizeof header) {
      ok = writeAll(header + done, sizeof header - done) && writeAll(payload, bytes);
    } else {
      ok = writeAll(payload + (done - sizeof header), bytes - (done - sizeof header));
    }
  } else if (!ok && w == 0) {
    errno = ENOSPC;
  }
  if (!ok) {
    fail("write failed", errno);
    dropped_.fetch_add(records, std::memory_order_relaxed);
    return false;
  }
  written_.fetch_add(records, std::memory_order_relaxed);
  return true;
}

void TraceWriter::fail(const char* what, int err) {
  if (failed_) return;
  failed_ = true;
  if (options_.on_error == nullptr) return;
  char line[512];
  std::snprintf(line, sizeof line,
                "trace %s: %s (%s); recording stopped, later records are dropped and counted",
                path_.c_str(), what, std::strerror(err));
  options_.on_error(line, options_.error_context);
}

WriterCounts TraceWriter::close(const CloseTotals& totals, std::uint64_t time_ns) {
  if (!opened_ || closing_.exchange(true)) return WriterCounts{written_.load(), dropped_.load()};
  enabled_.store(false, std::memory_order_seq_cst);
  flushThreadBuffers(true);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_one();
  if (thread_started_) pthread_join(thread_, nullptr);
  thread_started_ = false;
  CloseRecord c;
  c.time_ns = time_ns != 0 ? time_ns : clockNs(CLOCK_MONOTONIC);
  c.totals = totals;
  c.records_written = written_.load();
  c.records_dropped = dropped_.load();
  char bytes[recordSize(kCloseBytes)];
  encode(bytes, c);
  writeChunk(bytes, sizeof bytes, 1, 0);
  ::close(fd_);
  fd_ = -1;
  opened_ = false;
  return WriterCounts{c.records_written, c.records_dropped, failed_};
}

void TraceWriter::onForkChild() {
  // The child has a copy of our memory but not the background thread; mutex_ may be held by a
  // thread that does not exist here. Touch nothing shared: forget it all (leaking the copies).
  enabled_.store(false, std::memory_order_relaxed);
  if (fd_ >= 0) ::close(fd_);  // our descriptor only: the parent's stays open
  fd_ = -1;
  opened_ = false;
  thread_started_ = false;
  closing_.store(true);
  generation_ = g_generation.fetch_add(1, std::memory_order_relaxed) + 1;
  new (&mutex_) std::mutex;
  new (&wake_) std::condition_variable;
  threads_.clear();
  free_blocks_.clear();
  queue_.clear();
  tables_.clear();
}

}  // namespace delta::trace
