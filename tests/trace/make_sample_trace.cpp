// Writes the sample trace (sample_trace.h) to the path given: input of the CLI tests.
#include <cstdio>

#include "tests/trace/sample_trace.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_sample_trace FILE\n");
    return 2;
  }
  const std::string err = delta::trace::testing::writeSampleTrace(argv[1]);
  if (!err.empty()) {
    std::fprintf(stderr, "make_sample_trace: %s\n", err.c_str());
    return 1;
  }
  return 0;
}
