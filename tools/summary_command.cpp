// `delta-trace summary FILE` and `delta-trace diff A B`: see trace_commands.h. Output is
// deterministic (no clock, stable ordering: ties broken by id) so tests compare it exactly.
#include <fmt/core.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "tools/cli_args.h"
#include "tools/trace_commands.h"
#include "tools/trace_stats.h"

namespace delta::tools {

namespace {

constexpr std::string_view kSummaryHelp =
    "usage: delta-trace summary [--top N] FILE\n"
    "Summarises a trace written by libdelta (DELTA_TRACE=path): memory peaks, bytes moved,\n"
    "stalls, time over budget, what could not be analysed, the buffers that moved most and the\n"
    "kernels that waited longest. The file is streamed; a cut-short file is summarised up to\n"
    "its last whole record, with a warning.\n"
    "  --top N   rows in the top-buffers and top-kernels tables (default 10)\n";

constexpr std::string_view kDiffHelp =
    "usage: delta-trace diff A B\n"
    "Two traces of the same job side by side (e.g. two budgets, or two versions of libdelta):\n"
    "peaks, bytes moved, stalls, launches over budget, with B's change against A.\n";

int usage(std::string_view cmd, const std::string& msg) {
  fmt::print(stderr, "delta-trace {}: {} (see 'delta-trace {} --help')\n", cmd, msg, cmd);
  return 2;
}

std::string rankText(std::int32_t rank) { return rank < 0 ? "none" : std::to_string(rank); }

// Prints where the file stopped being readable; returns 1 when it is corrupt or unreadable.
int printFileState(std::FILE* out, const TraceStats& s) {
  if (s.status != trace::ReadStatus::kEnd) {
    // A cut-short file (a crash) is summarised with a warning; a corrupt one is an error.
    const bool cut = s.status == trace::ReadStatus::kTruncated;
    fmt::print(out, "{}: {}\n", cut ? "warning" : "error", s.error);
    return cut ? 0 : 1;
  }
  if (!s.closed) {
    fmt::print(out, "warning: {}: no closing record: the job did not finish cleanly (crash or kill);"
                    " totals are derived from the records present\n", s.path);
  }
  return 0;
}

void printSummary(std::FILE* out, const TraceStats& s, std::size_t top) {
  fmt::print(out, "trace {}\n", s.path);
  fmt::print(out, "  producer {}, format {}, pid {}, rank {}\n", s.producer, s.version, s.pid,
             rankText(s.rank));
  fmt::print(out, "  device {} ({}), budget {}, policy {}\n", s.device_name,
             formatBytes(s.device_memory), s.budget ? formatBytes(s.budget) : "none",
             s.policy.empty() ? "-" : s.policy);
  fmt::print(out, "  {} records over {}, {} iteration marker(s)\n", s.records,
             formatNs(s.durationNs()), s.iterations);
  fmt::print(out, "events\n");
  fmt::print(out, "  allocations {}, frees {}, launches {}, copies {} ({}), memsets {}\n", s.allocs,
             s.frees, s.launches, s.copies, formatBytes(s.copy_bytes), s.memsets);
  fmt::print(out, "memory\n");
  fmt::print(out, "  peak resident (managed)  {}\n", formatSignedBytes(s.peak_resident));
  if (s.closed) {
    fmt::print(out, "  peak resident (shim)     {}\n", formatBytes(s.close.totals.peak_resident));
  }
  fmt::print(out, "  peak on host             {}\n", formatSignedBytes(s.peak_host));
  fmt::print(out, "  peak unmanaged           {}\n", formatSignedBytes(s.peak_unmanaged));
  fmt::print(out, "  at the end               resident {}, on host {}\n",
             formatSignedBytes(s.resident), formatSignedBytes(s.host));
  fmt::print(out, "traffic\n");
  fmt::print(out, "  swapped out   {} in {} eviction(s)\n", formatBytes(s.bytes_d2h), s.evictions);
  fmt::print(out, "  swapped in    {} in {} restore(s), {} prefetched\n", formatBytes(s.bytes_h2d),
             s.restores, s.prefetched);
  fmt::print(out, "  dropped       {} in {} drop(s)\n", formatBytes(s.bytes_dropped), s.drops);
  fmt::print(out, "  recomputed    {} in {} recompute(s)\n", formatBytes(s.bytes_recomputed),
             s.recomputes);
  fmt::print(out, "  stalls        {} (evictions {}, restores {}, recomputes {})\n",
             formatNs(s.stallNs()), formatNs(s.stall_evict_ns), formatNs(s.stall_restore_ns),
             formatNs(s.stall_recompute_ns));
  fmt::print(out, "budget\n");
  fmt::print(out, "  budget changes {}, last {}\n", s.budget_changes,
             s.last_budget ? formatBytes(s.last_budget) : "none");
  fmt::print(out, "  launches over budget {}", s.over_budget);
  if (s.over_budget != 0) {
    fmt::print(out, "; worst {} over: {} needed {} with a budget of {}", formatBytes(s.worst_excess),
               s.kernelName(s.worst_kernel), formatBytes(s.worst_working_set),
               formatBytes(s.worst_budget));
  }
  fmt::print(out, "\n");
  if (s.plans != 0) {
    const trace::PlanRecord& p = s.last_plan;
    fmt::print(out, "  plans {} ({} on the planner thread); last: ", s.plans, formatNs(s.planning_ns));
    if (p.flags & 1) {
      fmt::print(out, "{} for {} launches, predicted {} per iteration\n", s.kernelName(p.name), p.launches,
                 formatNs(static_cast<std::uint64_t>(std::max<std::int64_t>(p.predicted_ns, 0))));
    } else {
      fmt::print(out, "none needed for {} launches (the iteration fits)\n", p.launches);
    }
  }
  fmt::print(out, "analysis\n");
  fmt::print(out, "  launches not analysed {} of {}", s.not_analysed, s.launches);
  if (s.not_analysed != 0) {
    std::vector<std::pair<std::uint32_t, std::uint64_t>> k;
    for (const auto& [id, ks] : s.kernels) {
      if (ks.not_analysed != 0) k.emplace_back(id, ks.not_analysed);
    }
    std::stable_sort(k.begin(), k.end(), [](auto& a, auto& b) { return a.second > b.second; });
    fmt::print(out, ":");
    for (std::size_t i = 0; i < k.size() && i < top; ++i) {
      fmt::print(out, " {} ({})", s.kernelName(k[i].first), k[i].second);
    }
  }
  fmt::print(out, "\n");

  std::vector<std::pair<std::uint64_t, const BufferStats*>> bufs;
  for (const auto& [id, b] : s.buffers) {
    if (b.moved() != 0) bufs.emplace_back(id, &b);
  }
  std::stable_sort(bufs.begin(), bufs.end(), [](auto& a, auto& b) {
    return a.second->swapped_out + a.second->swapped_in > b.second->swapped_out + b.second->swapped_in;
  });
  fmt::print(out, "top buffers by bytes swapped\n");
  if (bufs.empty()) fmt::print(out, "  (none)\n");
  else fmt::print(out, "  {:>10}  {:>10}  {:>11}  {:>10}  {:>10}  {:>10}\n", "buffer", "size",
                  "swapped out", "swapped in", "dropped", "recomputed");
  for (std::size_t i = 0; i < bufs.size() && i < top; ++i) {
    const BufferStats& b = *bufs[i].second;
    fmt::print(out, "  {:>10}  {:>10}  {:>11}  {:>10}  {:>10}  {:>10}\n", bufs[i].first,
               formatBytes(b.bytes), formatBytes(b.swapped_out), formatBytes(b.swapped_in),
               formatBytes(b.dropped), formatBytes(b.recomputed));
  }
  std::vector<std::pair<std::uint32_t, const KernelStats*>> ks;
  for (const auto& [id, k] : s.kernels) {
    if (k.stall_ns != 0) ks.emplace_back(id, &k);
  }
  std::stable_sort(ks.begin(), ks.end(),
                   [](auto& a, auto& b) { return a.second->stall_ns > b.second->stall_ns; });
  fmt::print(out, "top kernels by stalls\n");
  if (ks.empty()) fmt::print(out, "  (none)\n");
  for (std::size_t i = 0; i < ks.size() && i < top; ++i) {
    fmt::print(out, "  {:>10}  {:>4} stall(s)  {:>8} launch(es)  {}\n", formatNs(ks[i].second->stall_ns),
               ks[i].second->stall_events, ks[i].second->launches, s.kernelName(ks[i].first));
  }
  if (!s.sites.empty()) {
    // Recorded with DELTA_TRACE_STACKS=1: where the managed bytes were asked for.
    std::vector<std::pair<std::uint32_t, const TraceStats::Site*>> sites;
    for (const auto& [stack, site] : s.sites) sites.emplace_back(stack, &site);
    std::stable_sort(sites.begin(), sites.end(),
                     [](auto& a, auto& b) { return a.second->bytes > b.second->bytes; });
    fmt::print(out, "top allocation sites (innermost frame first)\n");
    for (std::size_t i = 0; i < sites.size() && i < top; ++i)
      fmt::print(out, "  {:>10}  {:>6} allocation(s)  {}\n", formatBytes(sites[i].second->bytes),
                 sites[i].second->allocations, s.siteName(sites[i].first, 4));
  }
  fmt::print(out, "file\n");
  if (s.closed) {
    fmt::print(out, "  closing record: {} records written, {} dropped by the writer{}\n",
               s.close.records_written, s.close.records_dropped,
               s.close.records_dropped ? " (the disk was full or slow: totals above are partial)" : "");
    fmt::print(out, "  shim totals: {} eviction(s), {} restore(s), {} recompute(s), stalls {}, "
                    "{} over-budget launch(es), {} out, {} in\n",
               s.close.totals.evictions, s.close.totals.restores, s.close.totals.recomputes,
               formatNs(s.close.totals.stall_ns), s.close.totals.over_budget_launches,
               formatBytes(s.close.totals.bytes_d2h), formatBytes(s.close.totals.bytes_h2d));
  } else {
    fmt::print(out, "  no closing record\n");
  }
}

}  // namespace

int summaryCommand(const std::vector<std::string>& args) {
  CliArgs a;
  if (std::string err = a.parse(args, {{"top", true}, {"help", false}}); !err.empty()) {
    return usage("summary", err);
  }
  if (a.has("help")) {
    fmt::print("{}", kSummaryHelp);
    return 0;
  }
  if (a.positional().size() != 1) return usage("summary", "expected one trace FILE");
  std::size_t top = 10;
  if (auto v = a.value("top")) {
    auto n = parseCount(*v);
    if (!n || *n == 0) return usage("summary", "bad --top '" + *v + "': expected an integer >= 1");
    top = *n;
  }
  TraceStats s;
  if (std::string err = computeTraceStats(a.positional()[0], s); !err.empty()) {
    fmt::print(stderr, "delta-trace summary: {}\n", err);
    return 1;
  }
  printSummary(stdout, s, top);
  std::fflush(stdout);
  return printFileState(stderr, s);
}

int diffCommand(const std::vector<std::string>& args) {
  CliArgs a;
  if (std::string err = a.parse(args, {{"help", false}}); !err.empty()) return usage("diff", err);
  if (a.has("help")) {
    fmt::print("{}", kDiffHelp);
    return 0;
  }
  if (a.positional().size() != 2) return usage("diff", "expected two trace files, A and B");
  TraceStats s[2];
  for (int i = 0; i < 2; ++i) {
    if (std::string err = computeTraceStats(a.positional()[i], s[i]); !err.empty()) {
      fmt::print(stderr, "delta-trace diff: {}\n", err);
      return 1;
    }
  }
  struct Row {
    const char* name;
    std::uint64_t a, b;
    bool bytes, time;
  };
  auto u = [](std::int64_t v) { return static_cast<std::uint64_t>(std::max<std::int64_t>(v, 0)); };
  const Row rows[] = {
      {"budget", s[0].budget, s[1].budget, true, false},
      {"duration", s[0].durationNs(), s[1].durationNs(), false, true},
      {"launches", s[0].launches, s[1].launches, false, false},
      {"peak resident", u(s[0].peak_resident), u(s[1].peak_resident), true, false},
      {"peak on host", u(s[0].peak_host), u(s[1].peak_host), true, false},
      {"swapped out", s[0].bytes_d2h, s[1].bytes_d2h, true, false},
      {"swapped in", s[0].bytes_h2d, s[1].bytes_h2d, true, false},
      {"dropped", s[0].bytes_dropped, s[1].bytes_dropped, true, false},
      {"recomputed", s[0].bytes_recomputed, s[1].bytes_recomputed, true, false},
      {"evictions", s[0].evictions, s[1].evictions, false, false},
      {"restores", s[0].restores, s[1].restores, false, false},
      {"recomputes", s[0].recomputes, s[1].recomputes, false, false},
      {"stalls", s[0].stallNs(), s[1].stallNs(), false, true},
      {"over budget", s[0].over_budget, s[1].over_budget, false, false},
      {"not analysed", s[0].not_analysed, s[1].not_analysed, false, false},
  };
  fmt::print("A: {} (policy {}, budget {})\n", s[0].path, s[0].policy,
             s[0].budget ? formatBytes(s[0].budget) : "none");
  fmt::print("B: {} (policy {}, budget {})\n", s[1].path, s[1].policy,
             s[1].budget ? formatBytes(s[1].budget) : "none");
  fmt::print("{:<14}  {:>12}  {:>12}  {:>14}\n", "", "A", "B", "B - A");
  for (const Row& r : rows) {
    auto text = [&](std::uint64_t v) {
      return r.bytes ? formatBytes(v) : r.time ? formatNs(v) : std::to_string(v);
    };
    std::string change;
    if (r.a == r.b) {
      change = "=";
    } else {
      const std::uint64_t d = r.b > r.a ? r.b - r.a : r.a - r.b;
      change = (r.b > r.a ? "+" : "-") + text(d);
      if (r.a != 0) {
        change += fmt::format(" ({:+.0f}%)", (static_cast<double>(r.b) - static_cast<double>(r.a)) * 100.0 /
                                                 static_cast<double>(r.a));
      }
    }
    fmt::print("{:<14}  {:>12}  {:>12}  {:>14}\n", r.name, text(r.a), text(r.b), change);
  }
  std::fflush(stdout);
  const int a_state = printFileState(stderr, s[0]);
  const int b_state = printFileState(stderr, s[1]);
  return a_state | b_state;
}

}  // namespace delta::tools
