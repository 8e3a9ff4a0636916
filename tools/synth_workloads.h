// Synthetic training iterations for `delta-trace synth`: families of models whose structure the
// shared traces lack, each written as an op log of the DTR prototype (one iteration: forward,
// backward with gradients, optimizer step) that `replay`, `sweep` and `maxbatch` read. A seed
// picks the shapes (depth, widths, batch, sequence length) from the family's ranges with its
// own generator (splitmix64, no library distribution), so that the same family, seed, scale and
// GPU give the same bytes everywhere. docs/delta-trace.md describes the families. Offline code.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "policy/workload.h"

namespace delta::tools {

struct SynthFamily {
  std::string_view name;
  std::string_view summary;  // one line
};

const std::vector<SynthFamily>& synthFamilies();
std::string synthFamilyNames();  // "unet, gan, ..." for messages

struct SynthOptions {
  std::string family;
  std::uint64_t seed = 1;
  double scale = 1.0;        // multiplies the batch the seed picked (rounded, at least 1)
  std::string gpu;           // cost model's GPU; empty: kDefaultGpu
  std::int64_t seq_len = 0;  // attention only: the sequence length instead of the seed's
};

struct SynthResult {
  std::string log;    // the DTR op log
  std::string error;  // empty on success
  // What the seed chose, in order ("batch", 8), ("levels", 4), ...
  std::vector<std::pair<std::string, std::int64_t>> choices;
  std::int64_t choice(std::string_view name) const;  // -1 if absent
};

SynthResult synthesize(const SynthOptions& options);

// The largest working set of one op (bytes of the distinct buffers it allocates, reads and
// writes) and the op's index.
std::pair<std::uint64_t, std::size_t> largestWorkingSet(const policy::Workload& w);

}  // namespace delta::tools
