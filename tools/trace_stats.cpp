// TraceStats: see trace_stats.h.
#include "tools/trace_stats.h"

#include <fmt/core.h>

#include <algorithm>

namespace delta::tools {

using trace::Record;
using trace::RecordType;

std::string TraceStats::kernelName(std::uint32_t id) const {
  auto it = names.find(id);
  if (it != names.end() && !it->second.empty()) return it->second;
  return id == 0 ? std::string("(none)") : "#" + std::to_string(id);
}

std::string TraceStats::siteName(std::uint32_t stack, std::size_t frames) const {
  auto it = stacks.find(stack);
  if (it == stacks.end()) return "#" + std::to_string(stack) + " (no stack record)";
  std::string text;
  for (std::size_t i = 0; i < it->second.size() && i < frames; ++i) {
    const trace::StackFrame& frame = it->second[i];
    auto name = names.find(frame.name);
    if (!text.empty()) text += " < ";
    text += frame.name != 0 && name != names.end() ? name->second
                                                   : fmt::format("{:#x}", frame.address);
  }
  return text.empty() ? "(empty stack)" : text;
}

bool memoryDelta(const Record& r, MemoryDelta& d) {
  d = MemoryDelta{};
  const auto b = [](std::uint64_t v) { return static_cast<std::int64_t>(v); };
  switch (r.type) {
    case RecordType::kAlloc:
      d.time_ns = r.alloc.time_ns;
      if (r.alloc.flags & trace::kAllocManaged) {
        d.resident = b(r.alloc.bytes);
      } else {
        d.unmanaged = b(r.alloc.bytes);
      }
      return true;
    case RecordType::kFree:
      d.time_ns = r.free.time_ns;
      if (r.free.residency == trace::Residency::kUnmanaged) d.unmanaged = -b(r.free.bytes);
      if (r.free.residency == trace::Residency::kResident) d.resident = -b(r.free.bytes);
      if (r.free.residency == trace::Residency::kOnHost) d.host = -b(r.free.bytes);
      return true;
    case RecordType::kEvict:
      d.time_ns = r.movement.end_ns;
      d.resident = -b(r.movement.bytes);
      if (!(r.movement.flags & trace::kEvictDrop)) d.host = b(r.movement.bytes);
      return true;
    case RecordType::kRestore:
      d.time_ns = r.movement.start_ns;
      d.resident = b(r.movement.bytes);
      d.host = -b(r.movement.bytes);
      return true;
    case RecordType::kRecompute:
      d.time_ns = r.movement.start_ns;
      d.resident = b(r.movement.bytes);
      return true;
    default:
      return false;
  }
}

namespace {

std::uint64_t eventTime(const Record& r) {
  switch (r.type) {
    case RecordType::kAlloc: return r.alloc.time_ns;
    case RecordType::kFree: return r.free.time_ns;
    case RecordType::kLaunch: return r.launch.time_ns;
    case RecordType::kCopy: return r.copy.time_ns;
    case RecordType::kMemset: return r.memset.time_ns;
    case RecordType::kEvict:
    case RecordType::kRestore:
    case RecordType::kRecompute: return r.movement.end_ns;
    case RecordType::kBudgetChange: return r.budget.time_ns;
    case RecordType::kOverBudget: return r.over_budget.time_ns;
    case RecordType::kIteration: return r.iteration.time_ns;
    case RecordType::kPlan: return r.plan.time_ns;
    case RecordType::kClose: return r.close.time_ns;
    default: return 0;
  }
}

}  // namespace

std::string computeTraceStats(const std::string& path, TraceStats& s) {
  s = TraceStats{};
  s.path = path;
  trace::TraceReader reader;
  if (std::string err = reader.open(path); !err.empty()) return err;
  const trace::FileHeader& h = reader.header();
  s.producer = h.producer;
  s.device_name = h.device_name;
  s.policy = h.policy;
  s.device_memory = h.device_memory;
  s.budget = s.last_budget = h.budget;
  s.start_ns = h.start_monotonic_ns;
  s.pid = h.pid;
  s.rank = h.rank;
  s.version = h.format_version;
  Record r;
  while (reader.next(r)) {
    ++s.records;
    if (const std::uint64_t t = eventTime(r); t != 0 && r.type != RecordType::kClose) {
      if (s.first_ns == 0 || t < s.first_ns) s.first_ns = t;
      s.last_ns = std::max(s.last_ns, t);
    }
    if (r.type == RecordType::kMemset) {
      ++s.memsets;
      continue;
    }
    MemoryDelta d;
    if (memoryDelta(r, d)) {
      s.resident += d.resident;
      s.host += d.host;
      s.unmanaged += d.unmanaged;
      s.peak_resident = std::max(s.peak_resident, s.resident);
      s.peak_host = std::max(s.peak_host, s.host);
      s.peak_unmanaged = std::max(s.peak_unmanaged, s.unmanaged);
    }
    switch (r.type) {
      case RecordType::kString:
        s.names[r.string.id] = std::string(r.string.text);
        break;
      case RecordType::kStack:
        s.stacks[r.stack.id].assign(r.stack.frames.begin(), r.stack.frames.end());
        break;
      case RecordType::kAlloc: {
        ++s.allocs;
        BufferStats& b = s.buffers[r.alloc.buffer];
        b.bytes = std::max(b.bytes, r.alloc.bytes);
        if (r.alloc.stack != 0) {
          TraceStats::Site& site = s.sites[r.alloc.stack];
          ++site.allocations;
          site.bytes += r.alloc.bytes;
        }
        break;
      }
      case RecordType::kFree:
        ++s.frees;
        break;
      case RecordType::kLaunch: {
        ++s.launches;
        KernelStats& k = s.kernels[r.launch.kernel];
        ++k.launches;
        if (!(r.launch.flags & trace::kLaunchAnalysed)) {
          ++s.not_analysed;
          ++k.not_analysed;
        }
        break;
      }
      case RecordType::kCopy:
        ++s.copies;
        s.copy_bytes += r.copy.bytes;
        break;
      case RecordType::kEvict:
      case RecordType::kRestore:
      case RecordType::kRecompute: {
        const trace::MovementRecord& m = r.movement;
        BufferStats& b = s.buffers[m.buffer];
        b.bytes = std::max(b.bytes, m.bytes);
        if (r.type == RecordType::kEvict) {
          s.stall_evict_ns += m.stall_ns;
          if (m.flags & trace::kEvictDrop) {
            ++s.drops;
            s.bytes_dropped += m.bytes;
            b.dropped += m.bytes;
          } else {
            ++s.evictions;
            s.bytes_d2h += m.bytes;
            b.swapped_out += m.bytes;
          }
        } else if (r.type == RecordType::kRestore) {
          ++s.restores;
          s.prefetched += (m.flags & trace::kRestorePrefetched) ? 1 : 0;
          s.bytes_h2d += m.bytes;
          s.stall_restore_ns += m.stall_ns;
          b.swapped_in += m.bytes;
        } else {
          ++s.recomputes;
          s.bytes_recomputed += m.bytes;
          s.stall_recompute_ns += m.stall_ns;
          b.recomputed += m.bytes;
        }
        if (m.stall_ns != 0) {
          KernelStats& k = s.kernels[m.kernel];
          k.stall_ns += m.stall_ns;
          ++k.stall_events;
        }
        break;
      }
      case RecordType::kBudgetChange:
        ++s.budget_changes;
        s.last_budget = r.budget.budget;
        break;
      case RecordType::kOverBudget: {
        ++s.over_budget;
        const trace::OverBudgetRecord& o = r.over_budget;
        const std::uint64_t excess = o.working_set > o.budget ? o.working_set - o.budget : 0;
        if (s.over_budget == 1 || excess > s.worst_excess) {
          s.worst_excess = excess;
          s.worst_working_set = o.working_set;
          s.worst_budget = o.budget;
          s.worst_kernel = o.kernel;
        }
        break;
      }
      case RecordType::kIteration:
        ++s.iterations;
        break;
      case RecordType::kPlan:
        ++s.plans;
        s.planning_ns += r.plan.planning_ns;
        s.last_plan = r.plan;
        break;
      case RecordType::kClose:
        s.closed = true;
        s.close = r.close;
        break;
      default:
        break;
    }
  }
  s.status = reader.status();
  if (s.status != trace::ReadStatus::kEnd) s.error = reader.error();
  return {};
}

std::string formatBytes(std::uint64_t n) {
  if (n < 1024) return fmt::format("{} B", n);
  const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(n) / 1024;
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  if (v >= 100 || u < 2) return fmt::format("{:.1f} {}", v, units[u]);
  return fmt::format("{:.2f} {}", v, units[u]);
}

std::string formatSignedBytes(std::int64_t n) {
  if (n < 0) return "-" + formatBytes(static_cast<std::uint64_t>(-n));
  return formatBytes(static_cast<std::uint64_t>(n));
}

std::string formatNs(std::uint64_t ns) {
  if (ns < 1000) return fmt::format("{} ns", ns);
  if (ns < 1000000) return fmt::format("{:.1f} us", static_cast<double>(ns) / 1e3);
  if (ns < 1000000000) return fmt::format("{:.2f} ms", static_cast<double>(ns) / 1e6);
  return fmt::format("{:.2f} s", static_cast<double>(ns) / 1e9);
}

std::string jsonString(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20) {
      out += fmt::format("\\u{:04x}", u);
    } else {
      out += c;
    }
  }
  out += '"';
  return out;
}

}  // namespace delta::tools
