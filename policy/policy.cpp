// Shared bookkeeping and victim selection for every policy: see policy.h.
#include "policy/policy.h"

#include <algorithm>

namespace delta::policy {

Policy::Policy(const PolicyConfig& config)
    : table_(config.max_buffers),
      costs_(config.h2d_gbps, config.d2h_gbps),
      config_(config) {
  scratch_.reserve(config.max_buffers);
}

void Policy::onAlloc(BufferId id, std::uint64_t bytes, std::int64_t now_ns) {
  if (table_.valid(id)) table_.allocate(id, bytes, now_ns);
}

void Policy::onFree(BufferId id, std::int64_t) {
  if (table_.valid(id)) table_.release(id);
}

void Policy::onLaunch(const Launch& launch) {
  for (BufferId id : launch.buffers) {
    if (table_.valid(id)) table_[id].last_use_ns = launch.now_ns;
  }
}

void Policy::onIteration(std::int64_t) {}

void Policy::onRecomputable(BufferId id, std::int64_t cost_ns) {
  if (table_.valid(id)) table_[id].recompute_ns = cost_ns < 0 ? kUnknownNs : cost_ns;
}

void Policy::onPinned(BufferId id, bool pinned) {
  if (table_.valid(id)) table_[id].pinned = pinned;
}

void Policy::onEvicted(BufferId id, Action how) {
  if (!table_.valid(id)) return;
  table_.setResident(id, false);
  table_[id].evicted_by = how;
}

void Policy::onRestored(BufferId id, std::int64_t now_ns) {
  if (!table_.valid(id)) return;
  table_.setResident(id, true);
  table_[id].last_use_ns = now_ns;
}

void Policy::onCopyMeasured(Direction dir, std::uint64_t bytes, std::int64_t ns) {
  costs_.onCopyMeasured(dir, bytes, ns);
}

std::size_t Policy::choosePrefetches(const PrefetchRequest&, std::span<Prefetch>) { return 0; }

std::uint64_t Policy::upcomingBytes(std::int64_t, std::int64_t& horizon_ns) const {
  horizon_ns = 0;
  return 0;
}

// Heap order: large buffers before small ones, then by score, then by lower id (determinism).
bool Policy::lessUrgent(const Scored& a, const Scored& b) {
  if (a.large != b.large) return !a.large;
  if (a.score != b.score) return a.score < b.score;
  return a.id > b.id;
}

std::size_t Policy::chooseVictims(const EvictRequest& request, std::span<Victim> out) {
  if (request.bytes == 0 || out.empty()) return 0;
  const std::uint32_t stamp = table_.markKeep(request.keep);
  scratch_.clear();
  for (BufferId id : table_.resident()) {
    const BufferState& s = table_[id];
    if (s.pinned || s.keep_stamp == stamp || s.bytes == 0) continue;
    const Rating r = rate(id, s, request);
    if (!r.eligible) continue;
    scratch_.push_back({r.score, id, r.action, s.bytes >= config_.min_evict_bytes});
  }
  std::make_heap(scratch_.begin(), scratch_.end(), lessUrgent);
  std::size_t n = 0;
  std::uint64_t freed = 0;
  auto end = scratch_.end();
  while (freed < request.bytes && n < out.size() && end != scratch_.begin()) {
    std::pop_heap(scratch_.begin(), end, lessUrgent);
    --end;
    out[n++] = {end->id, end->action};
    freed += table_[end->id].bytes;
  }
  return n;
}

}  // namespace delta::policy
