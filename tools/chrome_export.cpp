// `delta-trace export --chrome FILE -o out.json`: Chrome trace-event JSON (the "traceEvents"
// object form) for Perfetto and chrome://tracing. One process (the job); one track per stream
// (tid in order of first appearance, named by thread_name metadata); "X" slices for launches,
// evictions, restores and recomputes on their streams; instants for copies, memsets, iteration
// markers and over-budget launches; "C" counters for resident, host and unmanaged bytes and
// the budget. Times are microseconds from the trace's start with ns precision.
//
// Streams the input: the only state is one pending launch per stream (a launch's slice lasts
// until the next launch on its stream, at most kMaxLaunchUs; the last one 1 us: a trace records
// when kernels are enqueued, not how long they run). Counters are the running sums of the
// records' changes in file order (exact for a job that recorded from one thread).
//
// The `export` command's options are parsed here; --pytorch-snapshot goes to pytorch_snapshot.cpp.
#include <fmt/core.h>

#include <cstdio>
#include <map>

#include "tools/cli_args.h"
#include "tools/export_file.h"
#include "tools/pytorch_snapshot.h"
#include "tools/trace_commands.h"
#include "tools/trace_stats.h"

namespace delta::tools {

namespace {

using trace::Record;
using trace::RecordType;

constexpr std::string_view kHelp =
    "usage: delta-trace export --chrome FILE -o OUT.json\n"
    "       delta-trace export --pytorch-snapshot FILE -o OUT.pickle\n"
    "Writes a trace in another tool's format.\n"
    "  --chrome FILE   Chrome trace-event JSON that opens in Perfetto (ui.perfetto.dev) and\n"
    "                  chrome://tracing: a track per CUDA stream with launches, evictions,\n"
    "                  restores and recomputes as slices, and counters for resident, host and\n"
    "                  unmanaged bytes and the budget\n"
    "  --pytorch-snapshot FILE   the pickle torch.cuda.memory._dump_snapshot writes, for\n"
    "                  PyTorch's memory viewer (pytorch.org/memory_viz): allocations, frees,\n"
    "                  evictions and restores as allocator and segment events\n"
    "  -o, --output OUT   where to write ('-' for standard output)\n";

constexpr std::uint64_t kMaxLaunchNs = 10'000'000;

class ChromeWriter {
 public:
  ChromeWriter(std::FILE* out, std::uint64_t start_ns, std::uint32_t pid)
      : out_(out), start_ns_(start_ns), pid_(pid) {}

  std::string ts(std::uint64_t t) const {
    const std::uint64_t rel = t > start_ns_ ? t - start_ns_ : 0;
    return fmt::format("{}.{:03}", rel / 1000, rel % 1000);
  }
  static std::string dur(std::uint64_t ns) { return fmt::format("{}.{:03}", ns / 1000, ns % 1000); }

  void event(const std::string& body) {
    fmt::print(out_, "{}\n{{{}}}", first_ ? "" : ",", body);
    first_ = false;
  }

  std::uint32_t tid(std::uint64_t stream) {
    auto [it, inserted] = tids_.try_emplace(stream, static_cast<std::uint32_t>(tids_.size() + 1));
    if (inserted) {
      const std::string name =
          stream == 0 ? std::string("default stream") : fmt::format("stream 0x{:x}", stream);
      event(fmt::format(R"("ph":"M","name":"thread_name","pid":{},"tid":{},"args":{{"name":{}}})", pid_,
                        it->second, jsonString(name)));
      event(fmt::format(R"("ph":"M","name":"thread_sort_index","pid":{},"tid":{},"args":{{"sort_index":{}}})",
                        pid_, it->second, it->second));
    }
    return it->second;
  }

  void slice(std::uint64_t stream, const std::string& name, const char* cat, std::uint64_t start,
             std::uint64_t ns, const std::string& args) {
    const std::uint32_t t = tid(stream);
    event(fmt::format(R"("ph":"X","name":{},"cat":"{}","pid":{},"tid":{},"ts":{},"dur":{},"args":{{{}}})",
                      jsonString(name), cat, pid_, t, ts(start), dur(ns), args));
  }

  void instant(std::uint64_t stream, const std::string& name, const char* cat, std::uint64_t at,
               const char* scope, const std::string& args) {
    const std::uint32_t t = tid(stream);
    event(fmt::format(R"("ph":"i","s":"{}","name":{},"cat":"{}","pid":{},"tid":{},"ts":{},"args":{{{}}})",
                      scope, jsonString(name), cat, pid_, t, ts(at), args));
  }

  void counter(const char* name, std::uint64_t at, std::int64_t value) {
    event(fmt::format(R"("ph":"C","name":"{}","pid":{},"ts":{},"args":{{"bytes":{}}})", name, pid_,
                      ts(at), value));
  }

 private:
  std::FILE* out_;
  std::uint64_t start_ns_;
  std::uint32_t pid_;
  bool first_ = true;
  std::map<std::uint64_t, std::uint32_t> tids_;
};

struct PendingLaunch {
  std::uint64_t time_ns = 0;
  std::string name;
  std::string args;
};

}  // namespace

int exportCommand(const std::vector<std::string>& args) {
  std::vector<std::string> norm;
  for (const std::string& s : args) norm.push_back(s == "-o" ? "--output" : s);
  CliArgs a;
  if (std::string err = a.parse(norm, {{"chrome", true}, {"pytorch-snapshot", true}, {"output", true},
                                       {"help", false}});
      !err.empty()) {
    fmt::print(stderr, "delta-trace export: {} (see 'delta-trace export --help')\n", err);
    return 2;
  }
  if (a.has("help")) {
    fmt::print("{}", kHelp);
    return 0;
  }
  auto usage = [](const std::string& msg) {
    fmt::print(stderr, "delta-trace export: {} (see 'delta-trace export --help')\n", msg);
    return 2;
  };
  const auto chrome = a.value("chrome");
  const auto snapshot = a.value("pytorch-snapshot");
  const auto output = a.value("output");
  if (chrome && snapshot) return usage("--chrome and --pytorch-snapshot: one format at a time");
  if (!chrome && !snapshot) return usage("expected --chrome FILE or --pytorch-snapshot FILE");
  if (!output) return usage(snapshot ? "expected -o OUT.pickle" : "expected -o OUT.json");
  if (!a.positional().empty()) return usage("unexpected argument '" + a.positional()[0] + "'");
  if (snapshot) return exportPytorchSnapshot(*snapshot, *output);
  const auto& input = chrome;

  trace::TraceReader reader;
  if (std::string err = reader.open(*input); !err.empty()) {
    fmt::print(stderr, "delta-trace export: {}\n", err);
    return 1;
  }
  ExportFile file(*output, false);
  std::FILE* out = file.file();
  if (out == nullptr) return 1;
  const trace::FileHeader& h = reader.header();
  ChromeWriter w(out, h.start_monotonic_ns, h.pid);
  fmt::print(out, "{{\"displayTimeUnit\":\"ns\",\"otherData\":{{\"producer\":{},\"device\":{},"
                  "\"policy\":{},\"budget_bytes\":{}}},\n\"traceEvents\":[",
             jsonString(h.producer), jsonString(h.device_name), jsonString(h.policy), h.budget);
  w.event(fmt::format(R"("ph":"M","name":"process_name","pid":{},"args":{{"name":{}}})", h.pid,
                      jsonString(fmt::format("DELTA job (pid {}{})", h.pid,
                                             h.rank >= 0 ? fmt::format(", rank {}", h.rank) : ""))));
  w.counter("budget", h.start_monotonic_ns, static_cast<std::int64_t>(h.budget));

  std::map<std::uint64_t, PendingLaunch> pending;  // by stream
  auto finish = [&](std::uint64_t stream, std::uint64_t until) {
    auto it = pending.find(stream);
    if (it == pending.end()) return;
    std::uint64_t ns = until > it->second.time_ns ? until - it->second.time_ns : 1000;
    if (ns > kMaxLaunchNs) ns = kMaxLaunchNs;
    w.slice(stream, it->second.name, "launch", it->second.time_ns, ns, it->second.args);
    pending.erase(it);
  };
  std::int64_t resident = 0, host = 0, unmanaged = 0;
  Record r;
  while (reader.next(r)) {
    MemoryDelta d;
    if (memoryDelta(r, d)) {
      if (d.resident != 0) w.counter("resident bytes", d.time_ns, resident += d.resident);
      if (d.host != 0) w.counter("host bytes", d.time_ns, host += d.host);
      if (d.unmanaged != 0) w.counter("unmanaged bytes", d.time_ns, unmanaged += d.unmanaged);
    }
    switch (r.type) {
      case RecordType::kLaunch: {
        const trace::LaunchRecord& l = r.launch;
        finish(l.stream, l.time_ns);
        std::string ids;
        for (std::size_t i = 0; i < l.buffers.size() && i < 64; ++i) {
          ids += fmt::format("{}{}", i ? "," : "", l.buffers[i]);
        }
        pending[l.stream] = PendingLaunch{
            l.time_ns, reader.label(l.kernel),
            fmt::format(R"("grid":"{}x{}x{}","block":"{}x{}x{}","analysed":{},"buffers":[{}])", l.grid[0],
                        l.grid[1], l.grid[2], l.block[0], l.block[1], l.block[2],
                        (l.flags & trace::kLaunchAnalysed) ? "true" : "false", ids)};
        break;
      }
      case RecordType::kEvict:
      case RecordType::kRestore:
      case RecordType::kRecompute: {
        const trace::MovementRecord& m = r.movement;
        const bool drop = r.type == RecordType::kEvict && (m.flags & trace::kEvictDrop);
        const char* what = r.type == RecordType::kRestore ? "restore"
                           : r.type == RecordType::kRecompute ? "recompute"
                           : drop ? "drop" : "evict";
        std::string extra;
        if (r.type == RecordType::kRestore) {
          extra = fmt::format(R"(,"prefetched":{})", (m.flags & trace::kRestorePrefetched) ? "true" : "false");
        }
        if (m.kernel != 0) extra += fmt::format(R"(,"waiting_kernel":{})", jsonString(reader.label(m.kernel)));
        w.slice(m.stream, fmt::format("{} buffer {} ({})", what, m.buffer, formatBytes(m.bytes)), what,
                m.start_ns, m.end_ns > m.start_ns ? m.end_ns - m.start_ns : 0,
                fmt::format(R"("buffer":{},"bytes":{},"stall_ns":{}{})", m.buffer, m.bytes, m.stall_ns, extra));
        break;
      }
      case RecordType::kCopy: {
        const trace::CopyRecord& c = r.copy;
        w.instant(c.stream, fmt::format("memcpy {} {}", trace::copyKindName(c.kind), formatBytes(c.bytes)),
                  "copy", c.time_ns, "t",
                  fmt::format(R"("bytes":{},"dst":{},"src":{})", c.bytes, c.dst, c.src));
        break;
      }
      case RecordType::kMemset:
        w.instant(r.memset.stream, fmt::format("memset {}", formatBytes(r.memset.bytes)), "memset",
                  r.memset.time_ns, "t",
                  fmt::format(R"("buffer":{},"bytes":{})", r.memset.buffer, r.memset.bytes));
        break;
      case RecordType::kBudgetChange:
        w.counter("budget", r.budget.time_ns, static_cast<std::int64_t>(r.budget.budget));
        break;
      case RecordType::kOverBudget: {
        const trace::OverBudgetRecord& o = r.over_budget;
        w.instant(0, "over budget: " + reader.label(o.kernel), "over_budget", o.time_ns, "p",
                  fmt::format(R"("working_set":{},"budget":{})", o.working_set, o.budget));
        break;
      }
      case RecordType::kPlan: {
        const trace::PlanRecord& p = r.plan;
        w.instant(0, "plan: " + ((p.flags & 1) ? reader.label(p.name) : std::string("none needed")), "plan",
                  p.time_ns, "g",
                  fmt::format(R"("planning_ns":{},"predicted_ns":{},"launches":{})", p.planning_ns,
                              p.predicted_ns, p.launches));
        break;
      }
      case RecordType::kIteration:
        w.instant(0, fmt::format("iteration {}", r.iteration.index), "iteration", r.iteration.time_ns,
                  "g", fmt::format(R"("index":{})", r.iteration.index));
        break;
      default:
        break;
    }
  }
  while (!pending.empty()) finish(pending.begin()->first, 0);
  fmt::print(out, "\n]}}\n");
  return file.finish(reader);
}

}  // namespace delta::tools
