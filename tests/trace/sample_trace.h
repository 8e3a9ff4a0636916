// A small, fully deterministic trace with every record type, written through TraceWriter: the
// input of the round-trip tests and of the expected-output files for delta-trace's summary and
// export (tests/trace/expected/).
#pragma once

#include <string>

namespace delta::trace::testing {

// Writes the sample to `path` (replacing it); "" on success, else the writer's error.
std::string writeSampleTrace(const std::string& path);

// The sample's header start time on the monotonic clock: record times are offsets from it.
inline constexpr unsigned long long kSampleStartNs = 1'000'000'000ull;

}  // namespace delta::trace::testing
