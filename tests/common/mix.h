// The integer mixing the test workloads build their data from: splitmix64 (a counter-based
// hash: the same seed gives the same bytes in the kernel and in the host's shadow copy) and a
// rotation. Header only.
#pragma once

#include <cstdint>

namespace delta::testing {

inline constexpr std::uint64_t kGolden = 0x9E3779B97F4A7C15ull;

inline constexpr std::uint64_t splitmix(std::uint64_t x) {
  x += kGolden;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline constexpr std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

}  // namespace delta::testing
