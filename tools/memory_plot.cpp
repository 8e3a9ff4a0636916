// `delta-trace plot FILE -o memory.svg`: the memory timeline as one self-contained SVG (no
// script, no external file): resident managed bytes, host bytes and the budget line in the upper
// panel, swap traffic (device-to-host and host-to-device, GB/s) in the lower one.
//
// Two streaming passes: the first finds the time span, the second adds every record's byte
// changes into kBuckets time buckets. A bucket's value is the sum of all changes before its end,
// so the curve does not depend on the order threads' records reached the file; the number of
// points is bounded whatever the trace's length. Peaks shorter than a bucket are smoothed away
// (summary gives the exact peak).
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "tools/cli_args.h"
#include "tools/trace_commands.h"
#include "tools/trace_stats.h"

namespace delta::tools {

namespace {

using trace::Record;
using trace::RecordType;

constexpr std::string_view kHelp =
    "usage: delta-trace plot FILE -o MEMORY.svg\n"
    "Draws a trace's memory timeline as an SVG to open in a browser: resident managed bytes,\n"
    "bytes held on the host, the budget, and the swap traffic in each direction.\n"
    "  -o, --output MEMORY.svg   where to write ('-' for standard output)\n";

constexpr std::size_t kBuckets = 1000;
constexpr double kWidth = 1000, kHeight = 640;
constexpr double kLeft = 90, kRight = 30, kTop = 50;
constexpr double kMemHeight = 340, kGap = 60, kSwapHeight = 130;

struct Span {
  std::uint64_t first = 0, last = 0;
  void add(std::uint64_t t) {
    if (t == 0) return;
    if (first == 0 || t < first) first = t;
    last = std::max(last, t);
  }
};

// A "nice" axis step (1, 2, 5 x 10^k) giving about `ticks` ticks up to `max`.
double niceStep(double max, int ticks) {
  if (max <= 0) return 1;
  const double raw = max / ticks;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (raw <= m * p) return m * p;
  }
  return 10 * p;
}

struct Unit {
  double scale;
  const char* name;
};
Unit bytesUnit(double max) {
  if (max >= 1024.0 * 1024 * 1024) return {1024.0 * 1024 * 1024, "GiB"};
  if (max >= 1024.0 * 1024) return {1024.0 * 1024, "MiB"};
  if (max >= 1024.0) return {1024.0, "KiB"};
  return {1, "B"};
}
Unit timeUnit(double max_ns) {
  if (max_ns >= 1e9) return {1e9, "s"};
  if (max_ns >= 1e6) return {1e6, "ms"};
  if (max_ns >= 1e3) return {1e3, "us"};
  return {1, "ns"};
}

std::string num(double v) {
  std::string s = fmt::format("{:.4g}", v);
  return s;
}

}  // namespace

int plotCommand(const std::vector<std::string>& args) {
  std::vector<std::string> norm;
  for (const std::string& s : args) norm.push_back(s == "-o" ? "--output" : s);
  CliArgs a;
  auto usage = [](const std::string& msg) {
    fmt::print(stderr, "delta-trace plot: {} (see 'delta-trace plot --help')\n", msg);
    return 2;
  };
  if (std::string err = a.parse(norm, {{"output", true}, {"help", false}}); !err.empty()) return usage(err);
  if (a.has("help")) {
    fmt::print("{}", kHelp);
    return 0;
  }
  if (a.positional().size() != 1) return usage("expected one trace FILE");
  const auto output = a.value("output");
  if (!output) return usage("expected -o MEMORY.svg");
  const std::string& path = a.positional()[0];

  // Pass 1: the time span.
  Span span;
  std::string header_line;
  std::uint64_t budget0 = 0, start = 0;
  {
    trace::TraceReader reader;
    if (std::string err = reader.open(path); !err.empty()) {
      fmt::print(stderr, "delta-trace plot: {}\n", err);
      return 1;
    }
    const trace::FileHeader& h = reader.header();
    budget0 = h.budget;
    start = h.start_monotonic_ns;
    header_line = fmt::format("{} - {}, policy {}, budget {}", path, h.device_name,
                              h.policy.empty() ? "-" : std::string(h.policy),
                              h.budget ? formatBytes(h.budget) : "none");
    Record r;
    while (reader.next(r)) {
      MemoryDelta d;
      if (memoryDelta(r, d)) span.add(d.time_ns);
      if (r.type == RecordType::kEvict || r.type == RecordType::kRestore) {
        span.add(r.movement.start_ns);
        span.add(r.movement.end_ns);
      }
      if (r.type == RecordType::kLaunch) span.add(r.launch.time_ns);
      if (r.type == RecordType::kBudgetChange) span.add(r.budget.time_ns);
    }
    if (reader.status() != trace::ReadStatus::kEnd && reader.status() != trace::ReadStatus::kTruncated) {
      fmt::print(stderr, "delta-trace plot: {}\n", reader.error());
      return 1;
    }
  }
  if (span.first == 0) span.first = span.last = start;
  const std::uint64_t t0 = std::min(start, span.first);
  const double total = static_cast<double>(std::max<std::uint64_t>(span.last - t0, 1));
  auto bucketOf = [&](std::uint64_t t) {
    const double x = static_cast<double>(t > t0 ? t - t0 : 0) / total * kBuckets;
    return std::min<std::size_t>(static_cast<std::size_t>(x), kBuckets - 1);
  };

  // Pass 2: changes per bucket.
  std::vector<double> resident(kBuckets + 1), host(kBuckets + 1), d2h(kBuckets), h2d(kBuckets);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> budget_steps;  // (bucket, budget) kept small
  std::string warning;
  {
    trace::TraceReader reader;
    reader.open(path);
    Record r;
    while (reader.next(r)) {
      MemoryDelta d;
      if (memoryDelta(r, d)) {
        const std::size_t b = bucketOf(d.time_ns);
        resident[b + 1] += static_cast<double>(d.resident);
        host[b + 1] += static_cast<double>(d.host);
      }
      if (r.type == RecordType::kEvict && !(r.movement.flags & trace::kEvictDrop)) {
        d2h[bucketOf(r.movement.end_ns)] += static_cast<double>(r.movement.bytes);
      } else if (r.type == RecordType::kRestore) {
        h2d[bucketOf(r.movement.end_ns)] += static_cast<double>(r.movement.bytes);
      } else if (r.type == RecordType::kBudgetChange) {
        const std::size_t b = bucketOf(r.budget.time_ns);
        if (!budget_steps.empty() && budget_steps.back().first == b) budget_steps.pop_back();
        budget_steps.emplace_back(b, r.budget.budget);
      }
    }
    if (reader.status() == trace::ReadStatus::kTruncated) warning = reader.error();
  }
  double max_mem = static_cast<double>(budget0);
  for (std::size_t i = 1; i <= kBuckets; ++i) {
    resident[i] += resident[i - 1];
    host[i] += host[i - 1];
    max_mem = std::max({max_mem, resident[i], host[i]});
  }
  for (auto& [b, v] : budget_steps) max_mem = std::max(max_mem, static_cast<double>(v));
  const double bucket_s = total / kBuckets / 1e9;
  double max_rate = 0;
  for (std::size_t i = 0; i < kBuckets; ++i) max_rate = std::max({max_rate, d2h[i], h2d[i]});
  max_rate = max_rate / bucket_s / 1e9;  // GB/s

  std::FILE* out = *output == "-" ? stdout : std::fopen(output->c_str(), "w");
  if (out == nullptr) {
    fmt::print(stderr, "delta-trace plot: cannot write {}\n", *output);
    return 1;
  }
  const double plot_w = kWidth - kLeft - kRight;
  const Unit bu = bytesUnit(max_mem);
  const double mem_step = niceStep(max_mem / bu.scale, 5);
  const double mem_top = std::max(mem_step, std::ceil(max_mem / bu.scale / mem_step) * mem_step);
  const double rate_step = niceStep(max_rate, 3);
  const double rate_top = std::max(rate_step, std::ceil(max_rate / rate_step) * rate_step);
  const Unit tu = timeUnit(total);
  const double time_step = niceStep(total / tu.scale, 8);
  const double swap_top = kTop + kMemHeight + kGap;
  auto x = [&](std::size_t bucket) { return kLeft + plot_w * static_cast<double>(bucket) / kBuckets; };
  auto ymem = [&](double v) { return kTop + kMemHeight - kMemHeight * (v / bu.scale) / mem_top; };
  auto yrate = [&](double gbps) { return swap_top + kSwapHeight - kSwapHeight * gbps / rate_top; };

  fmt::print(out, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
  fmt::print(out, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
                  "font-family=\"sans-serif\" font-size=\"12\">\n", kWidth, kHeight, kWidth, kHeight);
  fmt::print(out, "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n");
  std::string title;
  for (char c : header_line) {
    if (c == '<') title += "&lt;";
    else if (c == '>') title += "&gt;";
    else if (c == '&') title += "&amp;";
    else title += c;
  }
  fmt::print(out, "<text x=\"{}\" y=\"22\" font-size=\"14\">Memory timeline: {}</text>\n", kLeft, title);
  // Axes and grid.
  for (double v = 0; v <= mem_top + 1e-9; v += mem_step) {
    const double y = ymem(v * bu.scale);
    fmt::print(out, "<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>"
                    "<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n",
               kLeft, y, kWidth - kRight, y, kLeft - 6, y + 4, num(v));
  }
  fmt::print(out, "<text transform=\"translate(20,{}) rotate(-90)\" text-anchor=\"middle\">memory ({})</text>\n",
             kTop + kMemHeight / 2, bu.name);
  for (double v = 0; v <= rate_top + 1e-9; v += rate_step) {
    const double y = yrate(v);
    fmt::print(out, "<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>"
                    "<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n",
               kLeft, y, kWidth - kRight, y, kLeft - 6, y + 4, num(v));
  }
  fmt::print(out, "<text transform=\"translate(20,{}) rotate(-90)\" text-anchor=\"middle\">swap (GB/s)</text>\n",
             swap_top + kSwapHeight / 2);
  for (double v = 0; v * tu.scale <= total + 1e-9; v += time_step) {
    const double px = kLeft + plot_w * v * tu.scale / total;
    fmt::print(out, "<line x1=\"{:.1f}\" y1=\"{}\" x2=\"{:.1f}\" y2=\"{}\" stroke=\"#eee\"/>"
                    "<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
               px, kTop, px, swap_top + kSwapHeight, px, swap_top + kSwapHeight + 16, num(v));
  }
  fmt::print(out, "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">time since start ({})</text>\n",
             kLeft + plot_w / 2, swap_top + kSwapHeight + 34, tu.name);
  fmt::print(out, "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#333\"/>\n",
             kLeft, kTop, plot_w, kMemHeight);
  fmt::print(out, "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#333\"/>\n",
             kLeft, swap_top, plot_w, kSwapHeight);
  // Series: steps at bucket boundaries.
  auto series = [&](const std::vector<double>& v, const char* color, const char* extra) {
    std::string pts;
    for (std::size_t i = 0; i <= kBuckets; ++i) {
      if (i > 0 && i < kBuckets && v[i] == v[i - 1] && v[i] == v[i + 1]) continue;  // flat: skip
      pts += fmt::format("{:.1f},{:.1f} ", x(i), ymem(v[i]));
    }
    fmt::print(out, "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" {} points=\"{}\"/>\n", color,
               extra, pts);
  };
  series(host, "#2a9d8f", "");
  series(resident, "#1d4ed8", "");
  // Budget: a step line.
  {
    std::string pts;
    double b = static_cast<double>(budget0);
    std::size_t at = 0;
    for (auto& [bucket, v] : budget_steps) {
      pts += fmt::format("{:.1f},{:.1f} {:.1f},{:.1f} ", x(at), ymem(b), x(bucket), ymem(b));
      b = static_cast<double>(v);
      at = bucket;
    }
    pts += fmt::format("{:.1f},{:.1f} {:.1f},{:.1f}", x(at), ymem(b), x(kBuckets), ymem(b));
    if (budget0 != 0 || !budget_steps.empty()) {
      fmt::print(out, "<polyline fill=\"none\" stroke=\"#dc2626\" stroke-width=\"1.5\" stroke-dasharray=\"6 4\" "
                      "points=\"{}\"/>\n", pts);
    }
  }
  // Swap traffic: bars per bucket (d2h above the axis in orange, h2d in purple beside it).
  for (std::size_t i = 0; i < kBuckets; ++i) {
    const double w = plot_w / kBuckets;
    if (d2h[i] > 0) {
      const double y = yrate(d2h[i] / bucket_s / 1e9);
      fmt::print(out, "<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.1f}\" fill=\"#f59e0b\"/>\n",
                 x(i), y, std::max(w / 2, 0.5), swap_top + kSwapHeight - y);
    }
    if (h2d[i] > 0) {
      const double y = yrate(h2d[i] / bucket_s / 1e9);
      fmt::print(out, "<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.1f}\" fill=\"#7c3aed\"/>\n",
                 x(i) + w / 2, y, std::max(w / 2, 0.5), swap_top + kSwapHeight - y);
    }
  }
  // Legend.
  const struct {
    const char* color;
    const char* label;
    bool dashed;
  } legend[] = {{"#1d4ed8", "resident (managed)", false},
                {"#2a9d8f", "on host", false},
                {"#dc2626", "budget", true},
                {"#f59e0b", "device to host", false},
                {"#7c3aed", "host to device", false}};
  double lx = kLeft;
  for (const auto& l : legend) {
    fmt::print(out, "<line x1=\"{}\" y1=\"36\" x2=\"{}\" y2=\"36\" stroke=\"{}\" stroke-width=\"3\"{}/>"
                    "<text x=\"{}\" y=\"40\">{}</text>\n",
               lx, lx + 20, l.color, l.dashed ? " stroke-dasharray=\"6 4\"" : "", lx + 25, l.label);
    lx += 170;
  }
  fmt::print(out, "</svg>\n");
  const bool failed = std::ferror(out) != 0;
  if (out != stdout) std::fclose(out);
  if (failed) {
    fmt::print(stderr, "delta-trace plot: writing {} failed\n", *output);
    return 1;
  }
  if (!warning.empty()) fmt::print(stderr, "delta-trace plot: warning: {}; plotted the records before it\n", warning);
  return 0;
}

}  // namespace delta::tools
