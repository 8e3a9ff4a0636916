// DTR op-log importer: see dtr_log_reader.h.
#include "policy/dtr_log_reader.h"

#include <charconv>
#include <unordered_map>

#include "policy/json_line.h"
#include "policy/line_reader.h"

namespace delta::policy {

namespace {

class DtrImporter {
 public:
  explicit DtrImporter(std::string name) { w_.name = std::move(name); }

  // Empty on success; true in `done` once the iteration is complete.
  std::string line(std::string_view text, bool& done);
  std::string finish();
  Workload take() { return std::move(w_); }

 private:
  std::string instruction(const JsonLine& j, bool& done);
  std::string storageOf(const std::string& name, BufferId& out) const;
  void addRef(const std::string& name, BufferId storage);
  void dropRef(BufferId storage);
  WorkloadOp& lastOp();

  Workload w_;
  JsonLine json_;
  std::unordered_map<std::string, BufferId> names_;
  std::vector<std::uint32_t> refs_;
  std::vector<bool> sized_;
  // Results of the last CALL still waiting for their MEMORY / ALIAS lines.
  std::vector<std::string> pending_results_;
  std::vector<std::string> last_args_;
  std::unordered_map<std::string, std::uint64_t> result_bytes_;
  bool started_ = false;
};

const std::string* str(const JsonLine& j, std::string_view key) {
  const JsonValue* v = j.find(key);
  return v != nullptr && v->kind == JsonValue::Kind::kString ? &v->str : nullptr;
}

const std::vector<std::string>* strs(const JsonLine& j, std::string_view key) {
  const JsonValue* v = j.find(key);
  return v != nullptr && v->kind == JsonValue::Kind::kArray && v->nums.empty() ? &v->strs : nullptr;
}

// DTR writes numbers as strings ("TIME":"733881"); accept both.
bool number(const JsonLine& j, std::string_view key, std::int64_t& out) {
  const JsonValue* v = j.find(key);
  if (v == nullptr) return false;
  if (v->kind == JsonValue::Kind::kInt) {
    out = v->num;
    return true;
  }
  if (v->kind != JsonValue::Kind::kString) return false;
  const char* b = v->str.data();
  const char* e = b + v->str.size();
  auto [p, ec] = std::from_chars(b, e, out);
  return ec == std::errc() && p == e;
}

std::string DtrImporter::line(std::string_view text, bool& done) {
  std::size_t first = text.find_first_not_of(" \t\r");
  if (first == std::string_view::npos) return {};  // blank line
  if (std::string err = json_.parse(text); !err.empty()) return "not a JSON object: " + err;
  return instruction(json_, done);
}

std::string DtrImporter::storageOf(const std::string& name, BufferId& out) const {
  auto it = names_.find(name);
  if (it == names_.end()) return "unknown tensor '" + name + "'";
  out = it->second;
  return {};
}

void DtrImporter::addRef(const std::string& name, BufferId storage) {
  auto it = names_.find(name);
  if (it != names_.end()) dropRef(it->second);  // the name is rebound
  names_[name] = storage;
  ++refs_[storage];
}

WorkloadOp& DtrImporter::lastOp() {
  if (w_.ops.empty()) w_.ops.push_back({"(start)", 0, {}, {}, {}, {}});
  return w_.ops.back();
}

void DtrImporter::dropRef(BufferId storage) {
  if (refs_[storage] == 0 || --refs_[storage] > 0) return;
  if (!w_.buffers[storage].persistent) lastOp().frees.push_back(storage);
}

std::string DtrImporter::instruction(const JsonLine& j, bool& done) {
  const std::string* ins = str(j, "INSTRUCTION");
  if (ins == nullptr) return "no \"INSTRUCTION\" string";
  const std::string& in = *ins;
  auto need = [&](const char* key) { return "\"" + in + "\" without a valid \"" + key + "\""; };
  if (in == "ANNOTATE") {
    const std::string* a = str(j, "ANNOTATION");
    if (a == nullptr) return need("ANNOTATION");
    if (*a == "START") {
      if (started_ && !w_.ops.empty()) done = true;  // keep one iteration
      started_ = true;
    }
    return {};
  }
  if (in == "CONSTANT") {
    const std::string* name = str(j, "NAME");
    if (name == nullptr) return need("NAME");
    const auto id = static_cast<BufferId>(w_.buffers.size());
    w_.buffers.push_back({*name, 0, true, -1, kUnknownNs});
    refs_.push_back(0);
    sized_.push_back(false);
    addRef(*name, id);
    return {};
  }
  if (in == "MEMORY") {
    const std::string* name = str(j, "NAME");
    std::int64_t bytes = 0;
    if (name == nullptr) return need("NAME");
    if (!number(j, "MEMORY", bytes) || bytes < 0) return need("MEMORY");
    for (const std::string& r : pending_results_) {
      if (r == *name) {
        result_bytes_[*name] = static_cast<std::uint64_t>(bytes);
        return {};
      }
    }
    BufferId id = 0;
    if (std::string err = storageOf(*name, id); !err.empty()) return err;
    if (!sized_[id]) w_.buffers[id].bytes = static_cast<std::uint64_t>(bytes);
    sized_[id] = true;
    return {};
  }
  if (in == "CALL" || in == "MUTATE") {
    const std::string* name = str(j, "NAME");
    const std::vector<std::string>* args = strs(j, "ARGS");
    std::int64_t time = 0;
    if (name == nullptr) return need("NAME");
    if (args == nullptr) return need("ARGS");
    if (!number(j, "TIME", time) || time < 0) return need("TIME");
    if (!pending_results_.empty()) return "\"" + in + "\" before the ALIAS lines of the previous call";
    WorkloadOp op{*name, time, {}, {}, {}, {}};
    for (const std::string& a : *args) {
      BufferId id = 0;
      if (std::string err = storageOf(a, id); !err.empty()) return err;
      bool dup = false;
      for (BufferId r : op.reads) dup = dup || r == id;
      if (!dup) op.reads.push_back(id);
    }
    if (in == "MUTATE") {
      const JsonValue* m = j.find("MUTATE");
      if (m == nullptr || m->kind != JsonValue::Kind::kArray || !m->strs.empty()) return need("MUTATE");
      for (std::int64_t k : m->nums) {
        if (k < 0 || static_cast<std::size_t>(k) >= args->size()) return "MUTATE index out of range";
        const BufferId id = names_[(*args)[static_cast<std::size_t>(k)]];
        bool dup = false;
        for (BufferId x : op.writes) dup = dup || x == id;
        if (!dup) op.writes.push_back(id);
      }
    } else {
      const std::vector<std::string>* results = strs(j, "RESULT");
      if (results == nullptr) return need("RESULT");
      pending_results_ = *results;
      last_args_ = *args;
    }
    w_.ops.push_back(std::move(op));
    return {};
  }
  if (in == "ALIAS") {
    const std::string* name = str(j, "NAME");
    std::int64_t alias = 0;
    if (name == nullptr) return need("NAME");
    if (!number(j, "ALIAS", alias)) return need("ALIAS");
    std::size_t i = 0;
    while (i < pending_results_.size() && pending_results_[i] != *name) ++i;
    if (i == pending_results_.size()) return "ALIAS for '" + *name + "', not a result of the last call";
    pending_results_.erase(pending_results_.begin() + static_cast<std::ptrdiff_t>(i));
    const auto op_index = static_cast<std::int32_t>(w_.ops.size() - 1);
    if (alias >= 0) {
      if (static_cast<std::size_t>(alias) >= last_args_.size()) return "ALIAS index out of range";
      addRef(*name, names_[last_args_[static_cast<std::size_t>(alias)]]);
      return {};
    }
    auto bytes = result_bytes_.find(*name);
    if (bytes == result_bytes_.end()) return "ALIAS for '" + *name + "' before its MEMORY line";
    const auto id = static_cast<BufferId>(w_.buffers.size());
    w_.buffers.push_back({*name, bytes->second, false, op_index, w_.ops.back().compute_ns});
    refs_.push_back(0);
    sized_.push_back(true);
    result_bytes_.erase(bytes);
    w_.ops.back().allocs.push_back(id);
    addRef(*name, id);
    return {};
  }
  if (in == "COPY" || in == "COPY_FROM") {
    const std::string* dst = str(j, "DST");
    const std::string* src = str(j, "SRC");
    if (dst == nullptr) return need("DST");
    if (src == nullptr) return need("SRC");
    BufferId id = 0;
    if (std::string err = storageOf(*src, id); !err.empty()) return err;
    addRef(*dst, id);  // COPY_FROM: addRef drops DST's old reference first
    return {};
  }
  if (in == "RELEASE") {
    const std::string* name = str(j, "NAME");
    if (name == nullptr) return need("NAME");
    auto it = names_.find(*name);
    if (it == names_.end()) return "RELEASE of unknown tensor '" + *name + "'";
    const BufferId id = it->second;
    names_.erase(it);
    dropRef(id);
    return {};
  }
  return "unknown instruction \"" + in + "\"";
}

std::string DtrImporter::finish() {
  if (!pending_results_.empty()) return "the log ends before the ALIAS line of '" + pending_results_[0] + "'";
  if (w_.ops.empty()) return "no CALL or MUTATE in the log";
  // Whatever is still referenced dies with the iteration.
  std::vector<bool> freed(w_.buffers.size(), false);
  for (const WorkloadOp& op : w_.ops) {
    for (BufferId id : op.frees) freed[id] = true;
  }
  for (BufferId id = 0; id < w_.buffers.size(); ++id) {
    if (!w_.buffers[id].persistent && !freed[id]) w_.ops.back().frees.push_back(id);
  }
  return w_.validate();
}

}  // namespace

ImportResult parseDtrLog(std::string_view text, const std::string& name) {
  ImportResult r;
  DtrImporter imp(name);
  std::size_t lineno = 0;
  bool done = false;
  while (!text.empty() && !done) {
    const std::size_t nl = text.find('\n');
    const std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    ++lineno;
    if (std::string err = imp.line(line, done); !err.empty()) {
      r.error = name + ":" + std::to_string(lineno) + ": " + err;
      return r;
    }
  }
  if (std::string err = imp.finish(); !err.empty()) {
    r.error = name + ": " + err;
    return r;
  }
  r.workload = imp.take();
  return r;
}

ImportResult readDtrLog(const std::string& path) {
  ImportResult r;
  LineReader reader;
  if (std::string err = reader.open(path); !err.empty()) {
    r.error = err;
    return r;
  }
  DtrImporter imp(path);
  std::string line;
  std::size_t lineno = 0;
  bool done = false;
  while (!done && reader.next(line)) {
    ++lineno;
    if (std::string err = imp.line(line, done); !err.empty()) {
      r.error = path + ":" + std::to_string(lineno) + ": " + err;
      return r;
    }
  }
  if (!reader.error().empty()) {
    r.error = reader.error();
    return r;
  }
  if (std::string err = imp.finish(); !err.empty()) {
    r.error = path + ": " + err;
    return r;
  }
  r.workload = imp.take();
  return r;
}

}  // namespace delta::policy
