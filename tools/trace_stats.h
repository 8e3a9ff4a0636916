// TraceStats: one streaming pass over a shim trace (trace/format.h) that gathers what summary
// and diff print: totals, derived memory peaks, per-buffer traffic and per-kernel stalls. Memory
// is bounded by the number of distinct buffers and kernels, never by the file's length.
// Also the small formatting helpers the trace subcommands share (sizes, times, JSON strings).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "trace/trace_reader.h"

namespace delta::tools {

struct BufferStats {
  std::uint64_t bytes = 0;  // size at allocation (or the largest seen)
  std::uint64_t swapped_out = 0;
  std::uint64_t swapped_in = 0;
  std::uint64_t dropped = 0;
  std::uint64_t recomputed = 0;
  std::uint64_t moved() const { return swapped_out + swapped_in + dropped + recomputed; }
};

struct KernelStats {
  std::uint64_t launches = 0;
  std::uint64_t not_analysed = 0;
  std::uint64_t stall_ns = 0;
  std::uint64_t stall_events = 0;
};

struct TraceStats {
  std::string path;
  std::string producer, device_name, policy;
  std::uint64_t device_memory = 0, budget = 0, start_ns = 0;
  std::uint32_t pid = 0;
  std::int32_t rank = -1;
  std::uint16_t version = 0;

  std::uint64_t records = 0;
  std::uint64_t first_ns = 0, last_ns = 0;  // event times (absolute, monotonic)
  std::uint64_t iterations = 0;
  std::uint64_t allocs = 0, frees = 0, launches = 0, not_analysed = 0, copies = 0, memsets = 0;
  std::uint64_t copy_bytes = 0;
  std::uint64_t evictions = 0, drops = 0, restores = 0, prefetched = 0, recomputes = 0;
  std::uint64_t bytes_d2h = 0, bytes_dropped = 0, bytes_h2d = 0, bytes_recomputed = 0;
  std::uint64_t stall_evict_ns = 0, stall_restore_ns = 0, stall_recompute_ns = 0;
  std::uint64_t over_budget = 0, worst_excess = 0, worst_working_set = 0, worst_budget = 0;
  std::uint32_t worst_kernel = 0;
  std::uint64_t budget_changes = 0, last_budget = 0;
  // Plans the shim's planner thread handed to the policy, and the last one.
  std::uint64_t plans = 0, planning_ns = 0;
  trace::PlanRecord last_plan{};
  // Derived from the events in file order (exact for one recording thread).
  std::int64_t resident = 0, host = 0, peak_resident = 0, peak_host = 0;
  std::int64_t unmanaged = 0, peak_unmanaged = 0;

  bool closed = false;
  trace::CloseRecord close{};
  trace::ReadStatus status = trace::ReadStatus::kOk;
  std::string error;  // when status is not kEnd

  std::map<std::uint64_t, BufferStats> buffers;
  std::map<std::uint32_t, KernelStats> kernels;
  std::map<std::uint32_t, std::string> names;  // name ids (kernels, stack frames) -> names
  // Allocations by call stack (DELTA_TRACE_STACKS=1): how many and how many bytes, per stack id;
  // and each stack's frames, innermost first.
  struct Site {
    std::uint64_t allocations = 0, bytes = 0;
  };
  std::map<std::uint32_t, Site> sites;
  std::map<std::uint32_t, std::vector<trace::StackFrame>> stacks;

  std::uint64_t stallNs() const { return stall_evict_ns + stall_restore_ns + stall_recompute_ns; }
  std::uint64_t durationNs() const { return last_ns > first_ns ? last_ns - first_ns : 0; }
  std::string kernelName(std::uint32_t id) const;
  // A stack's first `frames` frames, "innermost < caller < ...", by name where one was recorded.
  std::string siteName(std::uint32_t stack, std::size_t frames) const;
};

// Reads `path` whole (streaming). Returns "" when the header was readable (the stats may still
// carry a truncation or corruption in status/error); else the reader's error.
std::string computeTraceStats(const std::string& path, TraceStats& out);

// Resident/host byte changes one record makes (see docs/trace-format.md, "Deriving memory").
struct MemoryDelta {
  std::uint64_t time_ns = 0;
  std::int64_t resident = 0;
  std::int64_t host = 0;
  std::int64_t unmanaged = 0;
};
bool memoryDelta(const trace::Record& r, MemoryDelta& d);

// "0 B", "512 B", "1.5 KiB", "32.0 MiB", "1.00 GiB".
std::string formatBytes(std::uint64_t bytes);
std::string formatSignedBytes(std::int64_t bytes);
// "0 ns", "850 ns", "12.5 us", "3.20 ms", "1.25 s".
std::string formatNs(std::uint64_t ns);
// A JSON string literal, quotes included.
std::string jsonString(std::string_view s);

}  // namespace delta::tools
