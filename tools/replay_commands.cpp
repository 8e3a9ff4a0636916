// Replay subcommands: see replay_commands.h.
#include "tools/replay_commands.h"

#include <fmt/core.h>

#include <cstdio>
#include <limits>
#include <optional>

#include "policy/delta_policy.h"
#include "policy/oracle_policy.h"
#include "policy/policy_factory.h"
#include "policy/simulator.h"
#include "tools/cli_args.h"
#include "tools/gpu_cost_model.h"
#include "tools/played_sizes.h"
#include "tools/trace_loader.h"

namespace delta::tools {

namespace {

using policy::SimOptions;
using policy::SimResult;
using policy::Workload;

constexpr std::string_view kSimHelp =
    "  --h2d-gbps X      host-to-device bandwidth, GB/s (default 12)\n"
    "  --d2h-gbps Y      device-to-host bandwidth, GB/s (default 12)\n"
    "  --iterations N    iterations replayed (default 3)\n"
    "  --warmup W        first iterations left out of time and bytes (default 1)\n"
    "  --no-plan         delta keeps its configured mode instead of planning each iteration it\n"
    "                    learns: what libdelta.so does by default (DELTA_PLAN=0)\n"
    "PyTorch Execution Traces (docs/pytorch-traces.md):\n"
    "  --kineto FILE     time the ET's ops by the GPU kernels of this Kineto trace, recorded\n"
    "                    with it (ops missing from it fall back to the cost model)\n"
    "  --gpu NAME        the cost model's GPU: v100-16gb, a100-40gb (default), h100-80gb, h200\n"
    "Budgets are bytes (123456, 512M, 4GiB, 6GB) or a percentage of the workload's peak with\n"
    "unlimited memory (30%). Policies: delta, lru, dtr, swap-only, recompute-only, belady, oracle\n"
    "(belady and oracle know the future: replay only; docs/policy.md).\n"
    "Traces: DELTA traces (libdelta.so), DTR op logs, PyTorch Execution Traces (gzip or plain),\n"
    "recognised by content.\n";

const std::vector<OptionSpec> kSimOptions = {
    {"h2d-gbps", true}, {"d2h-gbps", true}, {"iterations", true}, {"warmup", true}, {"help", false},
    {"kineto", true},   {"gpu", true},        {"no-plan", false}};

// replay and sweep: the workload as delta-play --scale N plays it under libdelta.so.
constexpr std::string_view kAsPlayedHelp =
    "  --as-played N     predict what delta-play --scale N measures under libdelta.so: every\n"
    "                    size divided by N, buffers then below 1 MiB left out of the budget\n"
    "                    (the shim leaves them unmanaged), the others rounded up to 2 MiB (its\n"
    "                    mapping granularity); a budget in percent is of the peak as played;\n"
    "                    the link is divided by N, as delta-play divides cudasim's\n"
    "  --played-recompute  with --as-played: the run has delta-play's --recompute, whose\n"
    "                    registered results keep their producer's inputs alive (an input\n"
    "                    the program has freed is kept unregistered: swapped, never dropped)\n";

int usage(std::string_view cmd, const std::string& msg) {
  fmt::print(stderr, "delta-trace {}: {} (see 'delta-trace {} --help')\n", cmd, msg, cmd);
  return 2;
}

int fileError(std::string_view cmd, const std::string& msg) {
  fmt::print(stderr, "delta-trace {}: {}\n", cmd, msg);
  return 1;
}

// Parses the options every replay command shares; returns an error message or "".
std::string simOptions(const CliArgs& a, SimOptions& o) {
  if (auto v = a.value("h2d-gbps")) {
    auto x = parsePositive(*v);
    if (!x) return "bad --h2d-gbps '" + *v + "': expected a positive number of GB/s";
    o.h2d_gbps = *x;
  }
  if (auto v = a.value("d2h-gbps")) {
    auto x = parsePositive(*v);
    if (!x) return "bad --d2h-gbps '" + *v + "': expected a positive number of GB/s";
    o.d2h_gbps = *x;
  }
  if (auto v = a.value("iterations")) {
    auto x = parseCount(*v);
    if (!x || *x == 0) return "bad --iterations '" + *v + "': expected an integer >= 1";
    o.iterations = *x;
  }
  if (auto v = a.value("warmup")) {
    auto x = parseCount(*v);
    if (!x) return "bad --warmup '" + *v + "': expected an integer >= 0";
    o.warmup = *x;
  }
  if (o.warmup >= o.iterations) return "--warmup must be smaller than --iterations";
  if (a.has("no-plan")) o.plan = false;
  return {};
}

// --kineto and --gpu: what the PyTorch importer needs; an error message or "".
std::string loadOptions(const CliArgs& a, LoadOptions& o) {
  if (auto v = a.value("gpu")) {
    if (!findGpu(*v)) return "unknown --gpu '" + *v + "' (known: " + gpuNames() + ")";
    o.gpu = *v;
  }
  if (auto v = a.value("kineto")) {
    if (v->empty()) return "--kineto needs a file";
    o.kineto_path = *v;
  }
  return {};
}

// --as-played N and --played-recompute: the delta-play run a replay predicts (scale 0: none).
struct AsPlayed {
  std::uint64_t scale = 0;
  bool recompute = false;
};

// Parses them, and divides the link by the scale; an error message or "".
std::string asPlayedOption(const CliArgs& a, AsPlayed& played, SimOptions& o) {
  played = {};
  if (auto v = a.value("as-played")) {
    auto x = parseCount(*v);
    if (!x || *x == 0) return "bad --as-played '" + *v + "': expected delta-play's --scale, an integer >= 1";
    played.scale = *x;
    o.h2d_gbps /= static_cast<double>(played.scale);
    o.d2h_gbps /= static_cast<double>(played.scale);
    o.prefetch_sees_free_memory = false;  // as the shim runs (SimOptions)
  }
  played.recompute = a.has("played-recompute");
  if (played.recompute && played.scale == 0) return "--played-recompute goes with --as-played N";
  return {};
}

void addAsPlayedOptions(std::vector<OptionSpec>& specs) {
  specs.push_back({"as-played", true});
  specs.push_back({"played-recompute", false});
}

std::string checkPolicy(const std::string& name) {
  for (std::string_view n : policy::replayPolicyNames()) {
    if (n == name) return {};
  }
  return policy::makePolicy(name, {}).error;
}

// What delta (or a variant) planned (Plan::name), "" for other policies or when it did not
// plan. `detailed` adds the predicted iteration time of every candidate replayed.
std::string planText(const policy::Policy& policy, bool detailed) {
  if (const auto* oracle = dynamic_cast<const policy::OracleChoice*>(&policy)) {
    if (!detailed) return oracle->planName();
    std::string all;
    for (const policy::OracleCandidate& c : oracle->candidates()) {
      if (!all.empty()) all += ", ";
      all += c.name() + " " +
             (c.result.gave_up ? std::string("cut")
                               : fmt::format("{:.2f} %{}", c.result.overhead_pct,
                                             c.result.over_budget_ops ? fmt::format(" ({} over)", c.result.over_budget_ops) : ""));
    }
    return oracle->planName() + " (candidates: " + all + ")";
  }
  const auto* delta = dynamic_cast<const policy::DeltaPolicy*>(&policy);
  if (delta == nullptr || !delta->plan().planned) return {};
  const policy::Plan& plan = delta->plan();
  if (!detailed) return plan.name();
  return plan.name() + " (predicted per iteration: " + plan.predictions() + ")";
}

struct Replayed {
  SimResult result;
  std::string plan;
};

// Runs `workload` under `policy_name`; the policy is sized for the workload and knows the
// budget (delta plans with it).
Replayed simulate(const Workload& w, const std::string& policy_name, const SimOptions& o,
                  bool detailed_plan = false) {
  const policy::UseSchedule future = w.schedule();
  const policy::ReplayContext context{&w, o};
  policy::PolicyResult p = policy::makePolicy(policy_name, policy::policyConfigFor(w, o), &future, &context);
  policy::Simulator sim(w, o);
  Replayed r{sim.run(*p.policy), {}};
  r.plan = planText(*p.policy, detailed_plan);
  return r;
}

// A policy's overhead over the oracle's: 1 for the oracle itself and when both are 0, infinite
// when only the oracle's is 0.
double regretOf(double overhead_pct, double oracle_pct) {
  constexpr double kZero = 1e-9;
  if (oracle_pct < kZero) return overhead_pct < kZero ? 1.0 : std::numeric_limits<double>::infinity();
  return overhead_pct / oracle_pct;
}

std::string gib(std::uint64_t bytes) { return fmt::format("{:.3f}", static_cast<double>(bytes) / (1u << 30)); }
std::string ms(std::int64_t ns) { return fmt::format("{:.2f}", static_cast<double>(ns) / 1e6); }

struct Loaded {
  std::string path;
  Workload workload;
  std::uint64_t peak;
};

// `as_played`: the delta-play run predicted under the shim (played_sizes.h); none: the
// workload as recorded.
std::optional<Loaded> load(std::string_view cmd, const std::string& path, const LoadOptions& options,
                           int& status, const AsPlayed& as_played = {}) {
  std::vector<std::string> notes;
  policy::ImportResult r = loadWorkload(path, options, &notes);
  if (!r.error.empty()) {
    status = fileError(cmd, r.error);
    return std::nullopt;
  }
  // What the importer inferred goes to stderr: stdout stays a table (or CSV) to parse.
  for (const std::string& note : notes) fmt::print(stderr, "delta-trace {}: {}: {}\n", cmd, path, note);
  if (as_played.scale > 0) {
    // Budgets are shares of the peak as played, as delta-play's played_peak_bytes.
    Workload played = tools::played(r.workload, as_played.scale);
    const std::uint64_t peak = played.peakBytes();
    return Loaded{path, asManagedByShim(played, as_played.recompute), peak};
  }
  const std::uint64_t peak = r.workload.peakBytes();
  return Loaded{path, std::move(r.workload), peak};
}

std::string baseName(const std::string& path) {
  const std::size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

int replayCommand(const std::vector<std::string>& args) {
  constexpr std::string_view cmd = "replay";
  std::vector<OptionSpec> specs = kSimOptions;
  specs.push_back({"policy", true});
  specs.push_back({"budget", true});
  specs.push_back({"batch", true});
  addAsPlayedOptions(specs);
  CliArgs a;
  if (std::string err = a.parse(args, specs); !err.empty()) return usage(cmd, err);
  if (a.has("help")) {
    fmt::print(
        "usage: delta-trace replay --policy P --budget B [--h2d-gbps X --d2h-gbps Y] FILE\n"
        "Replays FILE through policy P on one simulated GPU with a memory budget B.\n"
        "  --policy P        policy name (required)\n"
        "  --budget B        memory budget (required)\n"
        "  --batch F         scale activations and compute by F first (default 1)\n"
        "{}{}",
        kAsPlayedHelp, kSimHelp);
    return 0;
  }
  SimOptions o;
  if (std::string err = simOptions(a, o); !err.empty()) return usage(cmd, err);
  AsPlayed as_played;
  if (std::string err = asPlayedOption(a, as_played, o); !err.empty()) return usage(cmd, err);
  const auto policy_name = a.value("policy");
  if (!policy_name) return usage(cmd, "--policy is required");
  if (std::string err = checkPolicy(*policy_name); !err.empty()) return usage(cmd, err);
  const auto budget_text = a.value("budget");
  if (!budget_text) return usage(cmd, "--budget is required");
  const std::optional<Budget> budget = parseBudget(*budget_text);
  if (!budget) return usage(cmd, "bad --budget '" + *budget_text + "': expected bytes (e.g. 4GiB) or a percentage (e.g. 50%)");
  double batch = 1.0;
  if (auto v = a.value("batch")) {
    auto x = parsePositive(*v);
    if (!x) return usage(cmd, "bad --batch '" + *v + "': expected a positive number");
    batch = *x;
  }
  LoadOptions load_options;
  if (std::string err = loadOptions(a, load_options); !err.empty()) return usage(cmd, err);
  if (a.positional().size() != 1) return usage(cmd, "expected exactly one trace FILE");
  if (as_played.scale > 0 && batch != 1.0) return usage(cmd, "--as-played and --batch do not go together");
  int status = 0;
  auto loaded = load(cmd, a.positional()[0], load_options, status, as_played);
  if (!loaded) return status;
  const Workload w = batch == 1.0 ? loaded->workload : loaded->workload.scaled(batch);
  o.budget_bytes = budget->bytesFor(loaded->peak);
  const Replayed replayed = simulate(w, *policy_name, o, true);
  const SimResult& r = replayed.result;
  fmt::print("trace            {}\n", loaded->path);
  fmt::print("policy           {}\n", *policy_name);
  fmt::print("ops              {} per iteration, {} buffers\n", w.ops.size(), w.buffers.size());
  fmt::print("budget           {} bytes ({} GiB, {})\n", r.budget_bytes, gib(r.budget_bytes), budget->text);
  fmt::print("peak             {} bytes ({} GiB; unlimited: {} GiB)\n", r.peak_bytes, gib(r.peak_bytes), gib(w.peakBytes()));
  fmt::print("time             {} ms (unlimited memory: {} ms)\n", ms(r.total_ns), ms(r.compute_ns));
  fmt::print("overhead         {:.2f} %\n", r.overhead_pct);
  fmt::print("recompute        {} ms ({} drops)\n", ms(r.recompute_ns), r.drops);
  fmt::print("stall            {} ms\n", ms(r.stall_ns));
  fmt::print("host->device     {} bytes ({} GiB, {} prefetches)\n", r.h2d_bytes, gib(r.h2d_bytes), r.prefetches);
  fmt::print("device->host     {} bytes ({} GiB, {} swaps)\n", r.d2h_bytes, gib(r.d2h_bytes), r.swaps);
  fmt::print("over-budget ops  {}\n", r.over_budget_ops);
  if (!replayed.plan.empty()) fmt::print("plan             {}\n", replayed.plan);
  return 0;
}

int sweepCommand(const std::vector<std::string>& args) {
  constexpr std::string_view cmd = "sweep";
  std::vector<OptionSpec> specs = kSimOptions;
  specs.push_back({"policies", true});
  specs.push_back({"budgets", true});
  specs.push_back({"csv", false});
  addAsPlayedOptions(specs);
  CliArgs a;
  if (std::string err = a.parse(args, specs); !err.empty()) return usage(cmd, err);
  if (a.has("help")) {
    fmt::print(
        "usage: delta-trace sweep --policies P1,P2,... --budgets 30%,50%,70% [--csv] FILE...\n"
        "Replays every FILE under every policy and budget; prints a table, or CSV with --csv.\n"
        "  --policies LIST   policy names (default: delta,lru,dtr,swap-only,belady,oracle)\n"
        "  --budgets LIST    budgets (default: 30%,50%,70%)\n"
        "  --csv             CSV: trace,policy,budget,budget_bytes,peak_bytes,overhead_pct,\n"
        "                    h2d_bytes,d2h_bytes,recompute_ns,stall_ns,over_budget_ops,swaps,\n"
        "                    drops,prefetches,plan (what delta or its variant planned: the\n"
        "                    mode, /net for the net window, /on-demand for no room made\n"
        "                    ahead, /far for room made for a burst far ahead, /fresh when\n"
        "                    replayed from a fresh start in that mode, /optimistic for mixed\n"
        "                    under the optimistic prior, /vetoed-N with N buffers kept\n"
        "                    resident while anything else can make room; empty when it did\n"
        "                    not plan; oracle: the rule it kept), regret\n"
        "                    (the overhead over oracle's on the same trace and budget: 1 for\n"
        "                    oracle; inf when only oracle's is 0; over-budget rows are not\n"
        "                    comparable)\n"
        "{}{}",
        kAsPlayedHelp, kSimHelp);
    return 0;
  }
  SimOptions o;
  if (std::string err = simOptions(a, o); !err.empty()) return usage(cmd, err);
  AsPlayed as_played;
  if (std::string err = asPlayedOption(a, as_played, o); !err.empty()) return usage(cmd, err);
  const std::vector<std::string> policies = splitList(a.value("policies").value_or("delta,lru,dtr,swap-only,belady,oracle"));
  for (const std::string& p : policies) {
    if (std::string err = checkPolicy(p); !err.empty()) return usage(cmd, err);
  }
  std::vector<Budget> budgets;
  for (const std::string& b : splitList(a.value("budgets").value_or("30%,50%,70%"))) {
    const std::optional<Budget> budget = parseBudget(b);
    if (!budget) return usage(cmd, "bad budget '" + b + "' in --budgets: expected bytes or a percentage");
    budgets.push_back(*budget);
  }
  LoadOptions load_options;
  if (std::string err = loadOptions(a, load_options); !err.empty()) return usage(cmd, err);
  if (a.positional().empty()) return usage(cmd, "expected at least one trace FILE");
  if (!load_options.kineto_path.empty() && a.positional().size() != 1) {
    return usage(cmd, "--kineto pairs with one Execution Trace: give exactly one FILE");
  }
  std::vector<Loaded> files;
  for (const std::string& path : a.positional()) {
    int status = 0;
    auto loaded = load(cmd, path, load_options, status, as_played);
    if (!loaded) return status;
    files.push_back(std::move(*loaded));
  }
  const bool csv = a.has("csv");
  if (csv) {
    fmt::print("trace,policy,budget,budget_bytes,peak_bytes,overhead_pct,h2d_bytes,d2h_bytes,"
               "recompute_ns,stall_ns,over_budget_ops,swaps,drops,prefetches,plan,regret\n");
  } else {
    fmt::print("{:<28} {:<15} {:>6} {:>10} {:>10} {:>10} {:>10} {:>10} {:>11} {:>10} {:>6} {:>7}\n", "trace", "policy",
               "budget", "budget_GiB", "peak_GiB", "overhead%", "h2d_GiB", "d2h_GiB", "recompute_ms", "stall_ms",
               "over", "regret");
  }
  for (const Loaded& f : files) {
    for (const Budget& b : budgets) {
      o.budget_bytes = b.bytesFor(f.peak);
      // Every row's regret is against the oracle's overhead on the same trace and budget.
      const Replayed oracle = simulate(f.workload, "oracle", o);
      for (const std::string& p : policies) {
        const Replayed replayed = p == "oracle" ? oracle : simulate(f.workload, p, o);
        const SimResult& r = replayed.result;
        const double regret = regretOf(r.overhead_pct, oracle.result.overhead_pct);
        const std::string name = baseName(f.path);
        if (csv) {
          fmt::print("{},{},{},{},{},{:.3f},{},{},{},{},{},{},{},{},{},{:.3f}\n", name, p, b.text, r.budget_bytes,
                     r.peak_bytes, r.overhead_pct, r.h2d_bytes, r.d2h_bytes, r.recompute_ns, r.stall_ns,
                     r.over_budget_ops, r.swaps, r.drops, r.prefetches, replayed.plan, regret);
        } else {
          fmt::print("{:<28} {:<15} {:>6} {:>10} {:>10} {:>10.2f} {:>10} {:>10} {:>11} {:>10} {:>6} {:>6.2f}x\n",
                     name.substr(0, 28), p, b.text, gib(r.budget_bytes), gib(r.peak_bytes), r.overhead_pct,
                     gib(r.h2d_bytes), gib(r.d2h_bytes), ms(r.recompute_ns), ms(r.stall_ns), r.over_budget_ops,
                     regret);
        }
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

int maxbatchCommand(const std::vector<std::string>& args) {
  constexpr std::string_view cmd = "maxbatch";
  std::vector<OptionSpec> specs = kSimOptions;
  specs.push_back({"policy", true});
  specs.push_back({"budget", true});
  specs.push_back({"max-overhead", true});
  CliArgs a;
  if (std::string err = a.parse(args, specs); !err.empty()) return usage(cmd, err);
  if (a.has("help")) {
    fmt::print(
        "usage: delta-trace maxbatch --policy P --budget B --max-overhead 20% FILE\n"
        "Finds the largest batch factor F (activation sizes and compute times x F) that runs\n"
        "within budget B (a percentage is of the peak at batch 1) with no op over budget and an\n"
        "overhead of at most the given one, to 0.01. Assumes fitting is monotone in F. Also\n"
        "prints the largest F whose peak fits with nothing paged (the baseline). In PyTorch\n"
        "Execution Traces only batch-sized buffers (leading dimension = the batch) and the ops\n"
        "that touch them scale; parameters, gradients and optimizer state do not.\n"
        "  --policy P          policy name (required)\n"
        "  --budget B          memory budget (required)\n"
        "  --max-overhead X    largest acceptable overhead, percent (default 20%)\n"
        "{}",
        kSimHelp);
    return 0;
  }
  SimOptions o;
  if (std::string err = simOptions(a, o); !err.empty()) return usage(cmd, err);
  const auto policy_name = a.value("policy");
  if (!policy_name) return usage(cmd, "--policy is required");
  if (std::string err = checkPolicy(*policy_name); !err.empty()) return usage(cmd, err);
  const auto budget_text = a.value("budget");
  if (!budget_text) return usage(cmd, "--budget is required");
  const std::optional<Budget> budget = parseBudget(*budget_text);
  if (!budget) return usage(cmd, "bad --budget '" + *budget_text + "': expected bytes (e.g. 4GiB) or a percentage (e.g. 50%)");
  const std::string overhead_text = a.value("max-overhead").value_or("20%");
  const std::optional<double> max_overhead = parsePercent(overhead_text);
  if (!max_overhead) return usage(cmd, "bad --max-overhead '" + overhead_text + "': expected a percentage (e.g. 20%)");
  LoadOptions load_options;
  if (std::string err = loadOptions(a, load_options); !err.empty()) return usage(cmd, err);
  if (a.positional().size() != 1) return usage(cmd, "expected exactly one trace FILE");
  int status = 0;
  auto loaded = load(cmd, a.positional()[0], load_options, status);
  if (!loaded) return status;
  o.budget_bytes = budget->bytesFor(loaded->peak);

  auto fits = [&](double f, SimResult& out) {
    out = simulate(loaded->workload.scaled(f), *policy_name, o).result;
    return out.over_budget_ops == 0 && out.overhead_pct <= *max_overhead;
  };
  SimResult best{};
  fmt::print("trace            {}\npolicy           {}\nbudget           {} bytes ({})\n", loaded->path,
             *policy_name, o.budget_bytes, budget->text);
  // The baseline a policy is measured against: the largest factor whose peak fits with nothing
  // paged (bisection on the peak alone, which grows with the factor).
  {
    double lo = 0, hi = 1;
    while (hi <= 1024.0 && loaded->workload.scaled(hi).peakBytes() <= o.budget_bytes) {
      lo = hi;
      hi *= 2;
    }
    while (hi - lo > 0.01) {
      const double mid = (lo + hi) / 2;
      (loaded->workload.scaled(mid).peakBytes() <= o.budget_bytes ? lo : hi) = mid;
    }
    fmt::print("unpaged factor   {:.2f} (peak within the budget with nothing paged)\n", lo);
  }
  if (!fits(1.0, best)) {
    fmt::print("max batch factor none: batch 1 does not fit (overhead {:.2f} %, {} ops over budget)\n",
               best.overhead_pct, best.over_budget_ops);
    return 0;
  }
  // Double until it fails, then bisect to 0.01.
  double lo = 1.0, hi = 2.0;
  SimResult r;
  constexpr double kMaxFactor = 1024.0;
  while (hi <= kMaxFactor && fits(hi, r)) {
    lo = hi;
    best = r;
    hi *= 2;
  }
  while (hi - lo > 0.01) {
    const double mid = (lo + hi) / 2;
    if (fits(mid, r)) {
      lo = mid;
      best = r;
    } else {
      hi = mid;
    }
  }
  fmt::print("max batch factor {:.2f} (overhead {:.2f} %, peak {} bytes)\n", lo, best.overhead_pct, best.peak_bytes);
  return 0;
}

}  // namespace delta::tools
