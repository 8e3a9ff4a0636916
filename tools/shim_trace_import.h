// Turns a trace written by libdelta.so (DELTA_TRACE) into a policy::Workload, so that
// `delta-trace replay|sweep|maxbatch` can ask of a job recorded once what another budget or
// policy would have done.
//
// The trace's managed allocations become buffers (never freed ones: persistent), each launch,
// copy and memset an op that reads the managed buffers it touched, in time order. A trace
// has no kernel durations: an op's compute time is the time to the next op (at most 10 ms,
// at least 1 us), which is what the job spent there as seen from the host — an estimate,
// and one that includes the shim's own stalls when the job ran under a tight budget.
#pragma once

#include <string>

#include "policy/dtr_log_reader.h"

namespace delta::tools {

policy::ImportResult importShimTrace(const std::string& path);

}  // namespace delta::tools
