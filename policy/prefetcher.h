// Brings swapped buffers back before the launch that needs them, from a schedule of the
// iteration (learned, or the future for Belady): walks the launches ahead in order and starts a
// restore once waiting for the next decision point would make it late, counting the copies
// already queued on the host-to-device engine; but not behind a queue that outlasts the next
// decision point when the launches before its transfer starts need its memory. Also says how
// many bytes the next launches will allocate, so the caller can free room ahead of time while
// compute runs.
// Cost: O(launches scanned), at most kMaxScan; no allocation.
#pragma once

#include <cstdint>
#include <span>

#include "policy/buffer_table.h"
#include "policy/cost_model.h"
#include "policy/use_schedule.h"

namespace delta::policy {

class Prefetcher {
 public:
  // `waits`: how long the device stood before each launch of the learned iteration
  // (AccessPattern::deviceWaits; empty when not known): a restore the link would start at once
  // is timed without them. `request.free_bytes` (when known) is what restores may take.
  static std::size_t choose(const UseSchedule& schedule, std::uint32_t position,
                            const BufferTable& table, const CostModel& costs,
                            const PrefetchRequest& request, std::span<Prefetch> out,
                            std::span<const std::int64_t> waits = {});

  // What sets the length of upcomingBytes' window: copying out the gross bytes counted so far
  // (every allocation, a restore at each use of a swapped buffer), or the net count itself
  // (shorter: room is made later, and fewer buffers needed soon are protected); or no window:
  // no room made ahead, every eviction waits until memory is needed (a drop frees its memory
  // at once; evicting early only chooses earlier, with less known). kFar counts as kGross, but
  // a launch outside the window does not end it: it reaches the last launch of the scan that is
  // in it by its own count, so that a burst of allocations behind launches that need little is
  // made room for while there is time to copy out (a GAN's generator step: 583 and 864 MB at
  // two launches 36 and 44 ms ahead, seen by kGross only 8 ms before); longer, it also makes
  // room early where needs are steady, and the prefetches that fill that room are evicted again
  // (a deep residual stack: every launch waited for a copy out). Which is better depends on
  // the workload; delta's planner chooses (planner.h).
  enum class Window : std::uint8_t { kGross, kNet, kNone, kFar };
  static constexpr int kWindows = 4;

  // Bytes the next launches need (their allocations and the restores of swapped buffers they
  // use, each restore once, net of the memory the window's launches free before the later
  // ones need it: the peak of that running sum, never negative), over the window: up to the
  // last launch that comes sooner than copying out the bytes `window` names (through that
  // launch) plus restoring the swapped ones would take. `need_at_ns`: how far ahead that peak
  // comes, the first launch that reaches it (when the memory is needed); `window_ns`
  // (optional): how far ahead the window reaches. `short_window`: each launch is tested on the
  // bytes counted before it, without its own, and the first that fails ends the window (what
  // the window was until it learned to reach allocations behind launches that need nothing;
  // shorter: the oracle's rules try both, docs/policy.md).
  static std::uint64_t upcomingBytes(const UseSchedule& schedule, std::uint32_t position,
                                     const BufferTable& table, const CostModel& costs,
                                     std::int64_t& need_at_ns, Window window = Window::kGross,
                                     std::int64_t* window_ns = nullptr, bool short_window = false);

 private:
  static constexpr std::uint32_t kMaxScan = 512;
};

}  // namespace delta::policy
