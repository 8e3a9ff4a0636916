// main() of faults-test: the programs under test come from meson as arguments.
#include <cstdio>

#include "faults_util.h"

namespace delta::faults {
namespace {
Programs gPrograms;
}
const Programs& programs() { return gPrograms; }
}  // namespace delta::faults

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s FAULT_JOB TRAIN_MLP LIBDELTA_SO DELTA_TRACE\n", argv[0]);
    return 2;
  }
  delta::faults::gPrograms = {argv[1], argv[2], argv[3], argv[4]};
  return RUN_ALL_TESTS();
}
