// Prefetch planning: see prefetcher.h.
#include "policy/prefetcher.h"

#include <algorithm>

namespace delta::policy {

namespace {

// Walks launch positions from `position` on, wrapping into the next iteration once.
// Calls fn(q, due_ns) until fn returns false or kMaxScan launches were seen.
template <typename Fn>
void walk(const UseSchedule& schedule, std::uint32_t position, std::uint32_t max_scan, Fn&& fn) {
  const std::uint32_t len = schedule.length();
  if (!schedule.ready() || len == 0) return;
  const std::uint32_t p0 = std::min(position, len);
  const std::int64_t base = schedule.offsetNs(p0);
  for (std::uint32_t k = 0; k < max_scan; ++k) {
    std::uint64_t qq = static_cast<std::uint64_t>(p0) + k;
    const bool wrapped = qq >= len;
    if (wrapped) qq -= len;
    if (qq >= len || (wrapped && qq >= p0)) return;  // one whole iteration seen
    const auto q = static_cast<std::uint32_t>(qq);
    const std::int64_t due = wrapped ? schedule.durationNs() - base + schedule.offsetNs(q)
                                     : schedule.offsetNs(q) - base;
    if (!fn(q, due)) return;
  }
}

}  // namespace

std::size_t Prefetcher::choose(const UseSchedule& schedule, std::uint32_t position,
                               const BufferTable& table, const CostModel& costs,
                               const PrefetchRequest& request, std::span<Prefetch> out) {
  std::size_t n = 0;
  // The next decision point is the next launch: anything that would be late if started then
  // must start now.
  const std::uint32_t p0 = std::min(position, schedule.length());
  const std::int64_t gap =
      std::max<std::int64_t>(0, schedule.offsetNs(p0 + 1) - schedule.offsetNs(p0));
  std::int64_t queue_end = std::max<std::int64_t>(0, request.h2d_busy_until_ns - request.now_ns);
  walk(schedule, position, kMaxScan, [&](std::uint32_t q, std::int64_t due) {
    if (due > queue_end + gap && due - queue_end - gap > schedule.durationNs()) return false;
    for (BufferId id : schedule.buffersAt(q)) {
      if (!table.valid(id)) continue;
      const BufferState& s = table[id];
      if (s.residency != Residency::kEvicted || s.evicted_by != Action::kSwap) continue;
      bool seen = false;
      for (std::size_t i = 0; i < n; ++i) seen = seen || out[i].id == id;
      if (seen) continue;
      const std::int64_t h2d = costs.transferNs(Direction::kHostToDevice, s.bytes);
      if (due - (queue_end + h2d) > gap) continue;  // not yet: still on time at the next launch
      out[n++] = {id, due};
      queue_end += h2d;
      if (n == out.size()) return false;
    }
    return true;
  });
  return n;
}

std::uint64_t Prefetcher::upcomingBytes(const UseSchedule& schedule, std::uint32_t position,
                                        const BufferTable& table, const CostModel& costs,
                                        std::int64_t& need_at_ns, Window window, std::int64_t* window_ns) {
  // Net bytes: a running sum over the window of the allocations and restores at each launch,
  // less what the launches before it free; the answer is its peak (never negative). Frees
  // after launch q make room for the launches after q only. A buffer's restore is counted once,
  // at its first use in the window; its free is subtracted only when its bytes are there to be
  // freed: resident now, or allocated or restored earlier in the window (a dropped buffer's
  // recompute is not counted, so neither is its free; a swapped one freed before any use in the
  // window is never brought back, and frees nothing).
  std::int64_t net = 0;
  std::uint64_t peak = 0;
  // The gross count (every allocation, and a restore at each use of a swapped buffer) sets the
  // window's length with Window::kGross. The net one is shorter, and better or worse by
  // workload (docs/policy.md: the CNNs gain, the LSTM loses).
  std::uint64_t gross = 0;
  std::int64_t restore_ns = 0;
  std::int64_t window_end = 0;
  need_at_ns = 0;
  if (window_ns != nullptr) *window_ns = 0;
  if (window == Window::kNone) return 0;
  const std::uint32_t len = schedule.length();
  const std::uint32_t p0 = std::min(position, len);
  // Order of a position within the window (positions below p0 come after the wrap).
  auto order = [&](std::uint32_t x) -> std::uint64_t {
    return x >= p0 ? x - p0 : static_cast<std::uint64_t>(x) + len - p0;
  };
  auto counted_by = [&](BufferId id, std::uint32_t q) {  // first use in the window at or before q
    const std::uint32_t first = schedule.nextUsePos(id, p0);
    return first != UseSchedule::kNoPos && order(first) <= order(q);
  };
  // Room for an allocation must be made by the time it happens, and room for a restore by the
  // time the restore has to start (its transfer time before the use, behind the other restores
  // counted): copying `bytes` out takes transferNs(bytes), so count what comes sooner than that
  // plus the restore time. Without the restore term a tight budget leaves no room to prefetch
  // into, and every restore happens on demand, in full view.
  walk(schedule, position, kMaxScan, [&](std::uint32_t q, std::int64_t due) {
    const std::uint64_t length_bytes = window == Window::kGross ? gross : peak;
    if (q != position && due > costs.transferNs(Direction::kDeviceToHost, length_bytes) + restore_ns) return false;
    window_end = due;
    net += static_cast<std::int64_t>(schedule.allocBytesAt(q));
    gross += schedule.allocBytesAt(q);
    for (BufferId id : schedule.buffersAt(q)) {
      if (table.valid(id) && table[id].residency == Residency::kEvicted &&
          table[id].evicted_by == Action::kSwap) {
        gross += table[id].bytes;
        restore_ns += costs.transferNs(Direction::kHostToDevice, table[id].bytes);
        if (schedule.nextUsePos(id, p0) == q) net += static_cast<std::int64_t>(table[id].bytes);
      }
    }
    if (net > 0 && static_cast<std::uint64_t>(net) > peak) {
      peak = static_cast<std::uint64_t>(net);
      need_at_ns = due;
    }
    for (BufferId id : schedule.freesAt(q)) {
      if (table.valid(id) && table[id].residency != Residency::kFree) {
        const BufferState& s = table[id];
        if (s.residency == Residency::kResident ||
            (s.residency == Residency::kEvicted && s.evicted_by == Action::kSwap && counted_by(id, q))) {
          net -= static_cast<std::int64_t>(s.bytes);
        }
      } else if (counted_by(id, q)) {  // not allocated now: its allocation in the window counted
        net -= static_cast<std::int64_t>(schedule.freedBytes(id));
      }
    }
    return true;
  });
  if (window_ns != nullptr) *window_ns = window_end;
  return peak;
}

}  // namespace delta::policy
