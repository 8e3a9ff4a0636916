// Small value types shared by every policy, the simulator and the shim: buffer ids, the two
// ways to release a buffer, and the requests the shim's launch path makes. Header only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace delta::policy {

// Ids are assigned by the caller (shim or simulator): small dense integers below the capacity
// given in PolicyConfig, so that per-buffer state is a plain array lookup.
using BufferId = std::uint32_t;
inline constexpr BufferId kNoBuffer = 0xffffffffu;

// A cost or time that is not known (no recompute hook, no prediction yet).
inline constexpr std::int64_t kUnknownNs = -1;
inline constexpr std::uint64_t kUnknownBytes = ~std::uint64_t{0};

enum class Action : std::uint8_t {
  kSwap,       // copy to host, copy back before the next use
  kRecompute,  // drop the contents, ask the hook to recompute them before the next use
};

enum class Direction : std::uint8_t { kHostToDevice, kDeviceToHost };

struct Victim {
  BufferId id = kNoBuffer;
  Action action = Action::kSwap;
};

// "Release at least `bytes`." The caller evicts the returned victims in order.
struct EvictRequest {
  std::uint64_t bytes = 0;
  std::int64_t now_ns = 0;
  // true: the memory is needed now, so a device-to-host copy is on the critical path;
  // false: asked ahead of time (proactive eviction or room for a prefetch).
  bool urgent = true;
  // Asked ahead (urgent == false): when the memory is needed, from now_ns (upcomingBytes'
  // need_at_ns). Predictive policies choose no buffer that must be back before then (so room
  // made ahead never evicts what is needed sooner), and price a copy out by the part of it
  // that ends later. 0: no constraint when urgent; ahead of need, never the buffers the next
  // launch uses.
  std::int64_t not_before_ns = 0;
  // When the device-to-host engine finishes what is already queued (<= now_ns when idle).
  std::int64_t d2h_busy_until_ns = 0;
  // The same for the host-to-device engine: restores queue behind it.
  std::int64_t h2d_busy_until_ns = 0;
  // The working set of the pending launch (and anything else the caller must keep): never chosen.
  std::span<const BufferId> keep;
};

struct PrefetchRequest {
  std::int64_t now_ns = 0;
  // When the host-to-device engine finishes what is already queued (<= now_ns when idle).
  std::int64_t h2d_busy_until_ns = 0;
  // Memory a restore started now can take without evicting: the budget less what is resident
  // and in flight. The default, unknown: no restore is held back for memory (Prefetcher::choose).
  std::uint64_t free_bytes = kUnknownBytes;
};

struct Prefetch {
  BufferId id = kNoBuffer;
  std::int64_t due_ns = 0;  // predicted time until its use, from now
};

// One launch (kernel, copy, memset) and the managed buffers it touches.
struct Launch {
  std::int64_t now_ns = 0;
  std::uint32_t stream = 0;
  std::span<const BufferId> buffers;
};

}  // namespace delta::policy
