// What transfers and recomputes cost: host-link bandwidth each way, seeded from a start-up
// measurement (or the simulator's configuration) and updated from the copies the caller times;
// and how far recompute hooks' own estimates are from the times measured when they ran.
// No allocation.
#pragma once

#include <cstddef>
#include <cstdint>

#include "policy/types.h"

namespace delta::policy {

class CostModel {
 public:
  // Bandwidths in bytes per ns (1 GB/s == 1 byte/ns).
  CostModel(double h2d_bytes_per_ns, double d2h_bytes_per_ns);

  // A copy of `bytes` took `ns`. Tiny copies are dominated by latency and are ignored. The
  // first one each way replaces the seed; later ones are smoothed.
  void onCopyMeasured(Direction dir, std::uint64_t bytes, std::int64_t ns);

  // Inline: room ahead asks it for every launch it walks (Prefetcher::upcomingBytes).
  std::int64_t transferNs(Direction dir, std::uint64_t bytes) const {
    return static_cast<std::int64_t>(static_cast<double>(bytes) / bytesPerNs(dir));
  }
  double bytesPerNs(Direction dir) const { return dir == Direction::kHostToDevice ? h2d_ : d2h_; }

  // A recompute its hook estimated at `estimated_ns` took `measured_ns` of device time. Hooks
  // estimate with one systematic error (a framework's cost model, a fixed guess), so the ratio
  // is learnt once for all of them and applied to estimates given later.
  void onRecomputeMeasured(std::int64_t estimated_ns, std::int64_t measured_ns);
  // Measured time per ns of a hook's estimate: 1 until measured.
  double recomputeScale() const { return recompute_scale_; }

 private:
  static constexpr std::uint64_t kMinSampleBytes = 1u << 20;
  // Weight of a new sample: smooths over one noisy copy, follows a change within ~10 copies.
  static constexpr double kSampleWeight = 0.2;

  // A wrong estimate is corrected at most this far either way: one stalled measurement must
  // not make every recompute look free or prohibitive.
  static constexpr double kMaxRecomputeScale = 100.0;

  double h2d_;
  double d2h_;
  double recompute_scale_ = 1.0;
  bool measured_[2] = {false, false};  // host to device, device to host
};

}  // namespace delta::policy
