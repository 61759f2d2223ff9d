#include "record/step_assembler.h"

#include <gtest/gtest.h>

#include <map>

namespace gpuprof::record {
namespace {

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kAnchor = 1'000 * kMs;

// Collects what the assembler emits.
struct Collected {
  std::vector<store::StepRow> steps;
  std::map<std::pair<int64_t, std::string>, store::PhaseRow> phases;
  std::vector<store::PhaseGpuRow> late_gpu;
  std::vector<store::DiagnosticRow> diagnostics;
  std::vector<store::CommBucketRow> comm;
};

class StepAssemblerTest : public ::testing::Test {
 protected:
  StepAssemblerTest()
      : asm_(&names_, kAnchor, [this](store::Row&& row) {
          if (auto* s = std::get_if<store::StepRow>(&row)) out_.steps.push_back(*s);
          if (auto* p = std::get_if<store::PhaseRow>(&row)) out_.phases[{p->step, p->name}] = *p;
          if (auto* g = std::get_if<store::PhaseGpuRow>(&row)) out_.late_gpu.push_back(*g);
          if (auto* d = std::get_if<store::DiagnosticRow>(&row)) out_.diagnostics.push_back(*d);
          if (auto* c = std::get_if<store::CommBucketRow>(&row)) out_.comm.push_back(*c);
        }) {}

  // Feeds an event at kAnchor + t_ms.
  void At(double t_ms, EventKind kind, uint32_t arg = 0, int64_t value = 0) {
    asm_.OnEvent(Event{kAnchor + static_cast<int64_t>(t_ms * kMs), value, arg, kind, 0});
  }
  // One auto iteration: forward [t, t+f], backward [.., +b], optimizer [.., +o].
  double Iteration(double t, double f, double b, double o) {
    At(t, EventKind::kForwardBegin);
    At(t + f, EventKind::kForwardEnd);
    At(t + f, EventKind::kBackwardBegin);
    At(t + f + b, EventKind::kBackwardEnd);
    At(t + f + b, EventKind::kOptimizerBegin);
    At(t + f + b + o, EventKind::kOptimizerEnd);
    return t + f + b + o;
  }
  // A bucket's collective over [kAnchor + start_ms, kAnchor + end_ms].
  void Bucket(int64_t bucket, double start_ms, double end_ms) {
    const int64_t start = kAnchor + static_cast<int64_t>(start_ms * kMs);
    const int64_t end = kAnchor + static_cast<int64_t>(end_ms * kMs);
    asm_.OnCommBucket(store::CommBucketRow{-1, bucket, start, end, 4096});
  }
  int64_t PhaseWall(int64_t step, const std::string& name) {
    auto it = out_.phases.find({step, name});
    return it == out_.phases.end() ? -1 : it->second.wall_ns;
  }

  PhaseNames names_;
  Collected out_;
  StepAssembler asm_;
};

TEST_F(StepAssemblerTest, AutoStepsTileTheTimelineAndGapIsDataloaderWait) {
  // GIVEN three iterations separated by 4 ms of loader wait
  double t = Iteration(10, 2, 3, 1);  // step 0: 10..16
  t = Iteration(t + 4, 2, 3, 1);      // step 1: 16..26 (wait 4)
  t = Iteration(t + 4, 2, 3, 1);      // step 2: 26..36 (wait 4)
  asm_.Finish(kAnchor + 100 * kMs);
  // THEN there are three steps; step 0 starts at its first forward and has no gap wait
  ASSERT_EQ(out_.steps.size(), 3u);
  EXPECT_EQ(out_.steps[0].step, 0);
  EXPECT_EQ(out_.steps[0].start_ns, 10 * kMs);
  EXPECT_EQ(out_.steps[0].end_ns, 16 * kMs);
  EXPECT_FALSE(out_.steps[0].wait_ns.has_value());
  // AND later steps start where the previous ended and carry the gap as wait
  EXPECT_EQ(out_.steps[1].start_ns, 16 * kMs);
  EXPECT_EQ(out_.steps[1].end_ns, 26 * kMs);
  EXPECT_EQ(out_.steps[1].wait_ns, 4 * kMs);
  EXPECT_EQ(out_.steps[1].wait_source, "gap");
  EXPECT_EQ(out_.steps[2].step, 2);
  // AND phase walls are the call durations
  EXPECT_EQ(PhaseWall(1, "forward"), 2 * kMs);
  EXPECT_EQ(PhaseWall(1, "backward"), 3 * kMs);
  EXPECT_EQ(PhaseWall(1, "optimizer"), 1 * kMs);
  EXPECT_EQ(out_.steps[1].forward_calls, 1);
  EXPECT_EQ(out_.steps[1].optimizer_calls, 1);
}

TEST_F(StepAssemblerTest, GradientAccumulationIsOneStep) {
  // GIVEN four forward+backward pairs and then one optimizer step
  double t = 0;
  for (int i = 0; i < 4; ++i) {
    At(t, EventKind::kForwardBegin);
    At(t + 1, EventKind::kForwardEnd);
    At(t + 1, EventKind::kBackwardBegin);
    At(t + 3, EventKind::kBackwardEnd);
    t += 4;
  }
  At(t, EventKind::kOptimizerBegin);
  At(t + 1, EventKind::kOptimizerEnd);
  asm_.Finish(kAnchor + 100 * kMs);
  // THEN it is one step with summed phases and four calls each
  ASSERT_EQ(out_.steps.size(), 1u);
  EXPECT_EQ(out_.steps[0].forward_calls, 4);
  EXPECT_EQ(out_.steps[0].backward_calls, 4);
  EXPECT_EQ(out_.steps[0].optimizer_calls, 1);
  EXPECT_EQ(PhaseWall(0, "forward"), 4 * kMs);
  EXPECT_EQ(PhaseWall(0, "backward"), 8 * kMs);
  EXPECT_EQ(out_.steps[0].end_ns, 17 * kMs);
}

TEST_F(StepAssemblerTest, SeveralOptimizersInOneIterationAreOneStep) {
  // GIVEN a GAN-like iteration: forward, backward, then two optimizers stepping back to back
  for (int it = 0; it < 2; ++it) {
    const double t = it * 20.0;
    At(t, EventKind::kForwardBegin);
    At(t + 2, EventKind::kForwardEnd);
    At(t + 2, EventKind::kBackwardBegin);
    At(t + 5, EventKind::kBackwardEnd);
    At(t + 6, EventKind::kOptimizerBegin);
    At(t + 7, EventKind::kOptimizerEnd);
    At(t + 8, EventKind::kOptimizerBegin);
    At(t + 9, EventKind::kOptimizerEnd);
  }
  asm_.Finish(kAnchor + 100 * kMs);
  // THEN there are two steps, each with two optimizer calls, ending at the second one
  ASSERT_EQ(out_.steps.size(), 2u);
  EXPECT_EQ(out_.steps[0].optimizer_calls, 2);
  EXPECT_EQ(out_.steps[0].end_ns, 9 * kMs);
  EXPECT_EQ(PhaseWall(0, "optimizer"), 2 * kMs);
  EXPECT_EQ(out_.steps[1].wait_ns, 11 * kMs);
}

TEST_F(StepAssemblerTest, ClosureStyleStepsStartAtTheOptimizerAndExcludeTheClosure) {
  // GIVEN optimizer.step(closure) three times, 4 ms apart: the optimizer begins, the closure
  // runs forward (2 ms) and backward (3 ms) inside it, then the optimizer's own update (1 ms)
  double t = 10;
  for (int it = 0; it < 3; ++it) {
    At(t, EventKind::kOptimizerBegin);
    At(t + 0.5, EventKind::kForwardBegin);
    At(t + 2.5, EventKind::kForwardEnd);
    At(t + 2.5, EventKind::kBackwardBegin);
    At(t + 5.5, EventKind::kBackwardEnd);
    At(t + 6.5, EventKind::kOptimizerEnd);
    t += 6.5 + 4;
  }
  asm_.Finish(kAnchor + 100 * kMs);
  // THEN each call is one step that starts at its optimizer's begin
  ASSERT_EQ(out_.steps.size(), 3u);
  EXPECT_EQ(out_.steps[0].start_ns, 10 * kMs);
  EXPECT_EQ(out_.steps[0].end_ns, static_cast<int64_t>(16.5 * kMs));
  EXPECT_EQ(out_.steps[1].start_ns, out_.steps[0].end_ns);
  EXPECT_EQ(out_.steps[1].end_ns, static_cast<int64_t>(27 * kMs));
  EXPECT_EQ(out_.steps[1].wait_ns, 4 * kMs);  // the gap before its optimizer call
  // AND the optimizer phase is its own time only: the closure's forward and backward are the
  // step's forward and backward, and the phases never sum to more than the step
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(PhaseWall(i, "forward"), 2 * kMs);
    EXPECT_EQ(PhaseWall(i, "backward"), 3 * kMs);
    EXPECT_EQ(PhaseWall(i, "optimizer"), static_cast<int64_t>(1.5 * kMs));
    const store::StepRow& st = out_.steps[static_cast<size_t>(i)];
    const int64_t phases = PhaseWall(i, "forward") + PhaseWall(i, "backward") +
                           PhaseWall(i, "optimizer") + st.wait_ns.value_or(0);
    EXPECT_LE(phases, st.end_ns - st.start_ns);
    EXPECT_EQ(st.forward_calls, 1);
    EXPECT_EQ(st.optimizer_calls, 1);
  }
}

TEST_F(StepAssemblerTest, AClosureEvaluatedSeveralTimesIsOneStep) {
  // GIVEN LBFGS with max_iter=3: one optimizer call evaluates the closure three times
  At(0, EventKind::kOptimizerBegin);
  double t = 1;
  for (int i = 0; i < 3; ++i) {
    At(t, EventKind::kForwardBegin);
    At(t + 1, EventKind::kForwardEnd);
    At(t + 1, EventKind::kBackwardBegin);
    At(t + 3, EventKind::kBackwardEnd);
    t += 4;  // 1 ms of line search between evaluations
  }
  At(t, EventKind::kOptimizerEnd);  // 13
  asm_.Finish(kAnchor + 100 * kMs);
  ASSERT_EQ(out_.steps.size(), 1u);
  EXPECT_EQ(out_.steps[0].forward_calls, 3);
  EXPECT_EQ(out_.steps[0].backward_calls, 3);
  EXPECT_EQ(PhaseWall(0, "forward"), 3 * kMs);
  EXPECT_EQ(PhaseWall(0, "backward"), 6 * kMs);
  EXPECT_EQ(PhaseWall(0, "optimizer"), 4 * kMs);  // 13 ms minus the 9 ms of closure work
}

TEST_F(StepAssemblerTest, AnExcludedEvaluationIsInNoStepNorInTheNextOnesGap) {
  // GIVEN two training steps, an evaluation of 20 ms between them (three
  // forwards and a loader wait), then a third step
  double t = Iteration(0, 2, 3, 1);  // step 0: 0..6
  At(7, EventKind::kExcludeBegin);
  for (int i = 0; i < 3; ++i) {
    At(8 + i * 6, EventKind::kWaitBegin, 0, 1);
    At(9 + i * 6, EventKind::kWaitEnd);
    At(9 + i * 6, EventKind::kForwardBegin);
    At(13 + i * 6, EventKind::kForwardEnd);
  }
  At(27, EventKind::kExcludeEnd);
  t = Iteration(29, 2, 3, 1);  // step 1: starts at 27, 2 ms gap
  asm_.Finish(kAnchor + 100 * kMs);
  // THEN the steps hold none of it
  ASSERT_EQ(out_.steps.size(), 2u);
  EXPECT_EQ(out_.steps[0].end_ns, 6 * kMs);
  EXPECT_EQ(out_.steps[1].start_ns, 27 * kMs);
  EXPECT_EQ(out_.steps[1].wait_ns, 2 * kMs);
  EXPECT_EQ(out_.steps[1].forward_calls, 1);
  EXPECT_EQ(PhaseWall(1, "forward"), 2 * kMs);
  // AND it is counted apart
  EXPECT_EQ(asm_.excluded_spans(), 1);
  EXPECT_EQ(asm_.excluded_ns(), 20 * kMs);
  EXPECT_EQ(asm_.excluded_forwards(), 3);
  EXPECT_EQ(asm_.orphan_calls(), 0);
  EXPECT_EQ(asm_.unmatched_events(), 0);
}

TEST_F(StepAssemblerTest, ActivityAfterLastOptimizerStepIsCountedNotAStep) {
  // GIVEN one full iteration and then an evaluation forward with no optimizer step
  Iteration(0, 1, 1, 1);
  At(10, EventKind::kForwardBegin);
  At(11, EventKind::kForwardEnd);
  asm_.Finish(kAnchor + 100 * kMs);
  // THEN one step is emitted and the trailing forward is an orphan
  EXPECT_EQ(out_.steps.size(), 1u);
  EXPECT_EQ(asm_.orphan_calls(), 1);
}

TEST_F(StepAssemblerTest, ManualStepsWithWrappedDataloaderUseExplicitWait) {
  // GIVEN the manual API: next() (wait) then step(i) with named phases, twice
  for (int i = 0; i < 2; ++i) {
    const double t = i * 10.0;
    At(t, EventKind::kWaitBegin);
    At(t + 3, EventKind::kWaitEnd);
    At(t + 3, EventKind::kStepBegin, 0, 100 + i);
    At(t + 3, EventKind::kPhaseBegin, PhaseNames::kForward);
    At(t + 5, EventKind::kPhaseEnd, PhaseNames::kForward);
    const uint32_t custom = names_.Intern("rollout");
    At(t + 5, EventKind::kPhaseBegin, custom);
    At(t + 9, EventKind::kPhaseEnd, custom);
    At(t + 9.5, EventKind::kStepEnd, 0, 100 + i);
  }
  asm_.Finish(kAnchor + 100 * kMs);
  // THEN steps carry the user's indices, the explicit wait, and the custom phase
  ASSERT_EQ(out_.steps.size(), 2u);
  EXPECT_EQ(out_.steps[0].step, 100);
  EXPECT_EQ(out_.steps[0].start_ns, 0);  // step 0 starts at its first wait
  EXPECT_EQ(out_.steps[0].wait_ns, 3 * kMs);
  EXPECT_EQ(out_.steps[0].wait_source, "explicit");
  EXPECT_EQ(out_.steps[1].step, 101);
  EXPECT_EQ(out_.steps[1].start_ns, static_cast<int64_t>(9.5 * kMs));
  EXPECT_EQ(out_.steps[1].wait_ns, 3 * kMs);
  EXPECT_EQ(PhaseWall(101, "rollout"), 4 * kMs);
  EXPECT_EQ(PhaseWall(101, "forward"), 2 * kMs);
}

TEST_F(StepAssemblerTest, AUserPhaseAroundAnAutoTimedPhaseOfTheSameNameCountsOnce) {
  // GIVEN auto mode's module/backward/optimizer events inside the user's step(i) with
  // s.phase("forward"/"backward"/"optimizer") around them (a GAN loop grouped by hand), and
  // a user "forward" phase opened inside the auto-timed forward
  At(0, EventKind::kStepBegin, 0, 7);
  At(0, EventKind::kPhaseBegin, PhaseNames::kForward);
  At(0.5, EventKind::kForwardBegin);
  At(10, EventKind::kForwardEnd);
  At(10.5, EventKind::kPhaseEnd, PhaseNames::kForward);
  At(11, EventKind::kPhaseBegin, PhaseNames::kBackward);
  At(11, EventKind::kBackwardBegin);
  At(15, EventKind::kBackwardEnd);
  At(15, EventKind::kPhaseEnd, PhaseNames::kBackward);
  At(16, EventKind::kPhaseBegin, PhaseNames::kOptimizer);
  At(16, EventKind::kOptimizerBegin);
  At(18, EventKind::kOptimizerEnd);
  At(18, EventKind::kPhaseEnd, PhaseNames::kOptimizer);
  At(19, EventKind::kForwardBegin);
  At(20, EventKind::kPhaseBegin, PhaseNames::kForward);
  At(21, EventKind::kPhaseEnd, PhaseNames::kForward);
  At(23, EventKind::kForwardEnd);
  At(24, EventKind::kStepEnd, 0, 7);
  asm_.Finish(kAnchor + 100 * kMs);
  // THEN each phase's time is the outer interval's, once
  ASSERT_EQ(out_.steps.size(), 1u);
  EXPECT_EQ(PhaseWall(7, "forward"), static_cast<int64_t>(10.5 * kMs) + 4 * kMs);
  EXPECT_EQ(PhaseWall(7, "backward"), 4 * kMs);
  EXPECT_EQ(PhaseWall(7, "optimizer"), 2 * kMs);
  EXPECT_EQ(out_.steps[0].forward_calls, 2);
}

TEST_F(StepAssemblerTest, ManualIndicesThatRestartEachEpochAreAllStoredInRunOrder) {
  // GIVEN the README loop inside an epoch loop: step(i) with i = 0, 1, 2 three times
  double t = 0;
  for (int epoch = 0; epoch < 3; ++epoch) {
    for (int i = 0; i < 3; ++i) {
      At(t, EventKind::kStepBegin, 0, i);
      At(t + 1, EventKind::kStepEnd, 0, i);
      t += 2;
    }
  }
  asm_.Finish(kAnchor + 100 * kMs);
  // THEN all nine steps are stored, numbered in run order, and tile the timeline
  ASSERT_EQ(out_.steps.size(), 9u);
  for (int k = 0; k < 9; ++k) EXPECT_EQ(out_.steps[k].step, k);
  EXPECT_EQ(asm_.steps_emitted(), 9);
  EXPECT_EQ(out_.steps[3].start_ns, out_.steps[2].end_ns);
  // AND each restart is noted once with the offset that maps stored steps back to i
  ASSERT_EQ(out_.diagnostics.size(), 2u);
  EXPECT_EQ(out_.diagnostics[0].level, "info");
  EXPECT_EQ(out_.diagnostics[0].source, "steps");
  EXPECT_NE(out_.diagnostics[0].message.find("prof.step(0) is stored as step 3"), std::string::npos)
      << out_.diagnostics[0].message;
  EXPECT_NE(out_.diagnostics[0].message.find("stored step = index + 3"), std::string::npos);
  EXPECT_NE(out_.diagnostics[1].message.find("stored step = index + 6"), std::string::npos);
}

TEST_F(StepAssemblerTest, RepeatedOrDecreasingManualIndicesTakeTheNextFreeNumber) {
  // GIVEN step(5), step(2), step(2), then step(10) (ahead of the stored steps again)
  double t = 0;
  for (int64_t i : {5, 2, 2, 10}) {
    At(t, EventKind::kStepBegin, 0, i);
    At(t + 1, EventKind::kStepEnd, 0, i);
    t += 2;
  }
  asm_.Finish(kAnchor + 100 * kMs);
  // THEN four steps: the user's index while it advances, else the next free number
  ASSERT_EQ(out_.steps.size(), 4u);
  EXPECT_EQ(out_.steps[0].step, 5);
  EXPECT_EQ(out_.steps[1].step, 6);
  EXPECT_EQ(out_.steps[2].step, 7);
  EXPECT_EQ(out_.steps[3].step, 10);
  // AND the offset changes are noted: +4 at step 6, +5 at step 7, back to the index at 10
  ASSERT_EQ(out_.diagnostics.size(), 3u);
  EXPECT_NE(out_.diagnostics[0].message.find("index + 4"), std::string::npos);
  EXPECT_NE(out_.diagnostics[1].message.find("index + 5"), std::string::npos);
  EXPECT_NE(out_.diagnostics[2].message.find("prof.step(10) is stored as step 10"),
            std::string::npos);
}

TEST_F(StepAssemblerTest, ManualStepCountsItsNamedForwardBackwardOptimizerPhases) {
  // GIVEN a manual step with two forward phases, one backward, one optimizer, one custom
  const uint32_t custom = names_.Intern("rollout");
  At(0, EventKind::kStepBegin, 0, 0);
  for (uint32_t id : {PhaseNames::kForward, PhaseNames::kForward, PhaseNames::kBackward,
                      PhaseNames::kOptimizer, custom}) {
    At(1, EventKind::kPhaseBegin, id);
    At(2, EventKind::kPhaseEnd, id);
  }
  At(3, EventKind::kStepEnd, 0, 0);
  // AND a manual step without such phases
  At(4, EventKind::kStepBegin, 0, 1);
  At(5, EventKind::kStepEnd, 0, 1);
  asm_.Finish(kAnchor + 100 * kMs);
  // THEN the call counters are those counts (measured), and 0 where none ran
  ASSERT_EQ(out_.steps.size(), 2u);
  EXPECT_EQ(out_.steps[0].forward_calls, 2);
  EXPECT_EQ(out_.steps[0].backward_calls, 1);
  EXPECT_EQ(out_.steps[0].optimizer_calls, 1);
  EXPECT_EQ(out_.steps[1].forward_calls, 0);
  EXPECT_TRUE(out_.diagnostics.empty());
}

TEST_F(StepAssemblerTest, ManualStepLeftOpenClosesAtFinish) {
  At(0, EventKind::kStepBegin, 0, 0);
  asm_.Finish(kAnchor + 7 * kMs);
  ASSERT_EQ(out_.steps.size(), 1u);
  EXPECT_EQ(out_.steps[0].end_ns, 7 * kMs);
}

TEST_F(StepAssemblerTest, ExplicitWaitInAutoModeWinsOverGap) {
  // GIVEN auto iterations where the loader is wrapped (wait measured around next())
  double t = Iteration(0, 1, 1, 1);
  At(t + 0.5, EventKind::kWaitBegin);
  At(t + 2.5, EventKind::kWaitEnd);
  Iteration(t + 3, 1, 1, 1);
  asm_.Finish(kAnchor + 100 * kMs);
  // THEN step 1's wait is the 2 ms measured inside next(), marked explicit
  ASSERT_EQ(out_.steps.size(), 2u);
  EXPECT_EQ(out_.steps[1].wait_ns, 2 * kMs);
  EXPECT_EQ(out_.steps[1].wait_source, "explicit");
  EXPECT_EQ(out_.steps[1].start_ns, 3 * kMs);
}

TEST_F(StepAssemblerTest, DataLoaderWaitIsTheMeasuredPartOfTheGap) {
  // GIVEN auto mode with the torch DataLoader hooked (kWaitBegin value 1): 1.5 ms in iter() and
  // next() before step 0, then per step 2 ms in next() inside a 5 ms gap (3 ms of logging)
  At(0, EventKind::kWaitBegin, 0, 1);
  At(1.5, EventKind::kWaitEnd);
  double t = Iteration(2, 1, 1, 1);  // step 0: 0..5
  At(t + 1, EventKind::kWaitBegin, 0, 1);
  At(t + 3, EventKind::kWaitEnd);
  t = Iteration(t + 5, 1, 1, 1);  // step 1: 5..13
  // AND a step whose gap holds a wrap_dataloader wait (value 0) and a DataLoader wait
  At(t + 1, EventKind::kWaitBegin, 0, 1);
  At(t + 2, EventKind::kWaitEnd);
  At(t + 2, EventKind::kWaitBegin, 0, 0);
  At(t + 3, EventKind::kWaitEnd);
  Iteration(t + 4, 1, 1, 1);
  asm_.Finish(kAnchor + 100 * kMs);
  // THEN step 0 starts at its first wait and carries it, from the DataLoader
  ASSERT_EQ(out_.steps.size(), 3u);
  EXPECT_EQ(out_.steps[0].start_ns, 0);
  EXPECT_EQ(out_.steps[0].wait_ns, static_cast<int64_t>(1.5 * kMs));
  EXPECT_EQ(out_.steps[0].wait_source, "dataloader");
  // AND step 1's wait is the 2 ms inside next(), not the 5 ms gap; the step still tiles
  EXPECT_EQ(out_.steps[1].wait_ns, 2 * kMs);
  EXPECT_EQ(out_.steps[1].wait_source, "dataloader");
  EXPECT_EQ(out_.steps[1].start_ns, 5 * kMs);
  EXPECT_EQ(out_.steps[1].end_ns, 13 * kMs);
  // AND a step with a wrap_dataloader wait is marked explicit, both waits summed
  EXPECT_EQ(out_.steps[2].wait_ns, 2 * kMs);
  EXPECT_EQ(out_.steps[2].wait_source, "explicit");
}

TEST_F(StepAssemblerTest, IterLoaderWaitsAreCountedAsLoaderStarts) {
  // GIVEN iter(loader) (kWaitBegin value 2) for 1 ms and next() for 0.5 ms before step 0
  At(0, EventKind::kWaitBegin, 0, 2);
  At(1, EventKind::kWaitEnd);
  At(1, EventKind::kWaitBegin, 0, 1);
  At(1.5, EventKind::kWaitEnd);
  double t = Iteration(2, 1, 1, 1);
  // AND a step with next() only, then one whose wait starts the loader again (a new epoch)
  At(t + 1, EventKind::kWaitBegin, 0, 1);
  At(t + 2, EventKind::kWaitEnd);
  t = Iteration(t + 3, 1, 1, 1);
  At(t + 1, EventKind::kWaitBegin, 0, 2);
  At(t + 4, EventKind::kWaitEnd);
  At(t + 4, EventKind::kWaitBegin, 0, 1);
  At(t + 6, EventKind::kWaitEnd);
  t = Iteration(t + 7, 1, 1, 1);
  // AND a step timed by its gap alone (no loader measured)
  Iteration(t + 2, 1, 1, 1);
  asm_.Finish(kAnchor + 200 * kMs);
  ASSERT_EQ(out_.steps.size(), 4u);
  // THEN the starts and their time are the iter() waits, inside the step's loader wait
  EXPECT_EQ(out_.steps[0].loader_starts, 1);
  EXPECT_EQ(out_.steps[0].loader_start_ns, 1 * kMs);
  EXPECT_EQ(out_.steps[0].wait_ns, static_cast<int64_t>(1.5 * kMs));
  EXPECT_EQ(out_.steps[0].wait_source, "dataloader");
  EXPECT_EQ(out_.steps[1].loader_starts, 0);
  EXPECT_EQ(out_.steps[1].loader_start_ns, 0);
  EXPECT_EQ(out_.steps[2].loader_starts, 1);
  EXPECT_EQ(out_.steps[2].loader_start_ns, 3 * kMs);
  EXPECT_EQ(out_.steps[2].wait_ns, 5 * kMs);
  // AND a step whose wait was not measured in a loader has none (unknown, not 0)
  EXPECT_EQ(out_.steps[3].wait_source, "gap");
  EXPECT_FALSE(out_.steps[3].loader_starts.has_value());
  EXPECT_FALSE(out_.steps[3].loader_start_ns.has_value());
}

TEST_F(StepAssemblerTest, GpuTimesAttachToTheirStepEvenWhenTheyResolveLate) {
  // GIVEN step 0 whose forward GPU time resolves while step 0 is still open
  At(0, EventKind::kForwardBegin);
  At(0, EventKind::kGpuPhase, PhaseNames::kForward, 5 * kMs);
  At(1, EventKind::kForwardEnd);
  At(1, EventKind::kBackwardBegin);
  At(2, EventKind::kBackwardEnd);
  At(2, EventKind::kOptimizerBegin);
  At(3, EventKind::kOptimizerEnd);
  // AND step 1 begins before step 0's backward GPU time (begin ts 1 ms) resolves
  At(4, EventKind::kForwardBegin);
  asm_.OnEvent(Event{kAnchor + 1 * kMs, 7 * kMs, PhaseNames::kBackward, EventKind::kGpuPhase, 0});
  // AND a GPU time for a moment no step covers
  asm_.OnEvent(Event{kAnchor - 50 * kMs, 1, PhaseNames::kForward, EventKind::kGpuPhase, 0});
  asm_.Finish(kAnchor + 100 * kMs);
  // THEN the forward GPU time is on step 0's phase row
  ASSERT_TRUE(out_.phases.at({0, "forward"}).gpu_ns.has_value());
  EXPECT_EQ(*out_.phases.at({0, "forward"}).gpu_ns, 5 * kMs);
  // AND the late backward time arrives as a delta row for step 0
  ASSERT_EQ(out_.late_gpu.size(), 1u);
  EXPECT_EQ(out_.late_gpu[0].step, 0);
  EXPECT_EQ(out_.late_gpu[0].name, "backward");
  EXPECT_EQ(out_.late_gpu[0].gpu_ns, 7 * kMs);
  // AND phases without CUDA events have no GPU time (unknown, not zero)
  EXPECT_FALSE(out_.phases.at({0, "optimizer"}).gpu_ns.has_value());
  EXPECT_EQ(asm_.unmatched_events(), 1);
}

TEST_F(StepAssemblerTest, UnbalancedEventsAreCountedNotFatal) {
  At(0, EventKind::kForwardEnd);
  At(1, EventKind::kOptimizerEnd);
  At(2, EventKind::kStepEnd);
  At(3, EventKind::kPhaseEnd, 7);
  asm_.Finish(kAnchor + 10 * kMs);
  EXPECT_EQ(out_.steps.size(), 0u);
  EXPECT_EQ(asm_.unmatched_events(), 4);
}

}  // namespace
}  // namespace gpuprof::record

namespace gpuprof::record {
namespace {

TEST_F(StepAssemblerTest, CommBucketsJoinTheStepHoldingTheirStart) {
  // GIVEN two auto steps (10..16, 16..26) with buckets reported during their backward
  At(10, EventKind::kForwardBegin);
  At(12, EventKind::kForwardEnd);
  At(12, EventKind::kBackwardBegin);
  Bucket(1, 13, 14.5);
  Bucket(0, 14, 15);
  At(15, EventKind::kBackwardEnd);
  At(15, EventKind::kOptimizerBegin);
  At(16, EventKind::kOptimizerEnd);
  // THEN nothing is stored while the step is open (a discarded step takes its buckets along)
  EXPECT_TRUE(out_.comm.empty());
  Iteration(20, 2, 3, 1);
  // AND a bucket reported late (a resolved CUDA event) still finds its closed step
  Bucket(1, 11, 13);
  asm_.Finish(kAnchor + 100 * kMs);
  ASSERT_EQ(out_.comm.size(), 3u);
  EXPECT_EQ(out_.comm[0].step, 0);
  EXPECT_EQ(out_.comm[0].bucket, 1);
  EXPECT_EQ(out_.comm[0].start_ns, 13 * kMs);  // relative to the run's start
  EXPECT_EQ(out_.comm[0].end_ns, 14500 * kMs / 1000);
  EXPECT_EQ(out_.comm[0].bytes, 4096);
  EXPECT_EQ(out_.comm[1].step, 0);
  EXPECT_EQ(out_.comm[2].step, 0);  // the late one
  EXPECT_EQ(asm_.unmatched_comm(), 0);
}

TEST_F(StepAssemblerTest, CommBucketBetweenStepsIsTheNextStepsAndOrphansAreCounted) {
  // GIVEN a bucket before any step, one after step 0's optimizer (before step 1's forward)
  Bucket(9, 1, 2);
  Iteration(10, 2, 3, 1);  // step 0 pending close at 16
  Bucket(0, 17, 18);
  Iteration(20, 2, 3, 1);  // step 1: 16..26
  // AND a bucket in a forward/backward that no optimizer step ends (discarded at Finish)
  At(30, EventKind::kForwardBegin);
  At(31, EventKind::kForwardEnd);
  Bucket(0, 31.5, 32);
  asm_.Finish(kAnchor + 100 * kMs);
  // THEN the between-steps bucket is step 1's; the first and the orphan are unmatched
  ASSERT_EQ(out_.comm.size(), 1u);
  EXPECT_EQ(out_.comm[0].step, 1);
  EXPECT_EQ(asm_.unmatched_comm(), 2);
}

TEST_F(StepAssemblerTest, CommBucketsOfManualSteps) {
  // GIVEN manual steps 5 and 6 with a bucket each
  At(0, EventKind::kStepBegin, 0, 5);
  Bucket(0, 3, 4);
  At(10, EventKind::kStepEnd, 0, 5);
  At(10, EventKind::kStepBegin, 0, 6);
  Bucket(0, 12, 13);
  At(20, EventKind::kStepEnd, 0, 6);
  asm_.Finish(kAnchor + 100 * kMs);
  ASSERT_EQ(out_.comm.size(), 2u);
  EXPECT_EQ(out_.comm[0].step, 5);
  EXPECT_EQ(out_.comm[1].step, 6);
}

}  // namespace
}  // namespace gpuprof::record
