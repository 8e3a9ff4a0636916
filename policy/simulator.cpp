// Replay engine: see simulator.h.
#include "policy/simulator.h"

#include <algorithm>

#include "policy/planner.h"

namespace delta::policy {

namespace {
constexpr std::size_t kMaxVictims = 256;
constexpr std::size_t kMaxPrefetches = 32;
const std::vector<BufferId> kNoInputs;
}  // namespace

PolicyConfig policyConfigFor(const Workload& workload, const SimOptions& options) {
  std::size_t uses = 0;
  for (const WorkloadOp& op : workload.ops) uses += op.allocs.size() + op.reads.size() + op.writes.size();
  PolicyConfig config;
  config.max_buffers = static_cast<std::uint32_t>(workload.buffers.size());
  config.max_launches = static_cast<std::uint32_t>(workload.ops.size()) * 2;
  config.max_uses = static_cast<std::uint32_t>(uses) * 2;
  config.h2d_gbps = options.h2d_gbps;
  config.d2h_gbps = options.d2h_gbps;
  config.budget_bytes = options.plan ? options.budget_bytes : 0;  // 0: the policy never plans
  config.plan_elsewhere = options.plan_elsewhere;
  // As the shim does (shim.cpp): delta learns the iteration's times from when each launch ran
  // (onLaunchTimed, from step), through the same code. Host-timed here and device-timed there,
  // the replay predicted a policy the shim did not run (docs/policy.md, *One clock*).
  config.timed_launches = true;
  return config;
}

Simulator::Simulator(const Workload& workload, const SimOptions& options)
    : workload_(workload), options_(options) {
  options_.iterations = std::max<std::uint32_t>(options_.iterations, 1);
  options_.warmup = std::min(options_.warmup, options_.iterations - 1);
  working_sets_.resize(workload.ops.size());
  dependents_.resize(workload.buffers.size());
  for (std::size_t i = 0; i < workload.ops.size(); ++i) working_sets_[i] = workload.ops[i].workingSet();
  for (BufferId b = 0; b < workload.buffers.size(); ++b) {
    for (BufferId in : inputsOf(b)) dependents_[in].push_back(b);
  }
  victims_.resize(kMaxVictims);
  prefetches_.resize(kMaxPrefetches);
}

const std::vector<BufferId>& Simulator::inputsOf(BufferId id) const {
  const std::int32_t p = workload_.buffers[id].producer;
  return p < 0 ? kNoInputs : workload_.ops[static_cast<std::size_t>(p)].reads;
}

std::int64_t Simulator::transferNs(Direction dir, std::uint64_t bytes) const {
  const double gbps = dir == Direction::kHostToDevice ? options_.h2d_gbps : options_.d2h_gbps;
  return static_cast<std::int64_t>(static_cast<double>(bytes) / gbps);
}

void Simulator::reset() {
  bufs_.assign(workload_.buffers.size(), Buf{});
  for (BufferId i = 0; i < bufs_.size(); ++i) {
    bufs_[i].bytes = workload_.buffers[i].bytes;
    bufs_[i].copy_bytes = workload_.copyBytes(i);
  }
  pending_out_.clear();
  keep_.clear();
  std::fill(waited_by_buffer_.begin(), waited_by_buffer_.end(), 0);
  used_ = 0;
  pending_out_bytes_ = 0;
  t_compute_ = t_h2d_ = t_d2h_ = 0;
  launches_told_ = 0;
  times_wanted_ = policy_ != nullptr && policy_->wantsLaunchTimes();
  r_ = SimResult{};
  r_.budget_bytes = options_.budget_bytes;
  next_iteration_ = 0;
  at_measured_ = SimResult{};
  t_measured_ = t_last_ = 0;
}

SimResult Simulator::run(Policy& policy) {
  start(policy);
  return resume(policy);
}

void Simulator::runFirst(Policy& policy, std::uint32_t iterations) {
  start(policy);
  runIterations(policy, std::min(iterations, options_.iterations));
  policy_ = nullptr;
}

void Simulator::start(Policy& policy) {
  policy_ = &policy;
  reset();
  for (BufferId b = 0; b < workload_.buffers.size(); ++b) {
    if (workload_.buffers[b].persistent) allocate(b, t_compute_, workload_.ops.size());
  }
}

void Simulator::runIterations(Policy& policy, std::uint32_t until) {
  policy_ = &policy;
  if (options_.give_up_after_ns > 0 && t_compute_ > options_.give_up_after_ns) r_.gave_up = true;
  for (; next_iteration_ < until && !r_.gave_up; ++next_iteration_) {
    const std::uint32_t it = next_iteration_;
    if (it == options_.warmup) {
      at_measured_ = r_;
      t_measured_ = t_compute_;
    }
    if (it + 1 == options_.iterations) t_last_ = t_compute_;
    if (options_.iteration_markers) policy.onIteration(t_compute_);
    servePlan();
    for (std::size_t i = 0; i < workload_.ops.size() && !r_.gave_up; ++i) {
      step(i);
      r_.gave_up = options_.give_up_after_ns > 0 && t_compute_ > options_.give_up_after_ns;
    }
    if (r_.gave_up) break;
    for (BufferId b = 0; b < bufs_.size(); ++b) {
      if (bufs_[b].live && !workload_.buffers[b].persistent) programFree(b, t_compute_);
    }
  }
}

SimResult Simulator::resume(Policy& policy) {
  runIterations(policy, options_.iterations);
  const std::uint32_t measured = options_.iterations - options_.warmup;
  SimResult r = r_;
  r.total_ns = t_compute_ - t_measured_;
  r.run_ns = t_compute_;
  r.last_iteration_ns = r.gave_up ? 0 : t_compute_ - t_last_;
  r.compute_ns = workload_.computeNs() * measured;
  r.recompute_ns -= at_measured_.recompute_ns;
  r.h2d_bytes -= at_measured_.h2d_bytes;
  r.d2h_bytes -= at_measured_.d2h_bytes;
  r.swaps -= at_measured_.swaps;
  r.drops -= at_measured_.drops;
  r.prefetches -= at_measured_.prefetches;
  r.stall_ns = r.total_ns - r.compute_ns - r.recompute_ns;
  r.overhead_pct = r.compute_ns > 0 ? 100.0 * static_cast<double>(r.total_ns - r.compute_ns) /
                                          static_cast<double>(r.compute_ns)
                                    : 0.0;
  policy_ = nullptr;
  return r;
}

void Simulator::servePlan() {
  if (!policy_->wantsPlan()) return;
  if (const PlanRequest* request = policy_->takePlanRequest()) policy_->deliverPlan(request->run());
}

void Simulator::addUsed(std::uint64_t bytes) {
  used_ += bytes;
  r_.peak_bytes = std::max(r_.peak_bytes, used_);
}

void Simulator::retire(std::int64_t now) {
  while (!pending_out_.empty() && pending_out_.front().ready_ns <= now) {
    const PendingOut p = pending_out_.front();
    pending_out_.pop_front();
    if (!underWay(p)) continue;
    Buf& b = bufs_[p.id];
    b.state = State::kSwapped;
    used_ -= b.bytes;
    pending_out_bytes_ -= b.bytes;
  }
}

bool Simulator::underWay(const PendingOut& out) const {
  const Buf& b = bufs_[out.id];
  return b.state == State::kSwappingOut && b.out_seq == out.seq;
}

void Simulator::step(std::size_t op_index) {
  const WorkloadOp& op = workload_.ops[op_index];
  const std::vector<BufferId>& ws = working_sets_[op_index];
  std::int64_t now = t_compute_;
  retire(now);
  keep_.assign(ws.begin(), ws.end());
  waited_until_ = now;
  for (BufferId w : op.writes) invalidateDependents(w, now);
  now = std::max(now, t_compute_);
  std::int64_t ready = now;
  // Each buffer's wait beyond the waits already reported goes to the policy: what its action
  // cost (waits for memory went to the copies out that were freeing it, in ensureRoom).
  auto wait_for = [&](BufferId b) {
    const std::int64_t t = makeResident(b, now);
    reportWait(b, t);
    ready = std::max(ready, t);
  };
  for (BufferId b : op.reads) wait_for(b);
  for (BufferId b : op.writes) wait_for(b);
  for (BufferId b : op.allocs) {
    const std::int64_t t = ensureRoom(bufs_[b].bytes, now);
    allocate(b, t, op_index);
    ready = std::max(ready, t);
  }
  const std::int64_t start = std::max({ready, t_compute_, now});
  retire(start);
  for (BufferId b : ws) {
    Buf& s = bufs_[b];
    if (s.state == State::kSwappingIn && s.ready_ns <= start) s.state = State::kResident;
    if (s.state != State::kResident) ++r_.used_while_evicted;
  }
  if (used_ > options_.budget_bytes) ++r_.over_budget_ops;
  const std::int64_t end = start + op.compute_ns;
  policy_->onLaunch({start, 0, ws});
  // The device is in step with the host here: the launch's times are known at once (the shim
  // reads them from events once the device has run it).
  if (times_wanted_) policy_->onLaunchTimed(launches_told_, start, end);
  ++launches_told_;
  servePlan();
  t_compute_ = end;
  for (BufferId b : ws) bufs_[b].last_use_end = end;
  for (BufferId w : op.writes) {
    bufs_[w].recomputable = false;
    policy_->onRecomputable(w, kUnknownNs);
  }
  waited_until_ = end;
  for (BufferId b : op.unregisters) unregister(b, end);
  for (BufferId b : op.frees) programFree(b, end);

  // While the op runs: free room ahead of what the next launches allocate or restore (without
  // evicting anything needed within that window), then prefetch into free memory.
  std::int64_t horizon = 0;
  const std::uint64_t need = policy_->upcomingBytes(start, horizon);
  const std::uint64_t room = options_.budget_bytes > used_ ? options_.budget_bytes - used_ : 0;
  if (need > room + pending_out_bytes_) {
    EvictRequest req{need - room - pending_out_bytes_, start, false, horizon, t_d2h_, t_h2d_, keep_};
    const std::size_t n = policy_->chooseVictims(req, victims_);
    for (std::size_t i = 0; i < n; ++i) evict(victims_[i], start);
  }
  const std::uint64_t free_bytes = !options_.prefetch_sees_free_memory ? kUnknownBytes
                                   : options_.budget_bytes > used_    ? options_.budget_bytes - used_
                                                                      : 0;
  const std::size_t n = policy_->choosePrefetches({start, t_h2d_, free_bytes}, prefetches_);
  for (std::size_t i = 0; i < n; ++i) {
    if (!tryPrefetch(prefetches_[i], start)) break;
  }
}

void Simulator::allocate(BufferId id, std::int64_t now, std::size_t op_index) {
  Buf& b = bufs_[id];
  const WorkloadBuffer& wb = workload_.buffers[id];
  if (b.state != State::kAbsent) releaseStorage(id, now);  // defensive: validate() forbids it
  b.state = State::kResident;
  b.live = true;
  b.holders = 0;
  b.last_use_end = now;
  addUsed(b.bytes);
  policy_->onAlloc(id, b.bytes, now);
  b.recomputable = wb.producer >= 0 && static_cast<std::size_t>(wb.producer) == op_index &&
                   wb.recompute_ns != kUnknownNs;
  if (b.recomputable) policy_->onRecomputable(id, wb.recompute_ns);
}

std::int64_t Simulator::ensureRoom(std::uint64_t bytes, std::int64_t now) {
  std::int64_t t = now;
  for (;;) {
    retire(t);
    if (used_ + bytes <= options_.budget_bytes) return t;
    const std::uint64_t over = used_ + bytes - options_.budget_bytes;
    if (over > pending_out_bytes_) {
      EvictRequest req{over - pending_out_bytes_, t, true, 0, t_d2h_, t_h2d_, keep_};
      const std::size_t n = policy_->chooseVictims(req, victims_);
      for (std::size_t i = 0; i < n; ++i) evict(victims_[i], t);
      if (n > 0) continue;
    }
    // A copy out cancelled (its buffer used, or freed) still holds the link until its end but
    // frees nothing: the memory waits for the first one still under way. Waited for and
    // blamed, a cancelled one billed its buffer's next action with the stall of the copies
    // behind it (the Transformer at 30 %, as played at 12 GB/s without planning: recomputes
    // measured at 3.9 times their cost, from the fifth iteration on).
    while (!pending_out_.empty() && !underWay(pending_out_.front())) pending_out_.pop_front();
    if (pending_out_.empty()) return t;  // nothing left to free: the op runs over budget
    t = std::max(t, pending_out_.front().ready_ns);
    reportWait(pending_out_.front().id, t);  // the memory waited for this copy out
  }
}

void Simulator::reportWait(BufferId id, std::int64_t until) {
  if (until <= waited_until_) return;
  policy_->onWaited(id, until - waited_until_);
  if (id < waited_by_buffer_.size() && next_iteration_ >= options_.warmup) {
    waited_by_buffer_[id] += until - waited_until_;
  }
  waited_until_ = until;
}

void Simulator::evict(const Victim& victim, std::int64_t now) {
  Buf& b = bufs_[victim.id];
  if (b.state == State::kSwappingIn) {
    // Still arriving: cancel the restore; the host copy stays valid.
    b.state = State::kSwapped;
    used_ -= b.bytes;
    policy_->onEvicted(victim.id, Action::kSwap);
    return;
  }
  if (b.state != State::kResident) {
    policy_->onEvicted(victim.id, Action::kSwap);  // out of step: resynchronise the policy
    return;
  }
  if (victim.action == Action::kRecompute && b.recomputable) {
    b.state = State::kDropped;
    used_ -= b.bytes;
    ++r_.drops;
    for (BufferId in : inputsOf(victim.id)) ++bufs_[in].holders;
    policy_->onEvicted(victim.id, Action::kRecompute);
    return;
  }
  const std::int64_t start = std::max({now, t_d2h_, b.last_use_end});
  const std::int64_t end = start + transferNs(Direction::kDeviceToHost, b.copy_bytes);
  t_d2h_ = end;
  b.state = State::kSwappingOut;
  b.ready_ns = end;
  pending_out_.push_back({victim.id, ++b.out_seq, end});
  pending_out_bytes_ += b.bytes;
  r_.d2h_bytes += b.copy_bytes;
  ++r_.swaps;
  policy_->onEvicted(victim.id, Action::kSwap);
  policy_->onCopyMeasured(Direction::kDeviceToHost, b.copy_bytes, end - start);
}

std::int64_t Simulator::startRestore(BufferId id, std::int64_t now) {
  Buf& b = bufs_[id];
  const std::int64_t start = std::max(now, t_h2d_);
  const std::int64_t end = start + transferNs(Direction::kHostToDevice, b.copy_bytes);
  t_h2d_ = end;
  b.state = State::kSwappingIn;
  b.ready_ns = end;
  addUsed(b.bytes);
  r_.h2d_bytes += b.copy_bytes;
  policy_->onRestored(id, now);
  policy_->onCopyMeasured(Direction::kHostToDevice, b.copy_bytes, end - start);
  return end;
}

std::int64_t Simulator::makeResident(BufferId id, std::int64_t now) {
  Buf& b = bufs_[id];
  switch (b.state) {
    case State::kResident:
      return now;
    case State::kSwappingIn:
      return b.ready_ns;
    case State::kSwappingOut:
      // Still on the device: cancel (the copy's time and bytes are spent).
      b.state = State::kResident;
      ++b.out_seq;
      pending_out_bytes_ -= b.bytes;
      policy_->onRestored(id, now);
      return now;
    case State::kSwapped:
      return startRestore(id, ensureRoom(b.bytes, now));
    case State::kDropped:
      return recompute(id, now);
    case State::kAbsent:
      break;
  }
  return now;  // validate() rules this out
}

std::int64_t Simulator::recompute(BufferId id, std::int64_t now) {
  Buf& b = bufs_[id];
  const std::vector<BufferId>& inputs = inputsOf(id);
  const std::size_t mark = keep_.size();
  keep_.push_back(id);
  keep_.insert(keep_.end(), inputs.begin(), inputs.end());
  std::int64_t ready = now;
  for (BufferId in : inputs) {
    // An input's restore (or its own recompute) is that input's cost, not this buffer's.
    const std::int64_t t = makeResident(in, now);
    reportWait(in, t);
    ready = std::max(ready, t);
  }
  const std::int64_t room = ensureRoom(b.bytes, now);
  const std::int64_t start = std::max({ready, room, t_compute_});
  const std::int64_t cost = workload_.buffers[id].recompute_ns;
  t_compute_ = start + cost;
  r_.recompute_ns += cost;
  b.state = State::kResident;
  b.last_use_end = t_compute_;
  addUsed(b.bytes);
  for (BufferId in : inputs) {
    Buf& s = bufs_[in];
    if (s.state == State::kSwappingIn && s.ready_ns <= start) s.state = State::kResident;
    if (s.state != State::kResident) ++r_.used_while_evicted;
    s.last_use_end = std::max(s.last_use_end, t_compute_);
  }
  policy_->onRestored(id, start);
  keep_.resize(mark);
  for (BufferId in : inputs) unhold(in, t_compute_);
  return t_compute_;
}

bool Simulator::tryPrefetch(const Prefetch& prefetch, std::int64_t now) {
  Buf& b = bufs_[prefetch.id];
  if (b.state != State::kSwapped) return true;  // nothing to do for this one
  retire(now);
  // Prefetches use free memory only; room is made ahead by upcomingBytes. Evicting for a
  // prefetch here would trade one restore for another and thrash the link.
  if (used_ + b.bytes > options_.budget_bytes) return false;
  startRestore(prefetch.id, now);
  ++r_.prefetches;
  return true;
}

void Simulator::programFree(BufferId id, std::int64_t now) {
  Buf& b = bufs_[id];
  b.live = false;
  if (b.holders > 0) return;  // a dropped dependent still needs it: kept until then
  // Nothing dropped needs it now, and once gone nothing can be recomputed from it.
  for (BufferId d : dependents_[id]) {
    if (bufs_[d].recomputable) {
      bufs_[d].recomputable = false;
      policy_->onRecomputable(d, kUnknownNs);
    }
  }
  releaseStorage(id, now);
}

void Simulator::unregister(BufferId id, std::int64_t now) {
  Buf& b = bufs_[id];
  // Regenerated on the compute stream before the next op, as the shim's delta_unregister does;
  // what it waited for is told as an op's waits are.
  if (b.state == State::kDropped) reportWait(id, recompute(id, now));
  if (b.recomputable) {
    b.recomputable = false;
    policy_->onRecomputable(id, kUnknownNs);
  }
}

void Simulator::releaseStorage(BufferId id, std::int64_t now) {
  Buf& b = bufs_[id];
  switch (b.state) {
    case State::kResident:
    case State::kSwappingIn:
      used_ -= b.bytes;
      break;
    case State::kSwappingOut:
      used_ -= b.bytes;
      pending_out_bytes_ -= b.bytes;
      ++b.out_seq;
      break;
    case State::kDropped:
      b.state = State::kAbsent;
      for (BufferId in : inputsOf(id)) unhold(in, now);
      break;
    case State::kSwapped:
    case State::kAbsent:
      break;
  }
  b.state = State::kAbsent;
  b.live = false;
  policy_->onFree(id, now);
}

void Simulator::unhold(BufferId id, std::int64_t now) {
  Buf& b = bufs_[id];
  if (b.holders > 0 && --b.holders == 0 && !b.live && b.state != State::kAbsent) {
    releaseStorage(id, now);
  }
}

void Simulator::invalidateDependents(BufferId id, std::int64_t now) {
  for (BufferId d : dependents_[id]) {
    Buf& s = bufs_[d];
    if (s.state == State::kDropped) reportWait(d, recompute(d, now));
    if (s.recomputable) {
      s.recomputable = false;
      policy_->onRecomputable(d, kUnknownNs);
    }
  }
}

}  // namespace delta::policy
