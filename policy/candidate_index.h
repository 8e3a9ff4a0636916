// The eviction candidates, kept ranked incrementally so that choosing k victims costs
// O(buckets + k log n) instead of a scan of every resident buffer.
//
// A policy's score usually depends on the moment of the request (staleness, time to the next
// use, the copy queues), so no single order can be kept up to date. What can be kept is an
// order that does not change with time: a per-buffer rank key (last use, predicted next use)
// that changes only on that buffer's events. Buffers are split into buckets of similar size and
// similar recompute cost per byte; inside a bucket the rank key orders them (within a bucket the
// score differs from the key's order by at most the buckets' width); across buckets the caller
// scores each bucket's top exactly. Each bucket is an intrusive max pairing heap over arrays
// indexed by BufferId, so nothing allocates after construction.
//
// Costs: insert O(1); erase / update O(log n) amortised; top O(1); a pass over the buckets
// O(non-empty buckets), at most kBuckets whatever n is. Not thread-safe.
#pragma once

#include <bit>
#include <cstdint>
#include <vector>

#include "policy/types.h"

namespace delta::policy {

class CandidateIndex {
 public:
  // Size classes are powers of 2 of the byte count, with class 0 for the small buffers that are
  // chosen only when the large ones do not suffice; cost classes are powers of 2 of the
  // recompute time per MiB, plus class 0 for "no hook". The widths bound how far in-bucket
  // order can stray from the exact score (a factor 4 for bytes x time / cost); the counts cover
  // up to 2^48 bytes and 2^40 ns per MiB. Only non-empty buckets are visited (a bitmap).
  static constexpr std::uint32_t kSizeClasses = 49;
  static constexpr std::uint32_t kCostClasses = 41;
  static constexpr std::uint32_t kBuckets = kSizeClasses * kCostClasses;

  explicit CandidateIndex(std::uint32_t capacity);

  static std::uint32_t bucketFor(std::uint64_t bytes, std::int64_t recompute_ns, std::uint64_t small_bytes);
  static bool smallBucket(std::uint32_t bucket) { return bucket < kCostClasses; }

  // Calls fn(bucket) for every non-empty bucket, in bucket order.
  template <typename Fn>
  void forEachBucket(Fn&& fn) const {
    for (std::uint32_t w = 0; w < kWords; ++w) {
      for (std::uint64_t bits = occupied_[w]; bits != 0; bits &= bits - 1) {
        fn(w * 64 + static_cast<std::uint32_t>(std::countr_zero(bits)));
      }
    }
  }

  bool contains(BufferId id) const { return bucket_[id] != kNone; }
  // Inserts, or moves `id` to `bucket` with `key` (higher keys first).
  void set(BufferId id, std::uint32_t bucket, double key);
  void erase(BufferId id);
  double key(BufferId id) const { return key_[id]; }

  BufferId top(std::uint32_t bucket) const { return root_[bucket]; }
  // Removes the top of `bucket` and returns it (kNoBuffer when empty).
  BufferId pop(std::uint32_t bucket);
  std::uint32_t bucketOf(BufferId id) const { return bucket_[id]; }
  std::uint32_t size() const { return size_; }

 private:
  static constexpr std::uint32_t kNone = 0xffffffffu;
  static constexpr std::uint32_t kWords = (kBuckets + 63) / 64;

  void setRoot(std::uint32_t bucket, BufferId id);

  BufferId meld(BufferId a, BufferId b);
  BufferId mergePairs(BufferId first);
  void detach(BufferId id);

  std::vector<double> key_;
  std::vector<BufferId> child_;    // first child
  std::vector<BufferId> next_;     // next sibling
  std::vector<BufferId> prev_;     // previous sibling, or parent for a first child
  std::vector<std::uint32_t> bucket_;  // kNone: not in the index
  std::vector<BufferId> root_;     // per bucket
  std::uint64_t occupied_[kWords] = {};
  std::uint32_t size_ = 0;
};

}  // namespace delta::policy
