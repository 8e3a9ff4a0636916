// Incrementally ranked eviction candidates: see candidate_index.h.
#include "policy/candidate_index.h"

#include <algorithm>
#include <bit>

namespace delta::policy {

CandidateIndex::CandidateIndex(std::uint32_t capacity)
    : key_(capacity, 0.0),
      child_(capacity, kNoBuffer),
      next_(capacity, kNoBuffer),
      prev_(capacity, kNoBuffer),
      bucket_(capacity, kNone),
      root_(kBuckets, kNoBuffer) {}

std::uint32_t CandidateIndex::bucketFor(std::uint64_t bytes, std::int64_t recompute_ns,
                                        std::uint64_t small_bytes) {
  const std::uint32_t size_class =
      bytes < small_bytes ? 0
                          : std::min<std::uint32_t>(static_cast<std::uint32_t>(std::bit_width(bytes)),
                                                    kSizeClasses - 1);
  std::uint32_t cost_class = 0;  // no hook
  if (recompute_ns != kUnknownNs) {
    // ns per MiB (bytes below 1 MiB count as 1 MiB: the class only has to be consistent).
    const std::uint64_t mib = std::max<std::uint64_t>(1, bytes >> 20);
    const auto per_mib = static_cast<std::uint64_t>(std::max<std::int64_t>(recompute_ns, 0)) / mib;
    cost_class = 1 + std::min<std::uint32_t>(static_cast<std::uint32_t>(std::bit_width(per_mib)),
                                             kCostClasses - 2);
  }
  return size_class * kCostClasses + cost_class;
}

void CandidateIndex::setRoot(std::uint32_t bucket, BufferId id) {
  root_[bucket] = id;
  const std::uint64_t bit = std::uint64_t{1} << (bucket % 64);
  if (id == kNoBuffer) {
    occupied_[bucket / 64] &= ~bit;
  } else {
    occupied_[bucket / 64] |= bit;
  }
}

BufferId CandidateIndex::meld(BufferId a, BufferId b) {
  if (a == kNoBuffer) return b;
  if (b == kNoBuffer) return a;
  // Higher key on top; ties: lower id on top, so the order is deterministic.
  if (key_[b] > key_[a] || (key_[b] == key_[a] && b < a)) std::swap(a, b);
  // b becomes a's first child.
  next_[b] = child_[a];
  if (child_[a] != kNoBuffer) prev_[child_[a]] = b;
  prev_[b] = a;
  child_[a] = b;
  next_[a] = kNoBuffer;
  prev_[a] = kNoBuffer;
  return a;
}

// Two-pass pairing of a sibling list, iteratively (no recursion: the list may be long).
BufferId CandidateIndex::mergePairs(BufferId first) {
  if (first == kNoBuffer) return kNoBuffer;
  // Pass 1, left to right: meld pairs; chain the results backwards through prev_.
  BufferId last = kNoBuffer;  // most recent pair result
  BufferId cur = first;
  while (cur != kNoBuffer) {
    const BufferId a = cur;
    const BufferId b = next_[a];
    cur = b != kNoBuffer ? next_[b] : kNoBuffer;
    next_[a] = prev_[a] = kNoBuffer;
    if (b != kNoBuffer) next_[b] = prev_[b] = kNoBuffer;
    const BufferId m = meld(a, b);
    prev_[m] = last;  // temporary back link
    last = m;
  }
  // Pass 2, right to left: meld each pair result into the accumulated heap.
  BufferId acc = last;
  BufferId p = prev_[acc];
  prev_[acc] = kNoBuffer;
  while (p != kNoBuffer) {
    const BufferId before = prev_[p];
    prev_[p] = kNoBuffer;
    acc = meld(p, acc);
    p = before;
  }
  return acc;
}

void CandidateIndex::detach(BufferId id) {
  // Unlinks a non-root node (with its subtree) from its parent's child list.
  const BufferId p = prev_[id];
  if (child_[p] == id) {
    child_[p] = next_[id];
  } else {
    next_[p] = next_[id];
  }
  if (next_[id] != kNoBuffer) prev_[next_[id]] = p;
  next_[id] = prev_[id] = kNoBuffer;
}

void CandidateIndex::set(BufferId id, std::uint32_t bucket, double key) {
  if (contains(id)) {
    if (bucket_[id] == bucket && key == key_[id]) return;
    erase(id);
  }
  key_[id] = key;
  bucket_[id] = bucket;
  child_[id] = next_[id] = prev_[id] = kNoBuffer;
  setRoot(bucket, meld(root_[bucket], id));
  ++size_;
}

void CandidateIndex::erase(BufferId id) {
  if (!contains(id)) return;
  const std::uint32_t b = bucket_[id];
  if (root_[b] == id) {
    setRoot(b, mergePairs(child_[id]));
  } else {
    detach(id);
    const BufferId sub = mergePairs(child_[id]);
    setRoot(b, meld(root_[b], sub));
  }
  child_[id] = next_[id] = prev_[id] = kNoBuffer;
  bucket_[id] = kNone;
  --size_;
}

BufferId CandidateIndex::pop(std::uint32_t bucket) {
  const BufferId id = root_[bucket];
  if (id != kNoBuffer) erase(id);
  return id;
}

}  // namespace delta::policy
