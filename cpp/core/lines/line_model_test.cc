#include "lines/line_model.h"

#include <gtest/gtest.h>

namespace gpuprof::lines {
namespace {

const LineStats* Find(const std::vector<LineStats>& v, int32_t line) {
  for (const auto& s : v)
    if (s.line == line) return &s;
  return nullptr;
}

const FunctionStats* FindFn(const std::vector<FunctionStats>& v, const std::string& name) {
  for (const auto& f : v)
    if (f.qualname == name) return &f;
  return nullptr;
}

class LineAggregatorTest : public ::testing::Test {
 protected:
  LineAggregator agg;
  int32_t file = agg.InternFile("/p/a.py");
};

TEST_F(LineAggregatorTest, LinesGetHitsAndInclusiveTime) {
  // GIVEN f (lines 1-4) calling g (lines 10-11) from line 2
  int32_t f = agg.AddCode(file, "f", 1, 4);
  int32_t g = agg.AddCode(file, "g", 10, 11);
  // WHEN
  agg.Enter(f, 0, true, 0);
  agg.Line(f, 2, 10);
  agg.Enter(g, 20, true, 0);
  agg.Line(g, 11, 25);
  agg.Leave(60, true);  // g took 40
  agg.Line(f, 3, 100);  // line 2 took 90 incl. g
  agg.Line(f, 3, 130);
  agg.Leave(150, true);
  // THEN
  auto lines = agg.Lines();
  ASSERT_NE(Find(lines, 2), nullptr);
  EXPECT_EQ(Find(lines, 2)->hits, 1);
  EXPECT_EQ(Find(lines, 2)->wall_time_ns, 90);
  EXPECT_EQ(Find(lines, 2)->self_time_ns, 50);
  EXPECT_EQ(Find(lines, 3)->hits, 2);
  EXPECT_EQ(Find(lines, 3)->wall_time_ns, 50);
  EXPECT_EQ(Find(lines, 11)->wall_time_ns, 35);
  EXPECT_FALSE(Find(lines, 2)->gpu.has_value());
  EXPECT_FALSE(Find(lines, 2)->memory_bytes.has_value());
  auto fns = agg.Functions();
  EXPECT_EQ(FindFn(fns, "f")->total_time_ns, 150);
  EXPECT_EQ(FindFn(fns, "f")->own_time_ns, 110);
  EXPECT_EQ(FindFn(fns, "g")->calls, 1);
  EXPECT_EQ(FindFn(fns, "g")->total_time_ns, 40);
}

TEST_F(LineAggregatorTest, SuspendedGeneratorAccruesNoTimeAndResumeIsNotACall) {
  int32_t main = agg.AddCode(file, "main", 1, 5);
  int32_t gen = agg.AddCode(file, "gen", 10, 12);
  agg.Line(main, 2, 0);            // adopted frame
  agg.Enter(gen, 10, true, 0);     // first next()
  agg.Line(gen, 11, 10);
  agg.Leave(20, false);            // yield
  agg.Line(main, 3, 30);
  agg.Enter(gen, 1000, false, 11); // resume on the yield line: no new hit
  agg.Line(gen, 12, 1005);
  agg.Leave(1010, true);
  agg.CloseAll(2000);
  auto lines = agg.Lines();
  EXPECT_EQ(Find(lines, 11)->hits, 1);
  EXPECT_EQ(Find(lines, 11)->wall_time_ns, 15);  // 10..20 and 1000..1005
  EXPECT_EQ(Find(lines, 3)->wall_time_ns, 1970);  // includes driving the generator
  EXPECT_EQ(Find(lines, 3)->self_time_ns, 1960);  // minus the resumed slice
  auto fns = agg.Functions();
  EXPECT_EQ(FindFn(fns, "gen")->calls, 1);
  EXPECT_EQ(FindFn(fns, "gen")->total_time_ns, 20);
  EXPECT_EQ(FindFn(fns, "main")->calls, 0);  // adopted, began before tracing
}

TEST_F(LineAggregatorTest, RecursionCountsOutermostTotalOnce) {
  int32_t fib = agg.AddCode(file, "fib", 1, 3);
  agg.Enter(fib, 0, true, 0);
  agg.Line(fib, 2, 0);
  agg.Enter(fib, 10, true, 0);
  agg.Line(fib, 2, 10);
  agg.Leave(30, true);
  agg.Leave(40, true);
  auto fns = agg.Functions();
  EXPECT_EQ(FindFn(fns, "fib")->calls, 2);
  EXPECT_EQ(FindFn(fns, "fib")->total_time_ns, 40);
  EXPECT_EQ(FindFn(fns, "fib")->own_time_ns, 40);
  auto lines = agg.Lines();
  EXPECT_EQ(Find(lines, 2)->hits, 2);
  EXPECT_EQ(Find(lines, 2)->wall_time_ns, 60);  // 40 outer + 20 inner (per activation)
}

TEST_F(LineAggregatorTest, LineInDeeperFrameRepairsMissedExits) {
  int32_t f = agg.AddCode(file, "f", 1, 3);
  int32_t g = agg.AddCode(file, "g", 10, 12);
  agg.Enter(f, 0, true, 0);
  agg.Line(f, 2, 0);
  agg.Enter(g, 10, true, 0);
  agg.Line(g, 11, 10);
  agg.Line(f, 3, 50);  // g's exit was never reported
  EXPECT_EQ(agg.depth(), 1u);
  EXPECT_EQ(agg.mismatches(), 1);
  agg.CloseAll(60);
  agg.CloseAll(70);  // idempotent
  EXPECT_EQ(agg.depth(), 0u);
  EXPECT_EQ(Find(agg.Lines(), 3)->wall_time_ns, 10);
}

TEST_F(LineAggregatorTest, LinesOutsideRegisteredRangeGrowAndShareMerges) {
  int32_t f = agg.AddCode(file, "f", 5, 6);
  int32_t lam = agg.AddCode(file, "<lambda>", 5, 5);
  agg.Enter(f, 0, true, 0);
  agg.Line(f, 3, 0);
  agg.Line(f, 9, 1);
  agg.Line(f, 5, 2);
  agg.Enter(lam, 3, true, 0);
  agg.Line(lam, 5, 3);
  agg.Leave(4, true);
  agg.Leave(5, true);
  auto lines = agg.Lines();
  EXPECT_EQ(Find(lines, 3)->hits, 1);
  EXPECT_EQ(Find(lines, 9)->hits, 1);
  EXPECT_EQ(Find(lines, 5)->hits, 2);
  EXPECT_EQ(lines.size(), 3u);
}

TEST_F(LineAggregatorTest, ExitOfDeeperFrameClosesFramesAboveAndUnknownExitIsIgnored) {
  int32_t f = agg.AddCode(file, "f", 1, 3);
  int32_t g = agg.AddCode(file, "g", 10, 12);
  int32_t h = agg.AddCode(file, "h", 20, 22);
  agg.Exit(h, 0, true);  // h began before tracing: ignored
  agg.Enter(f, 0, true, 0);
  agg.Line(f, 2, 0);
  agg.Enter(g, 10, true, 0);
  agg.Exit(f, 50, true);  // g's exit was missed
  EXPECT_EQ(agg.depth(), 0u);
  auto fns = agg.Functions();
  EXPECT_EQ(FindFn(fns, "f")->total_time_ns, 50);
  EXPECT_EQ(FindFn(fns, "g")->total_time_ns, 40);
  EXPECT_EQ(FindFn(fns, "h"), nullptr);
}

TEST(PathFilterTest, RootIncludeExcludeAndSitePackages) {
  PathFilter pf({"/proj"}, {"*/vendor/*.py"}, {"tests/*", "*_gen.py"}, "/proj");
  EXPECT_TRUE(pf.Recorded("/proj/a.py"));
  EXPECT_TRUE(pf.Recorded("b/c.py"));  // relative to cwd
  EXPECT_FALSE(pf.Recorded("/projx/a.py"));
  EXPECT_FALSE(pf.Recorded("/proj/tests/t.py"));
  EXPECT_FALSE(pf.Recorded("/proj/x_gen.py"));
  EXPECT_FALSE(pf.Recorded("/proj/.venv/lib/python3.11/site-packages/numpy/a.py"));
  EXPECT_TRUE(pf.Recorded("/opt/vendor/lib.py"));
  EXPECT_FALSE(pf.Recorded("/usr/lib/python3.11/json/decoder.py"));
  EXPECT_FALSE(pf.Recorded("<string>"));
  EXPECT_TRUE(pf.Recorded("/proj/sub/../a.py"));
}

TEST(PathFilterTest, NormalizePath) {
  EXPECT_EQ(NormalizePath("a/./b/../c.py", "/x"), "/x/a/c.py");
  EXPECT_EQ(NormalizePath("/a//b/", "/x"), "/a/b");
}

}  // namespace
}  // namespace gpuprof::lines
