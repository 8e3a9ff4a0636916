// Shared bookkeeping and victim selection for every policy: see policy.h.
#include "policy/policy.h"

#include <algorithm>

namespace delta::policy {

Policy::Policy(const PolicyConfig& config)
    : table_(config.max_buffers),
      costs_(config.h2d_gbps, config.d2h_gbps),
      config_(config),
      index_(config.max_buffers) {
  heap_.reserve(CandidateIndex::kBuckets);
  aside_.reserve(config.max_buffers);
  if (config.budget_bytes > 0) {
    vetoed_.assign(config.max_buffers, 0);
    vetoed_ids_.reserve(kVetoesReserved);
  }
}

void Policy::setVetoed(std::span<const BufferId> ids) {
  for (BufferId id : vetoed_ids_) vetoed_[id] = 0;
  vetoed_ids_.clear();
  for (BufferId id : ids) {
    if (!table_.valid(id)) continue;
    if (vetoed_.empty()) vetoed_.assign(table_.capacity(), 0);  // a replay's policy: offline
    if (vetoed_[id] != 0) continue;
    vetoed_[id] = 1;
    vetoed_ids_.push_back(id);
  }
}

double Policy::rankKey(BufferId, const BufferState& state) const {
  return -static_cast<double>(state.last_use_ns);
}

void Policy::noteChoice(BufferId, const BufferState&, Action) const {}

void Policy::reindex(BufferId id) {
  const BufferState& s = table_[id];
  if (s.residency != Residency::kResident || s.pinned || s.bytes == 0) {
    index_.erase(id);
    return;
  }
  index_.set(id, CandidateIndex::bucketFor(s.bytes, s.recompute_ns, config_.min_evict_bytes), rankKey(id, s));
}

void Policy::reindexAll() {
  for (BufferId id : table_.resident()) reindex(id);
}

void Policy::onAlloc(BufferId id, std::uint64_t bytes, std::int64_t now_ns) {
  if (!table_.valid(id)) return;
  table_.allocate(id, bytes, now_ns);
  reindex(id);
  residencyChanged(id);
}

void Policy::onFree(BufferId id, std::int64_t) {
  if (!table_.valid(id)) return;
  table_.release(id);
  index_.erase(id);
  residencyChanged(id);
}

void Policy::onLaunch(const Launch& launch) {
  for (BufferId id : launch.buffers) {
    if (!table_.valid(id)) continue;
    table_[id].last_use_ns = launch.now_ns;
    reindex(id);
  }
}

void Policy::onIteration(std::int64_t) {}

void Policy::onRecomputable(BufferId id, std::int64_t cost_ns) {
  if (!table_.valid(id)) return;
  table_[id].recompute_ns =
      cost_ns < 0 ? kUnknownNs
                  : static_cast<std::int64_t>(static_cast<double>(cost_ns) * costs_.recomputeScale());
  reindex(id);
  recomputableChanged(id);
}

void Policy::onRecomputeMeasured(BufferId id, std::int64_t estimated_ns, std::int64_t measured_ns) {
  costs_.onRecomputeMeasured(estimated_ns, measured_ns);
  if (!table_.valid(id) || measured_ns <= 0 || table_[id].recompute_ns == kUnknownNs) return;
  table_[id].recompute_ns = measured_ns;
  if (table_[id].residency == Residency::kResident) reindex(id);
}

void Policy::onPinned(BufferId id, bool pinned) {
  if (!table_.valid(id)) return;
  table_[id].pinned = pinned;
  reindex(id);
}

void Policy::onEvicted(BufferId id, Action how) {
  if (!table_.valid(id)) return;
  table_.setResident(id, false);
  table_[id].evicted_by = how;
  index_.erase(id);
  residencyChanged(id);
}

void Policy::onRestored(BufferId id, std::int64_t now_ns) {
  if (!table_.valid(id)) return;
  table_.setResident(id, true);
  table_[id].last_use_ns = now_ns;
  reindex(id);
  residencyChanged(id);
}

void Policy::onCopyMeasured(Direction dir, std::uint64_t bytes, std::int64_t ns) {
  costs_.onCopyMeasured(dir, bytes, ns);
}

void Policy::onWaited(BufferId, std::int64_t) {}

void Policy::onLaunchTimed(std::uint64_t, std::int64_t, std::int64_t, bool) {}

void Policy::deliverPlan(Plan&&) {}

std::size_t Policy::choosePrefetches(const PrefetchRequest&, std::span<Prefetch>) { return 0; }

std::uint64_t Policy::upcomingBytes(std::int64_t, std::int64_t& need_at_ns) const {
  need_at_ns = 0;
  return 0;
}

// Heap order: large buffers before small ones, then by score, then by lower id (determinism).
bool Policy::lessUrgent(const Scored& a, const Scored& b) {
  if (a.large != b.large) return !a.large;
  if (a.score != b.score) return a.score < b.score;
  return a.id > b.id;
}

void Policy::pushTop(std::uint32_t bucket, const EvictRequest& request, std::uint32_t stamp) {
  for (;;) {
    const BufferId id = index_.top(bucket);
    if (id == kNoBuffer) return;
    const BufferState& s = table_[id];
    if (s.keep_stamp == stamp) {  // in use by the pending launch: look past it
      aside_.push_back(index_.pop(bucket));
      continue;
    }
    if (honour_vetoes_ && vetoed_[id] != 0) {
      aside_.push_back(index_.pop(bucket));
      vetoed_aside_ = true;
      continue;
    }
    const Rating r = rate(id, s, request);
    // The bucket is ordered by rankKey: when its best is not eligible (predicted to be needed
    // within the request's window, or no hook for a recompute-only policy) the rest are not
    // either, or only rarely; skipping the bucket keeps the call O(buckets + k log n).
    if (!r.eligible) return;
    heap_.push_back({r.score, id, bucket, r.action, !CandidateIndex::smallBucket(bucket)});
    std::push_heap(heap_.begin(), heap_.end(), lessUrgent);
    return;
  }
}

// Lazy greedy over the bucket tops: the best top is re-rated against the copy queues as the
// victims already chosen leave them; if it got worse than the next best it goes back in the
// heap, else it is taken. Ratings only get worse as the queues grow, so this picks the same
// victims as re-rating every candidate after each choice would.
std::size_t Policy::chooseVictims(const EvictRequest& request, std::span<Victim> out) {
  if (request.bytes == 0 || out.empty()) return 0;
  const std::uint32_t stamp = table_.markKeep(request.keep);
  EvictRequest local = request;
  beginChoice();
  heap_.clear();
  aside_.clear();
  honour_vetoes_ = !vetoed_ids_.empty();
  vetoed_aside_ = false;
  index_.forEachBucket([&](std::uint32_t b) { pushTop(b, local, stamp); });
  std::size_t n = 0;
  std::uint64_t freed = 0;
  for (;;) {
    while (freed < request.bytes && n < out.size() && !heap_.empty()) {
      std::pop_heap(heap_.begin(), heap_.end(), lessUrgent);
      Scored best = heap_.back();
      heap_.pop_back();
      const BufferState& s = table_[best.id];
      const Rating r = rate(best.id, s, local);
      if (!r.eligible) continue;  // drop the bucket for this call, as pushTop does
      const Scored now{r.score, best.id, best.bucket, r.action, best.large};
      if (!heap_.empty() && lessUrgent(now, heap_.front())) {
        heap_.push_back(now);
        std::push_heap(heap_.begin(), heap_.end(), lessUrgent);
        continue;
      }
      aside_.push_back(index_.pop(best.bucket));
      out[n++] = {best.id, r.action};
      freed += s.bytes;
      if (r.action == Action::kSwap) {
        // The copy out queues behind the ones just chosen.
        local.d2h_busy_until_ns = std::max(local.d2h_busy_until_ns, local.now_ns) +
                                  costs_.transferNs(Direction::kDeviceToHost, s.bytes);
      }
      noteChoice(best.id, s, r.action);
      pushTop(best.bucket, local, stamp);
    }
    // The memory is needed now and the others did not free enough: the vetoed buffers set aside
    // go back among the candidates, and the choice goes on with them. Ahead of need, never.
    if (!vetoed_aside_ || !request.urgent || freed >= request.bytes || n >= out.size()) break;
    honour_vetoes_ = false;
    vetoed_aside_ = false;
    std::size_t kept = 0;
    for (BufferId id : aside_) {
      if (vetoed_[id] != 0 && table_[id].keep_stamp != stamp) {
        reindex(id);
      } else {
        aside_[kept++] = id;
      }
    }
    aside_.resize(kept);
    heap_.clear();
    index_.forEachBucket([&](std::uint32_t b) { pushTop(b, local, stamp); });
  }
  honour_vetoes_ = false;
  // Everything taken out goes back; the caller's onEvicted removes the victims it evicts.
  for (BufferId id : aside_) reindex(id);
  aside_.clear();
  return n;
}

}  // namespace delta::policy
