// PlayPlan: the roles, expected producers, sizes and tokens delta-play works from.
#include "tools/play/play_plan.h"

#include <gtest/gtest.h>

#include <set>

namespace delta::play {
namespace {

using policy::Workload;
using policy::WorkloadBuffer;
using policy::WorkloadOp;

// w (persistent) -> fwd: a = f(w) -> bwd: g = f(a, w) -> sgd: w -= g (in place) ; a, g freed.
Workload trainingStep() {
  Workload w;
  w.buffers = {WorkloadBuffer{"w", 4096, true, -1, policy::kUnknownNs},
               WorkloadBuffer{"a", 8192, false, 0, 100},
               WorkloadBuffer{"g", 4096, false, 1, 200}};
  w.ops.resize(3);
  w.ops[0] = WorkloadOp{"fwd", 100, {1}, {0}, {}, {}};
  w.ops[1] = WorkloadOp{"bwd", 200, {2}, {1, 0}, {}, {1}};
  w.ops[2] = WorkloadOp{"sgd", 50, {}, {2}, {0}, {2}};
  EXPECT_EQ(w.validate(), "");
  return w;
}

const Param& paramOf(const OpPlan& op, BufferId buffer) {
  for (const Param& p : op.params)
    if (p.buffer == buffer) return p;
  static const Param kNone{};
  ADD_FAILURE() << "no parameter for buffer " << buffer;
  return kNone;
}

TEST(PlayPlan, InputsExpectTheirLastWriterInProgramOrder) {
  const Workload w = trainingStep();
  const PlayPlan plan(w);
  ASSERT_EQ(plan.ops(), 3u);
  // fwd reads w: written in place by sgd in the iteration before (the start, in iteration 0).
  const Param& wInFwd = paramOf(plan.op(0), 0);
  EXPECT_EQ(wInFwd.role, Role::kRead);
  EXPECT_EQ(wInFwd.producer, 2);
  EXPECT_TRUE(wInFwd.previousIteration);
  EXPECT_EQ(plan.expected(0, wInFwd), 0u);
  EXPECT_EQ(plan.expected(4, wInFwd), plan.serial(3, 2));
  // bwd reads a, written by fwd in the same iteration.
  const Param& aInBwd = paramOf(plan.op(1), 1);
  EXPECT_EQ(aInBwd.producer, 0);
  EXPECT_FALSE(aInBwd.previousIteration);
  EXPECT_EQ(plan.expected(2, aInBwd), plan.serial(2, 0));
  // sgd writes w in place (checked, then stamped) and reads g.
  const Param& wInSgd = paramOf(plan.op(2), 0);
  EXPECT_EQ(wInSgd.role, Role::kWrite);
  EXPECT_TRUE(wInSgd.previousIteration);
  EXPECT_EQ(paramOf(plan.op(2), 2).producer, 1);
  EXPECT_EQ(paramOf(plan.op(0), 1).role, Role::kAlloc);
  EXPECT_EQ(plan.maxParams(), 3u);
}

TEST(PlayPlan, SerialsAreDistinctOverIterations) {
  const Workload w = trainingStep();
  const PlayPlan plan(w);
  std::set<uint64_t> serials;
  for (uint32_t i = 0; i < 4; ++i)
    for (size_t op = 0; op < plan.ops(); ++op) serials.insert(plan.serial(i, op));
  EXPECT_EQ(serials.size(), 12u);
  EXPECT_EQ(serials.count(0), 0u);  // 0 is the start
}

TEST(PlayPlan, RecomputeKnowsWhatAResultNeedsAndWhatAnInPlaceWriteSpoils) {
  const Workload w = trainingStep();
  const PlayPlan plan(w);
  EXPECT_FALSE(plan.recomputable(0));  // persistent
  EXPECT_TRUE(plan.recomputable(1));
  EXPECT_TRUE(plan.recomputable(2));
  EXPECT_EQ(plan.producerInputs(1), (std::vector<BufferId>{0}));
  EXPECT_EQ(plan.producerInputs(2), (std::vector<BufferId>{1, 0}));
  // sgd writes w: a and g were computed from it.
  EXPECT_EQ(plan.dependents(0), (std::vector<BufferId>{1, 2}));
  EXPECT_EQ(plan.dependents(1), (std::vector<BufferId>{2}));
  EXPECT_TRUE(plan.dependents(2).empty());
}

// Scaled sizes: played_sizes_test (tools::playedBytes).
TEST(PlayPlan, TokenPlaces) {
  EXPECT_EQ(PlayPlan::tokenOffsets(64), (std::vector<uint64_t>{0, 32, 56}));
  EXPECT_EQ(PlayPlan::tokenOffsets(4096), (std::vector<uint64_t>{0, 2048, 4088}));
  EXPECT_EQ(PlayPlan::tokenOffsets(8), (std::vector<uint64_t>{0}));
  EXPECT_NE(PlayPlan::token(5, 1), PlayPlan::token(5, 2));
  EXPECT_NE(PlayPlan::token(5, 1), PlayPlan::token(6, 1));
}

}  // namespace
}  // namespace delta::play
