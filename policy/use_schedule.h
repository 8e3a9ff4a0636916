// One iteration's launch sequence, as an index for predictions: for each launch its time offset
// from the iteration start, the bytes allocated just before it and the buffers it touched; for
// each buffer the positions of its uses. DeltaPolicy learns one from the previous iteration;
// BeladyPolicy is handed one built from the workload (the future).
//
// Cost: reserve() allocates everything once. clear()/addLaunch() are O(buffers of the launch);
// finish() is O(uses + buffer capacity); nextUseNs() is O(log uses of that buffer). None allocates.
// Frees are indexed too (per launch: the buffers freed after it, with their bytes), so that the
// memory the next launches need can be counted net of what they free.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "policy/types.h"

namespace delta::policy {

class UseSchedule {
 public:
  void reserve(std::uint32_t max_buffers, std::uint32_t max_launches, std::uint32_t max_uses);

  void clear();
  // Appends a launch; false (and the schedule is marked overflowed) when over capacity.
  bool addLaunch(std::int64_t offset_ns, std::uint64_t alloc_bytes_before,
                 std::span<const BufferId> ids);
  // `id` (`bytes` long) was freed after the last launch added: until then it is worth keeping,
  // after that there is nothing to keep.
  void addFree(BufferId id, std::uint64_t bytes = 0);
  // Closes the iteration: `duration_ns` is the iteration's length; builds the per-buffer index.
  void finish(std::int64_t duration_ns);
  // Replaces the launches' time offsets and the duration (offsets_ns: length() + 1 entries, the
  // last the duration) and keeps everything else: the same launches, timed another way. False,
  // and nothing changes, when the lengths differ or the schedule is not ready.
  bool retime(std::span<const std::int64_t> offsets_ns);

  bool ready() const { return ready_; }
  bool overflowed() const { return overflowed_; }
  std::uint32_t length() const { return length_; }
  std::int64_t durationNs() const { return duration_ns_; }
  std::int64_t offsetNs(std::uint32_t pos) const { return pos < length_ ? time_[pos] : duration_ns_; }
  std::uint64_t allocBytesAt(std::uint32_t pos) const { return pos < length_ ? alloc_[pos] : 0; }
  // The most any one launch allocates.
  std::uint64_t largestAllocBytes() const { return largest_alloc_; }
  std::span<const BufferId> buffersAt(std::uint32_t pos) const;
  // Buffers freed after launch `pos` (ready() only), and the bytes each was recorded with.
  std::span<const BufferId> freesAt(std::uint32_t pos) const;
  std::uint64_t freedBytes(BufferId id) const { return id < free_bytes_.size() ? free_bytes_[id] : 0; }
  // Position of the first use of `id` at or after `pos`, wrapping into the next iteration (then
  // it is below `pos`); kNoPos when `id` is not used in the schedule. O(log uses of `id`).
  std::uint32_t nextUsePos(BufferId id, std::uint32_t pos) const;
  static constexpr std::uint32_t kNoPos = 0xffffffffu;

  // Time from launch position `pos` (the next launch to run) to the next use of `id` at or after
  // it, wrapping into the next iteration, or to its free if that comes first (a buffer about to
  // be freed is worth little to evict); kUnknownNs when `id` is not used in the schedule.
  std::int64_t nextUseNs(BufferId id, std::uint32_t pos) const { return nextUse(id, pos).ns; }

  struct NextUse {
    std::int64_t ns = kUnknownNs;  // as nextUseNs
    bool reused = true;            // false: freed before any further use (ns is the time to the free)
  };
  NextUse nextUse(BufferId id, std::uint32_t pos) const;

 private:
  std::vector<std::int64_t> time_;
  std::vector<std::uint64_t> alloc_;
  std::vector<std::uint32_t> launch_begin_;  // length_ + 1 entries used
  std::vector<BufferId> launch_ids_;
  std::vector<std::uint32_t> buffer_begin_;  // per buffer, into use_pos_; capacity + 1 entries
  std::vector<std::uint32_t> use_pos_;
  std::vector<std::uint32_t> free_pos_;  // per buffer; kNoPos: not freed in the iteration
  std::vector<std::uint64_t> free_bytes_;  // per buffer: its bytes when freed
  std::vector<std::uint32_t> free_begin_;  // per launch, into free_ids_; length_ + 1 entries used
  std::vector<BufferId> free_ids_;         // buffers freed, grouped by launch (finish())
  std::uint64_t largest_alloc_ = 0;
  std::uint32_t length_ = 0;
  std::uint32_t uses_ = 0;
  // One past the highest buffer id used or freed in this recording (and in the index
  // finish() built): clear() and finish() cost O(this), not O(capacity), so that a process
  // with room for many buffers pays only for those it uses.
  std::uint32_t id_bound_ = 0;
  std::uint32_t indexed_bound_ = 0;
  std::int64_t duration_ns_ = 0;
  bool ready_ = false;
  bool overflowed_ = false;
};

}  // namespace delta::policy
