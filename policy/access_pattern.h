// Learns the launch sequence that training repeats every iteration. Iteration boundaries come
// from the caller's markers when it has them; otherwise a boundary is assumed when the first
// launch of the recording (same stream, same buffers) comes round again after at least
// kMinPeriod launches; a recording whose first launch has not come round within a limit
// (kFirstAnchorLimit launches, doubling each time) starts again from the current launch. Each
// finished iteration becomes the schedule that predicts the next.
//
// Cost: onLaunch is O(buffers of the launch) (a hash and a copy into preallocated storage); a
// boundary costs UseSchedule::finish, O(uses + buffer capacity). Nothing allocates after
// construction. A recording over capacity is dropped and prediction keeps the last good one.
#pragma once

#include <cstdint>
#include <span>

#include "policy/use_schedule.h"

namespace delta::policy {

class AccessPattern {
 public:
  AccessPattern(std::uint32_t max_buffers, std::uint32_t max_launches, std::uint32_t max_uses);

  void onAlloc(std::uint64_t bytes) { alloc_since_launch_ += bytes; }
  void onFree(BufferId id, std::uint64_t bytes) { recording_->addFree(id, bytes); }
  void onLaunch(const Launch& launch);
  void onIteration(std::int64_t now_ns);

  // The schedule learned from the last complete iteration (may be !ready()).
  const UseSchedule& schedule() const { return *learned_; }
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
  bool retimeLearned(std::span<const std::int64_t> offsets_ns) { return learned_->retime(offsets_ns); }

 private:
  static constexpr std::uint32_t kMinPeriod = 8;
  static constexpr std::uint32_t kFirstAnchorLimit = 256;

  static std::uint64_t signature(const Launch& launch);
  void boundary(std::int64_t now_ns);

  UseSchedule a_;
  UseSchedule b_;
  UseSchedule* learned_ = &a_;
  UseSchedule* recording_ = &b_;
  std::uint64_t first_signature_ = 0;
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
};

}  // namespace delta::policy
