// KernelTracer through the real dlopen/dlsym path, against the fake CUPTI library
// (fake_cupti/fake_cupti.h). The test drives simulated launches through the fake's control
// functions, resolved with dlsym from the same library handle the tracer loaded.
#include "telemetry/cupti_tracer.h"

#include <dlfcn.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "telemetry/fake_cupti/fake_cupti.h"

namespace gpuprof::telemetry {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

std::string FakeLibrary() {
  const char* env = std::getenv("GPUPROF_FAKE_CUPTI_DIR");
  std::string dir = env != nullptr && *env != '\0' ? env : GPUPROF_FAKE_CUPTI_DIR_DEFAULT;
  return dir + "/libcupti.so";
}

// The fake's control functions, resolved from the library the tracer loads.
struct Fake {
  Fake() {
    handle = dlopen(FakeLibrary().c_str(), RTLD_NOW | RTLD_LOCAL);
    EXPECT_NE(handle, nullptr) << dlerror();
    Bind(launch, "fake_cupti_launch");
    Bind(launch_via, "fake_cupti_launch_via");
    Bind(launch_config, "fake_cupti_launch_config");
    Bind(memcpy, "fake_cupti_memcpy");
    Bind(memset, "fake_cupti_memset");
    Bind(drop, "fake_cupti_drop");
    Bind(api_calls, "fake_cupti_api_calls");
    Bind(set_failure, "fake_cupti_set_failure");
    Bind(reset, "fake_cupti_reset");
    Bind(subscribed, "fake_cupti_subscribed");
    Bind(callback_enabled, "fake_cupti_callback_enabled");
    Bind(activity_enabled, "fake_cupti_activity_enabled");
    Bind(buffered_records, "fake_cupti_buffered_records");
  }
  ~Fake() {
    if (handle != nullptr) dlclose(handle);
  }
  template <typename Fn>
  void Bind(Fn*& fn, const char* name) {
    fn = handle != nullptr ? reinterpret_cast<Fn*>(dlsym(handle, name)) : nullptr;
    EXPECT_NE(fn, nullptr) << name;
  }

  void* handle = nullptr;
  decltype(fake_cupti_launch)* launch = nullptr;
  decltype(fake_cupti_launch_via)* launch_via = nullptr;
  decltype(fake_cupti_launch_config)* launch_config = nullptr;
  decltype(fake_cupti_memcpy)* memcpy = nullptr;
  decltype(fake_cupti_memset)* memset = nullptr;
  decltype(fake_cupti_drop)* drop = nullptr;
  decltype(fake_cupti_api_calls)* api_calls = nullptr;
  decltype(fake_cupti_set_failure)* set_failure = nullptr;
  decltype(fake_cupti_reset)* reset = nullptr;
  decltype(fake_cupti_subscribed)* subscribed = nullptr;
  decltype(fake_cupti_callback_enabled)* callback_enabled = nullptr;
  decltype(fake_cupti_activity_enabled)* activity_enabled = nullptr;
  decltype(fake_cupti_buffered_records)* buffered_records = nullptr;
};

// The tag of the launching thread, as linescope's tag function would return the current line.
thread_local uint64_t t_tag = kNoTag;

struct TagSource {
  std::atomic<uint64_t> calls{0};
  static uint64_t Fn(void* ctx) {
    static_cast<TagSource*>(ctx)->calls.fetch_add(1, std::memory_order_relaxed);
    return t_tag;
  }
};

const KernelTagTotals* FindTag(const KernelTraceTotals& totals, uint64_t tag) {
  for (const KernelTagTotals& t : totals.tags) {
    if (t.tag == tag) return &t;
  }
  return nullptr;
}

class KernelTracerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(fake_.reset, nullptr);
    fake_.reset();
    t_tag = kNoTag;
  }
  void TearDown() override { unsetenv(kCuptiLibraryEnv); }

  std::unique_ptr<KernelTracer> OpenFake(KernelTracerOptions options = {}) {
    auto tracer = KernelTracer::Open(FakeLibrary(), &TagSource::Fn, &tags_, options);
    EXPECT_TRUE(tracer.ok()) << tracer.error();
    if (!tracer.ok()) return nullptr;
    return std::move(tracer).value();
  }

  static KernelTraceTotals FlushAndTake(KernelTracer& tracer) {
    Status flushed = tracer.Flush();
    EXPECT_TRUE(flushed.ok()) << flushed.message();
    return tracer.TakeTotals();
  }

  Fake fake_;
  TagSource tags_;
};

constexpr uint64_t kTagA = 101;
constexpr uint64_t kTagB = 202;

TEST_F(KernelTracerTest, GivenLaunchesUnderTwoTags_WhenFlushed_ThenEachTagGetsExactlyItsKernels) {
  // GIVEN a tracer on the fake CUPTI
  auto tracer = OpenFake();
  ASSERT_NE(tracer, nullptr);
  EXPECT_EQ(tracer->library_path(), FakeLibrary());
  EXPECT_GT(tracer->cupti_version(), 0u);

  // WHEN tag A launches two kernels and tag B one, with known durations
  const uint64_t a1 = 1'500, a2 = 2'750, b1 = 40'000;
  t_tag = kTagA;
  fake_.launch("gemm", a1, 0);
  fake_.launch("relu", a2, 0);
  t_tag = kTagB;
  fake_.launch("gemm", b1, 0);
  KernelTraceTotals totals = FlushAndTake(*tracer);

  // THEN each tag holds exactly its kernels' device time, and nothing is unattributed
  ASSERT_THAT(totals.tags, SizeIs(2));
  const KernelTagTotals* a = FindTag(totals, kTagA);
  const KernelTagTotals* b = FindTag(totals, kTagB);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(a->kernel_count, 2u);
  EXPECT_EQ(a->kernel_ns, a1 + a2);
  EXPECT_EQ(a->kernel_busy_ns, a1 + a2);  // one stream: back to back
  EXPECT_EQ(b->kernel_count, 1u);
  EXPECT_EQ(b->kernel_ns, b1);
  EXPECT_EQ(totals.unattributed.kernel_count, 0u);
  EXPECT_EQ(totals.records, 3u);
  EXPECT_EQ(totals.dropped_records, 0u);
  EXPECT_EQ(tags_.calls.load(), 3u);
  EXPECT_EQ(tracer->tagged_calls(), 3u);
  // and per kernel name, over all tags, heaviest first
  ASSERT_THAT(totals.kernels, SizeIs(2));
  EXPECT_EQ(totals.kernels[0].name, "gemm");
  EXPECT_EQ(totals.kernels[0].count, 2u);
  EXPECT_EQ(totals.kernels[0].ns, a1 + b1);
  EXPECT_EQ(totals.kernels[1].name, "relu");
  EXPECT_EQ(totals.kernels[1].ns, a2);

  // WHEN taken again with nothing new, THEN it is empty (Take resets)
  KernelTraceTotals again = FlushAndTake(*tracer);
  EXPECT_THAT(again.tags, IsEmpty());
  EXPECT_THAT(again.kernels, IsEmpty());
  EXPECT_EQ(again.records, 0u);
}

TEST_F(KernelTracerTest, GivenEveryTracedLaunchApi_WhenKernelsRun_ThenAllAreAttributed) {
  // GIVEN a tracer
  auto tracer = OpenFake();
  ASSERT_NE(tracer, nullptr);
  // WHEN kernels start through the driver API, the Ex entry points and a graph launch
  const std::vector<std::pair<int, uint64_t>> launches = {{FAKE_CUPTI_VIA_DRIVER, 11},
                                                          {FAKE_CUPTI_VIA_DRIVER_EX, 12},
                                                          {FAKE_CUPTI_VIA_RUNTIME_EX, 13},
                                                          {FAKE_CUPTI_VIA_GRAPH, 14}};
  for (auto [via, tag] : launches) {
    t_tag = tag;
    ASSERT_NE(fake_.launch_via("k", 0, 100 * tag, 0, via), 0u);
  }
  KernelTraceTotals totals = FlushAndTake(*tracer);
  // THEN each one's time lands on its tag
  ASSERT_THAT(totals.tags, SizeIs(launches.size()));
  for (auto [via, tag] : launches) {
    const KernelTagTotals* t = FindTag(totals, tag);
    ASSERT_NE(t, nullptr) << "via " << via;
    EXPECT_EQ(t->kernel_ns, 100 * tag);
  }
  EXPECT_EQ(totals.unattributed.kernel_count, 0u);
}

TEST_F(KernelTracerTest,
       GivenRuntimeLaunchWithNestedDriverCall_WhenTraced_ThenTaggedOnceByRuntime) {
  // GIVEN a tracer and a runtime launch whose nested driver call carries the record's id
  auto tracer = OpenFake();
  ASSERT_NE(tracer, nullptr);
  t_tag = kTagA;
  // WHEN it runs
  fake_.launch_via("conv", 0, 7'000, 0, FAKE_CUPTI_VIA_RUNTIME_NESTED_DRIVER);
  KernelTraceTotals totals = FlushAndTake(*tracer);
  // THEN the kernel is the runtime call's tag, and tag_fn ran once for the two callbacks
  const KernelTagTotals* a = FindTag(totals, kTagA);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->kernel_ns, 7'000u);
  EXPECT_EQ(tags_.calls.load(), 1u);
  EXPECT_EQ(tracer->tagged_calls(), 2u);
}

TEST_F(KernelTracerTest, GivenLaunchDetailOff_WhenKernelsRun_ThenNoLaunchTotalsAreKept) {
  // GIVEN a tracer with the default options (launch_detail off)
  auto tracer = OpenFake();
  ASSERT_NE(tracer, nullptr);
  // WHEN tagged kernels run
  t_tag = kTagA;
  const int32_t grid[3] = {4, 1, 1}, block[3] = {256, 1, 1};
  fake_.launch_config("gemm", 100, 0, 0, grid, block);
  fake_.launch("relu", 50, 1);
  KernelTraceTotals totals = FlushAndTake(*tracer);
  // THEN the tag and name totals are there, and no per-launch totals
  ASSERT_NE(FindTag(totals, kTagA), nullptr);
  EXPECT_EQ(FindTag(totals, kTagA)->kernel_count, 2u);
  EXPECT_THAT(totals.kernels, SizeIs(2));
  EXPECT_THAT(totals.launches, IsEmpty());
}

TEST_F(KernelTracerTest, GivenLaunchDetail_WhenConfigsDiffer_ThenEachTagNameConfigIsOneEntry) {
  // GIVEN a tracer keeping per-launch-configuration totals
  KernelTracerOptions options;
  options.launch_detail = true;
  auto tracer = OpenFake(options);
  ASSERT_NE(tracer, nullptr);
  const int32_t small[3] = {4, 1, 1}, large[3] = {8, 2, 1};
  const int32_t wide[3] = {256, 1, 1}, square[3] = {16, 16, 1};

  // WHEN tag A runs gemm with two grids and on two streams, and relu with the defaults
  t_tag = kTagA;
  fake_.launch_config("gemm", 100, 0, 0, small, wide);
  fake_.launch_config("gemm", 300, 0, 0, small, wide);
  fake_.launch_config("gemm", 1'000, 0, 0, large, wide);
  fake_.launch_config("gemm", 50, 1, 0, small, wide);
  fake_.launch("relu", 20, 0);
  // and tag B runs gemm on device 1 and add (as heavy: ties are ordered by name)
  t_tag = kTagB;
  fake_.launch_config("gemm", 700, 2, 1, small, square);
  fake_.launch_config("add", 700, 2, 1, small, square);
  // and an untagged gemm runs with the first configuration
  t_tag = kNoTag;
  fake_.launch_config("gemm", 5'000, 0, 0, small, wide);
  KernelTraceTotals totals = FlushAndTake(*tracer);

  // THEN each (tag, name, device, stream, grid, block) has its own count and durations,
  // ascending tag, heaviest first; the untagged kernel is in none of them
  ASSERT_THAT(totals.launches, SizeIs(6));
  struct Want {
    uint64_t tag;
    const char* name;
    uint32_t device, stream;
    const int32_t* grid;
    const int32_t* block;
    uint64_t count, ns, min_ns, max_ns;
  };
  const Want expected[] = {
      {kTagA, "gemm", 0, 0, large, wide, 1, 1'000, 1'000, 1'000},
      {kTagA, "gemm", 0, 0, small, wide, 2, 400, 100, 300},
      {kTagA, "gemm", 0, 1, small, wide, 1, 50, 50, 50},
      {kTagA, "relu", 0, 0, nullptr, nullptr, 1, 20, 20, 20},
      {kTagB, "add", 1, 2, small, square, 1, 700, 700, 700},
      {kTagB, "gemm", 1, 2, small, square, 1, 700, 700, 700},
  };
  const int32_t default_grid[3] = {1, 1, 1}, default_block[3] = {128, 1, 1};
  for (size_t i = 0; i < std::size(expected); ++i) {
    const KernelLaunchTotals& got = totals.launches[i];
    const Want& want = expected[i];
    const int32_t* grid = want.grid != nullptr ? want.grid : default_grid;
    const int32_t* block = want.block != nullptr ? want.block : default_block;
    SCOPED_TRACE("launches[" + std::to_string(i) + "]");
    EXPECT_EQ(got.tag, want.tag);
    EXPECT_EQ(got.name, want.name);
    EXPECT_EQ(got.device, want.device);
    EXPECT_EQ(got.stream, want.stream);
    EXPECT_TRUE(std::equal(grid, grid + 3, got.grid));
    EXPECT_TRUE(std::equal(block, block + 3, got.block));
    EXPECT_EQ(got.count, want.count);
    EXPECT_EQ(got.ns, want.ns);
    EXPECT_EQ(got.min_ns, want.min_ns);
    EXPECT_EQ(got.max_ns, want.max_ns);
  }
  // and the other totals are unchanged by the option
  EXPECT_EQ(totals.unattributed.kernel_count, 1u);
  EXPECT_EQ(totals.unattributed.kernel_ns, 5'000u);
  ASSERT_NE(FindTag(totals, kTagA), nullptr);
  EXPECT_EQ(FindTag(totals, kTagA)->kernel_ns, 1'470u);
  ASSERT_THAT(totals.kernels, SizeIs(3));
  EXPECT_EQ(totals.kernels[0].name, "gemm");
  EXPECT_EQ(totals.kernels[0].count, 6u);

  // WHEN taken again with nothing new, THEN there are no launches (Take resets)
  EXPECT_THAT(FlushAndTake(*tracer).launches, IsEmpty());

  // WHEN a runtime launch makes a nested driver call
  t_tag = kTagA;
  fake_.launch_via("conv", 0, 7'000, 0, FAKE_CUPTI_VIA_RUNTIME_NESTED_DRIVER);
  KernelTraceTotals nested = FlushAndTake(*tracer);
  // THEN its kernel is counted once, under the runtime call's tag
  ASSERT_THAT(nested.launches, SizeIs(1));
  EXPECT_EQ(nested.launches[0].tag, kTagA);
  EXPECT_EQ(nested.launches[0].name, "conv");
  EXPECT_EQ(nested.launches[0].count, 1u);
  EXPECT_EQ(nested.launches[0].ns, 7'000u);
}

TEST_F(KernelTracerTest, GivenUntaggedAndUntracedLaunches_WhenTraced_ThenTheyAreUnattributed) {
  // GIVEN a tracer
  auto tracer = OpenFake();
  ASSERT_NE(tracer, nullptr);
  // WHEN one launch happens with no tag, one through no traced API, one with a tag
  t_tag = kNoTag;
  fake_.launch("untagged", 300, 0);
  fake_.launch_via("internal", 0, 500, 0, FAKE_CUPTI_VIA_NONE);
  t_tag = kTagA;
  fake_.launch("tagged", 900, 0);
  KernelTraceTotals totals = FlushAndTake(*tracer);
  // THEN the first two are in the unattributed bucket, each with its reason
  EXPECT_EQ(totals.unattributed.tag, kNoTag);
  EXPECT_EQ(totals.unattributed.kernel_count, 2u);
  EXPECT_EQ(totals.unattributed.kernel_ns, 800u);
  EXPECT_EQ(totals.unattributed_untagged, 1u);
  EXPECT_EQ(totals.unattributed_unmatched, 1u);
  EXPECT_EQ(totals.unattributed_evicted, 0u);
  ASSERT_THAT(totals.tags, SizeIs(1));
  EXPECT_EQ(totals.tags[0].kernel_ns, 900u);
  // and the untraced one is explained once
  EXPECT_THAT(tracer->TakeNotes(), Contains(HasSubstr("1 records so far belong to GPU work no "
                                                      "traced API call started")));
  EXPECT_THAT(tracer->TakeNotes(), IsEmpty());
}

TEST_F(KernelTracerTest, GivenCuptiDropsRecords_WhenFlushed_ThenTheCountIsReportedAndNoted) {
  // GIVEN a tracer and CUPTI reporting 5 dropped records
  auto tracer = OpenFake();
  ASSERT_NE(tracer, nullptr);
  fake_.drop(5);
  t_tag = kTagA;
  fake_.launch("k", 100, 0);
  // WHEN the buffer is delivered
  KernelTraceTotals totals = FlushAndTake(*tracer);
  // THEN the drops are counted and noted once
  EXPECT_EQ(totals.dropped_records, 5u);
  EXPECT_THAT(tracer->TakeNotes(),
              Contains(AllOf(HasSubstr("CUPTI dropped 5 activity records"), HasSubstr("missing"))));
  EXPECT_THAT(tracer->TakeNotes(), IsEmpty());
}

TEST_F(KernelTracerTest, GivenBufferCallbacksRefused_WhenOpened_ThenErrorAndNothingSubscribed) {
  // GIVEN CUPTI refusing the buffer callbacks
  fake_.set_failure("cuptiActivityRegisterCallbacks", 999);
  // WHEN opened
  auto failed = KernelTracer::Open(FakeLibrary(), &TagSource::Fn, &tags_);
  // THEN Open fails naming the step and the library, and nothing stays subscribed
  ASSERT_FALSE(failed.ok());
  EXPECT_THAT(failed.error(),
              HasSubstr("cuptiActivityRegisterCallbacks failed for " + FakeLibrary()));
  EXPECT_EQ(fake_.subscribed(), 0);
}

TEST_F(KernelTracerTest, GivenMissingLibrary_WhenOpened_ThenTheErrorNamesIt) {
  // WHEN the library does not exist
  auto tracer = KernelTracer::Open("/nonexistent/libcupti.so", &TagSource::Fn, &tags_);
  // THEN the error names the library and why it could not be loaded
  ASSERT_FALSE(tracer.ok());
  EXPECT_THAT(tracer.error(),
              AllOf(HasSubstr("cannot load CUPTI"), HasSubstr("/nonexistent/libcupti.so")));
}

TEST_F(KernelTracerTest, GivenALibraryThatIsNotCupti_WhenOpened_ThenTheErrorNamesTheMissingSymbol) {
  // WHEN a real shared library without the CUPTI entry points is loaded (the fake NVML)
  std::string nvml = std::string(GPUPROF_FAKE_NVML_DIR_DEFAULT) + "/libnvidia-ml.so.1";
  auto tracer = KernelTracer::Open(nvml, &TagSource::Fn, &tags_);
  // THEN the error says so
  ASSERT_FALSE(tracer.ok());
  EXPECT_THAT(tracer.error(),
              HasSubstr(nvml + " is not a usable CUPTI library: it lacks cuptiSubscribe"));
}

TEST_F(KernelTracerTest, GivenNoPath_WhenCandidatesAreListed_ThenEnvThenDefaultsAreUsed) {
  // GIVEN an explicit path, THEN only it
  EXPECT_EQ(CuptiLibraryCandidates("/x/libcupti.so"), std::vector<std::string>{"/x/libcupti.so"});
  // GIVEN no path and no variable, THEN the sonames
  unsetenv(kCuptiLibraryEnv);
  std::vector<std::string> defaults = CuptiLibraryCandidates("");
  EXPECT_THAT(defaults, Contains(std::string("libcupti.so")));
  EXPECT_THAT(defaults, Contains(std::string("libcupti.so.12")));
  EXPECT_THAT(defaults, Contains(std::string("libcupti.so.13")));
  // GIVEN the variable, THEN it
  setenv(kCuptiLibraryEnv, FakeLibrary().c_str(), 1);
  EXPECT_EQ(CuptiLibraryCandidates(""), std::vector<std::string>{FakeLibrary()});
  // and Open("") loads it
  auto tracer = KernelTracer::Open("", &TagSource::Fn, &tags_);
  ASSERT_TRUE(tracer.ok()) << tracer.error();
  EXPECT_EQ(tracer.value()->library_path(), FakeLibrary());
}

TEST_F(KernelTracerTest, GivenSubscribeFails_WhenOpened_ThenErrorAndNothingLeftEnabled) {
  // GIVEN cuptiSubscribe failing
  fake_.set_failure("cuptiSubscribe", 999);
  // WHEN opened
  auto tracer = KernelTracer::Open(FakeLibrary(), &TagSource::Fn, &tags_);
  // THEN the error names the step, the library and the CUPTI result
  ASSERT_FALSE(tracer.ok());
  EXPECT_THAT(tracer.error(), AllOf(HasSubstr("cuptiSubscribe failed for " + FakeLibrary()),
                                    HasSubstr("CUPTI_ERROR_UNKNOWN (CUPTI error 999)")));
  EXPECT_EQ(fake_.subscribed(), 0);
  EXPECT_EQ(fake_.activity_enabled(10), 0);
  // and a later Open (the failure cleared) succeeds: the process-wide slot was released
  fake_.set_failure("cuptiSubscribe", 0);
  EXPECT_NE(OpenFake(), nullptr);
}

TEST_F(KernelTracerTest, GivenAnotherCuptiClient_WhenOpened_ThenTheErrorSaysWhoHoldsCupti) {
  // GIVEN CUPTI refusing a second subscriber (as with torch.profiler or Nsight running)
  fake_.set_failure("cuptiSubscribe", 39);
  auto tracer = KernelTracer::Open(FakeLibrary(), &TagSource::Fn, &tags_);
  // THEN the error explains it
  ASSERT_FALSE(tracer.ok());
  EXPECT_THAT(tracer.error(),
              AllOf(HasSubstr("CUPTI error 39"), HasSubstr("another CUPTI client")));
}

TEST_F(KernelTracerTest, GivenATracerRunning_WhenASecondIsOpened_ThenItIsRefused) {
  auto first = OpenFake();
  ASSERT_NE(first, nullptr);
  auto second = KernelTracer::Open(FakeLibrary(), &TagSource::Fn, &tags_);
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(second.error(), HasSubstr("another KernelTracer is already tracing"));
  // and the first keeps working
  t_tag = kTagA;
  fake_.launch("k", 10, 0);
  EXPECT_EQ(FlushAndTake(*first).tags.size(), 1u);
}

TEST_F(KernelTracerTest, GivenCallbacksRefused_WhenOpened_ThenFatalOnlyWithoutAnyLaunchCallback) {
  // GIVEN CUPTI refusing every callback, THEN Open fails
  fake_.set_failure("cuptiEnableCallback", 1);
  auto none = KernelTracer::Open(FakeLibrary(), &TagSource::Fn, &tags_);
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(none.error(), HasSubstr("neither cudaLaunchKernel nor cuLaunchKernel"));
  EXPECT_EQ(fake_.subscribed(), 0);

  // GIVEN CUPTI refusing only cudaLaunchKernelExC (runtime domain 2, cbid 430)
  fake_.set_failure("cuptiEnableCallback", 0);
  fake_.set_failure("cuptiEnableCallback:2:430", 1);
  auto tracer = OpenFake();
  ASSERT_NE(tracer, nullptr);
  // THEN one note names it, and its launches are unattributed while others are not
  EXPECT_THAT(tracer->TakeNotes(),
              Contains(AllOf(HasSubstr("refused callbacks for cudaLaunchKernelExC ("),
                             HasSubstr("unattributed"))));
  EXPECT_EQ(fake_.callback_enabled(2, 211), 1);
  t_tag = kTagA;
  fake_.launch_via("ex", 0, 100, 0, FAKE_CUPTI_VIA_RUNTIME_EX);
  fake_.launch("plain", 200, 0);
  KernelTraceTotals totals = FlushAndTake(*tracer);
  EXPECT_EQ(totals.unattributed_unmatched, 1u);
  ASSERT_NE(FindTag(totals, kTagA), nullptr);
  EXPECT_EQ(FindTag(totals, kTagA)->kernel_ns, 200u);
}

TEST_F(KernelTracerTest, GivenKernelActivityRefused_WhenOpened_ThenError) {
  fake_.set_failure("cuptiActivityEnable:10", 27);
  auto tracer = KernelTracer::Open(FakeLibrary(), &TagSource::Fn, &tags_);
  ASSERT_FALSE(tracer.ok());
  EXPECT_THAT(tracer.error(), AllOf(HasSubstr("cuptiActivityEnable(CONCURRENT_KERNEL) failed"),
                                    HasSubstr("CUPTI_ERROR_NOT_SUPPORTED (CUPTI error 27)")));
  EXPECT_EQ(fake_.subscribed(), 0);
}

TEST_F(KernelTracerTest, GivenCopiesAndSets_WhenTraced_ThenTheyAreSeparateFromKernelTime) {
  // GIVEN a tracer with memcpy tracing (the default)
  auto tracer = OpenFake();
  ASSERT_NE(tracer, nullptr);
  // WHEN tag A copies twice, sets once and launches once
  t_tag = kTagA;
  fake_.memcpy(1 << 20, 4'000, 0);
  fake_.memcpy(1 << 10, 1'000, 0);
  fake_.memset(4096, 300, 0);
  fake_.launch("k", 2'000, 0);
  KernelTraceTotals totals = FlushAndTake(*tracer);
  // THEN copy, set and kernel time are kept apart
  const KernelTagTotals* a = FindTag(totals, kTagA);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->memcpy_count, 2u);
  EXPECT_EQ(a->memcpy_ns, 5'000u);
  EXPECT_EQ(a->memcpy_bytes, (1u << 20) + (1u << 10));
  EXPECT_EQ(a->memset_count, 1u);
  EXPECT_EQ(a->memset_ns, 300u);
  EXPECT_EQ(a->memset_bytes, 4096u);
  EXPECT_EQ(a->kernel_count, 1u);
  EXPECT_EQ(a->kernel_ns, 2'000u);
  EXPECT_EQ(a->kernel_busy_ns, 2'000u);

  // GIVEN memcpy tracing off, THEN neither the kinds nor the copy callbacks are enabled
  tracer.reset();
  KernelTracerOptions options;
  options.memcpy = false;
  tracer = OpenFake(options);
  ASSERT_NE(tracer, nullptr);
  EXPECT_EQ(fake_.activity_enabled(1), 0);
  EXPECT_EQ(fake_.callback_enabled(2, 41), 0);
  fake_.memcpy(64, 10, 0);
  EXPECT_EQ(FlushAndTake(*tracer).records, 0u);
}

TEST_F(KernelTracerTest, GivenOverlappingKernelsOfOneTag_WhenTraced_ThenBusyIsTheUnion) {
  // GIVEN two kernels of tag A on two streams overlapping by 400 ns, delivered later-first,
  // and a kernel of tag B entirely inside them
  auto tracer = OpenFake();
  ASSERT_NE(tracer, nullptr);
  const uint64_t t0 = 5'000'000'000;
  t_tag = kTagA;
  fake_.launch_via("late", t0 + 600, 1'000, 2, FAKE_CUPTI_VIA_RUNTIME);
  fake_.launch_via("early", t0, 1'000, 1, FAKE_CUPTI_VIA_RUNTIME);
  t_tag = kTagB;
  fake_.launch_via("inside", t0 + 100, 200, 3, FAKE_CUPTI_VIA_RUNTIME);
  KernelTraceTotals totals = FlushAndTake(*tracer);
  // THEN kernel_ns sums durations while kernel_busy_ns is the union, per tag
  const KernelTagTotals* a = FindTag(totals, kTagA);
  const KernelTagTotals* b = FindTag(totals, kTagB);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(a->kernel_ns, 2'000u);
  EXPECT_EQ(a->kernel_busy_ns, 1'600u);
  EXPECT_EQ(b->kernel_busy_ns, 200u);

  // WHEN a later Take brings a kernel of A overlapping the previous union's end
  t_tag = kTagA;
  fake_.launch_via("next", t0 + 1'500, 500, 1, FAKE_CUPTI_VIA_RUNTIME);
  KernelTraceTotals later = FlushAndTake(*tracer);
  // THEN only its part past the union counts as busy
  ASSERT_NE(FindTag(later, kTagA), nullptr);
  EXPECT_EQ(FindTag(later, kTagA)->kernel_ns, 500u);
  EXPECT_EQ(FindTag(later, kTagA)->kernel_busy_ns, 400u);
}

TEST_F(KernelTracerTest, GivenRecordsWithoutTimestamps_WhenTraced_ThenInNoTotalButNoted) {
  auto tracer = OpenFake();
  ASSERT_NE(tracer, nullptr);
  t_tag = kTagA;
  fake_.launch_via("k", 0, 100, 0, FAKE_CUPTI_VIA_RUNTIME_NO_TIMESTAMPS);
  KernelTraceTotals totals = FlushAndTake(*tracer);
  EXPECT_EQ(totals.invalid_records, 1u);
  EXPECT_EQ(totals.records, 0u);
  EXPECT_THAT(totals.tags, IsEmpty());
  EXPECT_THAT(tracer->TakeNotes(), Contains(HasSubstr("1 records so far carried no timestamps")));
}

TEST_F(KernelTracerTest, GivenMoreLaunchesThanSlotsBeforeDelivery_WhenFlushed_ThenEvictedNoted) {
  // GIVEN the smallest tag table (1024 slots)
  KernelTracerOptions options;
  options.tag_table_slots = 1;
  auto tracer = OpenFake(options);
  ASSERT_NE(tracer, nullptr);
  // WHEN one launch of tag A is followed by 1024 launches of B before any delivery
  t_tag = kTagA;
  fake_.launch("first", 100, 0);
  t_tag = kTagB;
  for (int i = 0; i < 1024; ++i) fake_.launch("k", 10, 0);
  KernelTraceTotals totals = FlushAndTake(*tracer);
  // THEN A's record found its slot reused: unattributed as evicted, with a note
  EXPECT_EQ(totals.unattributed_evicted, 1u);
  EXPECT_EQ(totals.unattributed.kernel_ns, 100u);
  ASSERT_NE(FindTag(totals, kTagB), nullptr);
  EXPECT_EQ(FindTag(totals, kTagB)->kernel_count, 1024u);
  EXPECT_THAT(tracer->TakeNotes(), Contains(HasSubstr("later traced calls had reused their tag "
                                                      "slot")));
}

TEST_F(KernelTracerTest, GivenAStoppedTracer_WhenStoppedAgain_ThenNothingChangesAndRecordsStay) {
  // GIVEN a tracer with a launch not yet delivered
  auto tracer = OpenFake();
  ASSERT_NE(tracer, nullptr);
  EXPECT_EQ(fake_.subscribed(), 1);
  EXPECT_EQ(fake_.activity_enabled(10), 1);
  t_tag = kTagA;
  fake_.launch("k", 250, 0);
  // WHEN stopped twice
  tracer->Stop();
  tracer->Stop();
  // THEN CUPTI is unsubscribed and disabled, the pending record was flushed and kept
  EXPECT_TRUE(tracer->stopped());
  EXPECT_EQ(fake_.subscribed(), 0);
  EXPECT_EQ(fake_.activity_enabled(10), 0);
  EXPECT_EQ(fake_.buffered_records(), 0u);
  EXPECT_TRUE(tracer->Flush().ok());
  KernelTraceTotals totals = tracer->TakeTotals();
  ASSERT_NE(FindTag(totals, kTagA), nullptr);
  EXPECT_EQ(FindTag(totals, kTagA)->kernel_ns, 250u);
  // and launches after Stop call no tag function
  uint64_t calls = tags_.calls.load();
  fake_.launch("after", 100, 0);
  EXPECT_EQ(tags_.calls.load(), calls);
  // and a new tracer can start once this one is gone (or merely stopped)
  auto next = OpenFake();
  ASSERT_NE(next, nullptr);
  tracer.reset();  // destroying a stopped tracer leaves the running one alone
  EXPECT_EQ(fake_.subscribed(), 1);
}

TEST_F(KernelTracerTest, GivenTwoThreadsLaunching_WhenTraced_ThenEachThreadsTagIsExact) {
  // GIVEN small buffers (records delivered on the launching threads while they run)
  KernelTracerOptions options;
  options.buffer_bytes = 4096;
  auto tracer = OpenFake(options);
  ASSERT_NE(tracer, nullptr);
  // WHEN two threads launch concurrently, each under its own tag, on its own stream
  constexpr int kLaunches = 20'000;
  auto worker = [&](uint64_t tag, uint64_t duration, uint32_t stream) {
    t_tag = tag;
    for (int i = 0; i < kLaunches; ++i) {
      fake_.launch_via(i % 2 ? "a" : "b", 0, duration, stream,
                       i % 3 ? FAKE_CUPTI_VIA_RUNTIME : FAKE_CUPTI_VIA_RUNTIME_NESTED_DRIVER);
    }
  };
  std::thread one(worker, kTagA, 100, 1);
  std::thread two(worker, kTagB, 300, 2);
  one.join();
  two.join();
  KernelTraceTotals totals = FlushAndTake(*tracer);
  // THEN every kernel is on its thread's tag, exactly
  const KernelTagTotals* a = FindTag(totals, kTagA);
  const KernelTagTotals* b = FindTag(totals, kTagB);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(a->kernel_count, uint64_t{kLaunches});
  EXPECT_EQ(a->kernel_ns, uint64_t{kLaunches} * 100);
  EXPECT_EQ(a->kernel_busy_ns, a->kernel_ns);
  EXPECT_EQ(b->kernel_count, uint64_t{kLaunches});
  EXPECT_EQ(b->kernel_ns, uint64_t{kLaunches} * 300);
  EXPECT_EQ(totals.unattributed.kernel_count, 0u);
  EXPECT_EQ(totals.dropped_records, 0u);
  EXPECT_EQ(tags_.calls.load(), uint64_t{2 * kLaunches});
}

// Not a performance assertion: prints the tracer's costs on the fake for the record
// (docs/telemetry.md quotes them).
TEST_F(KernelTracerTest, GivenManyLaunches_WhenTraced_ThenPerLaunchAndPerRecordCostIsReported) {
  constexpr uint64_t kCalls = 1'000'000;
  constexpr int kRecords = 100'000;
  auto elapsed_ns = [](auto since) {
    return static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now() - since)
                                   .count());
  };
  // GIVEN a tracer with buffers large enough to hold every record
  KernelTracerOptions options;
  options.buffer_bytes = size_t{64} << 20;
  auto tracer = OpenFake(options);
  ASSERT_NE(tracer, nullptr);
  t_tag = kTagA;

  // WHEN a million cudaLaunchKernel calls run through the tag callbacks alone (enter + exit)
  auto start = std::chrono::steady_clock::now();
  uint64_t delivered = fake_.api_calls(2, 211, kCalls);
  double per_call = elapsed_ns(start) / static_cast<double>(kCalls);
  // and, twice (the first round warms buffers and tables), 100k kernels are launched, then
  // their records delivered and processed
  double per_record = 0;
  KernelTraceTotals totals;
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < kRecords; ++i) fake_.launch(i % 4 ? "gemm" : "relu", 10, 0);
    ASSERT_EQ(fake_.buffered_records(), uint64_t{kRecords});
    start = std::chrono::steady_clock::now();
    ASSERT_TRUE(tracer->Flush().ok());
    per_record = elapsed_ns(start) / kRecords;
    totals = tracer->TakeTotals();
  }

  // THEN every call was tagged and every record accounted for; the costs are printed
  EXPECT_EQ(delivered, 2 * kCalls);
  EXPECT_EQ(tracer->tagged_calls(), kCalls + 2 * kRecords);
  ASSERT_NE(FindTag(totals, kTagA), nullptr);
  EXPECT_EQ(FindTag(totals, kTagA)->kernel_count, uint64_t{kRecords});
  std::printf(
      "[telemetry cost] KernelTracer: %.1f ns per traced launch in the tag callbacks (enter + "
      "exit, test tag_fn included); %.0f ns per activity record processed\n",
      per_call, per_record);
}

}  // namespace
}  // namespace gpuprof::telemetry
