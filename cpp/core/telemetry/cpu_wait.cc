#include "telemetry/cpu_wait.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iterator>

namespace gpuprof::telemetry {
namespace {

// Reads up to `n - 1` bytes of a small procfs file into `buf` (NUL-terminated); false on error.
bool ReadSmall(const std::string& path, char* buf, size_t n) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  ssize_t got;
  do {
    got = ::read(fd, buf, n - 1);
  } while (got < 0 && errno == EINTR);
  ::close(fd);
  if (got <= 0) return false;
  buf[got] = '\0';
  return true;
}

}  // namespace

std::optional<int64_t> ReadRunDelayNs(const std::string& schedstat_path) {
  // "<on-cpu ns> <run-queue ns> <timeslices>\n"
  char buf[128];
  if (!ReadSmall(schedstat_path, buf, sizeof buf)) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  std::strtoull(buf, &end, 10);
  if (end == buf || errno != 0) return std::nullopt;
  char* second = end;
  const unsigned long long delay = std::strtoull(second, &end, 10);
  if (end == second || errno != 0) return std::nullopt;
  return static_cast<int64_t>(delay);
}

CpuWaitReader::CpuWaitReader(std::string task_dir) : task_dir_(std::move(task_dir)) {}

std::optional<std::string> CpuWaitReader::Unavailable() const {
  DIR* dir = ::opendir(task_dir_.c_str());
  if (dir == nullptr) {
    return task_dir_ + " cannot be listed (" + std::strerror(errno) + ")";
  }
  std::optional<std::string> why = "no thread in " + task_dir_;
  while (const dirent* e = ::readdir(dir)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    const std::string path = task_dir_ + "/" + e->d_name + "/schedstat";
    if (ReadRunDelayNs(path)) {
      why.reset();
    } else {
      why = path + " cannot be read (a kernel without CONFIG_SCHED_INFO)";
    }
    break;
  }
  ::closedir(dir);
  return why;
}

int64_t CpuWaitReader::Delta() {
  const uint64_t call = ++calls_;
  int64_t total = 0;
  DIR* dir = ::opendir(task_dir_.c_str());
  if (dir == nullptr) return 0;
  std::string path = task_dir_ + "/";
  const size_t base = path.size();
  while (const dirent* e = ::readdir(dir)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    const pid_t tid = static_cast<pid_t>(std::strtol(e->d_name, nullptr, 10));
    path.resize(base);
    path += e->d_name;
    const size_t tdir = path.size();
    auto [it, fresh] = threads_.try_emplace(tid);
    Thread& t = it->second;
    if (fresh) {
      // Named once, when first seen: gpuprof names its threads before they run.
      char comm[64];
      path += "/comm";
      t.ours = ReadSmall(path, comm, sizeof comm) && std::strncmp(comm, "gpuprof", 7) == 0;
      path.resize(tdir);
    }
    t.seen = call;
    if (t.ours) continue;
    path += "/schedstat";
    const auto delay = ReadRunDelayNs(path);
    if (!delay) continue;  // gone between the listing and the read
    if (!fresh && call > 1 && *delay > t.run_delay_ns) total += *delay - t.run_delay_ns;
    t.run_delay_ns = *delay;
  }
  ::closedir(dir);
  // Forget threads that have exited (their ids may be reused by new threads).
  for (auto it = threads_.begin(); it != threads_.end();) {
    it = it->second.seen == call ? std::next(it) : threads_.erase(it);
  }
  return total;
}

}  // namespace gpuprof::telemetry
