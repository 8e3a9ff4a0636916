// PickleWriter's bytes against the encodings Python's pickle gives the same values
// (pickle.dumps(v, 2), memo opcodes aside: the writer keeps no memo).
#include "tools/pytorch_snapshot.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace delta::tools {
namespace {

using namespace std::string_literals;

std::string encode(void (*write)(PickleWriter&)) {
  PickleWriter p;
  p.begin();
  write(p);
  p.end();
  return p.take();
}

TEST(PickleWriter, SmallIntegersTakeTheShortestOpcode) {
  EXPECT_EQ(encode([](PickleWriter& p) { p.integer(5); }), "\x80\x02K\x05."s);
  EXPECT_EQ(encode([](PickleWriter& p) { p.integer(300); }), "\x80\x02M\x2c\x01."s);
  EXPECT_EQ(encode([](PickleWriter& p) { p.integer(70000); }), "\x80\x02Jp\x11\x01\x00."s);
  EXPECT_EQ(encode([](PickleWriter& p) { p.integer(-1); }), "\x80\x02J\xff\xff\xff\xff."s);
}

TEST(PickleWriter, WideIntegersAreMinimalTwosComplement) {
  EXPECT_EQ(encode([](PickleWriter& p) { p.integer(std::int64_t{1} << 31); }),
            "\x80\x02\x8a\x05\x00\x00\x00\x80\x00."s);
  EXPECT_EQ(encode([](PickleWriter& p) { p.unsignedInteger(std::uint64_t{1} << 40); }),
            "\x80\x02\x8a\x06\x00\x00\x00\x00\x00\x01."s);
  EXPECT_EQ(encode([](PickleWriter& p) { p.integer(-(std::int64_t{1} << 40)); }),
            "\x80\x02\x8a\x06\x00\x00\x00\x00\x00\xff."s);
  // A device address with the top bit set stays positive.
  EXPECT_EQ(encode([](PickleWriter& p) { p.unsignedInteger(UINT64_MAX); }),
            "\x80\x02\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00."s);
}

TEST(PickleWriter, ScalarsAndStrings) {
  EXPECT_EQ(encode([](PickleWriter& p) { p.string("ab"); }), "\x80\x02X\x02\x00\x00\x00" "ab."s);
  EXPECT_EQ(encode([](PickleWriter& p) { p.none(); }), "\x80\x02N."s);
  EXPECT_EQ(encode([](PickleWriter& p) { p.boolean(true); }), "\x80\x02\x88."s);
  EXPECT_EQ(encode([](PickleWriter& p) { p.boolean(false); }), "\x80\x02\x89."s);
}

TEST(PickleWriter, Containers) {
  EXPECT_EQ(encode([](PickleWriter& p) { p.beginDict(); p.endDict(); }), "\x80\x02}."s);
  EXPECT_EQ(encode([](PickleWriter& p) { p.beginList(); p.endList(); }), "\x80\x02]."s);
  // {"a": [1, (2, 3)]}
  EXPECT_EQ(encode([](PickleWriter& p) {
              p.beginDict();
              p.key("a");
              p.beginList();
              p.integer(1);
              p.beginTuple();
              p.integer(2);
              p.integer(3);
              p.endTuple();
              p.endList();
              p.endDict();
            }),
            "\x80\x02}(X\x01\x00\x00\x00" "a](K\x01(K\x02K\x03teu."s);
}

TEST(PickleWriter, LongListsGoOutInBatches) {
  PickleWriter p;
  p.beginList();
  for (std::size_t i = 0; i < PickleWriter::kBatch + 1; ++i) p.none();
  p.endList();
  const std::string want =
      "](" + std::string(PickleWriter::kBatch, 'N') + "e(Ne";
  EXPECT_EQ(p.take(), want);
}

}  // namespace
}  // namespace delta::tools
