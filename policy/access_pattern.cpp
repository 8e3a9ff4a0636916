// Iteration learning: see access_pattern.h.
#include "policy/access_pattern.h"

#include <algorithm>
#include <utility>

namespace delta::policy {

AccessPattern::AccessPattern(std::uint32_t max_buffers, std::uint32_t max_launches,
                             std::uint32_t max_uses, bool timed)
    : max_launches_(max_launches), timed_(timed) {
  for (UseSchedule& schedule : schedules_) schedule.reserve(max_buffers, max_launches, max_uses);
  if (timed_) {
    for (DeviceTimes& ends : device_times_) {
      ends.start.resize(max_launches, kNotReported);
      ends.end.resize(max_launches, kNotReported);
      ends.gap_is_waits.resize(max_launches, 1);
    }
    offsets_.resize(static_cast<std::size_t>(max_launches) + 1);
    device_waits_.resize(max_launches);
  }
}

std::uint64_t AccessPattern::signature(const Launch& launch) {
  std::uint64_t h = 1469598103934665603ull ^ launch.stream;  // FNV-1a over stream and ids
  for (BufferId id : launch.buffers) {
    h ^= id;
    h *= 1099511628211ull;
  }
  return h;
}

void AccessPattern::onIteration(std::int64_t now_ns) {
  markers_ = true;
  boundary(now_ns);
}

void AccessPattern::boundary(std::int64_t now_ns) {
  const bool closing = started_ && position_ > 0;
  bool learned = false;
  if (closing) {
    // The iteration before the one closing is timed now, by what the device reported of it, if
    // not yet: the learned iteration may change below, and those times are of its launches.
    DeviceTimes& older = device_times_[open_times_ ^ 1];
    if (timed_ && !older.done) applyDeviceTimes(older);
    const bool repeat = !relearn_next_ && learnedSchedule().ready() &&
                        recordingSchedule().length() == learnedSchedule().length() && recording_hash_ == learned_hash_;
    learned = repeat;
    if (!repeat) {
      recordingSchedule().finish(now_ns - iteration_start_ns_);
      if (recordingSchedule().ready()) {
        learned_ ^= 1u;
        device_waits_valid_ = false;  // until the device has timed this one
        learned_hash_ = recording_hash_;
        ++generation_;
        learned = true;
      }
    }
    relearn_next_ = false;
  }
  // What was allocated before the first iteration began is the program's setup (weights,
  // optimiser state: gigabytes at once), not an allocation the iteration repeats. Counted at
  // its first launch, it was room to make ahead at the end of every iteration, for memory that
  // never comes (an attention at 50 %: 3.5 GB of need against a 1.1 GB budget).
  if (!started_) alloc_since_launch_ = 0;
  startDeviceTimes(closing, learned);
  recordingSchedule().clear();
  recording_hash_ = 0;
  started_ = true;
  anchored_ = false;
  position_ = 0;
  iteration_start_ns_ = now_ns;
  ++boundaries_;
}

void AccessPattern::onLaunch(const Launch& launch) {
  const std::uint64_t sig = signature(launch);
  // A launch that names no buffer is no anchor: launches alike in all but their small buffers
  // (which the caller does not manage) would all look the same, and come round every few.
  const bool anchorable = !launch.buffers.empty();
  if (!started_) {
    boundary(launch.now_ns);
  } else if (!markers_ && anchored_ && anchorable && position_ >= kMinPeriod && sig == first_signature_) {
    boundary(launch.now_ns);
  } else if (!markers_ && position_ >= anchor_limit_) {
    // The launch this recording started with has not come round again: it may never (the first
    // iteration's launch on fresh allocations, whose ids the next iterations do not reuse).
    // Record again from this launch, not learning the partial recording, and wait twice as long
    // next time, so that an iteration longer than the limit is still found.
    recordingSchedule().clear();
    recording_hash_ = 0;
    anchored_ = false;
    position_ = 0;
    iteration_start_ns_ = launch.now_ns;
    startDeviceTimes(false, false);
    anchor_limit_ = std::max(anchor_limit_, std::min(2 * anchor_limit_, max_launches_));
  }
  if (!anchored_ && anchorable) {
    first_signature_ = sig;
    anchored_ = true;
  }
  recordingSchedule().addLaunch(launch.now_ns - iteration_start_ns_, alloc_since_launch_, launch.buffers);
  recording_hash_ = (recording_hash_ ^ sig) * 1099511628211ull;
  alloc_since_launch_ = 0;
  ++position_;
  if (timed_) {
    DeviceTimes& open = device_times_[open_times_];
    if (open.length < open.end.size()) {
      open.end[open.length++] = kNotReported;
    } else {
      open.done = true;  // over capacity: not learned either
    }
  }
  ++launches_;
}

void AccessPattern::startDeviceTimes(bool close, bool learned) {
  if (!timed_) return;
  DeviceTimes* open = &device_times_[open_times_];
  if (close) {
    open->closed = true;
    open->learned = learned;
    // Reported in full already (the device caught up before the boundary): timed at once.
    if (complete(*open)) applyDeviceTimes(*open);
    open_times_ ^= 1;
    open = &device_times_[open_times_];
  }
  *open = DeviceTimes{std::move(open->start), std::move(open->end), std::move(open->gap_is_waits), launches_, 0, 0,
                      false, false, false};
}

bool AccessPattern::onLaunchTimed(std::uint64_t launch, std::int64_t device_start_ns, std::int64_t device_end_ns,
                                  bool gap_is_waits) {
  if (!timed_) return false;
  const std::uint32_t before = device_timed_;
  for (std::uint32_t k = 0; k < 2; ++k) {
    DeviceTimes& ends = device_times_[k];
    if (ends.done || launch < ends.first || launch - ends.first >= ends.length) continue;
    const auto pos = static_cast<std::uint32_t>(launch - ends.first);
    if (ends.end[pos] == kNotReported) {
      ends.start[pos] = std::min(device_start_ns, device_end_ns);
      ends.end[pos] = device_end_ns;
      ends.gap_is_waits[pos] = gap_is_waits ? 1 : 0;
      ++ends.reported;
    }
    // The device reached a later iteration: what is missing of the earlier one is not coming
    // soon (a launch without a report, or a stream that lags).
    DeviceTimes& other = device_times_[k ^ 1];
    if (!other.done && other.closed && other.first < ends.first) applyDeviceTimes(other);
    if (complete(ends)) applyDeviceTimes(ends);
    break;
  }
  return device_timed_ != before;
}

bool AccessPattern::complete(const DeviceTimes& ends) {
  return !ends.done && ends.closed && ends.reported == ends.length;
}

bool AccessPattern::applyDeviceTimes(DeviceTimes& ends) {
  ends.done = true;
  if (!ends.learned || ends.reported == 0 || !learnedSchedule().ready() || learnedSchedule().length() != ends.length) {
    return false;
  }
  // The iteration as the device ran it: each launch starts where it started, after what it
  // waited for (restores, recomputes, a host that fell behind), and adds the time it ran beyond
  // the end of every launch before it (on streams that overlap, what it adds to the busy time).
  // The waits stay in: they come round again while the policy acts the same way, and a next
  // use predicted without them is nearer than it will be. Left out (as before), on a link
  // slower than the compute every swap looked visible and every window too long: delta's
  // summed overheads on the synthetic sample at 12 GB/s were 32 % higher (docs/policy.md,
  // *One clock*).
  //
  // Launches with no report (a mark lost when the host ran further ahead than the marks kept,
  // one that could not be recorded) ran all the same: a run of them between two reported
  // launches shares what the device took from the end of the one before to the start of the
  // one after (their waits in it: the best there is), in proportion to the times learned for
  // them so far; a run at either end of the iteration keeps those times. Counted as nothing,
  // the LSTM's learned iteration came out at a quarter of its length on the device (183 of
  // 770 ms: a ring of 256 marks, the host thousands of launches ahead), and every next use
  // looked four times nearer than it was.
  const UseSchedule& learned = schedule();
  std::int64_t frontier = INT64_MIN;
  std::int64_t offset = 0;
  for (std::uint32_t p = 0; p < ends.length;) {
    if (ends.end[p] != kNotReported) {
      const std::int64_t waited = frontier == INT64_MIN ? 0 : std::max<std::int64_t>(0, ends.start[p] - frontier);
      device_waits_[p] = ends.gap_is_waits[p] ? waited : kWaitsUnknown;
      offsets_[p] = offset + waited;
      offset = offsets_[p] + std::max<std::int64_t>(0, ends.end[p] - std::max(ends.start[p], frontier));
      frontier = std::max(frontier, ends.end[p]);
      ++p;
      continue;
    }
    const std::uint32_t first = p;
    std::uint32_t after = first;
    while (after < ends.length && ends.end[after] == kNotReported) ++after;
    const std::int64_t learned_ns = std::max<std::int64_t>(0, learned.offsetNs(after) - learned.offsetNs(first));
    const bool bounded = frontier != INT64_MIN && after < ends.length;
    const std::int64_t gap_ns = bounded ? std::max<std::int64_t>(0, ends.start[after] - frontier) : learned_ns;
    // Each launch of the run starts after its share of the ones before it; evenly when
    // nothing was learned for them.
    const std::uint32_t missing = after - first;
    for (; p < after; ++p) {
      device_waits_[p] = kWaitsUnknown;  // what the run waited is in its shares, not told apart
      const double before = learned_ns > 0 ? static_cast<double>(learned.offsetNs(p) - learned.offsetNs(first)) /
                                                 static_cast<double>(learned_ns)
                                           : static_cast<double>(p - first) / missing;
      offsets_[p] = offset + std::clamp<std::int64_t>(static_cast<std::int64_t>(before * static_cast<double>(gap_ns)), 0, gap_ns);
    }
    offset += gap_ns;
    // The gap's time is counted up to the next launch's start: not again as its wait.
    if (bounded) frontier = std::max(frontier, ends.start[after]);
  }
  offsets_[ends.length] = offset;
  if (!learnedSchedule().retime(std::span<const std::int64_t>(offsets_.data(), ends.length + 1))) {
    device_waits_valid_ = false;
    return false;
  }
  device_waits_valid_ = true;
  device_timed_in_full_ = ends.reported == ends.length;
  ++device_timed_;
  return true;
}

}  // namespace delta::policy
