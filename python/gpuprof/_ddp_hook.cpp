// gpuprof's native DDP comm hook: DDP's default reduction (each gradient bucket averaged by one
// allreduce, what torch's built-in ALLREDUCE hook does) with each bucket's start and end
// recorded, all in C++. A Python comm hook makes every bucket take the GIL twice, once on the
// reducer's thread and once on the collective's thread when its future completes; on a CPU
// (gloo) job that contends with the training thread and costs a few % of a step. This hook
// takes no GIL: the end is recorded by a C++ callback on the future, into the profile's
// session through the C entry point _native hands out (PySession.comm_bucket_sink).
//
// Built on demand against the installed torch (gpuprof/ddp_hook.py: `python -m
// gpuprof.ddp_hook build`), because a C++ hook must match torch's C++ ABI; gpuprof uses it for
// DDP models whose parameters are in host memory when it is built, else its Python hook.
//
// Module functions:
//   register(reducer, process_group)  the hook on a DDP model's reducer (once per model)
//   connect(capsule) / disconnect()   where bucket times go while a profile runs (none: the
//                                     hook only reduces)
//   recorded() -> int                 buckets recorded since the module was loaded
#include <time.h>
#include <torch/extension.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>
#include <vector>

namespace {

// The layout of gpuprof._native's CommBucketSink (cpp/python/native_module.cc), version 1.
struct CommBucketSink {
  int version;
  void (*add)(void* ctx, int64_t bucket, int64_t start_ns, int64_t end_ns, int64_t bytes);
  void* ctx;
};
constexpr const char* kSinkName = "gpuprof.comm_bucket_sink";

// CLOCK_MONOTONIC ns: gpuprof's clock (_native.monotonic_ns).
int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// The profile's sink, shared by every registered hook (a hook outlives a profile: DDP cannot
// unregister one). Callbacks run on the collective's threads; connect/disconnect on Python's.
class Target {
 public:
  void Connect(const CommBucketSink& sink) {
    std::lock_guard<std::mutex> lock(mu_);
    sink_ = sink;
    on_ = true;
  }
  void Disconnect() {
    std::lock_guard<std::mutex> lock(mu_);
    on_ = false;
  }
  bool on() const { return on_.load(std::memory_order_relaxed); }
  void Add(int64_t bucket, int64_t start_ns, int64_t end_ns, int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!on_) return;  // the profile stopped while the collective ran
    sink_.add(sink_.ctx, bucket, start_ns, end_ns, bytes);
    recorded_.fetch_add(1, std::memory_order_relaxed);
  }
  int64_t recorded() const { return recorded_.load(std::memory_order_relaxed); }

 private:
  std::mutex mu_;
  CommBucketSink sink_{};
  std::atomic<bool> on_{false};
  std::atomic<int64_t> recorded_{0};
};

Target& TheTarget() {
  static Target* target = new Target();  // never destroyed: callbacks may run at exit
  return *target;
}

class TimedAllreduceHook : public c10d::CommHookInterface {
 public:
  explicit TimedAllreduceHook(c10::intrusive_ptr<c10d::ProcessGroup> group)
      : group_(std::move(group)) {}

  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    Target& target = TheTarget();
    const bool timed = target.on();
    const int64_t start = timed ? NowNs() : 0;
    std::vector<at::Tensor> tensors = {bucket.getBufferRef()};
    tensors[0] /= group_->getSize();  // divide first: no overflow in low precision
    const int64_t index = static_cast<int64_t>(bucket.getIndex());
    const int64_t bytes = static_cast<int64_t>(tensors[0].numel() * tensors[0].element_size());
    c10::intrusive_ptr<c10::ivalue::Future> fut = group_->allreduce(tensors)->getFuture();
    if (timed) {
      fut->addCallback([index, start, bytes](c10::ivalue::Future& done) {
        if (!done.hasError()) TheTarget().Add(index, start, NowNs(), bytes);
      });
    }
    return fut;
  }

  at::Tensor parseHookResult(const c10::IValue& result) override {
    return c10d::detail::parseCppCommHookResult(result);
  }

 private:
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
};

void Register(const py::object& reducer, const py::object& process_group) {
  auto* r = reducer.cast<c10d::Reducer*>();
  auto group = process_group.cast<c10::intrusive_ptr<c10d::ProcessGroup>>();
  r->register_comm_hook(std::make_unique<TimedAllreduceHook>(std::move(group)));
}

void Connect(const py::capsule& capsule) {
  if (std::string(capsule.name() ? capsule.name() : "") != kSinkName) {
    throw std::invalid_argument("not a gpuprof comm bucket sink");
  }
  const auto* sink = capsule.get_pointer<CommBucketSink>();
  if (sink == nullptr || sink->version != 1) {
    throw std::invalid_argument("a comm bucket sink of another gpuprof version");
  }
  TheTarget().Connect(*sink);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("register", &Register, py::arg("reducer"), py::arg("process_group"));
  m.def("connect", &Connect, py::arg("capsule"));
  m.def("disconnect", [] { TheTarget().Disconnect(); });
  m.def("recorded", [] { return TheTarget().recorded(); });
}
