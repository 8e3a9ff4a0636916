// An exact lower bound on the time of any plan the simulator (policy/simulator.h) can run for a
// small workload within a budget: a mixed-integer program over the op sequence, solved with
// COIN-OR CBC. It checks the `oracle` policy (policy/oracle_policy.h): the oracle's replayed
// time can never be below this bound, and the distance between them is the oracle's gap.
//
// The model (one iteration, from the start, as SimOptions{iterations = 1, warmup = 0} runs it):
// - At the start of each op every live buffer is resident (counted in memory: resident, or
//   being copied either way), swapped or dropped; those the op touches are resident; the
//   resident bytes fit the budget. Persistent buffers start resident.
// - Between two ops a buffer may change state: resident -> swapped costs its copy out,
//   swapped -> resident its copy back, dropped -> resident (or swapped) its producer's time on
//   the compute stream, before the next op.
// - Time: op i starts at t_i >= t_{i-1} + its predecessor's time + the recomputes between them;
//   the end is t_{n-1} + the last op's time. Each copy engine runs one copy at a time: the copies
//   out that start after op a ends (the buffer's last use before the copy is op a or later)
//   and end by the start of op k (the op it is absent at) fit between the two; the copies back
//   that start after op a starts (the buffer was swapped at op a) and end by the start of
//   their next use k fit between them.
// It is a relaxation of the simulator, so its optimum is a lower bound, never a plan: it leaves
// out what only adds time or memory there — the memory of buffers still being copied in
// before they are counted, of freed inputs the simulator keeps for a recompute, a recompute's
// need for its inputs to be resident (and their restores or recomputes), recomputes forced by
// in-place writes, the loss of recomputability when an input is freed, and copies cancelled or
// repeated within one gap. Copies and compute overlap freely, as in the simulator.
#pragma once

#include <cstdint>
#include <string>

#include "policy/workload.h"

namespace delta::tools {

struct ExactBound {
  bool solved = false;      // CBC proved the optimum (or infeasibility) within the time limit
  bool feasible = false;    // some plan keeps every op within the budget (the model's)
  double lower_ns = 0;      // the optimum: no in-budget plan of the simulator runs faster
  std::string error;        // why not solved, when not
};

// Solves the model for `workload` (tens of ops) under `budget_bytes` and the two links (GB/s,
// 1 GB/s == 1 byte/ns); gives up after `max_seconds`.
ExactBound exactBound(const policy::Workload& workload, std::uint64_t budget_bytes, double h2d_gbps,
                      double d2h_gbps, double max_seconds = 20.0);

// Whether this build has the solver (meson found coinor-libcbc-dev).
bool haveExactSolver();

}  // namespace delta::tools
