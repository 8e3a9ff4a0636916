// Iteration learning: see access_pattern.h.
#include "policy/access_pattern.h"

#include <algorithm>
#include <utility>

namespace delta::policy {

AccessPattern::AccessPattern(std::uint32_t max_buffers, std::uint32_t max_launches,
                             std::uint32_t max_uses)
    : max_launches_(max_launches) {
  a_.reserve(max_buffers, max_launches, max_uses);
  b_.reserve(max_buffers, max_launches, max_uses);
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
  if (started_ && position_ > 0) {
    const bool repeat = !relearn_next_ && learned_->ready() &&
                        recording_->length() == learned_->length() && recording_hash_ == learned_hash_;
    if (!repeat) {
      recording_->finish(now_ns - iteration_start_ns_);
      if (recording_->ready()) {
        std::swap(learned_, recording_);
        learned_hash_ = recording_hash_;
        ++generation_;
      }
    }
    relearn_next_ = false;
  }
  recording_->clear();
  recording_hash_ = 0;
  started_ = true;
  position_ = 0;
  iteration_start_ns_ = now_ns;
  ++boundaries_;
}

void AccessPattern::onLaunch(const Launch& launch) {
  const std::uint64_t sig = signature(launch);
  if (!started_) {
    boundary(launch.now_ns);
  } else if (!markers_ && position_ >= kMinPeriod && sig == first_signature_) {
    boundary(launch.now_ns);
  } else if (!markers_ && position_ >= anchor_limit_) {
    // The launch this recording started with has not come round again: it may never (the first
    // iteration's launch on fresh allocations, whose ids the next iterations do not reuse).
    // Record again from this launch, not learning the partial recording, and wait twice as long
    // next time, so that an iteration longer than the limit is still found.
    recording_->clear();
    recording_hash_ = 0;
    position_ = 0;
    iteration_start_ns_ = launch.now_ns;
    anchor_limit_ = std::max(anchor_limit_, std::min(2 * anchor_limit_, max_launches_));
  }
  if (position_ == 0) first_signature_ = sig;
  recording_->addLaunch(launch.now_ns - iteration_start_ns_, alloc_since_launch_, launch.buffers);
  recording_hash_ = (recording_hash_ ^ sig) * 1099511628211ull;
  alloc_since_launch_ = 0;
  ++position_;
}

}  // namespace delta::policy
