#include "tools/shim_trace_import.h"

#include <algorithm>
#include <unordered_map>

#include "trace/trace_reader.h"

namespace delta::tools {
namespace {

constexpr std::int64_t kMinComputeNs = 1000;
constexpr std::int64_t kMaxComputeNs = 10'000'000;

struct Event {
  enum Kind : std::uint8_t { kAlloc = 0, kOp = 1, kFree = 2 };  // order at equal times
  std::uint64_t time;
  Kind kind;
  std::uint64_t serial;                // alloc, free
  std::uint64_t bytes;                 // alloc
  std::string name;                    // op
  std::vector<std::uint64_t> buffers;  // op: serials touched
};

}  // namespace

policy::ImportResult importShimTrace(const std::string& path) {
  policy::ImportResult result;
  trace::TraceReader reader;
  if (std::string error = reader.open(path); !error.empty()) {
    result.error = error;
    return result;
  }
  std::vector<Event> events;
  trace::Record record;
  while (reader.next(record)) {
    switch (record.type) {
      case trace::RecordType::kAlloc:
        if (record.alloc.flags & trace::kAllocManaged)
          events.push_back({record.alloc.time_ns, Event::kAlloc, record.alloc.buffer,
                            record.alloc.bytes, {}, {}});
        break;
      case trace::RecordType::kFree:
        events.push_back({record.free.time_ns, Event::kFree, record.free.buffer, 0, {}, {}});
        break;
      case trace::RecordType::kLaunch:
        events.push_back({record.launch.time_ns, Event::kOp, 0, 0, reader.label(record.launch.kernel),
                          {record.launch.buffers.begin(), record.launch.buffers.end()}});
        break;
      case trace::RecordType::kCopy: {
        Event copy{record.copy.time_ns, Event::kOp, 0, 0, "copy", {}};
        for (std::uint64_t serial : {record.copy.dst, record.copy.src})
          if (serial != 0) copy.buffers.push_back(serial);
        events.push_back(std::move(copy));
        break;
      }
      case trace::RecordType::kMemset: {
        Event memset{record.memset.time_ns, Event::kOp, 0, 0, "memset", {}};
        if (record.memset.buffer != 0) memset.buffers.push_back(record.memset.buffer);
        events.push_back(std::move(memset));
        break;
      }
      default:
        break;
    }
  }
  if (reader.status() != trace::ReadStatus::kEnd && reader.status() != trace::ReadStatus::kTruncated) {
    result.error = reader.error();
    return result;
  }
  // Threads' records come in chunks: put them back in time order.
  std::stable_sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    return a.time != b.time ? a.time < b.time : a.kind < b.kind;
  });

  policy::Workload& workload = result.workload;
  workload.name = path;
  std::unordered_map<std::uint64_t, policy::BufferId> ids;
  std::unordered_map<std::uint64_t, bool> freed;
  for (const Event& event : events)
    if (event.kind == Event::kFree) freed[event.serial] = true;
  std::vector<bool> live;
  std::vector<policy::BufferId> pendingAllocs;
  std::vector<std::uint64_t> opTimes;
  for (const Event& event : events) {
    switch (event.kind) {
      case Event::kAlloc: {
        const auto id = static_cast<policy::BufferId>(workload.buffers.size());
        policy::WorkloadBuffer buffer;
        buffer.name = "buffer " + std::to_string(event.serial);
        buffer.bytes = event.bytes;
        buffer.persistent = !freed.count(event.serial);  // never freed: there from the start
        workload.buffers.push_back(buffer);
        ids[event.serial] = id;
        live.push_back(buffer.persistent);
        if (!buffer.persistent) pendingAllocs.push_back(id);
        break;
      }
      case Event::kOp: {
        policy::WorkloadOp op;
        op.name = event.name;
        op.allocs = std::move(pendingAllocs);
        pendingAllocs.clear();
        for (policy::BufferId id : op.allocs) live[id] = true;
        for (std::uint64_t serial : event.buffers) {
          auto it = ids.find(serial);
          if (it != ids.end() && live[it->second] &&
              std::find(op.reads.begin(), op.reads.end(), it->second) == op.reads.end())
            op.reads.push_back(it->second);
        }
        workload.ops.push_back(std::move(op));
        opTimes.push_back(event.time);
        break;
      }
      case Event::kFree: {
        auto it = ids.find(event.serial);
        if (it == ids.end()) break;  // allocated before the trace began, or unmanaged
        const policy::BufferId id = it->second;
        auto pending = std::find(pendingAllocs.begin(), pendingAllocs.end(), id);
        if (pending != pendingAllocs.end()) {
          // Allocated and freed with no work in between: one empty op holds its lifetime.
          pendingAllocs.erase(pending);
          policy::WorkloadOp op;
          op.name = "allocation";
          op.allocs = {id};
          op.frees = {id};
          workload.ops.push_back(std::move(op));
          opTimes.push_back(event.time);
        } else if (live[id] && !workload.ops.empty()) {
          workload.ops.back().frees.push_back(id);
        }
        live[id] = false;
        break;
      }
    }
  }
  if (!pendingAllocs.empty()) {  // allocated after the last work: nothing ever used them
    policy::WorkloadOp op;
    op.name = "allocation";
    op.allocs = pendingAllocs;
    op.frees = pendingAllocs;
    workload.ops.push_back(std::move(op));
    opTimes.push_back(opTimes.empty() ? 0 : opTimes.back());
  }
  for (size_t i = 0; i < workload.ops.size(); ++i) {
    const std::int64_t gap =
        i + 1 < opTimes.size() ? static_cast<std::int64_t>(opTimes[i + 1] - opTimes[i]) : 0;
    workload.ops[i].compute_ns = std::clamp(gap, kMinComputeNs, kMaxComputeNs);
  }
  if (workload.ops.empty()) {
    result.error = path + ": the trace has no launches, copies or memsets to replay";
    return result;
  }
  if (std::string problem = workload.validate(); !problem.empty())
    result.error = path + ": cannot replay this trace: " + problem;
  return result;
}

}  // namespace delta::tools
