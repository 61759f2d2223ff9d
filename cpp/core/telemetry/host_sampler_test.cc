#include "telemetry/host_sampler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "telemetry/telemetry_test_util.h"

extern char** environ;

namespace gpuprof::telemetry {
namespace {

using ::testing::DoubleEq;
using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Optional;
using ::testing::SizeIs;

constexpr int64_t kSec = 1000000000;

// One /proc/<pid>/stat line: only ppid, utime, stime and starttime matter to the sampler; the
// rest are plausible values, including a negative tpgid as real daemons have.
std::string StatLine(int pid, const std::string& comm, int ppid, int utime, int stime,
                     int starttime = 5000) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "%d (%s) S %d %d %d 0 -1 4194560 1200 0 3 0 %d %d 0 0 20 0 4 0 %d 123456789 "
                "2500 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 3 0 0 0 0 0\n",
                pid, comm.c_str(), ppid, pid, pid, utime, stime, starttime);
  return buf;
}

// A fake /proc with the files the sampler reads. Two snapshots are written in turn.
class FakeProc {
 public:
  explicit FakeProc(const testing::TempDir& dir) : dir_(dir) {}
  void Stat(const std::string& text) { dir_.Write("stat", text); }
  void Meminfo(const std::string& text) { dir_.Write("meminfo", text); }
  void Vmstat(const std::string& text) { dir_.Write("vmstat", text); }
  void Diskstats(const std::string& text) { dir_.Write("diskstats", text); }
  void Process(int pid, const std::string& comm, int ppid, int utime, int stime, int resident_pages,
               int starttime = 5000) {
    dir_.Write(std::to_string(pid) + "/stat", StatLine(pid, comm, ppid, utime, stime, starttime));
    dir_.Write(std::to_string(pid) + "/statm",
               "90000 " + std::to_string(resident_pages) + " 3000 100 0 40000 0\n");
  }

 private:
  const testing::TempDir& dir_;
};

std::string Disk(int major, int minor, const std::string& name, long reads, long sectors) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%4d %7d %s %ld 17 %ld 900 50 3 400 70 0 800 970 0 0 0 0 0 0\n",
                major, minor, name.c_str(), reads, sectors);
  return buf;
}

const char* kMeminfo =
    "MemTotal:       16000000 kB\n"
    "MemFree:         2000000 kB\n"
    "MemAvailable:   10000000 kB\n"
    "Buffers:          500000 kB\n"
    "Cached:          4000000 kB\n"
    "SwapCached:            0 kB\n";

TEST(HostSamplerTest, GivenTwoSnapshotsOfAFakeProc_WhenSampled_ThenRatesAndTreeAreExact) {
  testing::TempDir dir;
  FakeProc proc(dir);
  const long tck = sysconf(_SC_CLK_TCK);
  const long page = sysconf(_SC_PAGESIZE);

  // GIVEN snapshot A: two cores, a training process 100 with child 101 and grandchild 102, an
  // unrelated process 200 with its own child 201, and disks with partitions and virtual devices
  proc.Stat(
      "cpu  1000 0 500 8000 500 0 0 0 14 0\n"
      "cpu0 500 0 250 4000 250 0 0 0 7 0\n"
      "cpu1 500 0 250 4000 250 0 0 0 7 0\n"
      "intr 123456 1 2 3\n"
      "ctxt 99\n");
  proc.Meminfo(kMeminfo);
  proc.Vmstat("nr_free_pages 1\npswpin 100\npswpout 7\n");
  proc.Diskstats(Disk(8, 0, "sda", 1000, 20000) + Disk(8, 1, "sda1", 900, 18000) +
                 Disk(259, 0, "nvme0n1", 5000, 100000) + Disk(259, 1, "nvme0n1p1", 4000, 90000) +
                 Disk(179, 0, "mmcblk0", 10, 80) + Disk(179, 1, "mmcblk0p1", 10, 80) +
                 Disk(7, 0, "loop0", 70, 700) + Disk(253, 0, "dm-0", 600, 6000) +
                 Disk(252, 0, "zram0", 5, 40));
  proc.Process(1, "init", 0, 10, 10, 100);
  proc.Process(100, "python", 1, 1000, 200, 25000);
  proc.Process(101, "pt_data_worker) (0", 100, 50, 10, 8000);
  proc.Process(102, "grand child", 101, 0, 0, 1000);
  proc.Process(200, "unrelated", 1, 500, 500, 7777);
  proc.Process(201, "unrelated kid", 200, 10, 10, 7777);

  HostSampler sampler(100, dir.path());
  store::HostSampleRow host;
  std::vector<store::WorkerSampleRow> workers;

  // WHEN sampled at t=1 s (priming)
  ASSERT_TRUE(sampler.Sample(1 * kSec, &host, &workers));

  // THEN levels are there, rates are not yet
  EXPECT_EQ(host.ts_ns, 1 * kSec);
  EXPECT_EQ(host.ncores, 2);
  EXPECT_FALSE(host.cpu_pct.has_value());
  EXPECT_THAT(host.cpu_per_core, IsEmpty());
  EXPECT_EQ(host.mem_total_bytes, 16000000LL * 1024);
  EXPECT_EQ(host.mem_used_bytes, 6000000LL * 1024);
  EXPECT_EQ(host.page_cache_bytes, 4500000LL * 1024);
  EXPECT_FALSE(host.swap_in_bps.has_value());
  EXPECT_FALSE(host.disk_read_bps.has_value());
  EXPECT_FALSE(host.disk_read_iops.has_value());
  EXPECT_FALSE(host.proc_cpu_pct.has_value());
  EXPECT_EQ(host.proc_rss_bytes, (25000LL + 8000 + 1000) * page);
  EXPECT_THAT(sampler.tree_pids(), ElementsAre(100, 101, 102));
  ASSERT_THAT(workers, SizeIs(3));
  EXPECT_EQ(workers[0].pid, 100);
  EXPECT_EQ(workers[0].role, "main");
  EXPECT_EQ(workers[1].role, "child");
  EXPECT_FALSE(workers[0].cpu_pct.has_value());
  EXPECT_EQ(workers[0].rss_bytes, 25000LL * page);

  // GIVEN snapshot B two seconds later: cpu0 50% busy, cpu1 25% (guest time grows inside user
  // and must not count twice); 50 pages swapped in; whole disks read 400 times / 8000 sectors
  // while partitions and virtual devices also moved; the tree gained a new child 103
  proc.Stat(
      "cpu  1110 0 540 8250 500 0 0 0 34 0\n"
      "cpu0 580 0 270 4100 250 0 0 0 27 0\n"
      "cpu1 530 0 270 4150 250 0 0 0 7 0\n"
      "intr 123999 1 2 3\n");
  proc.Vmstat("nr_free_pages 1\npswpin 150\npswpout 7\n");
  proc.Diskstats(Disk(8, 0, "sda", 1100, 22000) + Disk(8, 1, "sda1", 9000, 180000) +
                 Disk(259, 0, "nvme0n1", 5300, 106000) + Disk(259, 1, "nvme0n1p1", 40000, 900000) +
                 Disk(179, 0, "mmcblk0", 10, 80) + Disk(179, 1, "mmcblk0p1", 100, 800) +
                 Disk(7, 0, "loop0", 700, 7000) + Disk(253, 0, "dm-0", 6000, 60000) +
                 Disk(252, 0, "zram0", 50, 400));
  proc.Process(100, "python", 1, 1150, 250, 26000);
  proc.Process(101, "pt_data_worker) (0", 100, 90, 20, 8000);
  proc.Process(102, "grand child", 101, 100, 0, 1000);
  proc.Process(103, "new worker", 100, 30, 0, 500);
  proc.Process(200, "unrelated", 1, 900, 900, 7777);

  // WHEN sampled at t=3 s
  ASSERT_TRUE(sampler.Sample(3 * kSec, &host, &workers));

  // THEN every rate is exact
  EXPECT_THAT(host.cpu_pct, Optional(DoubleEq(37.5)));
  EXPECT_THAT(host.cpu_per_core, ElementsAre(DoubleEq(50.0), DoubleEq(25.0)));
  EXPECT_THAT(host.swap_in_bps, Optional(DoubleEq(50.0 * page / 2.0)));
  EXPECT_THAT(host.disk_read_iops, Optional(DoubleEq(400.0 / 2.0)));
  EXPECT_THAT(host.disk_read_bps, Optional(DoubleEq(8000.0 * 512 / 2.0)));
  // AND the tree has the root, its children and the grandchild, but nothing unrelated
  EXPECT_THAT(sampler.tree_pids(), ElementsAre(100, 101, 103, 102));
  std::vector<int64_t> copied = {7};
  sampler.CopyTreePids(&copied);
  EXPECT_EQ(copied, sampler.tree_pids());
  ASSERT_THAT(workers, SizeIs(4));
  auto cpu_of_one_core = [&](int ticks) { return 100.0 * ticks / tck / 2.0; };
  EXPECT_EQ(workers[0].pid, 100);
  EXPECT_EQ(workers[0].ts_ns, 3 * kSec);
  EXPECT_THAT(workers[0].cpu_pct, Optional(DoubleEq(cpu_of_one_core(200))));
  EXPECT_EQ(workers[0].rss_bytes, 26000LL * page);
  EXPECT_EQ(workers[1].pid, 101);
  EXPECT_THAT(workers[1].cpu_pct, Optional(DoubleEq(cpu_of_one_core(50))));
  EXPECT_EQ(workers[2].pid, 103);
  EXPECT_EQ(workers[2].role, "child");
  EXPECT_FALSE(workers[2].cpu_pct.has_value());  // first seen: no rate yet
  EXPECT_EQ(workers[3].pid, 102);
  EXPECT_THAT(workers[3].cpu_pct, Optional(DoubleEq(cpu_of_one_core(100))));
  EXPECT_THAT(host.proc_cpu_pct, Optional(DoubleEq(cpu_of_one_core(350))));
  EXPECT_EQ(host.proc_rss_bytes, (26000LL + 8000 + 500 + 1000) * page);
  EXPECT_THAT(sampler.TakeNotes(), IsEmpty());
}

TEST(HostSamplerTest, GivenReusedPid_WhenSampled_ThenItsRateRestarts) {
  // GIVEN a child whose pid is reused by a new process (different start time) between ticks
  testing::TempDir dir;
  FakeProc proc(dir);
  proc.Process(100, "python", 1, 100, 0, 10);
  proc.Process(101, "worker", 100, 500, 0, 10, /*starttime=*/6000);
  HostSampler sampler(100, dir.path());
  store::HostSampleRow host;
  std::vector<store::WorkerSampleRow> workers;
  sampler.Sample(0, &host, &workers);
  proc.Process(100, "python", 1, 200, 0, 10);
  proc.Process(101, "worker", 100, 20, 0, 10, /*starttime=*/9000);

  // WHEN sampled again
  sampler.Sample(1 * kSec, &host, &workers);

  // THEN the new process has no rate (not a negative one), the root has its rate
  ASSERT_THAT(workers, SizeIs(2));
  EXPECT_THAT(workers[0].cpu_pct, Optional(DoubleEq(100.0 * 100 / sysconf(_SC_CLK_TCK))));
  EXPECT_FALSE(workers[1].cpu_pct.has_value());
  // AND the files the fake tree lacks are noted once each, not fatal
  auto notes = sampler.TakeNotes();
  EXPECT_THAT(notes, SizeIs(4));  // stat, meminfo, vmstat, diskstats
  EXPECT_FALSE(host.cpu_pct.has_value());
  sampler.Sample(2 * kSec, &host, &workers);
  EXPECT_THAT(sampler.TakeNotes(), IsEmpty());
}

TEST(HostSamplerTest, GivenALaunchersOtherRanks_WhenSampled_ThenTheirCpuIsJobCpuNotTheTrees) {
  // GIVEN a launcher 50 (torchrun's agent) with three ranks: 100 (this process, with a loader
  // worker 101), 110 (with a worker 111) and 120; an unrelated process 200; the agent's own
  // CPU is not a rank's
  testing::TempDir dir;
  FakeProc proc(dir);
  const long tck = sysconf(_SC_CLK_TCK);
  proc.Process(1, "init", 0, 0, 0, 10);
  proc.Process(50, "torchrun", 1, 10, 0, 10);
  proc.Process(100, "python", 50, 100, 0, 10);
  proc.Process(101, "pt_data_worker", 100, 10, 0, 10);
  proc.Process(110, "python", 50, 100, 0, 10);
  proc.Process(111, "pt_data_worker", 110, 10, 0, 10);
  proc.Process(120, "python", 50, 100, 0, 10);
  proc.Process(200, "unrelated", 1, 0, 0, 10);
  HostSampler sampler(100, dir.path());
  sampler.set_job_parent(50);
  sampler.set_tree_rescan_interval_ns(10 * kSec);  // the second tick re-reads known pids
  store::HostSampleRow host;
  std::vector<store::WorkerSampleRow> workers;
  sampler.Sample(0, &host, &workers);
  EXPECT_FALSE(host.job_cpu_pct.has_value());  // priming: no rates yet

  // WHEN one second later every process has run (the agent and the unrelated one too)
  proc.Process(50, "torchrun", 1, 60, 0, 10);
  proc.Process(100, "python", 50, 150, 0, 10);
  proc.Process(101, "pt_data_worker", 100, 20, 0, 10);
  proc.Process(110, "python", 50, 180, 0, 10);
  proc.Process(111, "pt_data_worker", 110, 30, 0, 10);
  proc.Process(120, "python", 50, 140, 0, 10);
  proc.Process(200, "unrelated", 1, 90, 0, 10);
  ASSERT_TRUE(sampler.Sample(1 * kSec, &host, &workers));

  // THEN the tree and its worker rows are this rank's alone
  auto pct = [&](int ticks) { return 100.0 * ticks / tck; };
  EXPECT_THAT(sampler.tree_pids(), ElementsAre(100, 101));
  ASSERT_THAT(workers, SizeIs(2));
  EXPECT_THAT(host.proc_cpu_pct, Optional(DoubleEq(pct(50 + 10))));
  // AND the other ranks' trees (110, 111, 120) are the job's CPU, without the agent or 200
  EXPECT_THAT(host.job_cpu_pct, Optional(DoubleEq(pct(80 + 20 + 40))));

  // WHEN rank 120 exits before the next tick
  std::filesystem::remove_all(std::filesystem::path(dir.path()) / "120");
  proc.Process(100, "python", 50, 160, 0, 10);
  proc.Process(110, "python", 50, 190, 0, 10);
  ASSERT_TRUE(sampler.Sample(2 * kSec, &host, &workers));
  // THEN the ranks left count, and nothing fails
  EXPECT_THAT(host.job_cpu_pct, Optional(DoubleEq(pct(10))));

  // AND a sampler without a launcher has no job figure
  HostSampler alone(100, dir.path());
  alone.Sample(0, &host, &workers);
  alone.Sample(1 * kSec, &host, &workers);
  EXPECT_TRUE(host.proc_cpu_pct.has_value());
  EXPECT_FALSE(host.job_cpu_pct.has_value());
}

TEST(HostSamplerTest, GivenTheRanksPids_WhenSampled_ThenTheirTreesAreJobCpuWhateverTheLauncher) {
  // GIVEN ranks that are no launcher's children (mp.spawn under a shell 1 with an unrelated
  // sibling 200): this process 100, rank 110 with a worker 111
  testing::TempDir dir;
  FakeProc proc(dir);
  const long tck = sysconf(_SC_CLK_TCK);
  proc.Process(1, "bash", 0, 0, 0, 10);
  proc.Process(100, "python", 1, 100, 0, 10);
  proc.Process(110, "python", 1, 100, 0, 10);
  proc.Process(111, "pt_data_worker", 110, 10, 0, 10);
  proc.Process(200, "unrelated", 1, 0, 0, 10);
  HostSampler sampler(100, dir.path());
  sampler.set_tree_rescan_interval_ns(10 * kSec);
  store::HostSampleRow host;
  std::vector<store::WorkerSampleRow> workers;
  sampler.Sample(0, &host, &workers);
  proc.Process(100, "python", 1, 150, 0, 10);
  sampler.Sample(1 * kSec, &host, &workers);
  EXPECT_FALSE(host.job_cpu_pct.has_value());  // no rank known yet

  // WHEN the ranks tell it their pids (its own and one that exited among them)
  sampler.SetJobRoots({110, 100, 999});
  sampler.Sample(2 * kSec, &host, &workers);   // finds their trees (a full scan)
  EXPECT_FALSE(host.job_cpu_pct.has_value());  // none has a rate yet: unknown, not 0
  proc.Process(110, "python", 1, 180, 0, 10);
  proc.Process(111, "pt_data_worker", 110, 30, 0, 10);
  proc.Process(200, "unrelated", 1, 500, 0, 10);
  ASSERT_TRUE(sampler.Sample(3 * kSec, &host, &workers));

  // THEN the other rank's tree is the job's CPU, without the unrelated sibling or itself
  EXPECT_THAT(host.job_cpu_pct, Optional(DoubleEq(100.0 * (80 + 20) / tck)));
  EXPECT_THAT(sampler.tree_pids(), ElementsAre(100));
}

TEST(HostSamplerTest, GivenRanksThisProcessStarted_WhenTheyAreKnown_ThenTheyLeaveItsTree) {
  // GIVEN rank 0 (100) that started rank 1 (101, with a worker 102) itself, as Lightning's ddp
  // strategy does, and a loader worker 103 of its own
  testing::TempDir dir;
  FakeProc proc(dir);
  const long tck = sysconf(_SC_CLK_TCK);
  proc.Process(100, "python", 1, 100, 0, 10);
  proc.Process(101, "python rank 1", 100, 100, 0, 10);
  proc.Process(102, "pt_data_worker", 101, 10, 0, 10);
  proc.Process(103, "pt_data_worker", 100, 10, 0, 10);
  HostSampler sampler(100, dir.path());
  store::HostSampleRow host;
  std::vector<store::WorkerSampleRow> workers;
  sampler.Sample(0, &host, &workers);
  // Before the ranks told each other their pids, rank 1 looks like its child
  EXPECT_THAT(sampler.tree_pids(), ElementsAre(100, 101, 103, 102));

  // WHEN they did
  sampler.SetJobRoots({101});
  sampler.Sample(1 * kSec, &host, &workers);
  proc.Process(100, "python", 1, 150, 0, 10);
  proc.Process(101, "python rank 1", 100, 190, 0, 10);
  proc.Process(102, "pt_data_worker", 101, 20, 0, 10);
  proc.Process(103, "pt_data_worker", 100, 15, 0, 10);
  ASSERT_TRUE(sampler.Sample(2 * kSec, &host, &workers));

  // THEN rank 1 and its worker are the job's CPU, not this process's tree (counted once)
  EXPECT_THAT(sampler.tree_pids(), ElementsAre(100, 103));
  ASSERT_THAT(workers, SizeIs(2));
  EXPECT_THAT(host.proc_cpu_pct, Optional(DoubleEq(100.0 * (50 + 5) / tck)));
  EXPECT_THAT(host.job_cpu_pct, Optional(DoubleEq(100.0 * (90 + 10) / tck)));

  // AND seen from rank 1 (whose ranks are 100, the one that started it, and 101's sibling
  // rank 104 that 100 started too), each other rank is counted once: 104 is a root and also a
  // descendant of root 100
  proc.Process(104, "python rank 2", 100, 0, 0, 10);
  HostSampler rank1(101, dir.path());
  rank1.SetJobRoots({100, 104});
  rank1.Sample(3 * kSec, &host, &workers);
  proc.Process(100, "python", 1, 160, 0, 10);
  proc.Process(103, "pt_data_worker", 100, 20, 0, 10);
  proc.Process(104, "python rank 2", 100, 40, 0, 10);
  proc.Process(101, "python rank 1", 100, 190, 0, 10);
  ASSERT_TRUE(rank1.Sample(4 * kSec, &host, &workers));
  EXPECT_THAT(host.job_cpu_pct, Optional(DoubleEq(100.0 * (10 + 5 + 40) / tck)));
}

TEST(HostSamplerTest, GivenMissingProcRoot_WhenSampled_ThenReturnsFalseWithEmptyRow) {
  HostSampler sampler(1, "/nonexistent/gpuprof/proc");
  store::HostSampleRow host;
  std::vector<store::WorkerSampleRow> workers = {store::WorkerSampleRow()};
  EXPECT_FALSE(sampler.Sample(5, &host, &workers));
  EXPECT_EQ(host.ts_ns, 5);
  EXPECT_FALSE(host.mem_total_bytes.has_value());
  EXPECT_THAT(workers, IsEmpty());
  EXPECT_THAT(sampler.tree_pids(), IsEmpty());
}

TEST(HostSamplerTest, GivenRealProc_WhenSampledTwice_ThenPlausibleValuesAndOurChildIsInTheTree) {
  // GIVEN this test process with one child (sleep)
  pid_t child = 0;
  char arg0[] = "sleep";
  char arg1[] = "30";
  char* argv[] = {arg0, arg1, nullptr};
  ASSERT_EQ(posix_spawnp(&child, "sleep", nullptr, nullptr, argv, environ), 0);
  struct Reap {  // ends the child however the test ends
    pid_t pid;
    ~Reap() {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  } reap{child};
  HostSampler sampler(getpid());
  store::HostSampleRow host;
  std::vector<store::WorkerSampleRow> workers;

  // WHEN sampled, then again after ~100 ms of busy work
  ASSERT_TRUE(sampler.Sample(0, &host, &workers));
  auto start = std::chrono::steady_clock::now();
  volatile double sink = 0;
  while (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(100)) sink = sink + 1;
  ASSERT_TRUE(sampler.Sample(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count(),
      &host, &workers));

  // THEN host levels and rates are plausible
  ASSERT_TRUE(host.ncores.has_value());
  EXPECT_GE(*host.ncores, 1);
  ASSERT_TRUE(host.cpu_pct.has_value());
  EXPECT_GE(*host.cpu_pct, 0.0);
  EXPECT_LE(*host.cpu_pct, 100.0);
  EXPECT_THAT(host.cpu_per_core, SizeIs(static_cast<size_t>(*host.ncores)));
  ASSERT_TRUE(host.mem_total_bytes.has_value());
  EXPECT_GT(*host.mem_total_bytes, 0);
  EXPECT_LE(host.mem_used_bytes.value_or(-1), *host.mem_total_bytes);
  EXPECT_GE(host.page_cache_bytes.value_or(-1), 0);
  EXPECT_GE(host.swap_in_bps.value_or(-1), 0.0);
  EXPECT_GE(host.disk_read_bps.value_or(0), 0.0);
  // AND the tree is this process first, then the child
  ASSERT_THAT(sampler.tree_pids(), ::testing::Contains(static_cast<int64_t>(child)));
  ASSERT_FALSE(workers.empty());
  EXPECT_EQ(workers[0].pid, getpid());
  EXPECT_EQ(workers[0].role, "main");
  EXPECT_GT(workers[0].rss_bytes.value_or(0), 0);
  ASSERT_TRUE(workers[0].cpu_pct.has_value());
  EXPECT_GE(*workers[0].cpu_pct, 0.0);
  ASSERT_TRUE(host.proc_cpu_pct.has_value());
  EXPECT_GE(*host.proc_rss_bytes, *workers[0].rss_bytes);
}

TEST(HostSamplerTest, GivenRescanInterval_WhenChildAppearsBetweenScans_ThenFoundAtNextScan) {
  // GIVEN a tree scanned at t=0 with a 1 s rescan interval
  testing::TempDir dir;
  FakeProc proc(dir);
  proc.Process(100, "python", 1, 100, 0, 10);
  proc.Process(101, "worker", 100, 10, 0, 10);
  HostSampler sampler(100, dir.path());
  sampler.set_tree_rescan_interval_ns(1 * kSec);
  store::HostSampleRow host;
  std::vector<store::WorkerSampleRow> workers;
  sampler.Sample(0, &host, &workers);
  EXPECT_THAT(sampler.tree_pids(), ElementsAre(100, 101));

  // WHEN a new worker starts and the old one exits, sampled at 0.5 s and at 1 s
  proc.Process(100, "python", 1, 150, 0, 10);
  proc.Process(102, "new worker", 100, 5, 0, 10);
  std::filesystem::remove_all(dir.path() + "/101");
  sampler.Sample(kSec / 2, &host, &workers);
  std::vector<int64_t> between = sampler.tree_pids();
  ASSERT_THAT(workers, SizeIs(1));
  EXPECT_THAT(workers[0].cpu_pct,
              Optional(DoubleEq(100.0 * 50 / sysconf(_SC_CLK_TCK) / 0.5)));  // known pids re-read
  sampler.Sample(1 * kSec, &host, &workers);

  // THEN the exited worker leaves at once; the new one joins at the next full scan
  EXPECT_THAT(between, ElementsAre(100));
  EXPECT_THAT(sampler.tree_pids(), ElementsAre(100, 102));
}

TEST(HostSamplerTest, GivenRealProc_WhenSampledManyTimes_ThenPerTickCostIsReported) {
  // GIVEN samplers of this process's tree, one rescanning every tick, one at the default 1 s
  HostSampler every_tick(getpid());
  every_tick.set_tree_rescan_interval_ns(0);
  HostSampler by_default(getpid());
  store::HostSampleRow host;
  std::vector<store::WorkerSampleRow> workers;
  auto cost_us = [&](HostSampler& sampler, int ticks, int* ok) {
    sampler.Sample(0, &host, &workers);
    auto start = std::chrono::steady_clock::now();
    for (int i = 1; i <= ticks; ++i) *ok += sampler.Sample(i * 100000000LL, &host, &workers);
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
               .count() /
           ticks;
  };

  // WHEN each is ticked at 10 Hz of sample time
  int ok = 0;
  const double full = cost_us(every_tick, 100, &ok);
  const double dflt = cost_us(by_default, 200, &ok);

  // THEN every tick read something; the costs are printed for the record
  EXPECT_EQ(ok, 300);
  EXPECT_TRUE(host.mem_total_bytes.has_value());
  EXPECT_EQ(by_default.tree_pids().front(), getpid());
  std::printf(
      "[telemetry cost] HostSampler::Sample, real /proc: %.1f us/tick scanning every tick, "
      "%.1f us/tick at 10 Hz with the default 1 s rescan\n",
      full, dflt);
}

}  // namespace
}  // namespace gpuprof::telemetry
