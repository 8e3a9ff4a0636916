// Replays a Workload through a Policy on a model of one GPU: one compute stream, a host-to-device
// and a device-to-host copy engine running concurrently at given bandwidths (FIFO each), and a
// memory budget. The same Policy calls the shim makes drive it.
//
// Model, in short (docs/policy.md has the long form):
// - Decisions happen at op boundaries, at the time the previous op ends on the compute stream.
// - An op needs its working set resident; memory for its allocations and restores must fit the
//   budget. A swap frees memory when its copy out ends; a drop frees it at once. Copies move a
//   buffer's copy_bytes (the bytes it holds, where its memory is rounded up to whole granules).
// - A dropped buffer is recomputed on the compute stream by re-running its producer op (its whole
//   time, even for one of several results), after making that op's inputs resident (restoring or
//   recomputing them, recursively). Inputs that the program frees while a dependent is dropped
//   are kept alive (counted in memory, evictable) until it is recomputed or freed, as a
//   framework's recompute graph would hold them. An in-place write to a buffer first recomputes
//   its dropped dependents and ends their recomputability. An op's unregisters end the
//   recomputability of buffers the program keeps (a dropped one is recomputed first).
// - After an op starts, the policy may free room ahead (upcomingBytes) and start prefetches.
// - Every wait of an op beyond its predecessor's end is reported once (Policy::onWaited): to the
//   buffer restored or recomputed, or to the buffer whose copy out the memory waited for.
// - The workload is repeated `iterations` times; time, bytes and recompute figures cover the
//   iterations after `warmup`; peak and over-budget ops cover the whole run.
#pragma once

#include <cstdint>
#include <deque>
#include <limits>
#include <vector>

#include "policy/policy.h"
#include "policy/workload.h"

namespace delta::policy {

struct SimOptions {
  std::uint64_t budget_bytes = std::numeric_limits<std::uint64_t>::max();
  double h2d_gbps = 12.0;  // 1 GB/s == 1 byte/ns
  double d2h_gbps = 12.0;
  std::uint32_t iterations = 3;
  std::uint32_t warmup = 1;
  bool iteration_markers = true;  // tell the policy where iterations start
  // delta (and its variants) plan each learned iteration within the budget; false: they keep
  // their configured mode, as libdelta.so does by default (DELTA_PLAN=0).
  bool plan = true;
  // Stop once the simulated clock (warm-up included) passes this, and say so (SimResult::
  // gave_up); 0: never. For callers that only need to know whether a run beats another.
  std::int64_t give_up_after_ns = 0;
  // Plan as the shim does (PolicyConfig::plan_elsewhere): the request a learned iteration makes
  // is run at once, as if the planner thread finished within the iteration, and its plan is
  // adopted at the next boundary, one iteration later than planning on the spot does.
  bool plan_elsewhere = false;
  // Tell prefetches the memory free (PrefetchRequest::free_bytes), so that a restore queued
  // behind a backlog waits while the launches before its transfer need its memory; false: as
  // libdelta.so does today, which does not tell them (shim/residency.cpp, Residency::prefetch).
  bool prefetch_sees_free_memory = true;
};

struct SimResult {
  std::uint64_t budget_bytes = 0;
  std::uint64_t peak_bytes = 0;
  std::int64_t total_ns = 0;      // measured iterations, start to end of the compute stream
  std::int64_t compute_ns = 0;    // the same iterations with unlimited memory
  std::int64_t recompute_ns = 0;
  std::int64_t stall_ns = 0;      // total - compute - recompute: waiting for copies
  double overhead_pct = 0;        // (total - compute) / compute
  std::uint64_t h2d_bytes = 0;
  std::uint64_t d2h_bytes = 0;
  std::uint64_t swaps = 0;
  std::uint64_t drops = 0;
  std::uint64_t prefetches = 0;
  std::uint64_t over_budget_ops = 0;
  std::uint64_t used_while_evicted = 0;  // invariant: always 0
  std::int64_t run_ns = 0;        // the whole run, warm-up included
  std::int64_t last_iteration_ns = 0;  // the last iteration alone
  bool gave_up = false;           // stopped at give_up_after_ns: the other figures are partial
};

// A policy configuration for replaying `workload` under `options`: sized for it (its buffers,
// twice its launches and buffer uses, room to learn an iteration), the link as the first
// estimate of the bandwidths, and the budget (delta plans within it).
PolicyConfig policyConfigFor(const Workload& workload, const SimOptions& options);

class Simulator {
 public:
  // `workload` must be valid (Workload::validate) and outlive the simulator.
  Simulator(const Workload& workload, const SimOptions& options);

  SimResult run(Policy& policy);
  void setGiveUpAfter(std::int64_t ns) { options_.give_up_after_ns = ns; }

  // A run stopped after its first `iterations` (sooner if it gives up), its state kept. A copy
  // of this simulator resumed with a copy of the policy (DeltaPolicy's copy constructor) then
  // runs exactly as the run would have gone on, and each copy may be told something else
  // first: the planner's replays that learn the same iteration before switching each to
  // their candidate share it instead of running it again (Planner::choose). A copy shares the
  // workload; the policy it resumes with replaces the one it ran with.
  void runFirst(Policy& policy, std::uint32_t iterations);
  // The iterations not run yet (all of them after a run, none before one), and the result. A
  // run that passes a give-up time lowered since it stopped gives up at once: it would have
  // given up before where it stopped.
  SimResult resume(Policy& policy);
  // From now on, sums the waits reported to each buffer (Policy::onWaited) over the measured
  // iterations: what evicting it cost the run (its restores' and recomputes' waits, the memory's
  // wait for its copy out). Kept by a copy. O(buffers) once.
  void recordWaitsByBuffer() { waited_by_buffer_.assign(workload_.buffers.size(), 0); }
  // Indexed by buffer; empty unless recorded.
  const std::vector<std::int64_t>& waitedByBuffer() const { return waited_by_buffer_; }

 private:
  enum class State : std::uint8_t { kAbsent, kResident, kSwappingOut, kSwapped, kSwappingIn, kDropped };
  struct Buf {
    std::uint64_t bytes = 0;
    std::uint64_t copy_bytes = 0;  // what its copies move (Workload::copyBytes)
    std::int64_t ready_ns = 0;     // kSwappingIn: data ready; kSwappingOut: memory free
    std::int64_t last_use_end = 0;
    std::uint32_t holders = 0;     // dropped buffers whose recompute needs this one
    std::uint32_t out_seq = 0;     // matches the pending copy-out entry while it is valid
    State state = State::kAbsent;
    bool live = false;             // the program holds it
    bool recomputable = false;
  };
  struct PendingOut {
    BufferId id;
    std::uint32_t seq;
    std::int64_t ready_ns;
  };

  void start(Policy& policy);
  void runIterations(Policy& policy, std::uint32_t until);
  void reset();
  void step(std::size_t op_index);
  std::int64_t makeResident(BufferId id, std::int64_t now);
  std::int64_t recompute(BufferId id, std::int64_t now);
  std::int64_t ensureRoom(std::uint64_t bytes, std::int64_t now);
  void evict(const Victim& victim, std::int64_t now);
  bool tryPrefetch(const Prefetch& prefetch, std::int64_t now);
  std::int64_t startRestore(BufferId id, std::int64_t now);
  void allocate(BufferId id, std::int64_t now, std::size_t op_index);
  void programFree(BufferId id, std::int64_t now);
  void unregister(BufferId id, std::int64_t now);
  void releaseStorage(BufferId id, std::int64_t now);
  void unhold(BufferId id, std::int64_t now);
  void invalidateDependents(BufferId id, std::int64_t now);
  void retire(std::int64_t now);
  // False once the copy out was cancelled: its buffer came back into use, or was freed.
  bool underWay(const PendingOut& out) const;
  // Tells the policy the current op waited for `id` until `until`, beyond the waits reported.
  void reportWait(BufferId id, std::int64_t until);
  // Runs the plan the policy asks for, if any (SimOptions::plan_elsewhere).
  void servePlan();
  void addUsed(std::uint64_t bytes);
  std::int64_t transferNs(Direction dir, std::uint64_t bytes) const;
  const std::vector<BufferId>& inputsOf(BufferId id) const;

  const Workload& workload_;
  SimOptions options_;
  Policy* policy_ = nullptr;

  std::vector<std::vector<BufferId>> working_sets_;  // per op: WorkloadOp::workingSet
  std::vector<std::vector<BufferId>> dependents_;    // per buffer: results of ops that read it
  std::vector<Buf> bufs_;
  std::deque<PendingOut> pending_out_;
  std::vector<BufferId> keep_;
  std::vector<Victim> victims_;
  std::vector<Prefetch> prefetches_;

  std::uint64_t used_ = 0;
  std::uint64_t pending_out_bytes_ = 0;
  std::int64_t t_compute_ = 0;
  std::int64_t t_h2d_ = 0;
  std::int64_t t_d2h_ = 0;
  std::int64_t waited_until_ = 0;  // the current op's waits reported up to here (onWaited)
  std::vector<std::int64_t> waited_by_buffer_;  // recordWaitsByBuffer
  // Launches told to the policy so far: the next one's number for onLaunchTimed.
  std::uint64_t launches_told_ = 0;
  bool times_wanted_ = false;  // policy_->wantsLaunchTimes()
  SimResult r_;
  // Where the run is: the next iteration, and at the measured iterations' start, the figures
  // so far and the clock; at the last one's start, the clock.
  std::uint32_t next_iteration_ = 0;
  SimResult at_measured_{};
  std::int64_t t_measured_ = 0;
  std::int64_t t_last_ = 0;
};

}  // namespace delta::policy
