// A replayable workload: one training iteration as a sequence of ops, each with the buffers it
// allocates, reads, writes in place and frees, and its measured compute time. Buffers marked
// persistent (weights, inputs) exist before the first iteration and are never freed; the others
// are allocated and freed within the iteration. A buffer with a producer op can be dropped and
// recomputed by re-running that op (its cost), which needs the op's reads. Importers (DTR logs;
// later the shim's traces) produce this; the simulator repeats it. Offline code: allocates freely.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "policy/types.h"
#include "policy/use_schedule.h"

namespace delta::policy {

struct WorkloadBuffer {
  std::string name;
  std::uint64_t bytes = 0;
  bool persistent = false;
  std::int32_t producer = -1;              // op index; -1: none
  std::int64_t recompute_ns = kUnknownNs;  // kUnknownNs: not recomputable
  // Whether scaled() grows it with the batch (persistent buffers never grow). Importers that
  // know shapes clear it for what the batch does not size (gradients, optimizer state).
  bool scales_with_batch = true;
  // What a swap moves over the link, when it is less than the memory the buffer takes (the shim
  // maps whole granules and copies the buffer's own bytes); 0: `bytes`.
  std::uint64_t copy_bytes = 0;
};

struct WorkloadOp {
  std::string name;
  std::int64_t compute_ns = 0;
  std::vector<BufferId> allocs;  // created just before the op (its results)
  std::vector<BufferId> reads;
  std::vector<BufferId> writes;  // written in place (existing buffers)
  std::vector<BufferId> frees;   // freed just after the op
  bool scales_with_batch = true;  // whether scaled() grows its time (and its recompute cost)
  // Still allocated but recomputable no more after the op: the program gave up their recipes
  // (delta-play unregisters a result it frees while others' recomputes still keep it). One
  // dropped by then is regenerated first, while its inputs are as they were.
  std::vector<BufferId> unregisters{};

  // The buffers the op touches (allocs, reads, writes), each once, as the shim names a launch's
  // buffers: an op that reads and writes a buffer (an optimiser's update) uses it once.
  std::vector<BufferId> workingSet() const;
};

struct Workload {
  std::string name;
  std::vector<WorkloadBuffer> buffers;
  std::vector<WorkloadOp> ops;

  std::int64_t computeNs() const;
  // What a copy of buffer `id` moves: its copy_bytes where set and smaller, else its bytes.
  std::uint64_t copyBytes(BufferId id) const {
    const WorkloadBuffer& b = buffers[id];
    return b.copy_bytes > 0 && b.copy_bytes < b.bytes ? b.copy_bytes : b.bytes;
  }
  // Peak bytes with unlimited memory: persistent buffers plus the most live at any op.
  std::uint64_t peakBytes() const;
  // Empty when consistent; else the first problem (use before alloc, double free, ...).
  std::string validate() const;
  // Activation sizes and compute times (and recompute costs) multiplied by `factor`: a batch
  // `factor` times larger, assuming time grows linearly with the batch. Buffers and ops whose
  // scales_with_batch is false keep their size and time.
  Workload scaled(double factor) const;
  // The iteration as a schedule of launches (one per op): the future, for Belady.
  UseSchedule schedule() const;
};

}  // namespace delta::policy
