// Host-link cost model: see cost_model.h.
#include "policy/cost_model.h"

#include <algorithm>

namespace delta::policy {

namespace {
constexpr double kMinBytesPerNs = 1e-3;  // 1 MB/s: keeps a bogus measurement from dividing by 0
}

CostModel::CostModel(double h2d_bytes_per_ns, double d2h_bytes_per_ns)
    : h2d_(std::max(h2d_bytes_per_ns, kMinBytesPerNs)),
      d2h_(std::max(d2h_bytes_per_ns, kMinBytesPerNs)) {}

void CostModel::onCopyMeasured(Direction dir, std::uint64_t bytes, std::int64_t ns) {
  if (bytes < kMinSampleBytes || ns <= 0) return;
  const double sample = std::max(static_cast<double>(bytes) / static_cast<double>(ns), kMinBytesPerNs);
  const auto d = static_cast<std::size_t>(dir == Direction::kHostToDevice ? 0 : 1);
  double& rate = d == 0 ? h2d_ : d2h_;
  // The seed is a guess (a default, or what the caller was told): the first measurement
  // replaces it; later ones are smoothed.
  rate = measured_[d] ? rate + kSampleWeight * (sample - rate) : sample;
  measured_[d] = true;
}

void CostModel::onRecomputeMeasured(std::int64_t estimated_ns, std::int64_t measured_ns) {
  if (estimated_ns <= 0 || measured_ns <= 0) return;
  const double sample = std::clamp(static_cast<double>(measured_ns) / static_cast<double>(estimated_ns),
                                   1.0 / kMaxRecomputeScale, kMaxRecomputeScale);
  recompute_scale_ += kSampleWeight * (sample - recompute_scale_);
}

}  // namespace delta::policy
