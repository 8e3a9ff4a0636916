// Imports an op log of the DTR prototype (JSON lines, gzip or plain; format in
// ../shared/traces/README.md) as a Workload of one iteration:
// - storages, not names, are buffers: ALIAS k makes a result share argument k's storage, COPY
//   adds a name to a storage, COPY_FROM rebinds one, RELEASE drops one; a storage is freed
//   after the op that precedes its last reference's release;
// - CONSTANT storages are persistent (exist before the iteration, never freed);
// - CALL reads its arguments' storages and allocates its own results (producer: the call, whose
//   TIME is the recompute cost); MUTATE reads its arguments and writes the MUTATE ones in place;
// - only the first iteration is kept (a second ANNOTATE START ends the import); storages still
//   referenced at the end are freed after the last op. Offline code.
#pragma once

#include <string>
#include <string_view>

#include "policy/workload.h"

namespace delta::policy {

struct ImportResult {
  Workload workload;
  std::string error;  // empty on success; else "FILE:LINE: what"
};

ImportResult readDtrLog(const std::string& path);
// The same from text in memory (tests); `name` is used in messages.
ImportResult parseDtrLog(std::string_view text, const std::string& name);

}  // namespace delta::policy
