// What transfers cost: host-link bandwidth each way, seeded from a start-up measurement (or the
// simulator's configuration) and updated from the copies the caller times. No allocation.
#pragma once

#include <cstdint>

#include "policy/types.h"

namespace delta::policy {

class CostModel {
 public:
  // Bandwidths in bytes per ns (1 GB/s == 1 byte/ns).
  CostModel(double h2d_bytes_per_ns, double d2h_bytes_per_ns);

  // A copy of `bytes` took `ns`. Tiny copies are dominated by latency and are ignored.
  void onCopyMeasured(Direction dir, std::uint64_t bytes, std::int64_t ns);

  std::int64_t transferNs(Direction dir, std::uint64_t bytes) const;
  double bytesPerNs(Direction dir) const;

 private:
  static constexpr std::uint64_t kMinSampleBytes = 1u << 20;
  // Weight of a new sample: smooths over one noisy copy, follows a change within ~10 copies.
  static constexpr double kSampleWeight = 0.2;

  double h2d_;
  double d2h_;
};

}  // namespace delta::policy
