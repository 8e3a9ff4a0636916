// A synthetic training iteration as it is built (tensors, ops in program order) and written as
// an op log of the DTR prototype (JSON lines; ../shared/traces/README.md): constants declared
// first, then every CALL with its MEMORY and ALIAS lines, MUTATEs and annotations, and each
// tensor RELEASEd right after the last op that names it, so that the log frees everything it
// allocates. `delta-trace synth` builds its workload families on this (synth_workloads.h).
// Offline code.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace delta::tools {

using SynthShape = std::vector<std::int64_t>;
using TensorId = std::uint32_t;
inline constexpr TensorId kNoTensor = UINT32_MAX;

struct SynthTensor {
  std::string name;  // unique in the log: "<label>.<n>"
  SynthShape shape;
  std::uint32_t elem_bytes = 4;
  bool constant = false;           // exists before the iteration (CONSTANT), never released
  TensorId view_of = kNoTensor;    // a view shares this tensor's storage (ALIAS k)

  std::uint64_t numel() const;
  std::uint64_t bytes() const { return numel() * elem_bytes; }
};

class SynthGraph {
 public:
  // One result of a CALL: a new tensor, or a view of argument `alias` (ALIAS k in the log).
  struct Result {
    std::string_view label;
    SynthShape shape;
    std::uint32_t elem_bytes = 4;
    std::int32_t alias = -1;
  };

  TensorId constant(std::string_view label, SynthShape shape, std::uint32_t elem_bytes = 4);
  std::vector<TensorId> call(std::string_view op, const std::vector<TensorId>& args,
                             const std::vector<Result>& results, std::int64_t time_ns);
  TensorId call1(std::string_view op, const std::vector<TensorId>& args, const Result& result,
                 std::int64_t time_ns) {
    return call(op, args, {result}, time_ns)[0];
  }
  // `mutated`: indices into `args` written in place.
  void mutate(std::string_view op, const std::vector<TensorId>& args,
              const std::vector<std::uint32_t>& mutated, std::int64_t time_ns);
  void annotate(std::string_view annotation);  // "BACKWARD" (START is written first)

  const SynthTensor& tensor(TensorId id) const { return tensors_[id]; }
  std::size_t opCount() const { return ops_; }

  // The whole log, one instruction per line.
  std::string write() const;

 private:
  enum class Kind : std::uint8_t { kAnnotate, kCall, kMutate };
  struct Event {
    Kind kind;
    std::string name;  // op name or annotation
    std::vector<TensorId> args;
    std::vector<TensorId> results;
    std::vector<std::int32_t> aliases;  // per result: ALIAS (-1: own storage)
    std::vector<std::uint32_t> mutated;
    std::int64_t time_ns = 0;
  };
  TensorId add(std::string_view label, SynthShape shape, std::uint32_t elem_bytes);

  std::vector<SynthTensor> tensors_;
  std::vector<Event> events_;
  std::size_t ops_ = 0;
};

}  // namespace delta::tools
