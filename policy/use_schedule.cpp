// Per-iteration launch index: see use_schedule.h.
#include "policy/use_schedule.h"

#include <algorithm>

namespace delta::policy {

void UseSchedule::reserve(std::uint32_t max_buffers, std::uint32_t max_launches,
                          std::uint32_t max_uses) {
  time_.assign(max_launches, 0);
  alloc_.assign(max_launches, 0);
  launch_begin_.assign(static_cast<std::size_t>(max_launches) + 1, 0);
  launch_ids_.assign(max_uses, 0);
  buffer_begin_.assign(static_cast<std::size_t>(max_buffers) + 1, 0);
  use_pos_.assign(max_uses, 0);
  free_pos_.assign(max_buffers, kNoPos);
  free_bytes_.assign(max_buffers, 0);
  free_begin_.assign(static_cast<std::size_t>(max_launches) + 1, 0);
  free_ids_.assign(max_buffers, 0);
  clear();
}

void UseSchedule::clear() {
  std::fill(free_pos_.begin(), free_pos_.begin() + std::min<std::size_t>(id_bound_, free_pos_.size()),
            kNoPos);
  id_bound_ = 0;
  indexed_bound_ = 0;
  length_ = 0;
  uses_ = 0;
  largest_alloc_ = 0;
  duration_ns_ = 0;
  ready_ = false;
  overflowed_ = false;
}

bool UseSchedule::addLaunch(std::int64_t offset_ns, std::uint64_t alloc_bytes_before,
                            std::span<const BufferId> ids) {
  if (overflowed_ || length_ >= time_.size() || uses_ + ids.size() > launch_ids_.size()) {
    overflowed_ = true;
    return false;
  }
  time_[length_] = offset_ns;
  alloc_[length_] = alloc_bytes_before;
  largest_alloc_ = std::max(largest_alloc_, alloc_bytes_before);
  launch_begin_[length_] = uses_;
  for (BufferId id : ids) {
    launch_ids_[uses_++] = id;
    if (id < free_pos_.size() && id + 1 > id_bound_) id_bound_ = id + 1;
  }
  ++length_;
  launch_begin_[length_] = uses_;
  return true;
}

void UseSchedule::addFree(BufferId id, std::uint64_t bytes) {
  if (id >= free_pos_.size()) return;
  free_pos_[id] = length_ > 0 ? length_ - 1 : 0;
  free_bytes_[id] = bytes;
  if (id + 1 > id_bound_) id_bound_ = id + 1;
}

void UseSchedule::finish(std::int64_t duration_ns) {
  duration_ns_ = std::max(duration_ns, length_ ? time_[length_ - 1] : 0);
  if (overflowed_) return;
  // Counting sort of (buffer, position) pairs: positions come out ascending per buffer.
  const std::size_t nbuf = id_bound_;  // ids at or above it have no uses
  std::fill(buffer_begin_.begin(), buffer_begin_.begin() + nbuf + 1, 0);
  for (std::uint32_t i = 0; i < uses_; ++i) {
    if (launch_ids_[i] < nbuf) ++buffer_begin_[launch_ids_[i] + 1];
  }
  for (std::size_t b = 0; b < nbuf; ++b) buffer_begin_[b + 1] += buffer_begin_[b];
  // Fill using buffer_begin_[b] as a cursor, then shift back (classic two-pass CSR build).
  for (std::uint32_t pos = 0; pos < length_; ++pos) {
    for (std::uint32_t i = launch_begin_[pos]; i < launch_begin_[pos + 1]; ++i) {
      const BufferId id = launch_ids_[i];
      if (id < nbuf) use_pos_[buffer_begin_[id]++] = pos;
    }
  }
  for (std::size_t b = nbuf; b > 0; --b) buffer_begin_[b] = buffer_begin_[b - 1];
  buffer_begin_[0] = 0;
  // The same for frees: buffers grouped by the launch they are freed after.
  std::fill(free_begin_.begin(), free_begin_.begin() + length_ + 1, 0);
  for (std::size_t b = 0; b < nbuf; ++b) {
    if (free_pos_[b] < length_) ++free_begin_[free_pos_[b] + 1];
  }
  for (std::uint32_t p = 0; p < length_; ++p) free_begin_[p + 1] += free_begin_[p];
  for (std::size_t b = 0; b < nbuf; ++b) {
    if (free_pos_[b] < length_) free_ids_[free_begin_[free_pos_[b]]++] = static_cast<BufferId>(b);
  }
  for (std::uint32_t p = length_; p > 0; --p) free_begin_[p] = free_begin_[p - 1];
  free_begin_[0] = 0;
  indexed_bound_ = id_bound_;
  ready_ = true;
}

bool UseSchedule::retime(std::span<const std::int64_t> offsets_ns) {
  if (!ready_ || offsets_ns.size() != static_cast<std::size_t>(length_) + 1) return false;
  std::copy(offsets_ns.begin(), offsets_ns.end() - 1, time_.begin());
  duration_ns_ = std::max(offsets_ns.back(), length_ ? time_[length_ - 1] : 0);
  return true;
}

std::span<const BufferId> UseSchedule::buffersAt(std::uint32_t pos) const {
  if (pos >= length_) return {};
  return {launch_ids_.data() + launch_begin_[pos], launch_begin_[pos + 1] - launch_begin_[pos]};
}

std::span<const BufferId> UseSchedule::freesAt(std::uint32_t pos) const {
  if (!ready_ || pos >= length_) return {};
  return {free_ids_.data() + free_begin_[pos], free_begin_[pos + 1] - free_begin_[pos]};
}

std::uint32_t UseSchedule::nextUsePos(BufferId id, std::uint32_t pos) const {
  if (!ready_ || id >= indexed_bound_) return kNoPos;
  const std::uint32_t* first = use_pos_.data() + buffer_begin_[id];
  const std::uint32_t* last = use_pos_.data() + buffer_begin_[id + 1];
  if (first == last) return kNoPos;
  const std::uint32_t* next = std::lower_bound(first, last, pos);
  return next != last ? *next : *first;
}

UseSchedule::NextUse UseSchedule::nextUse(BufferId id, std::uint32_t pos) const {
  if (!ready_ || id >= indexed_bound_) return {};
  const std::uint32_t* first = use_pos_.data() + buffer_begin_[id];
  const std::uint32_t* last = use_pos_.data() + buffer_begin_[id + 1];
  if (first == last) return {};
  const std::int64_t base = offsetNs(pos);
  const std::uint32_t* next = std::lower_bound(first, last, pos);
  const std::int64_t use = next != last ? time_[*next] - base
                                        : duration_ns_ - base + time_[*first];  // next iteration
  const std::uint32_t freed = free_pos_[id];
  if (freed != kNoPos && freed + 1 >= pos && freed < length_) {
    // Freed after launch `freed`, i.e. by the time launch freed + 1 starts.
    const std::int64_t free_at = offsetNs(freed + 1) - base;
    if (free_at < use) return {free_at, false};
  }
  return {use, true};
}

}  // namespace delta::policy
