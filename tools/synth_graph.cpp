// Synthetic iteration and its DTR op log: see synth_graph.h.
#include "tools/synth_graph.h"

#include <fmt/core.h>

#include <cassert>

namespace delta::tools {

std::uint64_t SynthTensor::numel() const {
  std::uint64_t n = 1;
  for (std::int64_t d : shape) n *= static_cast<std::uint64_t>(d);
  return n;
}

TensorId SynthGraph::add(std::string_view label, SynthShape shape, std::uint32_t elem_bytes) {
  const auto id = static_cast<TensorId>(tensors_.size());
  SynthTensor t;
  t.name = fmt::format("{}.{}", label, id);
  t.shape = std::move(shape);
  t.elem_bytes = elem_bytes;
  tensors_.push_back(std::move(t));
  return id;
}

TensorId SynthGraph::constant(std::string_view label, SynthShape shape, std::uint32_t elem_bytes) {
  const TensorId id = add(label, std::move(shape), elem_bytes);
  tensors_[id].constant = true;
  return id;
}

std::vector<TensorId> SynthGraph::call(std::string_view op, const std::vector<TensorId>& args,
                                       const std::vector<Result>& results, std::int64_t time_ns) {
  Event e{Kind::kCall, std::string(op), args, {}, {}, {}, time_ns};
  for (const Result& r : results) {
    const TensorId id = add(r.label, r.shape, r.elem_bytes);
    if (r.alias >= 0) {
      assert(static_cast<std::size_t>(r.alias) < args.size());
      TensorId base = args[static_cast<std::size_t>(r.alias)];
      while (tensors_[base].view_of != kNoTensor) base = tensors_[base].view_of;
      tensors_[id].view_of = base;
    }
    e.results.push_back(id);
    e.aliases.push_back(r.alias);
  }
  std::vector<TensorId> out = e.results;
  events_.push_back(std::move(e));
  ++ops_;
  return out;
}

void SynthGraph::mutate(std::string_view op, const std::vector<TensorId>& args,
                        const std::vector<std::uint32_t>& mutated, std::int64_t time_ns) {
  events_.push_back({Kind::kMutate, std::string(op), args, {}, {}, mutated, time_ns});
  ++ops_;
}

void SynthGraph::annotate(std::string_view annotation) {
  events_.push_back({Kind::kAnnotate, std::string(annotation), {}, {}, {}, {}, 0});
}

namespace {

void appendNames(std::string& out, const SynthGraph& g, const std::vector<TensorId>& ids) {
  out += '[';
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) out += ',';
    out += '"';
    out += g.tensor(ids[i]).name;
    out += '"';
  }
  out += ']';
}

}  // namespace

std::string SynthGraph::write() const {
  // Each tensor dies after the last event that names it (its creation if nothing reads it).
  constexpr std::size_t kNever = SIZE_MAX;
  std::vector<std::size_t> last(tensors_.size(), kNever);
  for (std::size_t i = 0; i < events_.size(); ++i) {
    for (TensorId id : events_[i].args) last[id] = i;
    for (TensorId id : events_[i].results) last[id] = i;
  }
  std::vector<std::vector<TensorId>> releases(events_.size());
  for (TensorId id = 0; id < tensors_.size(); ++id) {
    if (!tensors_[id].constant && last[id] != kNever) releases[last[id]].push_back(id);
  }

  std::string out;
  out.reserve(events_.size() * 160);
  auto line = [&out](auto&&... parts) {
    (out += ... += parts);
    out += '\n';
  };
  line(R"({"ANNOTATION":"START","INSTRUCTION":"ANNOTATE"})");
  for (const SynthTensor& t : tensors_) {
    if (!t.constant) continue;
    line(R"({"INSTRUCTION":"CONSTANT","NAME":")", t.name, R"("})");
    line(R"({"INSTRUCTION":"MEMORY","MEMORY":")", std::to_string(t.bytes()), R"(","NAME":")", t.name, R"("})");
  }
  for (std::size_t i = 0; i < events_.size(); ++i) {
    const Event& e = events_[i];
    switch (e.kind) {
      case Kind::kAnnotate:
        line(R"({"ANNOTATION":")", e.name, R"(","INSTRUCTION":"ANNOTATE"})");
        break;
      case Kind::kCall: {
        out += R"({"ARGS":)";
        appendNames(out, *this, e.args);
        out += R"(,"INSTRUCTION":"CALL","NAME":")" + e.name + R"(","RESULT":)";
        appendNames(out, *this, e.results);
        line(R"(,"TIME":")", std::to_string(e.time_ns), R"("})");
        for (std::size_t k = 0; k < e.results.size(); ++k) {
          const SynthTensor& t = tensors_[e.results[k]];
          line(R"({"INSTRUCTION":"MEMORY","MEMORY":")", std::to_string(t.bytes()), R"(","NAME":")", t.name, R"("})");
          line(R"({"ALIAS":")", std::to_string(e.aliases[k]), R"(","INSTRUCTION":"ALIAS","NAME":")", t.name, R"("})");
        }
        break;
      }
      case Kind::kMutate: {
        out += R"({"ARGS":)";
        appendNames(out, *this, e.args);
        out += R"(,"INSTRUCTION":"MUTATE","MUTATE":[)";
        for (std::size_t k = 0; k < e.mutated.size(); ++k) {
          if (k > 0) out += ',';
          out += std::to_string(e.mutated[k]);
        }
        line(R"(],"NAME":")", e.name, R"(","TIME":")", std::to_string(e.time_ns), R"("})");
        break;
      }
    }
    for (TensorId id : releases[i]) line(R"({"INSTRUCTION":"RELEASE","NAME":")", tensors_[id].name, R"("})");
  }
  return out;
}

}  // namespace delta::tools
