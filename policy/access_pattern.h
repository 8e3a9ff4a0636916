// Learns the launch sequence that training repeats every iteration. Iteration boundaries come
// from the caller's markers when it has them; otherwise a boundary is assumed when the anchor,
// the first launch of the recording that names a buffer (same stream, same buffers), comes
// round again after at least kMinPeriod launches; a recording whose anchor has not come round
// within a limit (kFirstAnchorLimit launches, doubling each time) starts again from the
// current launch. Each finished iteration becomes the schedule that predicts the next.
//
// Cost: onLaunch is O(buffers of the launch) (a hash and a copy into preallocated storage); a
// boundary costs UseSchedule::finish, O(uses + buffer capacity). Nothing allocates after
// construction. A recording over capacity is dropped and prediction keeps the last good one.
//
// Its times are the caller's clock at each launch. A caller whose launches run later, on a
// device, can report when each ran there (onLaunchTimed): once an iteration's launches are
// reported, the learned iteration (when it is that iteration's launches) is timed by the
// device instead, as the device ran it: each launch starts when it started there, its waits
// (for a restore, a recompute, a host that fell behind) included, as they will be again while
// the policy acts the same way. The host runs ahead of the device and blocks only now and
// then; its intervals say little of how long the device takes to reach a launch, which is what
// predictions of next use, of room to make ahead and the planner's op times are about. The
// planner takes the waits out of the op times itself: those the device times show
// (deviceWaits), else those the policy was told of (onWaited).
// Cost: O(1) per report, O(launches) once per iteration timed.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "policy/use_schedule.h"

namespace delta::policy {

class AccessPattern {
 public:
  // timed: the caller will report device times (onLaunchTimed); storage is reserved for them.
  AccessPattern(std::uint32_t max_buffers, std::uint32_t max_launches, std::uint32_t max_uses,
                bool timed = false);

  void onAlloc(std::uint64_t bytes) { alloc_since_launch_ += bytes; }
  void onFree(BufferId id, std::uint64_t bytes) { recordingSchedule().addFree(id, bytes); }
  void onLaunch(const Launch& launch);
  void onIteration(std::int64_t now_ns);

  // The schedule learned from the last complete iteration (may be !ready()).
  const UseSchedule& schedule() const { return schedules_[learned_]; }
  // Launches seen since the iteration began: the position of the next launch.
  std::uint32_t position() const { return position_; }
  std::int64_t iterationStartNs() const { return iteration_start_ns_; }
  // Changes whenever a newly learned iteration replaces the schedule (predictions all change).
  // An iteration that repeats the learned one launch for launch does not replace it: a stable
  // loop is learned once, not re-learned (and re-ranked) every iteration.
  std::uint32_t generation() const { return generation_; }
  // Iteration boundaries so far (markers or detected), the first launch's included.
  std::uint32_t boundaries() const { return boundaries_; }
  // The next complete iteration replaces the learned one even if it repeats it launch for
  // launch: its times changed (the policy acts differently now), not its launches.
  void relearnNext() { relearn_next_ = true; }
  // The learned iteration, timed as `offsets_ns` (UseSchedule::retime): what its launches are
  // expected to take from now on, when the caller knows better than the last iteration did.
  // `waits_ns`: what each launch waited for in the run those times come from (deviceWaits of
  // that run); without them, none is known until the device times an iteration again.
  bool retimeLearned(std::span<const std::int64_t> offsets_ns, std::span<const std::int64_t> waits_ns = {}) {
    device_waits_valid_ = false;  // times of another run than the device's
    if (!learnedSchedule().retime(offsets_ns)) return false;
    if (waits_ns.size() == learnedSchedule().length() && waits_ns.size() <= device_waits_.size()) {
      std::copy(waits_ns.begin(), waits_ns.end(), device_waits_.begin());
      device_waits_valid_ = true;
    }
    return true;
  }
  // The `launch`-th onLaunch (from 0) ran on the device from `device_start_ns` (after what it
  // waited for) to `device_end_ns`. True when this report completed an iteration whose times
  // then replaced the learned iteration's (every prediction changed): an iteration is complete
  // when all its launches are reported, or when a launch of a later one is (those missing share
  // the device's time around them: applyDeviceTimes). Reports for iterations older than the
  // last complete one are ignored.
  // `gap_is_waits`: Policy::onLaunchTimed.
  bool onLaunchTimed(std::uint64_t launch, std::int64_t device_start_ns, std::int64_t device_end_ns,
                     bool gap_is_waits = true);
  // Iterations whose device times replaced the learned iteration's.
  std::uint32_t deviceTimed() const { return device_timed_; }
  // The last device times applied had a report for every launch: none of the learned times is
  // a share of a gap or a host interval (launches that ran before the caller marked any).
  bool deviceTimedInFull() const { return device_timed_in_full_; }
  // While the learned iteration is timed by the device: how long the device stood before each
  // launch of it, from the end of every launch before it (waits for restores, recomputes,
  // copies out, and a host that fell behind); kWaitsUnknown for a launch with no report or
  // after work the policy was not told of. Empty otherwise. The planner takes these out of the
  // op times: what is left is what each launch ran.
  std::span<const std::int64_t> deviceWaits() const {
    return device_waits_valid_ ? std::span<const std::int64_t>(device_waits_.data(), schedule().length())
                               : std::span<const std::int64_t>();
  }

  static constexpr std::int64_t kWaitsUnknown = -1;

 private:
  static constexpr std::uint32_t kMinPeriod = 8;
  static constexpr std::uint32_t kFirstAnchorLimit = 256;

  static constexpr std::int64_t kNotReported = INT64_MIN;
  // One iteration's launches as the device ran them.
  struct DeviceTimes {
    std::vector<std::int64_t> start;  // by position: when it began to run, once reported
    std::vector<std::int64_t> end;    // by position: when it ended, or kNotReported
    std::vector<std::uint8_t> gap_is_waits;  // by position, once reported
    std::uint64_t first = 0;          // the onLaunch index of position 0
    std::uint32_t length = 0;         // launches so far (at its boundary: all of them)
    std::uint32_t reported = 0;
    bool closed = false;              // its boundary has passed
    bool learned = false;             // closed, and the learned iteration is its launches
    bool done = true;                 // applied, or of no use: later reports are ignored
  };

  static std::uint64_t signature(const Launch& launch);
  void boundary(std::int64_t now_ns);
  // The next launch starts a new iteration's times; `close`: the one recorded so far ends.
  void startDeviceTimes(bool close, bool learned);
  // Closed, every launch reported, not applied yet.
  static bool complete(const DeviceTimes& ends);
  bool applyDeviceTimes(DeviceTimes& ends);

  UseSchedule& learnedSchedule() { return schedules_[learned_]; }
  UseSchedule& recordingSchedule() { return schedules_[learned_ ^ 1u]; }

  // The learned iteration and the one being recorded, which replaces it when complete. An
  // index, not pointers: a copy of the pattern (a planner's replay resumed from another's
  // state, Simulator::resume) is then a plain copy.
  UseSchedule schedules_[2];
  std::uint32_t learned_ = 0;
  std::uint64_t first_signature_ = 0;  // the anchor: the recording's first launch that names a buffer
  bool anchored_ = false;
  std::uint64_t recording_hash_ = 0;  // of the launch signatures recorded so far
  std::uint64_t learned_hash_ = 0;
  std::uint64_t alloc_since_launch_ = 0;
  std::int64_t iteration_start_ns_ = 0;
  std::uint32_t position_ = 0;
  std::uint32_t generation_ = 0;
  std::uint32_t boundaries_ = 0;
  std::uint32_t anchor_limit_ = kFirstAnchorLimit;  // launches without the first one recurring
  const std::uint32_t max_launches_;
  bool started_ = false;
  bool markers_ = false;  // the caller gives iteration markers: do not detect
  bool relearn_next_ = false;

  const bool timed_;
  DeviceTimes device_times_[2];
  std::uint32_t open_times_ = 0;  // device_times_ index of the iteration being recorded
  std::uint64_t launches_ = 0;   // onLaunch calls so far
  std::uint32_t device_timed_ = 0;
  std::vector<std::int64_t> offsets_;  // scratch for applyDeviceTimes: max_launches + 1
  std::vector<std::int64_t> device_waits_;  // deviceWaits(): max_launches
  bool device_waits_valid_ = false;
  bool device_timed_in_full_ = false;
};

}  // namespace delta::policy
