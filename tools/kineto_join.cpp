// ET <-> Kineto join: see kineto_join.h.
#include "tools/kineto_join.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "tools/json_document.h"

namespace delta::tools {

namespace {

using nlohmann::json;

constexpr std::size_t kLookahead = 32;       // Kineto ops skipped at most to find the next ET node
constexpr std::size_t kProbe = 200;          // ET nodes tried before giving up on a start
constexpr std::size_t kMaxStarts = 1024;     // candidate starts tried per thread pair (bounds the work)

struct CpuOp {
  std::int64_t begin_ns = 0;
  std::int64_t end_ns = 0;
  std::int64_t tid = 0;
  std::string name;
};

struct GpuWork {
  std::int64_t correlation = 0;
  std::int64_t begin_ns = 0;
  std::int64_t dur_ns = 0;
};

struct Launch {
  std::int64_t tid = 0;
  std::int64_t at_ns = 0;
};

bool microseconds(const json* v, std::int64_t& ns) {
  double us = 0;
  if (v == nullptr || !asNumber(*v, us) || std::fabs(us) > 9.0e15) return false;
  ns = std::llround(us * 1000.0);
  return true;
}

bool category(const json& e, std::initializer_list<std::string_view> cats) {
  const json* c = member(e, "cat");
  if (c == nullptr || !c->is_string()) return false;
  const std::string& s = c->get_ref<const std::string&>();
  for (std::string_view x : cats) {
    if (s == x) return true;
  }
  return false;
}

bool intArg(const json& e, const char* key, std::int64_t& out) {
  const json* args = member(e, "args");
  const json* v = args != nullptr ? member(*args, key) : nullptr;
  return v != nullptr && asInt(*v, out);
}

struct Alignment {
  std::size_t score = 0;
  std::size_t start = 0;                           // Kineto index of the first match
  std::vector<std::pair<std::size_t, std::size_t>> pairs;  // ET sequence index, Kineto index
};

// Greedy in-order alignment of ET names to Kineto names from Kineto position `from`.
Alignment align(const std::vector<const std::string*>& et, const std::vector<const std::string*>& kin,
                std::size_t from, bool keep_pairs) {
  Alignment a;
  a.start = from;
  std::size_t j = from;
  for (std::size_t i = 0; i < et.size() && j < kin.size(); ++i) {
    const std::size_t end = std::min(kin.size(), j + kLookahead);
    for (std::size_t q = j; q < end; ++q) {
      if (*kin[q] == *et[i]) {
        ++a.score;
        if (keep_pairs) a.pairs.emplace_back(i, q);
        j = q + 1;
        break;
      }
    }
    if (i + 1 == kProbe && a.score * 2 < kProbe) break;  // not this start
  }
  return a;
}

}  // namespace

std::string joinKineto(const EtTrace& trace, const std::vector<std::int64_t>& op_of_node, std::size_t ops,
                       const json& kineto, const std::string& name, KinetoJoin& out) {
  out = KinetoJoin{};
  out.op_gpu_ns.assign(ops, 0);
  out.op_kernels.assign(ops, 0);
  out.op_matched.assign(ops, false);
  const std::string hint = "; pass the Kineto trace (torch.profiler's JSON) recorded with this Execution Trace";
  const json* events = member(kineto, "traceEvents");
  if (events == nullptr || !events->is_array()) return name + ": no \"traceEvents\" list" + hint;

  std::vector<CpuOp> cpu;
  std::vector<GpuWork> gpu;
  std::unordered_map<std::int64_t, Launch> launches;  // correlation -> runtime call
  for (const json& e : *events) {
    if (!e.is_object()) continue;
    std::int64_t ts = 0, dur = 0, tid = 0, corr = 0;
    if (category(e, {"cpu_op", "user_annotation"})) {
      const json* n = member(e, "name");
      const json* t = member(e, "tid");
      if (n == nullptr || !n->is_string() || t == nullptr || !asInt(*t, tid)) continue;
      if (!microseconds(member(e, "ts"), ts) || !microseconds(member(e, "dur"), dur) || dur < 0) {
        return name + ": a CPU op with a bad \"ts\" or \"dur\" (" + e.dump().substr(0, 120) + ")" + hint;
      }
      cpu.push_back({ts, ts + dur, tid, n->get<std::string>()});
    } else if (category(e, {"kernel", "gpu_memcpy", "gpu_memset"})) {
      if (!microseconds(member(e, "ts"), ts) || !microseconds(member(e, "dur"), dur) || dur < 0) {
        return name + ": a GPU event with a bad \"ts\" or \"dur\" (" + e.dump().substr(0, 120) + ")" + hint;
      }
      if (!intArg(e, "correlation", corr)) corr = -1;
      gpu.push_back({corr, ts, dur});
    } else if (category(e, {"cuda_runtime", "cuda_driver"})) {
      const json* t = member(e, "tid");
      if (t == nullptr || !asInt(*t, tid) || !intArg(e, "correlation", corr)) continue;
      if (!microseconds(member(e, "ts"), ts)) continue;
      launches[corr] = {tid, ts};
    }
  }
  if (cpu.empty()) return name + ": no CPU ops (cpu_op events)" + hint;
  if (gpu.empty()) return name + ": no GPU kernels; was it recorded with ProfilerActivity.CUDA?" + hint;

  // Kineto threads: their ops in start order, parents before children.
  std::map<std::int64_t, std::vector<std::size_t>> kthreads;
  for (std::size_t i = 0; i < cpu.size(); ++i) kthreads[cpu[i].tid].push_back(i);
  for (auto& [tid, v] : kthreads) {
    std::stable_sort(v.begin(), v.end(), [&](std::size_t a, std::size_t b) {
      if (cpu[a].begin_ns != cpu[b].begin_ns) return cpu[a].begin_ns < cpu[b].begin_ns;
      return cpu[a].end_ns > cpu[b].end_ns;
    });
  }
  // ET threads: their nodes in id order, without the observer's thread and process nodes.
  std::map<std::int64_t, std::vector<std::size_t>> ethreads;
  for (std::size_t i = 0; i < trace.nodes.size(); ++i) {
    if (trace.nodes[i].name.starts_with("[pytorch|profiler|execution_")) continue;
    ethreads[trace.nodes[i].tid].push_back(i);
    ++out.et_nodes;
  }
  std::vector<std::pair<std::int64_t, std::vector<std::size_t>*>> eorder;
  for (auto& [tid, v] : ethreads) eorder.emplace_back(tid, &v);
  std::stable_sort(eorder.begin(), eorder.end(), [](const auto& a, const auto& b) { return a.second->size() > b.second->size(); });

  std::vector<std::int64_t> node_of_cpu(cpu.size(), -1);
  std::vector<std::int64_t> cpu_of_node(trace.nodes.size(), -1);
  std::int64_t main_begin = 0, main_end = 0;
  bool placed_main = false;
  std::vector<std::int64_t> used_ktids;
  for (const auto& [etid, enodes] : eorder) {
    std::vector<const std::string*> et;
    for (std::size_t i : *enodes) et.push_back(&trace.nodes[i].name);
    Alignment best;
    std::int64_t best_ktid = 0;
    std::int64_t best_distance = INT64_MAX;
    for (const auto& [ktid, kops] : kthreads) {
      if (std::find(used_ktids.begin(), used_ktids.end(), ktid) != used_ktids.end()) continue;
      std::vector<const std::string*> kin;
      for (std::size_t i : kops) kin.push_back(&cpu[i].name);
      std::size_t starts = 0;
      for (std::size_t p = 0; p < kin.size() && starts < kMaxStarts; ++p) {
        if (*kin[p] != *et[0]) continue;
        ++starts;
        Alignment a = align(et, kin, p, false);
        // Among equal matches (a profile of identical iterations), threads after the first
        // take the one nearest to it in time: the same iteration.
        const std::int64_t at = cpu[kops[p]].begin_ns;
        const std::int64_t distance =
            !placed_main ? 0 : at < main_begin ? main_begin - at : at > main_end ? at - main_end : 0;
        if (a.score > best.score || (a.score == best.score && a.score > 0 && distance < best_distance)) {
          best = a;
          best_ktid = ktid;
          best_distance = distance;
        }
      }
    }
    if (best.score == 0) continue;
    const std::vector<std::size_t>& kops = kthreads[best_ktid];
    std::vector<const std::string*> kin;
    for (std::size_t i : kops) kin.push_back(&cpu[i].name);
    best = align(et, kin, best.start, true);
    used_ktids.push_back(best_ktid);
    std::int64_t begin = INT64_MAX, end = INT64_MIN;
    for (const auto& [ei, ki] : best.pairs) {
      const std::size_t node = (*enodes)[ei];
      const std::size_t c = kops[ki];
      node_of_cpu[c] = static_cast<std::int64_t>(node);
      cpu_of_node[node] = static_cast<std::int64_t>(c);
      ++out.matched_nodes;
      begin = std::min(begin, cpu[c].begin_ns);
      end = std::max(end, cpu[c].end_ns);
    }
    if (!placed_main) {
      main_begin = begin;
      main_end = end;
      placed_main = true;
    }
  }

  // The iteration's window: from its first joined op to the end of its last.
  std::int64_t win_begin = INT64_MAX, win_end = INT64_MIN;
  for (std::size_t i = 0; i < trace.nodes.size(); ++i) {
    if (op_of_node[i] < 0 || cpu_of_node[i] < 0) continue;
    out.op_matched[static_cast<std::size_t>(op_of_node[i])] = true;
    const CpuOp& c = cpu[static_cast<std::size_t>(cpu_of_node[i])];
    win_begin = std::min(win_begin, c.begin_ns);
    win_end = std::max(win_end, c.end_ns);
  }
  if (win_begin > win_end) {
    return name + ": does not match the Execution Trace (none of the replayed iteration's ops found in it)" + hint;
  }

  // Runtime calls to the innermost joined CPU op around them, per thread, by a sweep.
  std::unordered_map<std::int64_t, std::int64_t> node_of_correlation;
  std::map<std::int64_t, std::vector<std::pair<std::int64_t, std::int64_t>>> calls;  // tid -> (at, corr)
  for (const auto& [corr, l] : launches) calls[l.tid].emplace_back(l.at_ns, corr);
  for (auto& [tid, v] : calls) {
    std::sort(v.begin(), v.end());
    auto kt = kthreads.find(tid);
    if (kt == kthreads.end()) continue;
    const std::vector<std::size_t>& kops = kt->second;
    std::vector<std::size_t> stack;
    std::size_t next = 0;
    for (const auto& [at, corr] : v) {
      while (next < kops.size() && cpu[kops[next]].begin_ns <= at) {
        while (!stack.empty() && cpu[stack.back()].end_ns < cpu[kops[next]].begin_ns) stack.pop_back();
        stack.push_back(kops[next++]);
      }
      while (!stack.empty() && cpu[stack.back()].end_ns < at) stack.pop_back();
      for (std::size_t s = stack.size(); s-- > 0;) {
        if (cpu[stack[s]].end_ns < at) continue;  // a finished sibling below the top
        if (node_of_cpu[stack[s]] >= 0) {
          node_of_correlation[corr] = node_of_cpu[stack[s]];
          break;
        }
      }
    }
  }
  for (const GpuWork& g : gpu) {
    auto l = launches.find(g.correlation);
    const std::int64_t at = l != launches.end() ? l->second.at_ns : g.begin_ns;
    if (at < win_begin || at > win_end) continue;
    ++out.window_kernels;
    out.window_gpu_ns += g.dur_ns;
    auto n = node_of_correlation.find(g.correlation);
    const std::int64_t op = n != node_of_correlation.end() ? op_of_node[static_cast<std::size_t>(n->second)] : -1;
    if (op < 0) {
      ++out.unjoined_kernels;
      continue;
    }
    out.op_gpu_ns[static_cast<std::size_t>(op)] += g.dur_ns;
    ++out.op_kernels[static_cast<std::size_t>(op)];
    out.joined_gpu_ns += g.dur_ns;
  }
  return {};
}

}  // namespace delta::tools
