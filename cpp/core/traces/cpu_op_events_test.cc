#include "traces/cpu_op_events.h"

#include <gtest/gtest.h>

#include <map>

namespace gpuprof::traces {
namespace {

std::map<std::string, CpuOpTotal> ByName(const std::vector<CpuOpTotal>& v) {
  std::map<std::string, CpuOpTotal> m;
  for (const CpuOpTotal& t : v) m[t.name] = t;
  return m;
}

TEST(AggregateCpuOps, SelfTimeIsDurationMinusDirectChildren) {
  // GIVEN aten::linear [0, 100) holding aten::t [0, 10) and aten::addmm [10, 90), which holds
  // aten::copy_ [20, 30); then aten::relu [100, 120)
  auto r = AggregateCpuOps({{"aten::addmm", 10, 80, 1},
                            {"aten::linear", 0, 100, 1},
                            {"aten::t", 0, 10, 1},
                            {"aten::copy_", 20, 10, 1},
                            {"aten::relu", 100, 20, 1}});
  ASSERT_TRUE(r.ok()) << r.error();
  auto m = ByName(*r);
  // THEN each operator's self time excludes only its own children
  EXPECT_EQ(m["aten::linear"].self_ns, 10);  // 100 - (10 + 80)
  EXPECT_EQ(m["aten::linear"].total_ns, 100);
  EXPECT_EQ(m["aten::addmm"].self_ns, 70);
  EXPECT_EQ(m["aten::t"].self_ns, 10);
  EXPECT_EQ(m["aten::copy_"].self_ns, 10);
  EXPECT_EQ(m["aten::relu"].self_ns, 20);
  // AND the list is sorted by self time
  EXPECT_EQ(r->front().name, "aten::addmm");
  int64_t self_sum = 0;
  for (const auto& t : *r) self_sum += t.self_ns;
  EXPECT_EQ(self_sum, 120);  // the covered wall time: self times never double count
}

TEST(AggregateCpuOps, RepeatedNamesAndThreadsAreKeptApart) {
  // Two threads run overlapping operators at the same time: no nesting across threads.
  auto r = AggregateCpuOps({{"aten::mm", 0, 50, 1},
                            {"aten::mm", 10, 20, 2},
                            {"aten::mm", 60, 30, 1},
                            {"aten::add", 15, 5, 2}});
  ASSERT_TRUE(r.ok()) << r.error();
  auto m = ByName(*r);
  EXPECT_EQ(m["aten::mm"].calls, 3);
  EXPECT_EQ(m["aten::mm"].self_ns, 50 + 15 + 30);
  EXPECT_EQ(m["aten::mm"].total_ns, 100);
  EXPECT_EQ(m["aten::add"].self_ns, 5);
}

TEST(AggregateCpuOps, EqualStartsNestTheShorterAndOverrunsAreClipped) {
  // aten::to and aten::_to_copy start together: the longer one is the parent. A child that
  // ends 5 ns after its parent (clock jitter) takes away only the parent's remaining time.
  auto r = AggregateCpuOps({{"aten::_to_copy", 0, 40, 7},
                            {"aten::to", 0, 50, 7},
                            {"aten::outer", 100, 20, 7},
                            {"aten::inner", 110, 15, 7}});
  ASSERT_TRUE(r.ok()) << r.error();
  auto m = ByName(*r);
  EXPECT_EQ(m["aten::to"].self_ns, 10);
  EXPECT_EQ(m["aten::_to_copy"].self_ns, 40);
  EXPECT_EQ(m["aten::outer"].self_ns, 10);
  EXPECT_EQ(m["aten::inner"].self_ns, 15);
}

TEST(AggregateCpuOps, AnOperatorRedispatchingToItselfIsOneCall) {
  // aten::sum [0, 100) whose only child is aten::sum [5, 90), which holds aten::fill_ [10, 20):
  // one call of aten::sum, as torch's key_averages reports it; a same-name child among others
  // stays a call of its own.
  auto r = AggregateCpuOps({{"aten::sum", 0, 100, 1},
                            {"aten::sum", 5, 85, 1},
                            {"aten::fill_", 10, 10, 1},
                            {"aten::add", 200, 50, 1},
                            {"aten::add", 205, 10, 1},
                            {"aten::mul", 220, 10, 1}});
  ASSERT_TRUE(r.ok()) << r.error();
  auto m = ByName(*r);
  EXPECT_EQ(m["aten::sum"].calls, 1);
  EXPECT_EQ(m["aten::sum"].self_ns, 90);
  EXPECT_EQ(m["aten::sum"].total_ns, 100);
  EXPECT_EQ(m["aten::fill_"].self_ns, 10);
  EXPECT_EQ(m["aten::add"].calls, 2);
  EXPECT_EQ(m["aten::add"].self_ns, 30 + 10);
}

TEST(AggregateCpuOps, NothingInNothingOutAndBadDurationsAreErrors) {
  auto empty = AggregateCpuOps({});
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
  auto bad = AggregateCpuOps({{"aten::mm", 0, -1, 1}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().find("aten::mm"), std::string::npos);
  EXPECT_NE(bad.error().find("negative duration"), std::string::npos);
}

}  // namespace
}  // namespace gpuprof::traces
