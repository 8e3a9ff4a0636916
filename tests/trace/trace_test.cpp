// Tests of the trace format library: byte-exact round trips, every prefix and every corrupted
// byte of a small trace, foreign and newer files, the writer's file-safety rules, many threads,
// a full disk and fork.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/trace/sample_trace.h"
#include "trace/trace_reader.h"
#include "trace/trace_writer.h"

namespace delta::trace {
namespace {

std::string tempPath(const std::string& name) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/delta_trace_test_" +
         std::to_string(getpid()) + "_" + name;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Re-encodes a record as read: must give the bytes that are in the file.
std::string reencode(const Record& r) {
  std::string out(r.size, '\0');
  char* p = out.data();
  char* end = nullptr;
  switch (r.type) {
    case RecordType::kString: end = encode(p, r.string); break;
    case RecordType::kStack: end = encode(p, r.stack); break;
    case RecordType::kAlloc: end = encode(p, r.alloc); break;
    case RecordType::kFree: end = encode(p, r.free); break;
    case RecordType::kLaunch: end = encode(p, r.launch); break;
    case RecordType::kCopy: end = encode(p, r.copy); break;
    case RecordType::kMemset: end = encode(p, r.memset); break;
    case RecordType::kEvict:
    case RecordType::kRestore:
    case RecordType::kRecompute: end = encode(p, r.type, r.movement); break;
    case RecordType::kBudgetChange: end = encode(p, r.budget); break;
    case RecordType::kOverBudget: end = encode(p, r.over_budget); break;
    case RecordType::kIteration: end = encode(p, r.iteration); break;
    case RecordType::kClose: end = encode(p, r.close); break;
    case RecordType::kPlan: end = encode(p, r.plan); break;
  }
  EXPECT_EQ(static_cast<std::size_t>(end - p), r.size);
  return out;
}

struct ReadAll {
  ReadStatus status = ReadStatus::kOk;
  std::string error;
  std::uint64_t good_end = 0;
  std::vector<std::pair<std::uint64_t, std::uint32_t>> records;  // offset, size
  bool saw_close = false;
};

ReadAll readMemory(std::string_view bytes) {
  ReadAll out;
  TraceReader r;
  if (r.openMemory(bytes, "t").empty()) {
    Record rec;
    while (r.next(rec)) out.records.emplace_back(rec.offset, rec.size);
  }
  out.status = r.status();
  out.error = r.error();
  out.good_end = r.goodEnd();
  out.saw_close = r.sawClose();
  return out;
}

class SampleTrace : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = tempPath("sample.dtrace");
    ASSERT_EQ(testing::writeSampleTrace(path_), "");
    bytes_ = slurp(path_);
  }
  void TearDown() override { unlink(path_.c_str()); }
  std::string path_;
  std::string bytes_;
};

TEST_F(SampleTrace, RoundTripIsByteExact) {
  TraceReader r;
  ASSERT_EQ(r.open(path_), "");
  EXPECT_EQ(r.header().pid, 4242u);
  EXPECT_EQ(r.header().rank, 0);
  EXPECT_EQ(r.header().budget, 96u << 20);
  EXPECT_EQ(r.header().device_memory, 1024u << 20);
  EXPECT_EQ(r.header().start_monotonic_ns, testing::kSampleStartNs);
  EXPECT_EQ(r.header().start_realtime_ns, 1'700'000'000'000'000'000ull);
  EXPECT_EQ(r.header().producer, "libdelta 0.1.0");
  EXPECT_EQ(r.header().device_name, "CPU platform (cudasim)");
  EXPECT_EQ(r.header().policy, "delta");
  EXPECT_EQ(r.header().options, "DELTA_BUDGET=96M\nDELTA_POLICY=delta");
  std::map<RecordType, int> counts;
  Record rec;
  std::uint64_t last_end = 0;
  while (r.next(rec)) {
    counts[rec.type]++;
    ASSERT_LE(rec.offset + rec.size, bytes_.size());
    EXPECT_GT(rec.offset, last_end == 0 ? 0 : last_end - 1);
    last_end = rec.offset + rec.size;
    EXPECT_EQ(reencode(rec), bytes_.substr(rec.offset, rec.size))
        << recordTypeName(rec.type) << " at " << rec.offset;
    if (rec.type == RecordType::kLaunch && rec.launch.time_ns == testing::kSampleStartNs + 150'000) {
      EXPECT_EQ(r.name(rec.launch.kernel), "gemm_kernel");
      EXPECT_EQ(rec.launch.buffers.size(), 3u);
      EXPECT_EQ(rec.launch.buffers[2], 5u);
      EXPECT_EQ(rec.launch.grid[0], 128u);
      EXPECT_EQ(rec.launch.stream, 0x10u);
    }
    if (rec.type == RecordType::kAlloc && rec.alloc.buffer == 1) {
      ASSERT_EQ(r.stack(rec.alloc.stack).size(), 3u);
      EXPECT_EQ(r.stack(rec.alloc.stack)[1].address, 0x402000u);
    }
    if (rec.type == RecordType::kPlan) {
      EXPECT_EQ(r.name(rec.plan.name), "recompute-only/on-demand");
      EXPECT_EQ(rec.plan.planning_ns, 2'500'000u);
      EXPECT_EQ(rec.plan.predicted_ns, 380'000);
      EXPECT_EQ(rec.plan.launches, 5u);
      EXPECT_EQ(rec.plan.flags, 1u);
    }
    if (rec.type == RecordType::kClose) {
      EXPECT_EQ(rec.close.totals.peak_resident, 112u << 20);
      EXPECT_EQ(rec.close.records_dropped, 0u);
      // Every record before the Close one: 4 strings, 1 stack, 26 events.
      EXPECT_EQ(rec.close.records_written, 31u);
    }
  }
  EXPECT_EQ(r.status(), ReadStatus::kEnd) << r.error();
  EXPECT_TRUE(r.sawClose());
  EXPECT_EQ(r.goodEnd(), bytes_.size());
  EXPECT_EQ(counts[RecordType::kString], 4);
  EXPECT_EQ(counts[RecordType::kStack], 1);
  EXPECT_EQ(counts[RecordType::kAlloc], 6);
  EXPECT_EQ(counts[RecordType::kFree], 4);
  EXPECT_EQ(counts[RecordType::kLaunch], 5);
  EXPECT_EQ(counts[RecordType::kCopy], 1);
  EXPECT_EQ(counts[RecordType::kMemset], 1);
  EXPECT_EQ(counts[RecordType::kEvict], 2);
  EXPECT_EQ(counts[RecordType::kRestore], 1);
  EXPECT_EQ(counts[RecordType::kRecompute], 1);
  EXPECT_EQ(counts[RecordType::kBudgetChange], 1);
  EXPECT_EQ(counts[RecordType::kOverBudget], 1);
  EXPECT_EQ(counts[RecordType::kIteration], 2);
  EXPECT_EQ(counts[RecordType::kPlan], 1);
  EXPECT_EQ(counts[RecordType::kClose], 1);
}

TEST_F(SampleTrace, WritingTheSameRecordsTwiceGivesTheSameBytes) {
  const std::string again = tempPath("again.dtrace");
  ASSERT_EQ(testing::writeSampleTrace(again), "");
  EXPECT_EQ(slurp(again), bytes_);
  unlink(again.c_str());
}

TEST_F(SampleTrace, EveryPrefixReadsAndReportsWhereItWasCut) {
  const ReadAll full = readMemory(bytes_);
  ASSERT_EQ(full.status, ReadStatus::kEnd);
  for (std::size_t n = 0; n < bytes_.size(); ++n) {
    const ReadAll cut = readMemory(std::string_view(bytes_).substr(0, n));
    // Exactly the records that lie wholly in the prefix are delivered.
    std::size_t whole = 0;
    std::uint64_t end = 0;
    for (auto [off, size] : full.records) {
      if (off + size <= n) {
        ++whole;
        end = off + size;
      }
    }
    ASSERT_EQ(cut.records.size(), whole) << "prefix " << n;
    ASSERT_FALSE(cut.saw_close) << "prefix " << n;
    if (n == 0) {
      EXPECT_EQ(cut.status, ReadStatus::kForeign);
    } else if (cut.status == ReadStatus::kEnd) {
      // Cut at a chunk boundary: a crash leaves this; no Close record says so.
      EXPECT_EQ(cut.good_end, n);
    } else {
      ASSERT_EQ(cut.status, ReadStatus::kTruncated) << "prefix " << n << ": " << cut.error;
      if (whole != 0) {
        EXPECT_EQ(cut.good_end, end) << "prefix " << n;
      }
      EXPECT_NE(cut.error.find("byte offset"), std::string::npos);
    }
  }
}

TEST_F(SampleTrace, EveryCorruptedByteIsReportedWithItsOffset) {
  for (std::size_t i = 0; i < bytes_.size(); ++i) {
    std::string bad = bytes_;
    bad[i] = static_cast<char>(bad[i] ^ 0x41);
    const ReadAll r = readMemory(bad);
    ASSERT_NE(r.status, ReadStatus::kEnd) << "byte " << i << " flipped went unnoticed";
    ASSERT_NE(r.status, ReadStatus::kOk);
    EXPECT_FALSE(r.error.empty());
    if (i >= 8 && i < 10) {
      EXPECT_EQ(r.status, ReadStatus::kNewerVersion);
    } else if (i >= 8) {
      // A chunk length made larger reads as a file cut short; anything else is corruption.
      EXPECT_TRUE(r.status == ReadStatus::kCorrupt || r.status == ReadStatus::kTruncated)
          << "byte " << i << ": " << readStatusName(r.status);
      EXPECT_NE(r.error.find("byte offset"), std::string::npos) << r.error;
    }
  }
}

TEST_F(SampleTrace, CorruptChunkNamesItsOffset) {
  // The data chunk follows the tables chunk; corrupt its last byte (the Close record's chunk
  // is after it).
  TraceReader r;
  ASSERT_EQ(r.open(path_), "");
  Record rec;
  std::uint64_t close_offset = 0;
  while (r.next(rec)) {
    if (rec.type == RecordType::kClose) close_offset = rec.offset;
  }
  ASSERT_GT(close_offset, kChunkHeaderBytes);
  std::string bad = bytes_;
  const std::size_t chunk = close_offset - kChunkHeaderBytes;
  bad[close_offset + 10] ^= 1;
  const ReadAll got = readMemory(bad);
  EXPECT_EQ(got.status, ReadStatus::kCorrupt);
  EXPECT_NE(got.error.find("checksum at byte offset " + std::to_string(chunk)), std::string::npos)
      << got.error;
  EXPECT_EQ(got.good_end, chunk);
}

TEST_F(SampleTrace, UnknownRecordTypesAreSkipped) {
  // Build a chunk holding a record of type 200 followed by an Iteration record.
  std::string payload(4 + 3, '\0');
  const std::uint32_t word = 200u | (3u << 8);
  std::memcpy(payload.data(), &word, 4);
  payload.resize(payload.size() + recordSize(kIterationBytes));
  encode(payload.data() + 7, IterationRecord{5, 7});
  std::string chunk(kChunkHeaderBytes, '\0');
  const std::uint32_t fields[4] = {kChunkTag, static_cast<std::uint32_t>(payload.size()), 3, 2};
  std::memcpy(chunk.data(), fields, 16);
  const std::uint64_t sum = chunkChecksum(payload.data(), payload.size(), 3, 2);
  std::memcpy(chunk.data() + 16, &sum, 8);
  // Insert before the closing chunk... simpler: append after the file (after Close).
  const std::string file = bytes_ + chunk + payload;
  TraceReader r;
  ASSERT_EQ(r.openMemory(file), "");
  Record rec;
  bool saw = false;
  while (r.next(rec)) saw = saw || (rec.type == RecordType::kIteration && rec.iteration.index == 7);
  EXPECT_EQ(r.status(), ReadStatus::kEnd) << r.error();
  EXPECT_TRUE(saw);
  EXPECT_EQ(r.unknownSkipped(), 1u);
}

TEST_F(SampleTrace, NewerVersionIsRefusedClearly) {
  std::string newer = bytes_;
  newer[8] = 2;
  TraceReader r;
  const std::string err = r.openMemory(newer, "new.dtrace");
  EXPECT_EQ(r.status(), ReadStatus::kNewerVersion);
  EXPECT_NE(err.find("version 2 is newer"), std::string::npos) << err;
}

TEST(TraceReader, ForeignFileIsRefusedClearly) {
  TraceReader r;
  const std::string err = r.openMemory("{\"op\": \"CALL\"}\n", "ops.json");
  EXPECT_EQ(r.status(), ReadStatus::kForeign);
  EXPECT_EQ(err, "ops.json: not a DELTA trace (it does not start with \"DELTATRC\")");
  TraceReader empty;
  EXPECT_EQ(empty.openMemory("", "e"), "e: not a DELTA trace (the file is empty)");
  TraceReader missing;
  EXPECT_NE(missing.open("/nonexistent/x.dtrace").find("cannot open"), std::string::npos);
}

// ---- Writer: file safety ----

TEST(TraceWriterOpen, ExpandsPidAndRank) {
  setenv("RANK", "3", 1);
  EXPECT_EQ(TraceWriter::expandPath("/t/job-%p-%r.%%", 77), "/t/job-77-3.%");
  unsetenv("RANK");
  setenv("LOCAL_RANK", "5", 1);
  EXPECT_EQ(TraceWriter::expandPath("r%r", 1), "r5");
  unsetenv("LOCAL_RANK");
  EXPECT_EQ(TraceWriter::expandPath("r%r-%x", 1), "r0-%x");
}

TEST(TraceWriterOpen, CreatesMode0600AndWritesPidInName) {
  const std::string pattern = tempPath("mode-%p.dtrace");
  TraceWriter w;
  WriterOptions o;
  o.path = pattern;
  const mode_t old = umask(0);
  ASSERT_EQ(w.open(o, TraceInfo{}), "");
  umask(old);
  EXPECT_EQ(w.path(), TraceWriter::expandPath(pattern, static_cast<std::uint32_t>(getpid())));
  w.close({});
  struct stat st {};
  ASSERT_EQ(stat(w.path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  TraceReader r;
  EXPECT_EQ(r.open(w.path()), "");
  EXPECT_EQ(r.header().pid, static_cast<std::uint32_t>(getpid()));
  unlink(w.path().c_str());
}

TEST(TraceWriterOpen, RefusesSymlinks) {
  const std::string target = tempPath("target");
  const std::string link = tempPath("link.dtrace");
  spit(target, "precious");
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  for (bool overwrite : {false, true}) {
    TraceWriter w;
    WriterOptions o;
    o.path = link;
    o.overwrite = overwrite;
    const std::string err = w.open(o, TraceInfo{});
    EXPECT_NE(err.find("symbolic link"), std::string::npos) << err;
  }
  EXPECT_EQ(slurp(target), "precious");
  unlink(link.c_str());
  unlink(target.c_str());
}

TEST(TraceWriterOpen, OverwritesOnlyTracesUnlessAsked) {
  const std::string path = tempPath("other.dtrace");
  spit(path, "not a trace");
  {
    TraceWriter w;
    WriterOptions o;
    o.path = path;
    const std::string err = w.open(o, TraceInfo{});
    EXPECT_NE(err.find("is not a DELTA trace; not overwriting it"), std::string::npos) << err;
    EXPECT_EQ(slurp(path), "not a trace");
  }
  {
    TraceWriter w;
    WriterOptions o;
    o.path = path;
    o.overwrite = true;
    ASSERT_EQ(w.open(o, TraceInfo{}), "");
    w.close({});
  }
  {
    // Now it is a trace: replaced without asking.
    TraceWriter w;
    WriterOptions o;
    o.path = path;
    ASSERT_EQ(w.open(o, TraceInfo{}), "");
    w.iteration({1, 1});
    w.close({});
  }
  TraceReader r;
  ASSERT_EQ(r.open(path), "");
  Record rec;
  int n = 0;
  while (r.next(rec)) ++n;
  EXPECT_EQ(n, 2);  // Iteration + Close
  unlink(path.c_str());
}

TEST(TraceWriterOpen, AFileAnotherWriterHoldsIsNeitherTruncatedNorShared) {
  // Two processes given the same path (an exec'd child inheriting DELTA_TRACE without %p):
  // the second must not truncate the first's file nor write into it. Two writers in one
  // process open the file twice, which is what the flock sees too.
  const std::string path = tempPath("shared.dtrace");
  TraceWriter first;
  WriterOptions o;
  o.path = path;
  ASSERT_EQ(first.open(o, TraceInfo{}), "");
  first.iteration({1, 1});
  {
    TraceWriter second;
    const std::string err = second.open(o, TraceInfo{});
    EXPECT_NE(err.find("is being written by another process"), std::string::npos) << err;
    EXPECT_NE(err.find("%p"), std::string::npos) << err;
  }
  first.iteration({2, 2});
  first.close({});
  TraceReader r;
  ASSERT_EQ(r.open(path), "");
  Record rec;
  int n = 0;
  while (r.next(rec)) ++n;
  EXPECT_EQ(r.status(), ReadStatus::kEnd) << r.error();
  EXPECT_EQ(n, 3);  // both iterations and the Close record: nothing lost, nothing foreign
  // Once closed, the file is free again (a trace: replaced without asking).
  TraceWriter third;
  EXPECT_EQ(third.open(o, TraceInfo{}), "");
  third.close({});
  unlink(path.c_str());
}

TEST(TraceWriterRecord, FileSizeLimitStopsRecordingWithoutSigxfsz) {
  // Past RLIMIT_FSIZE a write raises SIGXFSZ, whose default action ends the process: the
  // job's, since close() writes from the job's thread. In a child, with the limit just past
  // the header: the Close record no longer fits.
  const std::string path = tempPath("fsize.dtrace");
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    TraceWriter w;
    WriterOptions o;
    o.path = path;
    bool reported = false;
    o.on_error = [](const char* message, void* flag) {
      *static_cast<bool*>(flag) = std::strstr(message, "File too large") != nullptr;
    };
    o.error_context = &reported;
    TraceInfo info;
    info.producer = "fsize test";
    FileHeader h;
    h.producer = info.producer;
    rlimit limit{};
    getrlimit(RLIMIT_FSIZE, &limit);
    limit.rlim_cur = encodeFileHeader(h, nullptr) + 10;
    setrlimit(RLIMIT_FSIZE, &limit);
    if (!w.open(o, info).empty()) _exit(3);
    // Nothing recorded: the first write after the header is the Close record, from here.
    const WriterCounts counts = w.close({});
    _exit(reported && counts.failed ? 0 : 4);
  }
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
  TraceReader r;
  EXPECT_EQ(r.open(path), "") << "the header is there and reads";
  unlink(path.c_str());
}

// ---- Writer: threads, full disk, fork ----

TEST(TraceWriterRecord, EightThreadsKeepTheirOrderOrCountDrops) {
  const std::string path = tempPath("threads.dtrace");
  constexpr int kThreads = 8;
  constexpr std::uint64_t kPerThread = 50'000;
  TraceWriter w;
  WriterOptions o;
  o.path = path;
  o.flush_interval_ms = 5;  // exercise the periodic flush against the recording threads
  ASSERT_EQ(w.open(o, TraceInfo{}), "");
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&w, t] {
      const std::uint32_t k = w.internName("thread_kernel");
      const std::uint64_t ids[] = {static_cast<std::uint64_t>(t)};
      for (std::uint64_t i = 0; i < kPerThread; ++i) {
        w.launch({i, static_cast<std::uint64_t>(t + 1), k, {1, 1, 1}, {1, 1, 1}, 1, ids});
      }
    });
  }
  for (auto& th : threads) th.join();
  const WriterCounts c = w.close({});
  TraceReader r;
  ASSERT_EQ(r.open(path), "");
  Record rec;
  std::vector<std::int64_t> last(kThreads + 1, -1);
  std::uint64_t launches = 0, gaps = 0;
  while (r.next(rec)) {
    if (rec.type != RecordType::kLaunch) continue;
    ++launches;
    const auto s = rec.launch.stream;
    ASSERT_GE(s, 1u);
    ASSERT_LE(s, static_cast<std::uint64_t>(kThreads));
    const auto t = static_cast<std::int64_t>(rec.launch.time_ns);
    ASSERT_GT(t, last[s]) << "thread " << s << " out of order";
    gaps += static_cast<std::uint64_t>(t - last[s] - 1);
    last[s] = t;
    EXPECT_EQ(r.name(rec.launch.kernel), "thread_kernel");
  }
  EXPECT_EQ(r.status(), ReadStatus::kEnd) << r.error();
  EXPECT_EQ(launches + c.dropped, kThreads * kPerThread);
  EXPECT_EQ(launches + 1, c.written);  // + the String record
  EXPECT_LE(gaps, c.dropped);
  unlink(path.c_str());
}

TEST(TraceWriterRecord, FullDiskDropsAndCountsWithoutStalling) {
  static std::atomic<int> errors{0};
  static std::string message;
  TraceWriter w;
  WriterOptions o;
  o.path = "/dev/full";
  o.overwrite = true;  // not a regular file: only written to when asked
  o.on_error = [](const char* m, void*) {
    errors++;
    message = m;
  };
  ASSERT_EQ(w.open(o, TraceInfo{}), "");
  constexpr std::uint64_t kRecords = 200'000;
  const auto t0 = std::chrono::steady_clock::now();
  for (std::uint64_t i = 0; i < kRecords; ++i) w.iteration({i, i});
  const auto elapsed = std::chrono::steady_clock::now() - t0;
  const WriterCounts c = w.close({});
  EXPECT_EQ(c.written, 0u);
  EXPECT_EQ(c.dropped, kRecords);
  EXPECT_EQ(errors.load(), 1);
  EXPECT_NE(message.find("No space left on device"), std::string::npos) << message;
  EXPECT_LT(elapsed, std::chrono::seconds(2));
}

TEST(TraceWriterOpen, DevFullIsRefusedWithoutOverwrite) {
  TraceWriter w;
  WriterOptions o;
  o.path = "/dev/full";
  EXPECT_NE(w.open(o, TraceInfo{}).find("not a regular file"), std::string::npos);
}

TEST(TraceWriterRecord, ForkedChildRecordsNothingAndLeavesTheParentsFile) {
  const std::string path = tempPath("fork.dtrace");
  TraceWriter w;
  WriterOptions o;
  o.path = path;
  ASSERT_EQ(w.open(o, TraceInfo{}), "");
  w.iteration({1, 1});
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    w.onForkChild();
    w.iteration({2, 2});
    w.close({});
    _exit(w.enabled() ? 1 : 0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  w.iteration({3, 3});
  w.close({});
  TraceReader r;
  ASSERT_EQ(r.open(path), "");
  Record rec;
  std::vector<std::uint64_t> seen;
  while (r.next(rec)) {
    if (rec.type == RecordType::kIteration) seen.push_back(rec.iteration.index);
  }
  EXPECT_EQ(r.status(), ReadStatus::kEnd) << r.error();
  EXPECT_EQ(seen, (std::vector<std::uint64_t>{1, 3}));
  unlink(path.c_str());
}

TEST(TraceWriterRecord, NamesAndStacksAreStoredOnce) {
  const std::string path = tempPath("tables.dtrace");
  TraceWriter w;
  WriterOptions o;
  o.path = path;
  ASSERT_EQ(w.open(o, TraceInfo{}), "");
  static const char* kName = "my_kernel";
  const std::uint32_t a = w.internName(kName);
  EXPECT_EQ(w.internName(kName), a);
  EXPECT_EQ(w.internString("my_kernel"), a);
  const std::uint64_t f1[] = {1, 2, 3}, f2[] = {1, 2};
  const std::uint32_t s1 = w.internStack(f1);
  EXPECT_EQ(w.internStack(f1), s1);
  EXPECT_NE(w.internStack(f2), s1);
  w.close({});
  TraceReader r;
  ASSERT_EQ(r.open(path), "");
  Record rec;
  int strings = 0, stacks = 0;
  while (r.next(rec)) {
    strings += rec.type == RecordType::kString;
    stacks += rec.type == RecordType::kStack;
  }
  EXPECT_EQ(strings, 1);
  EXPECT_EQ(stacks, 2);
  unlink(path.c_str());
}

TEST(TraceWriterRecord, DisabledWriterIgnoresRecords) {
  TraceWriter w;
  w.iteration({1, 1});
  EXPECT_EQ(w.internString("x"), 0u);
  EXPECT_EQ(w.close({}).written, 0u);
}

}  // namespace
}  // namespace delta::trace
