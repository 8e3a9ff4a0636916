// The DTR-log importer on small hand-written logs (no shared traces needed).
#include "policy/dtr_log_reader.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#if DELTA_HAVE_ZLIB
#include <zlib.h>
#endif

namespace delta::policy {
namespace {

const Workload& expectOk(const ImportResult& r) {
  EXPECT_EQ(r.error, "");
  return r.workload;
}

BufferId byName(const Workload& w, const std::string& name) {
  for (BufferId i = 0; i < w.buffers.size(); ++i) {
    if (w.buffers[i].name == name) return i;
  }
  ADD_FAILURE() << "no buffer " << name;
  return kNoBuffer;
}

TEST(DtrLogReader, TinyFixtureStructure) {
  const ImportResult r = readDtrLog(DELTA_FIXTURES "/tiny_dtr.log");
  const Workload& w = expectOk(r);
  ASSERT_EQ(w.ops.size(), 5u);  // conv, view, relu, add_, sum
  EXPECT_EQ(w.validate(), "");
  // Storages: w, x (constants), a (shared with the view av), b, s.
  ASSERT_EQ(w.buffers.size(), 5u);
  const BufferId a = byName(w, "a"), b = byName(w, "b"), s = byName(w, "s");
  EXPECT_TRUE(w.buffers[byName(w, "w")].persistent);
  EXPECT_EQ(w.buffers[byName(w, "x")].bytes, 4000u);
  EXPECT_EQ(w.buffers[a].bytes, 8000u);
  EXPECT_EQ(w.buffers[a].producer, 0);
  EXPECT_EQ(w.buffers[a].recompute_ns, 500);
  EXPECT_EQ(w.buffers[b].recompute_ns, 200);
  // The view allocates nothing and reads a; relu reads a's storage through the view.
  EXPECT_TRUE(w.ops[1].allocs.empty());
  EXPECT_EQ(w.ops[2].reads, std::vector<BufferId>{a});
  // MUTATE writes c == b's storage in place and reads both.
  EXPECT_EQ(w.ops[3].writes, std::vector<BufferId>{b});
  EXPECT_EQ(w.ops[3].compute_ns, 100);
  // b dies when COPY_FROM rebinds c after RELEASE b; a dies with the view and c's release.
  EXPECT_EQ(w.ops[3].frees, std::vector<BufferId>{b});
  bool a_freed_after_sum = false;
  for (BufferId id : w.ops[4].frees) a_freed_after_sum = a_freed_after_sum || id == a;
  EXPECT_TRUE(a_freed_after_sum);
  bool s_freed = false;  // still referenced at the end: freed after the last op
  for (BufferId id : w.ops[4].frees) s_freed = s_freed || id == s;
  EXPECT_TRUE(s_freed);
  EXPECT_EQ(w.computeNs(), 851);
  EXPECT_EQ(w.peakBytes(), 1000u + 4000u + 8000u + 8000u);
}

struct BadCase {
  const char* name;
  const char* text;
  const char* error;  // substring
};

class DtrLogReaderBad : public ::testing::TestWithParam<BadCase> {};

TEST_P(DtrLogReaderBad, ReportsLineAndCause) {
  const ImportResult r = parseDtrLog(GetParam().text, "t.log");
  EXPECT_NE(r.error.find(GetParam().error), std::string::npos) << r.error;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, DtrLogReaderBad,
    ::testing::Values(
        BadCase{"not_json", "hello\n", "t.log:1: not a JSON object"},
        BadCase{"no_instruction", "{\"NAME\":\"x\"}\n", "no \"INSTRUCTION\""},
        BadCase{"unknown_instruction", "{\"INSTRUCTION\":\"JUMP\"}\n", "unknown instruction \"JUMP\""},
        BadCase{"unknown_tensor", "{\"INSTRUCTION\":\"RELEASE\",\"NAME\":\"q\"}\n", "unknown tensor"},
        BadCase{"bad_time",
                "{\"INSTRUCTION\":\"CONSTANT\",\"NAME\":\"x\"}\n"
                "{\"INSTRUCTION\":\"CALL\",\"NAME\":\"f\",\"ARGS\":[\"x\"],\"RESULT\":[],\"TIME\":\"1.5\"}\n",
                "t.log:2: \"CALL\" without a valid \"TIME\""},
        BadCase{"trailing", "{\"INSTRUCTION\":\"ANNOTATE\",\"ANNOTATION\":\"START\"} x\n", "trailing text"},
        BadCase{"nested", "{\"INSTRUCTION\":{\"a\":1}}\n", "expected a string"},
        BadCase{"missing_alias",
                "{\"INSTRUCTION\":\"CONSTANT\",\"NAME\":\"x\"}\n"
                "{\"INSTRUCTION\":\"CALL\",\"NAME\":\"f\",\"ARGS\":[\"x\"],\"RESULT\":[\"y\"],\"TIME\":\"5\"}\n"
                "{\"INSTRUCTION\":\"MEMORY\",\"NAME\":\"y\",\"MEMORY\":\"8\"}\n",
                "ends before the ALIAS line"},
        BadCase{"empty", "", "no CALL or MUTATE"}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(DtrLogReader, SecondStartEndsTheIteration) {
  const char* text =
      "{\"INSTRUCTION\":\"ANNOTATE\",\"ANNOTATION\":\"START\"}\n"
      "{\"INSTRUCTION\":\"CONSTANT\",\"NAME\":\"x\"}\n"
      "{\"INSTRUCTION\":\"MEMORY\",\"NAME\":\"x\",\"MEMORY\":\"8\"}\n"
      "{\"INSTRUCTION\":\"CALL\",\"NAME\":\"f\",\"ARGS\":[\"x\"],\"RESULT\":[],\"TIME\":5}\n"
      "{\"INSTRUCTION\":\"ANNOTATE\",\"ANNOTATION\":\"START\"}\n"
      "{\"INSTRUCTION\":\"CALL\",\"NAME\":\"g\",\"ARGS\":[\"x\"],\"RESULT\":[],\"TIME\":5}\n";
  const ImportResult r = parseDtrLog(text, "t");
  EXPECT_EQ(expectOk(r).ops.size(), 1u);
}

TEST(DtrLogReader, MissingFileIsAClearError) {
  const ImportResult r = readDtrLog("/nonexistent/dir/x.log.gz");
  EXPECT_NE(r.error.find("/nonexistent/dir/x.log.gz: No such file"), std::string::npos) << r.error;
}

#if DELTA_HAVE_ZLIB
TEST(DtrLogReader, ReadsGzipLikePlain) {
  std::ifstream in(DELTA_FIXTURES "/tiny_dtr.log");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string path = ::testing::TempDir() + "tiny_dtr.log.gz";
  gzFile gz = gzopen(path.c_str(), "wb");
  ASSERT_NE(gz, nullptr);
  gzwrite(gz, text.data(), static_cast<unsigned>(text.size()));
  gzclose(gz);
  const ImportResult r = readDtrLog(path);
  EXPECT_EQ(expectOk(r).ops.size(), 5u);
  std::remove(path.c_str());
}
#endif

}  // namespace
}  // namespace delta::policy
