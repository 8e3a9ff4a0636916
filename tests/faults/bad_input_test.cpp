// Bad input: every DELTA_* option with empty, negative, huge, malformed and unit-mangled
// values under a real LD_PRELOAD; corrupt, truncated, foreign and hostile files given to every
// delta-trace subcommand; trace paths that must not be written.
//
// What must hold: one clear line and a non-zero exit where the input is refused; no crash, no
// hang (every run has a time limit), and nothing written where it should not be.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "faults_util.h"
#include "shim/options.h"
#include "trace/format.h"

extern char** environ;

namespace delta::faults {
namespace {

size_t lineCount(const std::string& text) {
  return static_cast<size_t>(std::count(text.begin(), text.end(), '\n'));
}

// ---- options ---------------------------------------------------------------------------------

std::vector<std::string> smallJob() {
  return {programs().faultJob, "--buffers", "2", "--mib", "1", "--rounds", "1"};
}

// Values every kind of option gets: empty, negative, huge, malformed, unit-mangled, and a few
// that only a careless parser would take.
const std::vector<std::string> kHostileValues = {
    "",
    "-1",
    "-5G",
    "-0",
    "99999999999999999999999999",
    "9223372036854775807",   // 2^63 - 1: a size that parses, larger than any device
    "18446744073709551616",  // 2^64
    "1e9",
    "0x10",
    "1.5G",
    "12 parsecs",
    "10 GB GB",
    "10GBB",
    "6Gi",
    "10%%",
    "150%",
    "nan",
    "inf",
    " 1",
    "1 ",
    "on off",
    "TRUE1",
    "delta,lru",
    "6\nGiB",
    "\x1b[31mred",
    std::string(4096, '7'),
};

// What the option parser (the shim's own, compiled in) says about `name=value`.
bool parserRejects(const std::string& name, const std::string& value) {
  std::string entry = name + "=" + value;
  char* environment[] = {entry.data(), nullptr};
  shim::Options options;
  std::string error;
  return !shim::parseOptions(environment, options, error);
}

TEST(BadOptions, EveryOptionStopsTheJobAtStartWithOneLine) {
  int refused = 0;
  for (size_t i = 0; i < shim::optionCount(); ++i) {
    const std::string name(shim::optionInfo(i).name);
    int refusedHere = 0;
    for (const std::string& value : kHostileValues) {
      const bool rejected = parserRejects(name, value);
      // Sizes that parse but cannot be had are refused once the device is known.
      const bool tooLarge = (name == "DELTA_BUDGET" || name == "DELTA_HOST_LIMIT") &&
                            value == "9223372036854775807";
      if (!rejected && !tooLarge) continue;
      SCOPED_TRACE(name + "='" + value.substr(0, 40) + "'");
      const Outcome job = run(smallJob(), {{"LD_PRELOAD=" + programs().shim, name + "=" + value}});
      ASSERT_FALSE(job.timedOut) << job.describe();
      EXPECT_EQ(job.status, 1) << job.describe();
      EXPECT_EQ(job.err.rfind("libdelta: " + name, 0), 0u) << job.describe();
      EXPECT_EQ(lineCount(job.err), 1u) << job.describe();
      EXPECT_LE(job.err.size(), 1200u) << "a long value is cut in the message";
      EXPECT_TRUE(job.out.empty()) << "the job did not start\n" << job.describe();
      ++refusedHere;
    }
    // Paths take any text; every other option must have refused most of these.
    if (shim::optionInfo(i).defaultValue.empty()) {
      EXPECT_EQ(refusedHere, 0) << name;
    } else {
      EXPECT_GE(refusedHere, 10) << name;
    }
    refused += refusedHere;
  }
  RecordProperty("refused_runs", refused);
}

TEST(BadOptions, UnknownVariablesAndTyposStopTheJob) {
  for (const char* setting :
       {"DELTA_BUGDET=1G", "DELTA_=1", "DELTA_budget=1G", "DELTA_TRACE_STACK=1",
        "DELTA_VERBOSE_=1", "DELTA_MIN_BYTES_=1"}) {
    SCOPED_TRACE(setting);
    const Outcome job = run(smallJob(), {{"LD_PRELOAD=" + programs().shim, setting}});
    EXPECT_EQ(job.status, 1) << job.describe();
    EXPECT_EQ(job.err.rfind("libdelta: ", 0), 0u) << job.describe();
    EXPECT_EQ(lineCount(job.err), 1u) << job.describe();
    EXPECT_TRUE(job.out.empty()) << job.describe();
  }
}

TEST(BadOptions, DisableWinsOverBadValues) {
  // The off switch works even when a wrapper script sets something this version refuses.
  const Outcome job = run(smallJob(), {{"LD_PRELOAD=" + programs().shim, "DELTA_DISABLE=1",
                                        "DELTA_BUDGET=12 parsecs", "DELTA_BUGDET=1"}});
  EXPECT_EQ(job.status, 0) << job.describe();
  EXPECT_EQ(job.value("verify"), "ok") << job.describe();
  EXPECT_TRUE(job.err.empty()) << job.describe();
}

TEST(BadOptions, CuptiPathThatIsNotCuptiMeansOneLineAndPassThrough) {
  TempDir dir;
  writeFile(dir.file("libcupti.so"), "not a library");
  for (const std::string& path : {dir.file("missing.so"), dir.file("libcupti.so"), dir.path(),
                                 programs().faultJob}) {
    SCOPED_TRACE(path);
    const Outcome job =
        run(smallJob(), {underShim({"DELTA_BUDGET=2M", "DELTA_CUPTI_PATH=" + path})});
    EXPECT_EQ(job.status, 0) << job.describe();
    EXPECT_EQ(job.value("verify"), "ok") << job.describe();
    ASSERT_EQ(job.shimMessages().size(), 1u) << job.describe();
    EXPECT_NE(job.shimMessages()[0].find("CUPTI"), std::string::npos) << job.describe();
    EXPECT_EQ(job.err.find("libdelta: stats"), std::string::npos) << "pass-through";
  }
}

// ---- trace files -----------------------------------------------------------------------------

// Builds traces byte by byte: a header, then chunks of records, each with a valid checksum
// unless asked otherwise, so that hostile contents get past the checksums to the parsers.
class TraceBuilder {
 public:
  TraceBuilder() {
    header_.device_memory = 4ull << 30;
    header_.budget = 1ull << 30;
    header_.pid = 4242;
    header_.producer = "faults-test";
    header_.device_name = "hostile";
    header_.policy = "lru";
    header_.start_monotonic_ns = 1000;
  }
  trace::FileHeader& header() { return header_; }

  std::string headerBytes() const {
    std::string bytes(trace::encodeFileHeader(header_, nullptr), '\0');
    trace::encodeFileHeader(header_, bytes.data());
    return bytes;
  }
  template <class R>
  TraceBuilder& add(const R& record) {
    std::string bytes(trace::recordSize(size(record)), '\0');
    trace::encode(bytes.data(), record);
    return raw(bytes);
  }
  TraceBuilder& movement(trace::RecordType type, const trace::MovementRecord& record) {
    std::string bytes(trace::recordSize(trace::kMovementBytes), '\0');
    trace::encode(bytes.data(), type, record);
    return raw(bytes);
  }
  // A record of any type with any claimed payload length, followed by `payload`.
  TraceBuilder& raw(uint8_t type, uint32_t claimedPayload, const std::string& payload) {
    std::string bytes(4, '\0');
    const uint32_t word = type | (claimedPayload << 8);
    std::memcpy(bytes.data(), &word, 4);
    return raw(bytes + payload);
  }
  TraceBuilder& raw(const std::string& recordBytes) {
    payload_ += recordBytes;
    ++records_;
    return *this;
  }
  // Ends the chunk; `claimedRecords` / `claimedBytes` (when set) lie in its header.
  TraceBuilder& endChunk(uint32_t thread = 1, int64_t claimedRecords = -1,
                         int64_t claimedBytes = -1) {
    const uint32_t records = claimedRecords >= 0 ? uint32_t(claimedRecords) : records_;
    const uint32_t bytes = claimedBytes >= 0 ? uint32_t(claimedBytes) : uint32_t(payload_.size());
    char head[trace::kChunkHeaderBytes];
    char* p = head;
    p = trace::detail::put<uint32_t>(p, trace::kChunkTag);
    p = trace::detail::put<uint32_t>(p, bytes);
    p = trace::detail::put<uint32_t>(p, thread);
    p = trace::detail::put<uint32_t>(p, records);
    trace::detail::put<uint64_t>(
        p, trace::chunkChecksum(payload_.data(), payload_.size(), thread, records));
    chunks_ += std::string(head, sizeof head) + payload_;
    payload_.clear();
    records_ = 0;
    return *this;
  }
  std::string bytes() {
    if (records_ > 0) endChunk();
    return headerBytes() + chunks_;
  }

 private:
  static uint32_t size(const trace::StringRecord& r) { return trace::payloadSize(r); }
  static uint32_t size(const trace::StackRecord& r) { return trace::payloadSize(r); }
  static uint32_t size(const trace::LaunchRecord& r) { return trace::payloadSize(r); }
  static uint32_t size(const trace::AllocRecord&) { return trace::kAllocBytes; }
  static uint32_t size(const trace::FreeRecord&) { return trace::kFreeBytes; }
  static uint32_t size(const trace::CopyRecord&) { return trace::kCopyBytes; }
  static uint32_t size(const trace::MemsetRecord&) { return trace::kMemsetBytes; }
  static uint32_t size(const trace::BudgetChangeRecord&) { return trace::kBudgetChangeBytes; }
  static uint32_t size(const trace::OverBudgetRecord&) { return trace::kOverBudgetBytes; }
  static uint32_t size(const trace::IterationRecord&) { return trace::kIterationBytes; }
  static uint32_t size(const trace::CloseRecord&) { return trace::kCloseBytes; }

  trace::FileHeader header_;
  std::string payload_;
  uint32_t records_ = 0;
  std::string chunks_;
};

std::string u32(uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); }
std::string u64(uint64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); }

// A small, well-formed trace: what the cut and flipped variants start from.
std::string goodTrace() {
  TraceBuilder b;
  b.add(trace::StringRecord{1, "kernel"});
  for (uint64_t i = 1; i <= 20; ++i)
    b.add(trace::AllocRecord{2000 + i, i, 0x7000000000 + i * (4 << 20), 4 << 20, 0, 0,
                             trace::kAllocManaged});
  for (uint64_t i = 1; i <= 20; ++i) {
    const uint64_t ids[] = {i, i % 20 + 1};
    trace::LaunchRecord launch;
    launch.time_ns = 5000 + i * 10;
    launch.kernel = 1;
    launch.flags = trace::kLaunchAnalysed;
    launch.buffers = ids;
    b.add(launch);
    b.movement(trace::RecordType::kEvict,
               trace::MovementRecord{5001 + i * 10, 5003 + i * 10, i, 4 << 20, 1, 7, 1, 0});
    b.movement(trace::RecordType::kRestore,
               trace::MovementRecord{5004 + i * 10, 5006 + i * 10, i, 4 << 20, 0, 7, 1, 0});
  }
  b.endChunk(1);
  for (uint64_t i = 1; i <= 20; ++i)
    b.add(trace::FreeRecord{9000 + i, i, 4 << 20, trace::Residency::kResident});
  trace::CloseRecord close;
  close.time_ns = 10000;
  close.totals.evictions = 20;
  close.totals.restores = 20;
  close.records_written = 81;
  b.add(close);
  return b.bytes();
}

struct BadFile {
  std::string name;
  std::string bytes;
  bool mayBeRead = false;  // well-formed, or cut short: a summary with a warning is fine
};

std::vector<BadFile> badFiles() {
  std::vector<BadFile> files;
  const std::string good = goodTrace();
  files.push_back({"empty", ""});
  files.push_back({"png", std::string("\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x10\0\0\0\x10\x08\x06\0\0\0", 33)});
  files.push_back({"elf", readFile(programs().faultJob)});
  files.push_back({"zeros", std::string(64 << 10, '\0')});
  std::mt19937_64 random(8);
  std::string noise(16 << 10, '\0');
  for (char& c : noise) c = static_cast<char>(random());
  files.push_back({"noise", noise});
  files.push_back({"text", "hello\nworld\n"});
  files.push_back({"long-line", std::string(1 << 20, 'x')});
  files.push_back({"json-garbage", "{\"op\":\n{{{{\n"});
  files.push_back({"magic-only", "DELTATRC"});
  files.push_back({"magic-and-noise", "DELTATRC" + noise});
  // Headers that lie.
  files.push_back({"newer-version", "DELTATRC" + std::string("\x09\0\0\0", 4) + good.substr(12)});
  files.push_back({"reserved-set", "DELTATRC" + std::string("\x01\0\x01\0", 4) + good.substr(12)});
  files.push_back({"header-body-4GiB", "DELTATRC" + std::string("\x01\0\0\0", 4) + u32(0xFFFFFFFF) +
                                           good.substr(16)});
  files.push_back({"header-body-0", "DELTATRC" + std::string("\x01\0\0\0", 4) + u32(0) +
                                        good.substr(16)});
  {
    std::string flipped = good;
    flipped[40] ^= 0x20;
    files.push_back({"header-checksum", flipped});
  }
  {
    // A header whose strings claim more bytes than its body has, with a valid checksum.
    std::string fields = u64(1) + u64(2) + u64(3) + u64(4) + u32(5) + u32(0xFFFFFFFF) +
                         std::string("\xff\xff", 2) + "x";
    fields += u64(trace::checksum(fields.data(), fields.size()));
    files.push_back({"header-string-overrun", "DELTATRC" + std::string("\x01\0\0\0", 4) +
                                                  u32(uint32_t(fields.size())) + fields});
  }
  const std::string header = TraceBuilder().headerBytes();
  files.push_back({"header-only", header, true});
  // Chunks that lie.
  files.push_back({"chunk-4GiB", header + u32(trace::kChunkTag) + u32(0xFFFFFFFF) + u32(1) +
                                     u32(1) + u64(0) + "abc"});
  files.push_back({"chunk-bad-tag", header + "CHNX" + good.substr(header.size() + 4)});
  {
    TraceBuilder b;
    b.add(trace::IterationRecord{1, 1});
    b.endChunk(1, 0xFFFFFFFF);
    files.push_back({"chunk-count-lies", b.bytes()});
  }
  {
    TraceBuilder b;
    b.add(trace::IterationRecord{1, 1});
    b.endChunk(1, -1, 8);
    files.push_back({"chunk-length-lies", b.bytes()});
  }
  {
    std::string flipped = good;
    flipped[header.size() + 100] ^= 1;
    files.push_back({"payload-checksum", flipped});
  }
  // Records that lie, inside chunks whose checksums are right.
  {
    TraceBuilder b;
    b.raw(uint8_t(trace::RecordType::kLaunch), trace::kLaunchFixedBytes + 8,
          std::string(trace::kLaunchFixedBytes - 4, '\0') + u32(0xFFFFFFFF) + u64(1));
    files.push_back({"launch-count-huge", b.bytes()});
  }
  {
    TraceBuilder b;
    b.raw(uint8_t(trace::RecordType::kStack), 8, u32(1) + u32(0x0FFFFFFF));
    files.push_back({"stack-frames-huge", b.bytes()});
  }
  {
    TraceBuilder b;
    b.raw(uint8_t(trace::RecordType::kString), 0xFFFFFF, u32(1) + "abc");
    files.push_back({"record-longer-than-chunk", b.bytes()});
  }
  {
    TraceBuilder b;
    b.raw(uint8_t(trace::RecordType::kAlloc), 3, "abc");
    files.push_back({"alloc-too-short", b.bytes()});
  }
  {
    TraceBuilder b;
    b.raw(200, 5, "hello");  // an unknown type: skipped, as the format promises
    b.add(trace::IterationRecord{1, 1});
    files.push_back({"unknown-record-type", b.bytes(), true});
  }
  {
    // Well-formed but absurd: sizes near 2^64, times at both ends of the clock, movements of
    // buffers never allocated, frees of unknown buffers, ids reused, durations backwards.
    TraceBuilder b;
    b.add(trace::AllocRecord{0, 1, ~0ull, ~0ull, 0, 0xFFFFFFFF, trace::kAllocManaged});
    b.add(trace::AllocRecord{~0ull, 2, 0, ~0ull - 5, 0, 0, trace::kAllocManaged});
    b.add(trace::AllocRecord{5, 1, 0, 1ull << 63, 0, 0, trace::kAllocManaged});
    b.movement(trace::RecordType::kEvict, trace::MovementRecord{~0ull, 0, 77, ~0ull, ~0ull, 0, 99, 0xFF});
    b.movement(trace::RecordType::kRestore, trace::MovementRecord{10, 5, 78, ~0ull, ~0ull, 0, 0, 0});
    b.movement(trace::RecordType::kRecompute, trace::MovementRecord{10, 5, 1, 1, 1, 0, 0, 0});
    b.add(trace::FreeRecord{3, 12345, ~0ull, trace::Residency::kOnHost});
    b.add(trace::FreeRecord{4, 1, 1, static_cast<trace::Residency>(200)});
    b.add(trace::CopyRecord{6, ~0ull, 0, 1, 2, static_cast<trace::CopyKind>(99)});
    b.add(trace::MemsetRecord{7, 2, ~0ull, ~0ull});
    b.add(trace::BudgetChangeRecord{8, 0});
    b.add(trace::OverBudgetRecord{9, 4000000000u, ~0ull, 0});
    b.add(trace::IterationRecord{~0ull, ~0ull});
    const uint64_t ids[] = {1, 2, 3, 0, ~0ull};
    trace::LaunchRecord launch;
    launch.time_ns = 1;
    launch.kernel = 123456;  // a name that was never stored
    launch.grid[0] = 0xFFFFFFFF;
    launch.buffers = ids;
    b.add(launch);
    files.push_back({"absurd-values", b.bytes(), true});
  }
  {
    // Many records: a hostile count that is real, not claimed (readers must not be quadratic).
    TraceBuilder b;
    for (uint64_t i = 1; i <= 60000; ++i) {
      b.add(trace::AllocRecord{i, i, i << 21, 2 << 20, 0, 0, trace::kAllocManaged});
      if (i % 2000 == 0) b.endChunk(uint32_t(1 + i % 7));
    }
    files.push_back({"sixty-thousand-buffers", b.bytes(), true});
  }
  // The good trace, cut at every kind of place, and with bytes flipped.
  for (size_t cut : {size_t(1), size_t(7), size_t(8), size_t(15), size_t(16), size_t(40),
                     header.size() - 1, header.size(), header.size() + 3, header.size() + 23,
                     header.size() + 24, header.size() + 60, good.size() / 2, good.size() - 1})
    files.push_back({"cut-" + std::to_string(cut), good.substr(0, cut), cut >= header.size()});
  return files;
}

// Every subcommand, with FILE where the trace goes and OUT where an output file goes.
struct Invocation {
  std::string name;
  std::vector<std::string> args;
};
const std::vector<Invocation> kInvocations = {
    {"summary", {"summary", "FILE"}},
    {"export", {"export", "--chrome", "FILE", "-o", "OUT"}},
    {"plot", {"plot", "FILE", "-o", "OUT"}},
    {"diff-first", {"diff", "FILE", "GOOD"}},
    {"diff-second", {"diff", "GOOD", "FILE"}},
    {"replay", {"replay", "--policy", "lru", "--budget", "50%", "FILE"}},
    {"sweep", {"sweep", "--policies", "lru,delta", "--budgets", "30%,70%", "FILE"}},
    {"maxbatch", {"maxbatch", "--policy", "lru", "--budget", "50%", "--max-overhead", "20%", "FILE"}},
};

TEST(BadTraceFiles, EverySubcommandRefusesOrReadsThemWithoutCrashingOrHanging) {
  TempDir dir;
  writeFile(dir.file("good.trace"), goodTrace());
  // The good trace itself reads cleanly everywhere: the baseline of what "works" means here.
  std::vector<BadFile> files = badFiles();
  files.push_back({"good", goodTrace(), true});
  int runs = 0;
  for (const BadFile& file : files) {
    const std::string path = dir.file(file.name + ".trace");
    writeFile(path, file.bytes);
    for (const Invocation& invocation : kInvocations) {
      SCOPED_TRACE(file.name + " / " + invocation.name);
      const std::string out = dir.file(file.name + "." + invocation.name + ".out");
      std::vector<std::string> argv = {programs().deltaTrace};
      for (const std::string& arg : invocation.args)
        argv.push_back(arg == "FILE" ? path : arg == "OUT" ? out : arg == "GOOD" ? dir.file("good.trace") : arg);
      RunOptions options;
      options.timeoutSeconds = 20;
      const Outcome tool = run(argv, options);
      ++runs;
      ASSERT_FALSE(tool.timedOut) << tool.describe();
      ASSERT_EQ(tool.signal, 0) << tool.describe();
      if (tool.status == 0) {
        EXPECT_TRUE(file.mayBeRead) << "a bad file was accepted\n" << tool.describe();
        struct stat st {};
        if (stat(out.c_str(), &st) == 0) {
          EXPECT_LT(st.st_size, 32 << 20) << "an absurd output for an absurd input";
        }
      } else {
        EXPECT_EQ(tool.status, 1) << tool.describe();
        EXPECT_EQ(lineCount(tool.err), 1u) << tool.describe();
        EXPECT_NE(tool.err.find(file.name), std::string::npos) << "names the file\n"
                                                               << tool.describe();
        EXPECT_FALSE(fileExists(out)) << "no output for a refused input\n" << tool.describe();
      }
      unlink(out.c_str());
    }
  }
  RecordProperty("tool_runs", runs);
}

TEST(BadTraceFiles, NonFilesAreRefused) {
  TempDir dir;
  // A directory, a missing file, a device that never ends and one that is always empty.
  for (const std::string& path : {dir.path(), dir.file("missing.trace"), std::string("/dev/zero"),
                                 std::string("/dev/null")}) {
    for (const Invocation& invocation : kInvocations) {
      SCOPED_TRACE(path + " / " + invocation.name);
      const std::string out = dir.file(invocation.name + ".out");
      std::vector<std::string> argv = {programs().deltaTrace};
      for (const std::string& arg : invocation.args)
        argv.push_back(arg == "FILE" ? path : arg == "OUT" ? out : arg == "GOOD" ? path : arg);
      RunOptions options;
      options.timeoutSeconds = 20;
      const Outcome tool = run(argv, options);
      ASSERT_FALSE(tool.timedOut) << tool.describe();
      ASSERT_EQ(tool.signal, 0) << tool.describe();
      EXPECT_EQ(tool.status, 1) << tool.describe();
      EXPECT_EQ(lineCount(tool.err), 1u) << tool.describe();
      EXPECT_FALSE(fileExists(out)) << tool.describe();
    }
  }
}

// PyTorch Execution Traces and Kineto traces (issue 18): as the FILE, and as --kineto beside a
// good ET. Built as text here: the suite never reads ../shared.
std::string goodEt() {
  return R"({"schema": "1.1.0-chakra.0.0.4", "nodes": [
{"id": 1, "name": "[pytorch|profiler|execution_trace|process]", "ctrl_deps": 1, "inputs": {"values": []}, "outputs": {"values": []}},
{"id": 2, "name": "[pytorch|profiler|execution_trace|thread]", "ctrl_deps": 1, "inputs": {"values": []}, "outputs": {"values": []}},
{"id": 3, "name": "aten::ones", "ctrl_deps": 2, "inputs": {"values": []}, "outputs": {"values": [[1, 10, 0, 4096, 4, "cuda:0"]], "shapes": [[64, 64]]}},
{"id": 4, "name": "aten::mm", "ctrl_deps": 2, "inputs": {"values": [[1, 10, 0, 4096, 4, "cuda:0"], [2, 100, 0, 4096, 4, "cuda:0"]], "shapes": [[64, 64], [64, 64]]}, "outputs": {"values": [[3, 11, 0, 4096, 4, "cuda:0"]], "shapes": [[64, 64]]}},
{"id": 5, "name": "aten::sum", "ctrl_deps": 2, "inputs": {"values": [[3, 11, 0, 4096, 4, "cuda:0"]], "shapes": [[64, 64]]}, "outputs": {"values": [[4, 12, 0, 1, 4, "cuda:0"]], "shapes": [[]]}}
]})";
}

std::string goodKineto() {
  return R"({"traceEvents": [
{"ph": "X", "cat": "cpu_op", "name": "aten::ones", "tid": 1, "ts": 10, "dur": 5},
{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "tid": 1, "ts": 20, "dur": 5},
{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "tid": 1, "ts": 21, "dur": 1, "args": {"correlation": 7}},
{"ph": "X", "cat": "kernel", "name": "gemm", "tid": 7, "ts": 22, "dur": 30, "args": {"correlation": 7}},
{"ph": "X", "cat": "cpu_op", "name": "aten::sum", "tid": 1, "ts": 60, "dur": 5}
]})";
}

std::vector<BadFile> badPyTorchFiles(const std::string& good) {
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    const std::size_t at = s.find(from);
    if (at != std::string::npos) s.replace(at, from.size(), to);
    return s;
  };
  std::vector<BadFile> files;
  for (std::size_t cut : {std::size_t(1), std::size_t(30), good.size() / 2, good.size() - 2})
    files.push_back({"cut-" + std::to_string(cut), good.substr(0, cut)});
  const bool et = good.find("\"nodes\"") != std::string::npos;
  if (et) {
    files.push_back({"schema-2", replaced("1.1.0-chakra.0.0.4", "2.0.0")});
    files.push_back({"schema-number", replaced("\"1.1.0-chakra.0.0.4\"", "11")});
    files.push_back({"numel-huge", replaced("0, 4096, 4,", "0, 18446744073709551615, 4,")});
    files.push_back({"numel-2e300", replaced("0, 4096, 4,", "0, 2e300, 4,")});
    files.push_back({"elem-bytes-huge", replaced("4096, 4, \"cuda:0\"", "4096, 4294967296, \"cuda:0\"")});
    files.push_back({"storage-negative", replaced("[1, 10,", "[1, -10,")});
    files.push_back({"id-string", replaced("\"id\": 4,", "\"id\": \"4\",")});
    files.push_back({"nodes-object", replaced("\"nodes\": [", "\"nodes\": {\"a\": [") + "}"});
    files.push_back({"parent-cycle", replaced("\"ctrl_deps\": 2", "\"ctrl_deps\": 4")});
    files.push_back({"values-deep", replaced("\"values\": []", "\"values\": " + std::string(200, '[') + std::string(200, ']'))});
  } else {
    files.push_back({"events-object", replaced("\"traceEvents\": [", "\"traceEvents\": {\"a\": [") + "}"});
    files.push_back({"ts-huge", replaced("\"ts\": 20,", "\"ts\": 1e300,")});
    files.push_back({"dur-negative", replaced("\"dur\": 30", "\"dur\": -30")});
    files.push_back({"correlation-huge", replaced("\"correlation\": 7}}", "\"correlation\": 1e30}}")});
    files.push_back({"other-run", replaced("aten::", "other::")});
  }
  return files;
}

TEST(BadTraceFiles, PyTorchTracesAreRefusedClearlyOrRead) {
  TempDir dir;
  const std::string et_path = dir.file("good-et.json");
  const std::string kineto_path = dir.file("good-kineto.json");
  writeFile(et_path, goodEt());
  writeFile(kineto_path, goodKineto());
  struct Case {
    BadFile file;
    bool as_kineto;
  };
  std::vector<Case> cases = {{{"good-et", goodEt(), true}, false}, {{"good-kineto", goodKineto(), true}, true}};
  for (BadFile& f : badPyTorchFiles(goodEt())) cases.push_back({f, false});
  for (BadFile& f : badPyTorchFiles(goodKineto())) cases.push_back({f, true});
  for (const Case& c : cases) {
    const std::string path = dir.file((c.as_kineto ? "kineto-" : "et-") + c.file.name + ".json");
    writeFile(path, c.file.bytes);
    for (const Invocation& invocation : kInvocations) {
      if (invocation.name != "replay" && invocation.name != "sweep" && invocation.name != "maxbatch") continue;
      SCOPED_TRACE(path + " / " + invocation.name);
      std::vector<std::string> argv = {programs().deltaTrace};
      for (const std::string& arg : invocation.args) argv.push_back(arg == "FILE" ? (c.as_kineto ? et_path : path) : arg);
      if (c.as_kineto) {
        argv.insert(argv.begin() + 2, path);
        argv.insert(argv.begin() + 2, "--kineto");
      }
      RunOptions options;
      options.timeoutSeconds = 20;
      const Outcome tool = run(argv, options);
      ASSERT_FALSE(tool.timedOut) << tool.describe();
      ASSERT_EQ(tool.signal, 0) << tool.describe();
      if (c.file.mayBeRead) {
        EXPECT_EQ(tool.status, 0) << tool.describe();
      } else if (tool.status != 0) {
        EXPECT_EQ(tool.status, 1) << tool.describe();
        EXPECT_EQ(lineCount(tool.err), 1u) << tool.describe();
        EXPECT_NE(tool.err.find(c.file.name), std::string::npos) << "names the file\n" << tool.describe();
      }
    }
  }
}

// ---- trace paths -----------------------------------------------------------------------------

// A job under the shim with DELTA_TRACE=path: it must run as usual and say once that it runs
// without a trace.
Outcome jobWithTrace(const std::string& path, std::vector<std::string> env = {}) {
  env.push_back("DELTA_BUDGET=8M");
  env.push_back("DELTA_TRACE=" + path);
  return run({programs().faultJob, "--buffers", "4", "--mib", "4", "--rounds", "2"},
             {underShim(env)});
}

void expectRanWithoutTrace(const Outcome& job, const std::string& why) {
  EXPECT_EQ(job.status, 0) << job.describe();
  EXPECT_EQ(job.value("verify"), "ok") << job.describe();
  ASSERT_EQ(job.shimMessages().size(), 1u) << job.describe();
  EXPECT_NE(job.shimMessages()[0].find("DELTA_TRACE"), std::string::npos) << job.describe();
  EXPECT_NE(job.shimMessages()[0].find(why), std::string::npos) << job.describe();
  EXPECT_NE(job.shimMessages()[0].find("without a trace"), std::string::npos) << job.describe();
}

TEST(TracePaths, UnwritableDirectories) {
  TempDir dir;
  writeFile(dir.file("plain-file"), "x");
  // Not writable even for root: a directory that is a file, /proc, a missing directory.
  expectRanWithoutTrace(jobWithTrace(dir.file("plain-file/job.trace")), "Not a directory");
  expectRanWithoutTrace(jobWithTrace("/proc/self/job.trace"), "cannot create");
  expectRanWithoutTrace(jobWithTrace(dir.file("missing/job.trace")), "No such file");
  expectRanWithoutTrace(jobWithTrace(dir.path() + "/" + std::string(300, 'n') + ".trace"),
                        "File name too long");
  // A directory without write permission (root ignores permissions: then this case is not
  // one, and is skipped).
  const std::string locked = dir.file("locked");
  mkdir(locked.c_str(), 0500);
  if (geteuid() != 0) expectRanWithoutTrace(jobWithTrace(locked + "/job.trace"), "Permission denied");
  EXPECT_FALSE(fileExists(locked + "/job.trace"));
}

TEST(TracePaths, SymbolicLinksAreNeverFollowed) {
  TempDir dir;
  const std::string target = dir.file("precious.txt");
  writeFile(target, "precious contents\n");
  const std::string link = dir.file("job.trace");
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  expectRanWithoutTrace(jobWithTrace(link), "symbolic link");
  EXPECT_EQ(readFile(target), "precious contents\n");
  // Not even with overwriting allowed.
  expectRanWithoutTrace(jobWithTrace(link, {"DELTA_TRACE_OVERWRITE=1"}), "symbolic link");
  EXPECT_EQ(readFile(target), "precious contents\n");
  // A dangling link: its target must not be created.
  const std::string dangling = dir.file("dangling.trace");
  ASSERT_EQ(symlink(dir.file("created-through-link").c_str(), dangling.c_str()), 0);
  expectRanWithoutTrace(jobWithTrace(dangling), "symbolic link");
  EXPECT_FALSE(fileExists(dir.file("created-through-link")));
  // A link to a trace: still not followed.
  const std::string traceTarget = dir.file("real.trace");
  writeFile(traceTarget, goodTrace());
  const std::string traceLink = dir.file("link-to-trace.trace");
  ASSERT_EQ(symlink(traceTarget.c_str(), traceLink.c_str()), 0);
  expectRanWithoutTrace(jobWithTrace(traceLink), "symbolic link");
  EXPECT_EQ(readFile(traceTarget), goodTrace());
}

TEST(TracePaths, ExistingFilesThatAreNotTracesAreLeftAlone) {
  TempDir dir;
  const std::string notes = dir.file("notes.trace");
  writeFile(notes, "my notes, not a trace\n");
  expectRanWithoutTrace(jobWithTrace(notes), "not a DELTA trace");
  EXPECT_EQ(readFile(notes), "my notes, not a trace\n");
  const std::string png = dir.file("picture.trace");
  const std::string pngBytes("\x89PNG\r\n\x1a\n\0\0\0\rIHDR", 16);
  writeFile(png, pngBytes);
  expectRanWithoutTrace(jobWithTrace(png), "not a DELTA trace");
  EXPECT_EQ(readFile(png), pngBytes);
  // A directory, a FIFO and a device are not regular files.
  const std::string directory = dir.file("directory.trace");
  mkdir(directory.c_str(), 0700);
  expectRanWithoutTrace(jobWithTrace(directory), "");
  const std::string fifo = dir.file("fifo.trace");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  expectRanWithoutTrace(jobWithTrace(fifo), "not a regular file");
  expectRanWithoutTrace(jobWithTrace("/dev/null"), "not a regular file");
  // An old trace is replaced (that is what DELTA_TRACE_OVERWRITE is not needed for), and
  // the new one reads back.
  const std::string old = dir.file("old.trace");
  writeFile(old, goodTrace());
  const Outcome replaced = jobWithTrace(old);
  EXPECT_EQ(replaced.status, 0) << replaced.describe();
  EXPECT_TRUE(replaced.shimMessages().empty()) << replaced.describe();
  const Outcome summary = run({programs().deltaTrace, "summary", old});
  EXPECT_EQ(summary.status, 0) << summary.describe();
  EXPECT_NE(summary.out.find("libdelta"), std::string::npos) << summary.describe();
}

}  // namespace
}  // namespace delta::faults
