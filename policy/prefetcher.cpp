// Prefetch planning: see prefetcher.h.
#include "policy/prefetcher.h"

#include <algorithm>

namespace delta::policy {

namespace {

// Launch positions from `position` on, each with its learned time from there, wrapping into the
// next iteration once, at most `max_scan` of them.
class Cursor {
 public:
  Cursor(const UseSchedule& schedule, std::uint32_t position, std::uint32_t max_scan)
      : schedule_(schedule),
        len_(schedule.ready() ? schedule.length() : 0),
        p0_(std::min(position, schedule.length())),
        base_(schedule.offsetNs(p0_)),
        max_scan_(max_scan) {}

  // The next position and its due time, without moving on; false once the walk is over.
  bool peek(std::uint32_t& q, std::int64_t& due) const {
    if (len_ == 0 || k_ >= max_scan_) return false;
    std::uint64_t qq = static_cast<std::uint64_t>(p0_) + k_;
    const bool wrapped = qq >= len_;
    if (wrapped) qq -= len_;
    if (qq >= len_ || (wrapped && qq >= p0_)) return false;  // one whole iteration seen
    q = static_cast<std::uint32_t>(qq);
    due = wrapped ? schedule_.durationNs() - base_ + schedule_.offsetNs(q) : schedule_.offsetNs(q) - base_;
    return true;
  }
  void advance() { ++k_; }

 private:
  const UseSchedule& schedule_;
  const std::uint32_t len_;
  const std::uint32_t p0_;
  const std::int64_t base_;
  const std::uint32_t max_scan_;
  std::uint32_t k_ = 0;
};

// Calls fn(q, due_ns) for the positions of a Cursor until fn returns false.
template <typename Fn>
void walk(const UseSchedule& schedule, std::uint32_t position, std::uint32_t max_scan, Fn&& fn) {
  Cursor cursor(schedule, position, max_scan);
  std::uint32_t q = 0;
  std::int64_t due = 0;
  while (cursor.peek(q, due) && fn(q, due)) cursor.advance();
}

// Whether `id` is used at or before launch `q`, walking from `p0` (wrapping): its allocation or
// restore within such a walk is counted by q.
bool usedBy(const UseSchedule& schedule, std::uint32_t p0, BufferId id, std::uint32_t q) {
  const std::uint32_t len = schedule.length();
  auto order = [&](std::uint32_t x) -> std::uint64_t {
    return x >= p0 ? x - p0 : static_cast<std::uint64_t>(x) + len - p0;
  };
  const std::uint32_t first = schedule.nextUsePos(id, p0);
  return first != UseSchedule::kNoPos && order(first) <= order(q);
}

// The most the launches from `position` on allocate at once, net of what they free, over those
// due within a horizon that only grows: each call walks on from where the last one stopped, so
// one choose() walks the schedule at most once. Frees count as upcomingBytes counts them: a
// resident buffer's, and one allocated within the walk. Restores are not counted: the caller
// counts them itself.
class AllocationsAhead {
 public:
  AllocationsAhead(const UseSchedule& schedule, std::uint32_t position, const BufferTable& table,
                   std::uint32_t max_scan)
      : schedule_(schedule), table_(table), p0_(std::min(position, schedule.length())),
        cursor_(schedule, position, max_scan) {}

  std::uint64_t peakWithin(std::int64_t horizon_ns) {
    std::uint32_t q = 0;
    std::int64_t due = 0;
    for (; cursor_.peek(q, due) && due <= horizon_ns; cursor_.advance()) {
      net_ += static_cast<std::int64_t>(schedule_.allocBytesAt(q));
      if (net_ > 0) peak_ = std::max(peak_, static_cast<std::uint64_t>(net_));
      for (BufferId id : schedule_.freesAt(q)) {
        if (table_.valid(id) && table_[id].residency != Residency::kFree) {
          if (table_[id].residency == Residency::kResident) net_ -= static_cast<std::int64_t>(table_[id].bytes);
        } else if (usedBy(schedule_, p0_, id, q)) {
          net_ -= static_cast<std::int64_t>(schedule_.freedBytes(id));
        }
      }
    }
    return peak_;
  }

 private:
  const UseSchedule& schedule_;
  const BufferTable& table_;
  const std::uint32_t p0_;
  Cursor cursor_;
  std::int64_t net_ = 0;
  std::uint64_t peak_ = 0;
};

}  // namespace

std::size_t Prefetcher::choose(const UseSchedule& schedule, std::uint32_t position,
                               const BufferTable& table, const CostModel& costs,
                               const PrefetchRequest& request, std::span<Prefetch> out,
                               std::span<const std::int64_t> waits) {
  std::size_t n = 0;
  // The next decision point is the next launch: anything that would be late if started then
  // must start now.
  const std::uint32_t p0 = std::min(position, schedule.length());
  const std::int64_t gap =
      std::max<std::int64_t>(0, schedule.offsetNs(p0 + 1) - schedule.offsetNs(p0));
  std::int64_t queue_end = std::max<std::int64_t>(0, request.h2d_busy_until_ns - request.now_ns);
  // The next decision comes when the launch just made ends and the next one starts.
  const std::uint32_t len = schedule.length();
  const std::int64_t to_next_decision =
      p0 > 0 ? schedule.offsetNs(p0) - schedule.offsetNs(p0 - 1)
             : (len > 0 ? schedule.durationNs() - schedule.offsetNs(len - 1) : 0);
  AllocationsAhead allocations(schedule, position, table, kMaxScan);
  std::uint64_t chosen_bytes = 0;
  // What the launches from the next one to q waited for, as the device ran them last.
  std::int64_t waited = 0;
  walk(schedule, position, kMaxScan, [&](std::uint32_t q, std::int64_t learned_due) {
    if (learned_due > queue_end + gap && learned_due - queue_end - gap > schedule.durationNs()) return false;
    if (q != p0 && q < waits.size() && waits[q] > 0) waited += waits[q];
    for (BufferId id : schedule.buffersAt(q)) {
      if (!table.valid(id)) continue;
      const BufferState& s = table[id];
      if (s.residency != Residency::kEvicted || s.evicted_by != Action::kSwap) continue;
      bool seen = false;
      for (std::size_t i = 0; i < n; ++i) seen = seen || out[i].id == id;
      if (seen) continue;
      const std::int64_t h2d = costs.transferNs(Direction::kHostToDevice, s.bytes);
      // A restore the link would start at once is timed by when its use comes without the
      // waits the learned times keep: they hold the use's wait for this very restore, last
      // time it was late, and timed by them it is late by as much again, every iteration. So
      // is one done, behind the copies queued, before the next decision (where `due` is
      // reckoned from): the link idles by then, so the wait was lateness, not load (gan-6 at
      // 50 %/50 GB/s, a restore behind 2 ms of copies as an 11.6 ms launch began: 8.28 %
      // overhead judged by an empty queue alone, 2.38 so). One that queues past the next
      // decision keeps the learned time: there the waits are the link's load, and starting it
      // earlier only holds its memory longer (at 12 GB/s, every wait taken out made the
      // synthetic sample 20 % slower). A queue that merely drains by then is not enough: the
      // planner's replay parted from the run (docs/policy.md, *Where delta's regret at 50 GB/s
      // comes from* and *A restore done before the next decision*).
      const bool idle_by_next = queue_end <= 0 || queue_end + h2d <= to_next_decision;
      const std::int64_t due = idle_by_next ? learned_due - waited : learned_due;
      if (due - (queue_end + h2d) > gap) continue;  // not yet: still on time at the next launch
      // Behind a backlog that outlasts the next decision, its transfer starts no sooner for being
      // queued now, but its memory is taken now and held idle until then. Where the launches
      // before the transfer starts allocate that memory, it waits for a later decision, when the
      // backlog is shorter: queued now, those launches took the memory back on demand, its
      // transfer spent for nothing, and it was queued again at once, every launch
      // (deep-residual-25 at 30 %/50 GB/s: 35 restores taken back in two iterations, 41.6 %
      // overhead against 25.3; docs/policy.md, *A restore behind a backlog*). Nothing later can
      // start sooner: the queue is in order of use.
      if (queue_end > to_next_decision && request.free_bytes != kUnknownBytes &&
          chosen_bytes + s.bytes + allocations.peakWithin(queue_end) > request.free_bytes) {
        return false;
      }
      chosen_bytes += s.bytes;
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
                                        std::int64_t& need_at_ns, Window window, std::int64_t* window_ns,
                                        bool short_window) {
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
  // The peak of the net count over every launch walked, and when it comes: the answer's once the
  // window reaches that far.
  std::uint64_t walked_peak = 0;
  std::int64_t walked_peak_at = 0;
  need_at_ns = 0;
  if (window_ns != nullptr) *window_ns = 0;
  if (window == Window::kNone) return 0;
  const std::uint32_t len = schedule.length();
  const std::uint32_t p0 = std::min(position, len);
  // Order of a position within the window (positions below p0 come after the wrap).
  auto counted_by = [&](BufferId id, std::uint32_t q) { return usedBy(schedule, p0, id, q); };
  // Room for an allocation must be made by the time it happens, and room for a restore by the
  // time the restore has to start (its transfer time before the use, behind the other restores
  // counted). So a launch is in the window when copying out what it needs, with what the
  // launches before it need, takes longer than the time left until it, plus the restore time:
  // that room has to start now. Without the restore term a tight budget leaves no room to
  // prefetch into, and every restore happens on demand, in full view. The first launch that
  // needs bytes and is not in the window ends it; one that needs none (most launches, where
  // small buffers are unmanaged) does not, while an allocation of the iteration's largest size
  // right after it could still be in it. Before, a launch's own bytes were left out of its
  // test, so such a launch always ended the window, and an allocation two launches ahead was
  // seen only one launch before it, too late for its copy out to hide (the LSTM, swap-only, at
  // 30 %/12 GB/s: room ahead never made). Scanning on costs more launches a call: 200-340 on
  // average on the shared traces as played, against 29-155.
  walk(schedule, position, kMaxScan, [&](std::uint32_t q, std::int64_t due) {
    if (short_window && q != position &&
        due > costs.transferNs(Direction::kDeviceToHost, window != Window::kNet ? gross : peak) + restore_ns) {
      return false;
    }
    std::uint64_t q_gross = schedule.allocBytesAt(q);
    std::int64_t q_net = static_cast<std::int64_t>(q_gross);
    std::int64_t q_restore_ns = 0;
    for (BufferId id : schedule.buffersAt(q)) {
      if (table.valid(id) && table[id].residency == Residency::kEvicted &&
          table[id].evicted_by == Action::kSwap) {
        q_gross += table[id].bytes;
        q_restore_ns += costs.transferNs(Direction::kHostToDevice, table[id].bytes);
        if (schedule.nextUsePos(id, p0) == q) q_net += static_cast<std::int64_t>(table[id].bytes);
      }
    }
    const auto net_through_q = static_cast<std::uint64_t>(std::max<std::int64_t>(net + q_net, 0));
    const std::uint64_t length_bytes = window != Window::kNet ? gross + q_gross : std::max(peak, net_through_q);
    const std::int64_t restores_ns = restore_ns + q_restore_ns;
    const bool in_window =
        q == position || due <= costs.transferNs(Direction::kDeviceToHost, length_bytes) + restores_ns;
    if (!in_window && window != Window::kFar &&
        (q_gross > 0 ||
         due > costs.transferNs(Direction::kDeviceToHost, length_bytes + schedule.largestAllocBytes()) + restores_ns)) {
      return false;
    }
    // Launches walked over outside the window count only once a later one is in it (kFar; any
    // other window ends at the first that needs bytes, so those it passes need none).
    net += q_net;
    gross += q_gross;
    restore_ns = restores_ns;
    if (net > 0 && static_cast<std::uint64_t>(net) > walked_peak) {
      walked_peak = static_cast<std::uint64_t>(net);
      walked_peak_at = due;
    }
    if (in_window) {
      window_end = due;
      peak = walked_peak;
      need_at_ns = walked_peak_at;
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
