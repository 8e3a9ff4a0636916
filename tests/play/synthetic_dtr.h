// A synthetic DTR op log (the format of ../shared/traces/README.md) for the delta-play tests: a
// stack of `layers` linear layers trained with SGD, with weights (CONSTANT, written in place by
// the optimizer), activations saved for backward, gradients, a view (ALIAS) and renames (COPY,
// COPY_FROM), so that a test needs no shared trace. Header only.
#pragma once

#include <cstdint>
#include <string>

namespace delta::testing {

struct SyntheticNet {
  int layers = 10;
  uint64_t activationBytes = 4 << 20;
  uint64_t weightBytes = 1 << 20;
  int64_t forwardNs = 1500000;
  int64_t backwardNs = 3000000;
  int64_t optimizerNs = 400000;
};

inline std::string syntheticDtrLog(const SyntheticNet& net) {
  std::string log;
  auto line = [&log](const std::string& text) { log += "{" + text + "}\n"; };
  auto q = [](const std::string& s) { return "\"" + s + "\""; };
  auto memory = [&](const std::string& name, uint64_t bytes) {
    line("\"INSTRUCTION\":\"MEMORY\",\"NAME\":" + q(name) + ",\"MEMORY\":" + q(std::to_string(bytes)));
  };
  auto result = [&](const std::string& name, uint64_t bytes, int alias = -1) {
    memory(name, bytes);
    line("\"INSTRUCTION\":\"ALIAS\",\"NAME\":" + q(name) + ",\"ALIAS\":" + q(std::to_string(alias)));
  };
  auto call = [&](const std::string& op, const std::string& args, const std::string& results,
                  int64_t ns) {
    line("\"INSTRUCTION\":\"CALL\",\"NAME\":" + q(op) + ",\"ARGS\":[" + args + "],\"RESULT\":[" +
         results + "],\"TIME\":" + q(std::to_string(ns)));
  };
  auto release = [&](const std::string& name) {
    line("\"INSTRUCTION\":\"RELEASE\",\"NAME\":" + q(name));
  };
  auto a = [](int k) { return "a" + std::to_string(k); };
  auto w = [](int k) { return "w" + std::to_string(k); };

  line("\"INSTRUCTION\":\"ANNOTATE\",\"ANNOTATION\":\"START\"");
  line("\"INSTRUCTION\":\"CONSTANT\",\"NAME\":\"a0\"");
  memory("a0", net.activationBytes);
  for (int k = 1; k <= net.layers; ++k) {
    line("\"INSTRUCTION\":\"CONSTANT\",\"NAME\":" + q(w(k)));
    memory(w(k), net.weightBytes);
  }
  for (int k = 1; k <= net.layers; ++k) {
    call("linear", q(a(k - 1)) + "," + q(w(k)), q(a(k)), net.forwardNs);
    result(a(k), net.activationBytes);
  }
  // The loss's gradient, through a view of the output and a rename.
  call("view", q(a(net.layers)), q("out"), 1000);
  result("out", net.activationBytes, 0);
  line("\"INSTRUCTION\":\"COPY\",\"DST\":\"y\",\"SRC\":\"out\"");
  call("loss_backward", q("y"), q("g" + std::to_string(net.layers)), net.forwardNs);
  result("g" + std::to_string(net.layers), net.activationBytes);
  release("y");
  release("out");
  line("\"INSTRUCTION\":\"ANNOTATE\",\"ANNOTATION\":\"BACKWARD\"");
  for (int k = net.layers; k >= 1; --k) {
    const std::string g = "g" + std::to_string(k), gPrev = "g" + std::to_string(k - 1),
                      gw = "gw" + std::to_string(k);
    call("linear_backward", q(g) + "," + q(a(k - 1)) + "," + q(w(k)), q(gPrev) + "," + q(gw),
         net.backwardNs);
    result(gPrev, net.activationBytes);
    result(gw, net.weightBytes);
    release(g);
    release(a(k));
    line("\"INSTRUCTION\":\"MUTATE\",\"NAME\":\"sgd_\",\"ARGS\":[" + q(w(k)) + "," + q(gw) +
         "],\"MUTATE\":[0],\"TIME\":" + q(std::to_string(net.optimizerNs)));
    release(gw);
  }
  release("g0");
  return log;
}

}  // namespace delta::testing
