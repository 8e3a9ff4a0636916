// The interface the shim and the simulator drive: events (a buffer allocated, freed, used by a
// launch, marked recomputable, evicted, restored; an iteration boundary; a measured copy; a
// launch that waited for a buffer) and
// queries (victims to release N bytes and the action for each; buffers to bring back early).
// Subclasses differ only in how they rate a candidate and whether they predict.
//
// Hot-path contract: after construction no call allocates, throws, locks or logs. Costs:
// onWaited O(1); other events O(log n) amortised for n resident buffers (onLaunch O(buffers of the launch x log n),
// plus learning in DeltaPolicy: a learned iteration re-ranks the resident buffers once,
// O(n log n), and so does each iteration the device's times retime, in the onLaunchTimed
// that completes it, otherwise O(1)); chooseVictims O(B + k log n) for k victims, where B <= CandidateIndex::kBuckets
// is the number of non-empty size/cost buckets (a constant, not a scan of the buffers);
// choosePrefetches O(launches scanned ahead, at most kMaxScan). Not thread-safe: the caller
// serialises calls (the shim holds its residency lock).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "policy/buffer_table.h"
#include "policy/candidate_index.h"
#include "policy/cost_model.h"
#include "policy/types.h"

namespace delta::policy {

struct PolicyConfig {
  std::uint32_t max_buffers = 1u << 16;   // ids must be below this
  std::uint32_t max_launches = 1u << 16;  // per iteration, for learning the pattern
  std::uint32_t max_uses = 1u << 20;      // buffer uses per iteration, for learning
  double h2d_gbps = 12.0;                 // first estimate of the host link, until measured
  double d2h_gbps = 12.0;
  // Buffers below this are chosen only when the larger ones do not free enough: evicting many
  // small buffers costs per-buffer overhead (map/unmap, a copy each) for little memory.
  std::uint64_t min_evict_bytes = 64u << 10;
  // The memory budget the caller keeps, when it has one: delta and its variants plan each
  // learned iteration within it (planner.h: the mode, how far ahead to make room). 0: no
  // planning.
  std::uint64_t budget_bytes = 0;
  // The caller runs the planner (off its launch path: the shim's planner thread): a newly
  // learned iteration is copied into a PlanRequest for it instead of planned on the spot, and
  // the plan it hands back is adopted at the next iteration boundary. false: planned in the
  // call that learns the iteration (the simulator).
  bool plan_elsewhere = false;
  // The caller reports when each launch ran on the device (onLaunchTimed), and delta times
  // the iteration it learns by those times: storage for them is reserved at construction.
  bool timed_launches = false;
};

struct Plan;
struct PlanRequest;

class Policy {
 public:
  explicit Policy(const PolicyConfig& config);
  virtual ~Policy() = default;
  Policy& operator=(const Policy&) = delete;

  virtual std::string_view name() const = 0;

  // --- Events. Ids are the caller's, below config.max_buffers; unknown ids are ignored. ---
  virtual void onAlloc(BufferId id, std::uint64_t bytes, std::int64_t now_ns);
  virtual void onFree(BufferId id, std::int64_t now_ns);
  // Call after making the launch's buffers resident, before (or as) it is enqueued.
  virtual void onLaunch(const Launch& launch);
  // Iteration boundary, when the caller knows it (framework marker).
  virtual void onIteration(std::int64_t now_ns);
  // A hook can recompute this buffer at `cost_ns` (its own estimate, scaled by what earlier
  // recomputes measured against their estimates); kUnknownNs: it cannot (any more).
  void onRecomputable(BufferId id, std::int64_t cost_ns);
  // A recompute of `id` that its hook estimated at `estimated_ns` took `measured_ns`: the buffer's
  // cost becomes the measured one, and later estimates are corrected by the same ratio.
  void onRecomputeMeasured(BufferId id, std::int64_t estimated_ns, std::int64_t measured_ns);
  void onPinned(BufferId id, bool pinned);
  // The caller released the buffer as returned by chooseVictims (or by its own decision).
  void onEvicted(BufferId id, Action how);
  void onRestored(BufferId id, std::int64_t now_ns);
  void onCopyMeasured(Direction dir, std::uint64_t bytes, std::int64_t ns);
  // The launch about to be reported through onLaunch (or a recompute forced by a write) waited
  // `waited_ns` for `id` to come back: its restore or recompute ended that much after the
  // launch could otherwise have started, beyond what it already waited for the buffers reported
  // before it. Report only waits > 0, before the onLaunch. This is what an action really cost,
  // which a model of the copy engines and the memory can only estimate; policies that learn
  // from it (delta) weigh their next choices by it. Default: ignored.
  virtual void onWaited(BufferId id, std::int64_t waited_ns);
  // The `launch`-th call of onLaunch (from 0) ran on the device from `device_start_ns` (once
  // what it waited for was there) to `device_end_ns` (any origin, the same for every call).
  // Reported once the device has run it, so usually several launches later, in any order
  // across streams, and not for every launch. The replay has no need of it: its launch times
  // are its device's. `gap_is_waits`: false when work the policy was not told of (launches
  // that touch none of its buffers) may have run on the device since the launch before, so
  // that the time before `device_start_ns` is not all waiting. Default: ignored.
  virtual void onLaunchTimed(std::uint64_t launch, std::int64_t device_start_ns, std::int64_t device_end_ns,
                             bool gap_is_waits = true);
  // Whether onLaunchTimed is of any use to this policy: a caller that must pay to measure the
  // device's times asks first.
  virtual bool wantsLaunchTimes() const { return false; }

  // --- Queries. ---
  // Fills `out` with victims, best first, until their bytes reach `request.bytes` or `out` is
  // full; returns how many. Fewer bytes than asked means nothing else may be evicted. The caller
  // must report each one it evicts through onEvicted before asking again.
  std::size_t chooseVictims(const EvictRequest& request, std::span<Victim> out);
  // Evicted (swapped) buffers to start restoring now, most urgent first.
  virtual std::size_t choosePrefetches(const PrefetchRequest& request, std::span<Prefetch> out);
  // Bytes the next launches will allocate or restore, for freeing room ahead of time (0: no
  // prediction); `need_at_ns` is set to how far ahead they are needed (the launch where the
  // need peaks), for EvictRequest::not_before_ns.
  virtual std::uint64_t upcomingBytes(std::int64_t now_ns, std::int64_t& need_at_ns) const;

  // Iteration boundaries the policy has seen so far, the caller's markers and those it found in
  // the launches itself (0: it does not look for iterations). A caller that numbers buffers
  // can number them the same way each iteration from there (the shim does: a learned pattern
  // is keyed by buffer id).
  virtual std::uint32_t iterationBoundaries() const { return 0; }
  // With a plan: the candidate running now ("" without one) and how many times the policy left
  // one for another after measuring it (delta: DeltaPolicy::checkPlan). For reports, not the
  // launch path: the name is built on each call.
  virtual std::string runningPlan() const { return {}; }
  virtual std::uint32_t planSwitches() const { return 0; }
  // Buffers vetoed now (setVetoed): for reports and tests.
  std::size_t vetoedCount() const { return vetoed_ids_.size(); }
  // Vetoes a planning policy adopts without allocating (setVetoed).
  static constexpr std::size_t kVetoesReserved = 64;

  const BufferTable& buffers() const { return table_; }
  const CostModel& costs() const { return costs_; }

  // --- Planning by the caller (PolicyConfig::plan_elsewhere). ---
  // A request is waiting: take it (once), run it on any thread (PlanRequest::run) and hand the
  // plan back through deliverPlan, serialised with the other calls like them. The request is
  // the policy's and stays untouched by it until the plan is delivered. One load: cheap enough
  // to ask after every event.
  bool wantsPlan() const { return plan_wanted_; }
  virtual const PlanRequest* takePlanRequest() { return nullptr; }
  virtual void deliverPlan(Plan&& plan);

 protected:
  struct Rating {
    double score = 0;  // higher: evicted first
    Action action = Action::kSwap;
    bool eligible = false;
  };
  // Rates one candidate: resident, not pinned, not kept. `request` carries the copy queues as
  // they will be once the victims chosen earlier in the same call are evicted.
  virtual Rating rate(BufferId id, const BufferState& state, const EvictRequest& request) const = 0;
  // The order inside a candidate bucket (higher: considered first). It must not depend on the
  // time of the request, only on the buffer's own events (last use, predicted next use): the
  // index is updated on those events, never by a scan. Default: least recently used first.
  virtual double rankKey(BufferId id, const BufferState& state) const;
  // Called at the start of each chooseVictims, then once per victim chosen (before the next is
  // rated), so a policy can count the work its own choices add (restores it will owe).
  virtual void beginChoice() const {}
  virtual void noteChoice(BufferId id, const BufferState& state, Action action) const;
  // After any change of `id`'s residency (allocated, evicted, restored, freed).
  virtual void residencyChanged(BufferId) {}
  // After onRecomputable changed `id`'s recompute cost (kUnknownNs: no longer recomputable).
  virtual void recomputableChanged(BufferId) {}
  // Re-ranks `id` after an event (or removes it from the candidates when it cannot be one).
  void reindex(BufferId id);
  // Re-ranks every resident buffer: when what rankKey depends on changed for all of them.
  void reindexAll();
  // Buffers a plan keeps resident while anything else can make room (Plan::vetoed): never
  // chosen ahead of need, and when memory is needed only once the others do not free enough.
  // Replaces the set given before. O(ids given now and before); sized at construction when the
  // policy plans (PolicyConfig::budget_bytes), so that adopting a plan of up to kVetoesReserved
  // vetoes (the planner's make eight at most) allocates nothing.
  void setVetoed(std::span<const BufferId> ids);
  // For a policy that can be copied whole (DeltaPolicy): protected, so that no copy slices.
  Policy(const Policy&) = default;

  BufferTable table_;
  CostModel costs_;
  PolicyConfig config_;
  bool plan_wanted_ = false;

 private:
  struct Scored {
    double score;
    BufferId id;
    std::uint32_t bucket;
    Action action;
    bool large;
  };
  static bool lessUrgent(const Scored& a, const Scored& b);
  // Rates the first eligible buffer of `bucket` into heap_; kept buffers (and vetoed ones while
  // honoured) are set aside.
  void pushTop(std::uint32_t bucket, const EvictRequest& request, std::uint32_t stamp);

  CandidateIndex index_;
  std::vector<Scored> heap_;     // one entry per bucket at most; reserved at construction
  std::vector<BufferId> aside_;  // taken out of the index during one call; reserved
  std::vector<std::uint8_t> vetoed_;    // per buffer (setVetoed)
  std::vector<BufferId> vetoed_ids_;    // those set, to clear them; reserved with vetoed_
  bool honour_vetoes_ = false;          // within chooseVictims: vetoed buffers are set aside
  bool vetoed_aside_ = false;           // and one was
};

}  // namespace delta::policy
