// Per-buffer state: see buffer_table.h.
#include "policy/buffer_table.h"

namespace delta::policy {

BufferTable::BufferTable(std::uint32_t capacity) : states_(capacity) { resident_.reserve(capacity); }

void BufferTable::allocate(BufferId id, std::uint64_t bytes, std::int64_t now_ns) {
  if (states_[id].residency != Residency::kFree) release(id);  // id reused without a free
  BufferState& s = states_[id];
  s = BufferState{};
  s.bytes = bytes;
  s.last_use_ns = now_ns;
  addResident(id);
}

void BufferTable::release(BufferId id) {
  if (states_[id].residency == Residency::kResident) removeResident(id);
  states_[id].residency = Residency::kFree;
}

void BufferTable::setResident(BufferId id, bool resident) {
  BufferState& s = states_[id];
  if (s.residency == Residency::kFree) return;
  if (resident && s.residency != Residency::kResident) addResident(id);
  if (!resident && s.residency == Residency::kResident) {
    removeResident(id);
    s.residency = Residency::kEvicted;
  }
}

std::uint32_t BufferTable::markKeep(std::span<const BufferId> ids) {
  if (++stamp_ == 0) {  // wrapped: clear old stamps so none matches by accident
    for (BufferState& s : states_) s.keep_stamp = 0;
    stamp_ = 1;
  }
  for (BufferId id : ids) {
    if (valid(id)) states_[id].keep_stamp = stamp_;
  }
  return stamp_;
}

void BufferTable::addResident(BufferId id) {
  BufferState& s = states_[id];
  s.residency = Residency::kResident;
  s.resident_index = static_cast<std::uint32_t>(resident_.size());
  resident_.push_back(id);
  resident_bytes_ += s.bytes;
}

void BufferTable::removeResident(BufferId id) {
  BufferState& s = states_[id];
  const BufferId last = resident_.back();
  resident_[s.resident_index] = last;
  states_[last].resident_index = s.resident_index;
  resident_.pop_back();
  resident_bytes_ -= s.bytes;
}

}  // namespace delta::policy
