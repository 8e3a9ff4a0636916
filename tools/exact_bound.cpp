// The exact lower bound: see exact_bound.h.
#include "tools/exact_bound.h"

#include <algorithm>
#include <cmath>
#include <vector>

#if DELTA_HAVE_CBC
#include <coin/Cbc_C_Interface.h>
#endif

namespace delta::tools {

bool haveExactSolver() { return DELTA_HAVE_CBC != 0; }

#if DELTA_HAVE_CBC
namespace {

using policy::BufferId;
using policy::Workload;

// Times in the program are microseconds (ns values near 1e9 would strain the solver's
// tolerances); the result goes back to ns.
constexpr double kUs = 1e-3;
constexpr int kNone = -1;

class Model {
 public:
  Model() : m_(Cbc_newModel()) { Cbc_setLogLevel(m_, 0); }
  ~Model() { Cbc_deleteModel(m_); }
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  int binary(double obj = 0) { return col(0, 1, obj, 1); }
  int fixed(double value) { return col(value, value, 0, 1); }
  int continuous(double obj = 0) { return col(0, 1e18, obj, 0); }
  // sum(coef x) sense rhs, sense 'L', 'G' or 'E'.
  void row(const std::vector<std::pair<int, double>>& terms, char sense, double rhs) {
    cols_.clear();
    coefs_.clear();
    for (auto [c, v] : terms) {
      if (c == kNone || v == 0) continue;
      cols_.push_back(c);
      coefs_.push_back(v);
    }
    Cbc_addRow(m_, "", static_cast<int>(cols_.size()), cols_.data(), coefs_.data(), sense, rhs);
  }
  Cbc_Model* get() { return m_; }

 private:
  int col(double lb, double ub, double obj, char integer) {
    Cbc_addCol(m_, "", lb, ub, obj, integer, 0, nullptr, nullptr);
    return n_++;
  }
  Cbc_Model* m_;
  int n_ = 0;
  std::vector<int> cols_;
  std::vector<double> coefs_;
};

}  // namespace

ExactBound exactBound(const Workload& w, std::uint64_t budget_bytes, double h2d_gbps, double d2h_gbps,
                      double max_seconds) {
  ExactBound out;
  const int n = static_cast<int>(w.ops.size());
  const int nb = static_cast<int>(w.buffers.size());
  if (n == 0) {
    out.solved = out.feasible = true;
    return out;
  }
  // Live range [first, last] of each buffer, its uses, and until when a drop is possible.
  std::vector<int> first(nb, kNone), last(nb, n - 1), drop_until(nb, kNone);
  std::vector<std::vector<char>> used(nb, std::vector<char>(n, 0));
  for (int b = 0; b < nb; ++b) {
    if (w.buffers[b].persistent) first[b] = 0;
  }
  for (int i = 0; i < n; ++i) {
    const policy::WorkloadOp& op = w.ops[i];
    for (BufferId b : op.allocs) first[b] = i;
    for (const auto* list : {&op.allocs, &op.reads, &op.writes}) {
      for (BufferId b : *list) used[b][i] = 1;
    }
    for (BufferId b : op.frees) last[b] = i;
  }
  for (int b = 0; b < nb; ++b) {
    const policy::WorkloadBuffer& wb = w.buffers[b];
    if (wb.persistent || wb.producer < 0 || wb.recompute_ns == policy::kUnknownNs) continue;
    drop_until[b] = last[b];
    for (int i = wb.producer + 1; i <= last[b]; ++i) {  // an in-place write ends recomputability
      if (std::find(w.ops[i].writes.begin(), w.ops[i].writes.end(), static_cast<BufferId>(b)) != w.ops[i].writes.end()) {
        drop_until[b] = i - 1;
        break;
      }
    }
  }

  Model m;
  // State variables per live (buffer, op): resident, swapped, dropped.
  std::vector<std::vector<int>> R(nb, std::vector<int>(n, kNone)), S = R, D = R;
  for (int b = 0; b < nb; ++b) {
    if (first[b] == kNone) continue;
    for (int i = first[b]; i <= last[b]; ++i) {
      if (used[b][i]) {
        R[b][i] = m.fixed(1);
        continue;
      }
      R[b][i] = m.binary();
      S[b][i] = m.binary();
      if (i <= drop_until[b] && i > w.buffers[b].producer) D[b][i] = m.binary();
      m.row({{R[b][i], 1}, {S[b][i], 1}, {D[b][i], 1}}, 'E', 1);
    }
  }
  // Memory at the start of every op.
  for (int i = 0; i < n; ++i) {
    std::vector<std::pair<int, double>> terms;
    double fixed_bytes = 0;
    for (int b = 0; b < nb; ++b) {
      if (R[b][i] == kNone) continue;
      if (used[b][i]) {
        fixed_bytes += static_cast<double>(w.buffers[b].bytes);
      } else {
        terms.push_back({R[b][i], static_cast<double>(w.buffers[b].bytes)});
      }
    }
    if (fixed_bytes > static_cast<double>(budget_bytes)) {
      out.solved = true;  // an op's own buffers exceed the budget: no plan fits
      return out;
    }
    if (!terms.empty()) m.row(terms, 'L', static_cast<double>(budget_bytes) - fixed_bytes);
  }
  // Op start times, and the end.
  std::vector<int> t(n);
  for (int i = 0; i < n; ++i) t[i] = m.continuous();
  const int end = m.continuous(1.0);
  auto c = [&](int i) { return static_cast<double>(w.ops[i].compute_ns) * kUs; };
  m.row({{end, 1}, {t[n - 1], -1}}, 'G', c(n - 1));

  // Transitions between op i-1 and op i (and before op 0 for persistent buffers, which start
  // resident). Copies out: (buffer, boundary, last use before). Copies back: (buffer, boundary,
  // next use at or after).
  struct Copy {
    int var, boundary, use;
    double us;
  };
  std::vector<Copy> outs, ins;
  std::vector<std::vector<std::pair<int, double>>> recomputes(n);
  auto transfer_us = [](std::uint64_t bytes, double gbps) {
    return std::floor(static_cast<double>(bytes) / gbps) * kUs;  // as the simulator truncates
  };
  for (int b = 0; b < nb; ++b) {
    if (first[b] == kNone) continue;
    const double out_us = transfer_us(w.copyBytes(static_cast<BufferId>(b)), d2h_gbps);
    const double in_us = transfer_us(w.copyBytes(static_cast<BufferId>(b)), h2d_gbps);
    const double rc_us = w.buffers[b].recompute_ns > 0 ? static_cast<double>(w.buffers[b].recompute_ns) * kUs : 0;
    int last_use = kNone;
    for (int i = first[b]; i <= last[b]; ++i) {
      if (i > first[b] || w.buffers[b].persistent) {
        const int r0 = i > first[b] ? R[b][i - 1] : m.fixed(1);
        const int s0 = i > first[b] ? S[b][i - 1] : kNone;
        const int d0 = i > first[b] ? D[b][i - 1] : kNone;
        if (S[b][i] != kNone) {  // resident -> swapped: a copy out
          const int v = m.binary();
          m.row({{v, 1}, {r0, -1}, {S[b][i], -1}}, 'G', -1);
          outs.push_back({v, i, last_use, out_us});
        }
        if (s0 != kNone) {  // swapped -> resident: a copy back, done by the next use
          int next = kNone;
          for (int k = i; k <= last[b] && next == kNone; ++k) {
            if (used[b][k]) next = k;
          }
          const int v = m.binary();
          m.row({{v, 1}, {s0, -1}, {R[b][i], -1}}, 'G', -1);
          ins.push_back({v, i, next, in_us});
        }
        if (d0 != kNone) {  // dropped -> resident or swapped: a recompute before op i
          const int v = m.binary();
          m.row({{v, 1}, {d0, -1}, {R[b][i], -1}, {S[b][i], -1}}, 'G', -1);
          recomputes[i].push_back({v, rc_us});
        }
      }
      if (used[b][i]) last_use = i;
    }
  }
  // The compute stream: ops in order, recomputes between them.
  for (int i = 0; i < n; ++i) {
    std::vector<std::pair<int, double>> terms{{t[i], 1}};
    for (auto [v, us] : recomputes[i]) terms.push_back({v, -us});
    if (i == 0) {
      m.row(terms, 'G', 0);
    } else {
      terms.push_back({t[i - 1], -1});
      m.row(terms, 'G', c(i - 1));
    }
  }
  // The copy engines, one copy at a time: every copy that lies inside [from, to] fits in it.
  // Copies out lie in [end of their last use, start of the op they are absent at]; copies back
  // in [start of the op they were swapped at, start of their next use].
  for (int a = -1; a < n; ++a) {
    for (int k = std::max(a, 0); k < n; ++k) {
      std::vector<std::pair<int, double>> terms;
      double rhs = 0;
      for (const Copy& o : outs) {
        if (o.boundary <= k && (a < 0 || (o.use != kNone && o.use >= a))) terms.push_back({o.var, o.us});
      }
      if (!terms.empty() && (a < 0 || k > a)) {
        terms.push_back({t[k], -1});
        if (a >= 0) {
          terms.push_back({t[a], 1});
          rhs = -c(a);
        }
        m.row(terms, 'L', rhs);
      }
      if (a < 0) continue;
      terms.clear();
      for (const Copy& r : ins) {
        if (r.use != kNone && r.use <= k && r.boundary - 1 >= a) terms.push_back({r.var, r.us});
      }
      if (!terms.empty() && k > a) {
        terms.push_back({t[k], -1});
        terms.push_back({t[a], 1});
        m.row(terms, 'L', 0);
      }
    }
  }

  Cbc_setMaximumSeconds(m.get(), max_seconds);
  Cbc_setParameter(m.get(), "threads", "1");
  Cbc_setParameter(m.get(), "allowableGap", "1e-7");
  Cbc_setParameter(m.get(), "ratioGap", "0");
  Cbc_solve(m.get());
  if (Cbc_isProvenInfeasible(m.get())) {
    out.solved = true;
    return out;
  }
  if (!Cbc_isProvenOptimal(m.get())) {
    out.error = "not solved within " + std::to_string(max_seconds) + " s";
    return out;
  }
  out.solved = out.feasible = true;
  out.lower_ns = Cbc_getObjValue(m.get()) / kUs;
  return out;
}

#else

ExactBound exactBound(const policy::Workload&, std::uint64_t, double, double, double) {
  ExactBound out;
  out.error = "built without CBC (coinor-libcbc-dev)";
  return out;
}

#endif

}  // namespace delta::tools
