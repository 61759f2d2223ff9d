#include "lines/line_model.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

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

// Frame keys in these tests: small integers standing for the tracer's frame addresses.
constexpr FrameKey kF = 1, kG = 2, kH = 3;

TEST_F(LineAggregatorTest, RepeatLineStartsTheCurrentLineAgain) {
  // GIVEN f on line 2 (a one-line loop jumping back to its own line twice)
  int32_t f = agg.AddCode(file, "f", 1, 3);
  agg.Enter(f, kF, 0, true, 0);
  EXPECT_FALSE(agg.RepeatLine(kF, 5));  // no current line yet: nothing recorded
  EXPECT_TRUE(agg.Line(kF, 2, 10));
  // WHEN
  EXPECT_TRUE(agg.RepeatLine(kF, 20));
  EXPECT_TRUE(agg.RepeatLine(kF, 35));
  EXPECT_FALSE(agg.RepeatLine(kG, 36));  // not the innermost frame
  EXPECT_TRUE(agg.Line(kF, 3, 40));
  agg.Exit(kF, 50);
  // THEN three hits of line 2 and all of its time
  auto lines = agg.Lines();
  EXPECT_EQ(Find(lines, 2)->hits, 3);
  EXPECT_EQ(Find(lines, 2)->wall_time_ns, 30);
  EXPECT_EQ(Find(lines, 3)->hits, 1);
}

TEST_F(LineAggregatorTest, AGeneratorExpressionOnTheCallingLineIsNotCountedTwice) {
  // GIVEN f on line 2 driving a generator expression defined on that line (its own code
  // object), which calls a recorded function g (line 10) twice, 10 ns each, and itself spends
  // 1 ns per resumption on line 2
  int32_t f = agg.AddCode(file, "f", 1, 3);
  int32_t gen = agg.AddCode(file, "<genexpr>", 2, 2);
  int32_t g = agg.AddCode(file, "g", 9, 10);
  agg.Enter(f, kF, 0, true, 0);
  ASSERT_TRUE(agg.Line(kF, 2, 0));
  int64_t t = 5;
  for (int i = 0; i < 2; ++i) {
    agg.EnterAtLine(gen, kG, t, i == 0, 2);  // a start, then a resume
    t += 1;
    agg.EnterAtLine(g, kH, t, true, 10);
    t += 10;
    agg.Exit(kH, t);
    agg.Exit(kG, t);  // yields
  }
  ASSERT_TRUE(agg.Line(kF, 3, 30));
  agg.Exit(kF, 31);
  // THEN line 2 has f's inclusive time once (30 ns, not 30 + the generator's 22), and its self
  // time is what f and the generator spent there outside g (30 - 20)
  auto lines = agg.Lines();
  EXPECT_EQ(Find(lines, 2)->wall_time_ns, 30);
  EXPECT_EQ(Find(lines, 2)->self_time_ns, 10);
  EXPECT_EQ(Find(lines, 2)->hits, 3);  // f's line event and the generator's two
  EXPECT_EQ(Find(lines, 10)->wall_time_ns, 20);
  // AND the function figures are those of three functions
  auto fns = agg.Functions();
  EXPECT_EQ(FindFn(fns, "<genexpr>")->own_time_ns, 2);
  EXPECT_EQ(FindFn(fns, "f")->own_time_ns, 9);
}

TEST_F(LineAggregatorTest, RecursionOnOneLineStillSumsItsActivations) {
  // GIVEN f calling itself from line 2 (the same code object: recursion, not a nested one)
  int32_t f = agg.AddCode(file, "f", 1, 2);
  constexpr FrameKey kInner = 9;
  agg.Enter(f, kF, 0, true, 0);
  ASSERT_TRUE(agg.Line(kF, 2, 0));
  agg.EnterAtLine(f, kInner, 2, true, 2);
  agg.Exit(kInner, 8);
  agg.Exit(kF, 10);
  // THEN line 2 counts both activations, as documented for recursion
  EXPECT_EQ(Find(agg.Lines(), 2)->wall_time_ns, 10 + 6);
}

TEST_F(LineAggregatorTest, CodeObjectsOfOneFunctionAreOneRow) {
  // GIVEN two code objects with the same file, first line and qualname (a notebook cell
  // compiled in two parts), and one that differs only in its first line
  int32_t a = agg.AddCode(file, "<module>", 1, 3);
  int32_t b = agg.AddCode(file, "<module>", 1, 5);
  int32_t c = agg.AddCode(file, "<module>", 7, 8);
  agg.Enter(a, kF, 0, true, 2);
  agg.Exit(kF, 10);
  agg.Enter(b, kG, 10, true, 5);
  agg.Exit(kG, 13);
  agg.Enter(c, kH, 20, true, 7);
  agg.Exit(kH, 21);
  // THEN the first two are one function with both calls and times
  auto fns = agg.Functions();
  ASSERT_EQ(fns.size(), 2u);
  EXPECT_EQ(fns[0].first_line, 1);
  EXPECT_EQ(fns[0].calls, 2);
  EXPECT_EQ(fns[0].total_time_ns, 13);
  EXPECT_EQ(fns[0].own_time_ns, 13);
  EXPECT_EQ(fns[1].first_line, 7);
  EXPECT_EQ(fns[1].calls, 1);
}

TEST_F(LineAggregatorTest, LineCallsCountFreshCallsStartedFromTheLine) {
  int32_t f = agg.AddCode(file, "f", 1, 4);
  int32_t g = agg.AddCode(file, "g", 10, 11);
  agg.Enter(f, kF, 0, true, 0);
  EXPECT_TRUE(agg.Line(kF, 2, 1));
  for (int i = 0; i < 3; ++i) {
    agg.EnterAtLine(g, kG, 2 + 10 * i, true, 11);
    agg.Exit(kG, 5 + 10 * i);
  }
  agg.Enter(g, kH, 40, /*fresh_call=*/false, 11);  // a resume is not a call
  agg.Exit(kH, 41);
  EXPECT_TRUE(agg.Line(kF, 3, 50));
  agg.Exit(kF, 60);
  auto lines = agg.Lines();
  EXPECT_EQ(Find(lines, 2)->calls, 3);
  EXPECT_EQ(Find(lines, 3)->calls, 0);
  EXPECT_EQ(Find(lines, 11)->calls, 0);
}

TEST_F(LineAggregatorTest, DiscardCurrentLineForgetsTheStoppingLine) {
  // GIVEN f whose line 3 is the one that stops the session
  int32_t f = agg.AddCode(file, "f", 1, 4);
  agg.Enter(f, kF, 0, true, 0);
  EXPECT_TRUE(agg.Line(kF, 2, 10));
  EXPECT_TRUE(agg.Line(kF, 3, 20));
  // WHEN
  agg.DiscardCurrentLine();
  agg.CloseAll(100);
  // THEN line 3 has neither a hit nor time; line 2 is intact
  auto lines = agg.Lines();
  EXPECT_EQ(Find(lines, 3), nullptr);
  EXPECT_EQ(Find(lines, 2)->hits, 1);
  EXPECT_EQ(Find(lines, 2)->wall_time_ns, 10);
  agg.DiscardCurrentLine();  // nothing open: no effect
}

TEST_F(LineAggregatorTest, PublishesTheInnermostCurrentLine) {
  // GIVEN a publish target
  std::atomic<uint64_t> current{99};
  agg.PublishTo(&current);
  EXPECT_EQ(current.load(), 0u);  // nothing open
  int32_t f = agg.AddCode(file, "f", 1, 4);
  int32_t g = agg.AddCode(file, "g", 10, 11);
  // WHEN f runs line 2, calls g (line 11), g returns, f goes on to line 3 and ends
  agg.Enter(f, kF, 0, true, 0);
  EXPECT_EQ(current.load(), 0u);  // no current line yet
  agg.Line(kF, 2, 1);
  EXPECT_EQ(current.load(), LineAggregator::LineKey(f, 2));
  agg.EnterAtLine(g, kG, 2, true, 11);
  EXPECT_EQ(current.load(), LineAggregator::LineKey(g, 11));
  agg.Exit(kG, 3);
  EXPECT_EQ(current.load(), LineAggregator::LineKey(f, 2));  // back on the calling line
  agg.Line(kF, 3, 4);
  EXPECT_EQ(current.load(), LineAggregator::LineKey(f, 3));
  agg.DiscardCurrentLine();
  EXPECT_EQ(current.load(), 0u);
  agg.CloseAll(5);
  EXPECT_EQ(current.load(), 0u);
  EXPECT_EQ(agg.code_file(g), file);
}

TEST_F(LineAggregatorTest, LinesGetHitsAndInclusiveTime) {
  // GIVEN f (lines 1-4) calling g (lines 10-11) from line 2
  int32_t f = agg.AddCode(file, "f", 1, 4);
  int32_t g = agg.AddCode(file, "g", 10, 11);
  // WHEN
  agg.Enter(f, kF, 0, true, 0);
  EXPECT_TRUE(agg.Line(kF, 2, 10));
  agg.Enter(g, kG, 20, true, 0);
  EXPECT_TRUE(agg.Line(kG, 11, 25));
  agg.Exit(kG, 60);                   // g took 40
  EXPECT_TRUE(agg.Line(kF, 3, 100));  // line 2 took 90 incl. g
  EXPECT_TRUE(agg.Line(kF, 3, 130));
  agg.Exit(kF, 150);
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
  EXPECT_EQ(agg.mismatches(), 0);
}

TEST_F(LineAggregatorTest, LineOfAFrameThatIsNotInnermostIsRefusedUntilEntered) {
  // GIVEN f open; a tracer that does not report call starts
  int32_t f = agg.AddCode(file, "f", 1, 4);
  int32_t g = agg.AddCode(file, "g", 10, 11);
  agg.Enter(f, kF, 0, true, 0);
  ASSERT_TRUE(agg.Line(kF, 2, 0));
  // WHEN g's first line arrives from a frame the aggregator does not know
  EXPECT_FALSE(agg.Line(kG, 10, 10));
  EXPECT_EQ(agg.depth(), 1u);
  // THEN after the tracer enters it, the line is recorded in g
  agg.EnterAtLine(g, kG, 10, true, 10);
  EXPECT_TRUE(agg.ExitTop(kG, 30));
  EXPECT_FALSE(agg.ExitTop(kG, 30));  // no longer the innermost frame
  EXPECT_TRUE(agg.Line(kF, 3, 40));
  EXPECT_EQ(Find(agg.Lines(), 10)->wall_time_ns, 20);
  EXPECT_EQ(Find(agg.Lines(), 10)->hits, 1);
  EXPECT_EQ(Find(agg.Lines(), 2)->self_time_ns, 20);
  EXPECT_EQ(FindFn(agg.Functions(), "g")->calls, 1);
}

TEST_F(LineAggregatorTest, SuspendedGeneratorAccruesNoTimeAndResumeIsNotACall) {
  int32_t main = agg.AddCode(file, "main", 1, 5);
  int32_t gen = agg.AddCode(file, "gen", 10, 12);
  agg.Enter(main, kF, 0, false, 0);  // adopted frame: began before tracing
  agg.Line(kF, 2, 0);
  agg.Enter(gen, kG, 10, true, 0);  // first next()
  agg.Line(kG, 11, 10);
  agg.Exit(kG, 20);  // yield
  agg.Line(kF, 3, 30);
  agg.Enter(gen, kG, 1000, false, 11);  // resume on the yield line: no new hit
  agg.Line(kG, 12, 1005);
  agg.Exit(kG, 1010);
  agg.CloseAll(2000);
  auto lines = agg.Lines();
  EXPECT_EQ(Find(lines, 11)->hits, 1);
  EXPECT_EQ(Find(lines, 11)->wall_time_ns, 15);   // 10..20 and 1000..1005
  EXPECT_EQ(Find(lines, 3)->wall_time_ns, 1970);  // includes driving the generator
  EXPECT_EQ(Find(lines, 3)->self_time_ns, 1960);  // minus the resumed slice
  auto fns = agg.Functions();
  EXPECT_EQ(FindFn(fns, "gen")->calls, 1);
  EXPECT_EQ(FindFn(fns, "gen")->total_time_ns, 20);
  EXPECT_EQ(FindFn(fns, "main")->calls, 0);  // adopted, began before tracing
}

TEST_F(LineAggregatorTest, RecursionCountsOutermostTotalOnce) {
  int32_t fib = agg.AddCode(file, "fib", 1, 3);
  agg.Enter(fib, kF, 0, true, 0);
  agg.Line(kF, 2, 0);
  EXPECT_FALSE(agg.Line(kG, 2, 10));  // same code, another frame: a new activation
  agg.Enter(fib, kG, 10, true, 0);
  agg.Line(kG, 2, 10);
  agg.Exit(kG, 30);
  agg.Exit(kF, 40);
  auto fns = agg.Functions();
  EXPECT_EQ(FindFn(fns, "fib")->calls, 2);
  EXPECT_EQ(FindFn(fns, "fib")->total_time_ns, 40);
  EXPECT_EQ(FindFn(fns, "fib")->own_time_ns, 40);
  auto lines = agg.Lines();
  EXPECT_EQ(Find(lines, 2)->hits, 2);
  EXPECT_EQ(Find(lines, 2)->wall_time_ns, 60);  // 40 outer + 20 inner (per activation)
}

TEST_F(LineAggregatorTest, EnterOfAnOpenKeyRepairsMissedExits) {
  int32_t f = agg.AddCode(file, "f", 1, 3);
  int32_t g = agg.AddCode(file, "g", 10, 12);
  agg.Enter(f, kF, 0, true, 0);
  agg.Line(kF, 2, 0);
  agg.Enter(g, kG, 10, true, 0);
  agg.Line(kG, 11, 10);
  // WHEN f's frame is reported again although g never exited (an adopted continuation)
  agg.Enter(f, kF, 50, false, 0);
  // THEN g was closed at that moment and f goes on
  EXPECT_EQ(agg.depth(), 1u);
  EXPECT_EQ(agg.mismatches(), 1);
  EXPECT_TRUE(agg.Line(kF, 3, 50));
  agg.CloseAll(60);
  agg.CloseAll(70);  // idempotent
  EXPECT_EQ(agg.depth(), 0u);
  EXPECT_EQ(Find(agg.Lines(), 3)->wall_time_ns, 10);
  EXPECT_EQ(FindFn(agg.Functions(), "g")->total_time_ns, 40);
  EXPECT_EQ(FindFn(agg.Functions(), "f")->calls, 1);
}

TEST_F(LineAggregatorTest, FreshCallOnAReusedKeyClosesTheDeadFrame) {
  // GIVEN g's exit was missed and a new call of h got g's frame address
  int32_t f = agg.AddCode(file, "f", 1, 3);
  int32_t g = agg.AddCode(file, "g", 10, 12);
  int32_t h = agg.AddCode(file, "h", 20, 22);
  agg.Enter(f, kF, 0, true, 0);
  agg.Line(kF, 2, 0);
  agg.Enter(g, kG, 10, true, 0);
  agg.Line(kG, 11, 10);
  agg.Enter(h, kG, 40, true, 0);
  // THEN g ended there and h's line is h's
  EXPECT_EQ(agg.depth(), 2u);
  EXPECT_TRUE(agg.Line(kG, 21, 40));
  agg.CloseAll(50);
  EXPECT_EQ(FindFn(agg.Functions(), "g")->total_time_ns, 30);
  EXPECT_EQ(FindFn(agg.Functions(), "h")->calls, 1);
  EXPECT_EQ(Find(agg.Lines(), 21)->wall_time_ns, 10);
}

TEST_F(LineAggregatorTest, LinesOutsideRegisteredRangeGrowAndShareMerges) {
  int32_t f = agg.AddCode(file, "f", 5, 6);
  int32_t lam = agg.AddCode(file, "<lambda>", 5, 5);
  agg.Enter(f, kF, 0, true, 0);
  agg.Line(kF, 3, 0);
  agg.Line(kF, 9, 1);
  agg.Line(kF, 5, 2);
  agg.Enter(lam, kG, 3, true, 0);
  agg.Line(kG, 5, 3);
  agg.Exit(kG, 4);
  agg.Exit(kF, 5);
  auto lines = agg.Lines();
  EXPECT_EQ(Find(lines, 3)->hits, 1);
  EXPECT_EQ(Find(lines, 9)->hits, 1);
  EXPECT_EQ(Find(lines, 5)->hits, 2);
  // merged: f 2..5, which includes the lambda's 3..4 on the same line (not added again)
  EXPECT_EQ(Find(lines, 5)->wall_time_ns, 3);
  EXPECT_EQ(Find(lines, 5)->self_time_ns, 3);
  EXPECT_EQ(lines.size(), 3u);
}

TEST_F(LineAggregatorTest, GrowingAnArrayKeepsOpenFramesOfThatCodeConsistent) {
  // GIVEN two open activations of f, the outer one on line 2
  int32_t f = agg.AddCode(file, "f", 2, 2);
  agg.Enter(f, kF, 0, true, 0);
  agg.Line(kF, 2, 0);
  agg.Enter(f, kG, 10, true, 0);
  // WHEN the inner one reaches lines outside the range (the array grows twice)
  agg.Line(kG, 1, 10);
  agg.Line(kG, 40, 20);
  agg.Exit(kG, 30);
  agg.Exit(kF, 100);
  // THEN the outer frame's line 2 still gets its time
  auto lines = agg.Lines();
  EXPECT_EQ(Find(lines, 2)->wall_time_ns, 100);
  EXPECT_EQ(Find(lines, 2)->self_time_ns, 80);
  EXPECT_EQ(Find(lines, 1)->wall_time_ns, 10);
  EXPECT_EQ(Find(lines, 40)->wall_time_ns, 10);
}

TEST_F(LineAggregatorTest, ExitOfDeeperFrameClosesFramesAboveAndUnknownExitIsIgnored) {
  int32_t f = agg.AddCode(file, "f", 1, 3);
  int32_t g = agg.AddCode(file, "g", 10, 12);
  agg.AddCode(file, "h", 20, 22);
  agg.Exit(kH, 0);  // h began before tracing: ignored
  EXPECT_EQ(agg.mismatches(), 0);
  agg.Enter(f, kF, 0, true, 0);
  agg.Line(kF, 2, 0);
  agg.Enter(g, kG, 10, true, 0);
  EXPECT_TRUE(agg.IsOpen(kF));
  agg.Exit(kF, 50);  // g's exit was missed
  EXPECT_EQ(agg.depth(), 0u);
  EXPECT_EQ(agg.mismatches(), 1);
  auto fns = agg.Functions();
  EXPECT_EQ(FindFn(fns, "f")->total_time_ns, 50);
  EXPECT_EQ(FindFn(fns, "g")->total_time_ns, 40);
  EXPECT_EQ(FindFn(fns, "h"), nullptr);
}

// The tracer's fast path for a fresh call's first line: TryEnterFreshAtLine, and
// EnterAtLine when it declines, must record exactly what EnterAtLine alone records.
TEST(LineAggregatorFastPathTest, TryEnterFreshAtLineMatchesEnterAtLine) {
  LineAggregator fast, plain;
  struct Codes {
    int32_t f, gen, g, rec;
  };
  auto add = [](LineAggregator& a) {
    int32_t file = a.InternFile("/p/a.py");
    return Codes{a.AddCode(file, "f", 1, 4), a.AddCode(file, "<genexpr>", 2, 2),
                 a.AddCode(file, "g", 9, 10), a.AddCode(file, "rec", 20, 22)};
  };
  Codes cf = add(fast), cp = add(plain);
  int declined = 0;
  auto enter = [&](int32_t Codes::*code, FrameKey key, int64_t t, int32_t line) {
    if (!fast.TryEnterFreshAtLine(cf.*code, key, t, line)) {
      ++declined;
      fast.EnterAtLine(cf.*code, key, t, true, line);
    }
    plain.EnterAtLine(cp.*code, key, t, true, line);
  };
  auto both = [&](auto&& op) {
    op(fast);
    op(plain);
  };
  // a plain call; a frame on its caller's line (declined: shadowing); a line outside the
  // code's range (declined); a key still open at the top (declined: repair); deep recursion
  // past the initial stack capacity (declined once per growth)
  enter(&Codes::f, 1, 0, 2);
  enter(&Codes::g, 2, 1, 10);
  both([](LineAggregator& a) { a.Exit(2, 5); });
  enter(&Codes::gen, 3, 6, 2);
  both([](LineAggregator& a) { a.Exit(3, 8); });
  enter(&Codes::g, 4, 9, 30);
  both([](LineAggregator& a) { a.Exit(4, 11); });
  both([](LineAggregator& a) { a.Line(1, 3, 12); });
  enter(&Codes::g, 5, 13, 10);
  enter(&Codes::g, 5, 14, 9);  // the exit of key 5 was missed
  both([](LineAggregator& a) { a.Exit(5, 15); });
  int64_t t = 20;
  for (FrameKey k = 100; k < 400; ++k) enter(&Codes::rec, k, t++, 21);
  for (FrameKey k = 399; k >= 100; --k) both([&](LineAggregator& a) { a.Exit(k, t); }), ++t;
  both([&](LineAggregator& a) { a.Exit(1, t); });
  EXPECT_GE(declined, 4);
  auto lf = fast.Lines(), lp = plain.Lines();
  ASSERT_EQ(lf.size(), lp.size());
  for (size_t i = 0; i < lf.size(); ++i) {
    EXPECT_EQ(lf[i].line, lp[i].line);
    EXPECT_EQ(lf[i].hits, lp[i].hits) << lf[i].line;
    EXPECT_EQ(lf[i].wall_time_ns, lp[i].wall_time_ns) << lf[i].line;
    EXPECT_EQ(lf[i].self_time_ns, lp[i].self_time_ns) << lf[i].line;
    EXPECT_EQ(lf[i].calls, lp[i].calls) << lf[i].line;
  }
  auto ff = fast.Functions(), fp = plain.Functions();
  ASSERT_EQ(ff.size(), fp.size());
  for (size_t i = 0; i < ff.size(); ++i) {
    EXPECT_EQ(ff[i].qualname, fp[i].qualname);
    EXPECT_EQ(ff[i].calls, fp[i].calls) << ff[i].qualname;
    EXPECT_EQ(ff[i].total_time_ns, fp[i].total_time_ns) << ff[i].qualname;
    EXPECT_EQ(ff[i].own_time_ns, fp[i].own_time_ns) << ff[i].qualname;
  }
  EXPECT_EQ(fast.mismatches(), plain.mismatches());
  EXPECT_EQ(FindFn(ff, "rec")->calls, 300);
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

TEST(PathFilterTest, SyntheticNamesOnlyByIncludeAndExcludeStillWins) {
  // GIVEN code compiled under synthetic names (exec of a string, a notebook cell)
  PathFilter only_include({"/proj"}, {"<cell-*>"}, {}, "/proj");
  PathFilter both({"/proj"}, {"<cell-*>"}, {"<cell-2*>"}, "/proj");
  PathFilter everything_excluded({"/proj"}, {"<cell-*>"}, {"*"}, "/proj");
  // THEN an include records them, and an exclude wins over that include, as for files
  EXPECT_TRUE(only_include.Recorded("<cell-1>"));
  EXPECT_FALSE(only_include.Recorded("<stdin>"));
  EXPECT_TRUE(both.Recorded("<cell-1>"));
  EXPECT_FALSE(both.Recorded("<cell-2>"));
  EXPECT_FALSE(everything_excluded.Recorded("<cell-1>"));
  EXPECT_FALSE(everything_excluded.Recorded("/proj/a.py"));
}

TEST(PathFilterTest, StandardLibraryIsLibraryCodeUnlessIncludedOrHoldingTheRoot) {
  // GIVEN an interpreter installed under the user's home, the project root being the home
  const std::vector<std::string> stdlib = {"/home/u/.pyenv/versions/3.11/lib/python3.11"};
  PathFilter home({"/home/u"}, {}, {}, "/home/u", stdlib);
  PathFilter with_include({"/home/u"}, {"*/json/*"}, {}, "/home/u", stdlib);
  PathFilter inside({"/home/u/.pyenv/versions/3.11/lib/python3.11/json"}, {}, {}, "/", stdlib);
  // THEN its standard library is not the user's code (like site-packages) ...
  EXPECT_TRUE(home.Recorded("/home/u/train.py"));
  EXPECT_FALSE(home.Recorded("/home/u/.pyenv/versions/3.11/lib/python3.11/json/encoder.py"));
  EXPECT_TRUE(home.Recorded("/home/u/.pyenv/versions/3.11/lib/python3.11x/mine.py"));
  // ... unless an include names it, or the root itself lies in it
  EXPECT_TRUE(with_include.Recorded("/home/u/.pyenv/versions/3.11/lib/python3.11/json/encoder.py"));
  EXPECT_TRUE(inside.Recorded("/home/u/.pyenv/versions/3.11/lib/python3.11/json/encoder.py"));
  EXPECT_FALSE(inside.Recorded("/home/u/.pyenv/versions/3.11/lib/python3.11/os.py"));
}

TEST(PathFilterTest, RootAndFilesAreAlsoTakenByTheirResolvedPath) {
  // GIVEN a project directory and a symbolic link to it
  char tmpl[] = "/tmp/pathfilter_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string base = ResolvedPath(tmpl).empty() ? tmpl : ResolvedPath(tmpl);
  const std::string real = base + "/real", link = base + "/link";
  ASSERT_EQ(mkdir(real.c_str(), 0700), 0);
  ASSERT_EQ(symlink(real.c_str(), link.c_str()), 0);
  { std::ofstream(real + "/mod.py") << "x = 1\n"; }
  { std::ofstream(real + "/skip.py") << "x = 1\n"; }
  // WHEN the root is given through the link, or the files are named through it
  PathFilter by_link({link}, {}, {}, "/");
  PathFilter by_real({real}, {}, {"*/link/skip.py"}, "/");
  // THEN the files under the directory are recorded whichever way either is named, and an
  // exclude that matches one form wins
  EXPECT_TRUE(by_link.Recorded(real + "/mod.py"));
  EXPECT_TRUE(by_link.Recorded(link + "/mod.py"));
  EXPECT_TRUE(by_real.Recorded(link + "/mod.py"));
  EXPECT_FALSE(by_real.Recorded(link + "/skip.py"));
  EXPECT_FALSE(by_link.Recorded(base + "/other.py"));
  EXPECT_EQ(ResolvedPath(real + "/mod.py"), "");  // already resolved
  EXPECT_EQ(ResolvedPath(link + "/mod.py"), real + "/mod.py");
  EXPECT_EQ(ResolvedPath(base + "/missing.py"), "");
  // AND a package linked from site-packages into the project (an editable install by link)
  // is the project's code, while site-packages itself is not
  const std::string site = base + "/venv/lib/python3.11/site-packages";
  ASSERT_EQ(std::system(("mkdir -p " + site).c_str()), 0);
  ASSERT_EQ(symlink(real.c_str(), (site + "/proj").c_str()), 0);
  { std::ofstream(site + "/other.py") << "x = 1\n"; }
  EXPECT_TRUE(by_real.Recorded(site + "/proj/mod.py"));
  PathFilter venv_in_root({base}, {}, {}, "/");
  EXPECT_FALSE(venv_in_root.Recorded(site + "/other.py"));
  EXPECT_TRUE(venv_in_root.Recorded(real + "/mod.py"));
  std::remove((site + "/other.py").c_str());
  std::remove((site + "/proj").c_str());
  ASSERT_EQ(std::system(("rm -r " + base + "/venv").c_str()), 0);
  std::remove((real + "/mod.py").c_str());
  std::remove((real + "/skip.py").c_str());
  std::remove(link.c_str());
  rmdir(real.c_str());
  rmdir(base.c_str());
}

TEST(PathFilterTest, NormalizePath) {
  EXPECT_EQ(NormalizePath("a/./b/../c.py", "/x"), "/x/a/c.py");
  EXPECT_EQ(NormalizePath("/a//b/", "/x"), "/a/b");
}

}  // namespace
}  // namespace gpuprof::lines
