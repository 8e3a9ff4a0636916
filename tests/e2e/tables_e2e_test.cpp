// End-to-end tests of what the shim must never get wrong: a kernel that reaches buffers through
// tables of pointers in device memory (small unmanaged tables, tables copied device to device,
// written again, freed, nested), and a device that holds less than the budget (another process
// or unmanaged allocations took it). On cudasim, under a real LD_PRELOAD; a kernel touching an
// evicted buffer makes cudasim stop with "illegal address".
//
// Arguments (from meson): train-tables, libdelta.so, table-probe.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "tests/common/child_process.h"

namespace {

std::string gTrainTables;
std::string gShim;
std::string gProbe;

using Outcome = delta::testing::ChildRun;

Outcome run(const std::vector<std::string>& argv, std::vector<std::string> env, bool shim = true) {
  if (shim) {
    env.push_back("LD_PRELOAD=" + gShim);
    env.push_back("DELTA_VERBOSE=1");
  }
  return delta::testing::runChild(argv, env);
}

void expectNoFault(const Outcome& o) {
  EXPECT_EQ(o.err.find("cudasim: illegal address"), std::string::npos) << o.err;
  EXPECT_EQ(o.err.find("failed"), std::string::npos) << o.err;
}

// ---- train-tables: the whole job ----

struct Job {
  std::vector<std::string> argv;
  Outcome plain;
  unsigned long long peak = 0;
};

const Job& job(uint64_t seed) {
  static std::map<uint64_t, Job> jobs;
  auto it = jobs.find(seed);
  if (it != jobs.end()) return it->second;
  Job j;
  j.argv = {gTrainTables, "--seed", std::to_string(seed), "--steps", "5"};
  j.plain = run(j.argv, {}, false);
  j.peak = std::strtoull(j.plain.value("peak_bytes").c_str(), nullptr, 10);
  return jobs.emplace(seed, std::move(j)).first->second;
}

void expectSameResults(const Outcome& shimmed, const Outcome& plain) {
  ASSERT_EQ(plain.status, 0) << plain.err;
  ASSERT_EQ(shimmed.status, 0) << shimmed.err;
  expectNoFault(shimmed);
  ASSERT_FALSE(plain.value("checksum").empty());
  for (const auto& [key, value] : plain.values) {
    if (key == "peak_bytes") continue;
    auto it = shimmed.values.find(key);
    ASSERT_NE(it, shimmed.values.end()) << key;
    EXPECT_EQ(it->second, value) << key;
  }
  ASSERT_NE(shimmed.stat("peak_resident_bytes"), ~0ull) << "no stats line:\n" << shimmed.err;
}

TEST(TablesEndToEnd, WeightsOnlyThroughSmallTablesOnADeviceOfHalfThePeak) {
  for (uint64_t seed : {1, 2}) {
    const Job& j = job(seed);
    ASSERT_GT(j.peak, 64ull << 20) << j.plain.out << j.plain.err;
    // Without the shim the job needs its peak: the device of half of it cannot run it.
    const std::string device = "CUDASIM_DEVICE_MEMORY=" + std::to_string(j.peak / 2);
    for (int percent : {30, 35, 40}) {
      for (const char* minBytes : {"", "DELTA_MIN_BYTES=0"}) {
        const unsigned long long budget = j.peak * percent / 100;
        SCOPED_TRACE("seed " + std::to_string(seed) + ", budget " + std::to_string(percent) +
                     "% " + minBytes);
        Outcome shimmed =
            run(j.argv, {device, "DELTA_BUDGET=" + std::to_string(budget), minBytes});
        expectSameResults(shimmed, j.plain);
        EXPECT_GT(shimmed.stat("evictions"), 0u);
        EXPECT_GT(shimmed.stat("pointer_tables"), 0u);
        EXPECT_EQ(shimmed.stat("over_budget_launches"), 0u);
        EXPECT_LE(shimmed.stat("peak_resident_bytes"), budget);
      }
    }
  }
}

TEST(TablesEndToEnd, TheJobFailsWithoutTheShimOnThatDevice) {
  const Job& j = job(1);
  Outcome plain = run(j.argv, {"CUDASIM_DEVICE_MEMORY=" + std::to_string(j.peak / 2)}, false);
  EXPECT_EQ(plain.status, 1);
  EXPECT_NE(plain.err.find("out of memory"), std::string::npos) << plain.err;
}

// Another process holds half of the device: the default budget (90 % of the device) is more
// than there is; the shim says so once, with the effective ceiling, and the job finishes.
TEST(TablesEndToEnd, ADeviceHalfTakenByAnotherProcess) {
  const Job& j = job(1);
  Outcome shimmed = run(j.argv, {"CUDASIM_DEVICE_MEMORY=" + std::to_string(j.peak),
                                 "CUDASIM_FAULTS=device-taken=" + std::to_string(j.peak / 2)});
  expectSameResults(shimmed, j.plain);
  EXPECT_NE(shimmed.err.find("the effective ceiling"), std::string::npos) << shimmed.err;
  EXPECT_NE(shimmed.err.find("only " + std::to_string((j.peak / 2) >> 20) + " MiB free"),
            std::string::npos)
      << shimmed.err;
  EXPECT_LT(shimmed.stat("ceiling_bytes"), j.peak / 2);
  EXPECT_LE(shimmed.stat("peak_resident_bytes"), shimmed.stat("ceiling_bytes"));
  EXPECT_GT(shimmed.stat("evictions"), 0u);
}

// The program itself took half of the device in small unmanaged allocations first.
TEST(TablesEndToEnd, ADeviceHalfTakenByUnmanagedAllocations) {
  const Job& j = job(1);
  std::vector<std::string> argv = j.argv;
  argv.insert(argv.end(), {"--hog", std::to_string(j.peak / 2)});
  Outcome shimmed = run(argv, {"CUDASIM_DEVICE_MEMORY=" + std::to_string(j.peak)});
  expectSameResults(shimmed, j.plain);
  EXPECT_NE(shimmed.err.find("the effective ceiling"), std::string::npos) << shimmed.err;
  EXPECT_LT(shimmed.stat("ceiling_bytes"), j.peak / 2);
}

// Unmanaged allocations made while managed buffers fill the device: the shim evicts to make
// room for them rather than let them fail, and lowers its ceiling.
TEST(TablesEndToEnd, UnmanagedAllocationsGetRoomFromManagedBuffers) {
  const Job& j = job(2);
  std::vector<std::string> argv = j.argv;
  // The budget is the whole device: only the device itself can say no. The weights and the
  // gradients (2 MiB each) are unmanaged, the activations (8 MiB) managed.
  const unsigned long long device = j.peak * 3 / 4;
  Outcome shimmed = run(argv, {"CUDASIM_DEVICE_MEMORY=" + std::to_string(device),
                               "DELTA_BUDGET=100%", "DELTA_MIN_BYTES=4MiB"});
  expectSameResults(shimmed, j.plain);
  EXPECT_GT(shimmed.stat("device_full"), 0u) << shimmed.err;
  EXPECT_LT(shimmed.stat("ceiling_bytes"), device);
  EXPECT_NE(shimmed.err.find("the device ran out of memory"), std::string::npos) << shimmed.err;
}

// ---- table-probe: one way of reaching a buffer per run ----

std::vector<std::string> probeScenarios() {
  Outcome listed = run({gProbe, "list"}, {}, false);
  std::vector<std::string> names;
  size_t start = 0;
  while (start < listed.out.size()) {
    size_t end = listed.out.find('\n', start);
    if (end == std::string::npos) end = listed.out.size();
    if (end > start) names.push_back(listed.out.substr(start, end - start));
    start = end + 1;
  }
  return names;
}

TEST(TablesEndToEnd, EveryProbeScenarioWithAndWithoutTheShim) {
  const std::vector<std::string> names = probeScenarios();
  ASSERT_GE(names.size(), 10u);
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    Outcome plain = run({gProbe, name}, {}, false);
    ASSERT_EQ(plain.status, 0) << plain.err;
    EXPECT_EQ(plain.value(name), "ok");
    for (const char* minBytes : {"", "DELTA_MIN_BYTES=0"}) {
      SCOPED_TRACE(minBytes);
      // Three 4 MiB buffers: every target is evicted before the launch that needs it.
      Outcome shimmed = run({gProbe, name}, {"DELTA_BUDGET=12M", "DELTA_POLICY=lru", minBytes});
      EXPECT_EQ(shimmed.status, 0) << shimmed.err;
      expectNoFault(shimmed);
      EXPECT_EQ(shimmed.value(name), "ok") << shimmed.out << shimmed.err;
      EXPECT_GT(shimmed.stat("evictions"), 0u) << shimmed.err;
    }
  }
}

// What a launch brings back follows what the table holds now.
TEST(TablesEndToEnd, LinksFollowTheTablesContents) {
  const std::pair<const char*, const char*> cases[] = {
      {"table-reset", "1"},   // the new target only, not the old one
      {"table-memset", "0"},  // nothing left to follow
      {"table-freed", "0"},   // a new allocation at the freed table's address leads nowhere
      {"host-copy", "2"},
      {"nested-tables", "2"},
  };
  for (const auto& [name, restores] : cases) {
    SCOPED_TRACE(name);
    Outcome shimmed = run({gProbe, name}, {"DELTA_BUDGET=12M", "DELTA_POLICY=lru"});
    ASSERT_EQ(shimmed.status, 0) << shimmed.err;
    EXPECT_EQ(shimmed.value("restores_for_last_launch"), restores) << shimmed.out;
  }
}

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s TRAIN_TABLES LIBDELTA_SO TABLE_PROBE\n", argv[0]);
    return 2;
  }
  gTrainTables = argv[1];
  gShim = argv[2];
  gProbe = argv[3];
  return RUN_ALL_TESTS();
}
