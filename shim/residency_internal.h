// What residency.cpp and residency_recompute.cpp share: the calling thread's identity, how
// deep this thread's recompute callbacks are nested, and the framework drop notices queued
// under the residency lock. Not part of the shim's interface.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>

namespace delta::shim::detail {

// Identifies the calling thread (for per-thread default streams): a thread-local's address.
const void* thisThread();
// This thread's nesting of recompute callbacks (0: the program's own work).
int& recomputeDepth();
// Recompute callbacks whose work needs other dropped buffers nest; this deep is a cycle.
constexpr int kMaxRecomputeDepth = 64;
// A framework-managed buffer was dropped by this thread's call: the framework's notifier (if
// one is set) hears of it once the residency lock is released (Residency::deliverDropNotices).
void queueDropNotice(CUdeviceptr address, size_t bytes);

// Managed buffers at most (heldCounts_ is sized for it once, not to move under releaseHeld).
constexpr uint32_t kMaxBuffers = 1u << 18;

// Victims asked of the policy at a time.
constexpr size_t kVictimBatch = 64;
// Rounds of asking the policy for victims the device has finished with (Residency::evictUntil,
// before any will do; Residency::makeRoomAhead, before giving up until the next launch): each
// round passes over up to kVictimBatch the device has not finished with.
constexpr int kPreferPassedRounds = 8;

inline uint64_t roundUp(uint64_t value, uint64_t to) { return (value + to - 1) / to * to; }

}  // namespace delta::shim::detail
