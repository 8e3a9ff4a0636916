// Per-buffer state every policy keeps (size, last use, recompute cost, residency), plus a dense
// list of the resident buffers (to re-rank them all; victims come from CandidateIndex).
// Storage is sized once at construction; every update is O(1) and never allocates.
#pragma once

#include <cstdint>
#include <vector>

#include "policy/types.h"

namespace delta::policy {

enum class Residency : std::uint8_t { kFree, kResident, kEvicted };

struct BufferState {
  std::uint64_t bytes = 0;
  std::int64_t last_use_ns = 0;
  std::int64_t recompute_ns = kUnknownNs;  // kUnknownNs: cannot be recomputed
  std::uint32_t keep_stamp = 0;           // == the table's stamp: in the current request's keep set
  std::uint32_t resident_index = 0;       // position in the dense resident list
  Residency residency = Residency::kFree;
  Action evicted_by = Action::kSwap;  // meaningful while kEvicted
  bool pinned = false;
};

class BufferTable {
 public:
  explicit BufferTable(std::uint32_t capacity);

  std::uint32_t capacity() const { return static_cast<std::uint32_t>(states_.size()); }
  bool valid(BufferId id) const { return id < states_.size(); }
  const BufferState& operator[](BufferId id) const { return states_[id]; }
  BufferState& operator[](BufferId id) { return states_[id]; }

  void allocate(BufferId id, std::uint64_t bytes, std::int64_t now_ns);
  void release(BufferId id);
  void setResident(BufferId id, bool resident);

  const std::vector<BufferId>& resident() const { return resident_; }
  std::uint64_t residentBytes() const { return resident_bytes_; }

  // Marks `ids` as kept for one request; returns the stamp to compare with keep_stamp.
  std::uint32_t markKeep(std::span<const BufferId> ids);

 private:
  void addResident(BufferId id);
  void removeResident(BufferId id);

  std::vector<BufferState> states_;
  std::vector<BufferId> resident_;  // reserved to capacity: push_back never reallocates
  std::uint64_t resident_bytes_ = 0;
  std::uint32_t stamp_ = 0;
};

}  // namespace delta::policy
