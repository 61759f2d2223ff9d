// Bounded single-producer single-consumer ring. Push/Pop are wait-free, allocation-free and
// noexcept. Exactly one thread may push and exactly one (other) thread may pop.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <new>
#include <type_traits>

namespace gpuprof::record {

template <typename T>
class SpscRing {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  // capacity is rounded up to a power of two (at least 2).
  explicit SpscRing(size_t capacity) : mask_(RoundUp(capacity) - 1), slots_(new T[mask_ + 1]) {}
  SpscRing(const SpscRing&) = delete;
  SpscRing& operator=(const SpscRing&) = delete;

  // Producer thread only. Returns false when full (the caller counts the drop).
  bool Push(const T& item) noexcept {
    const size_t head = head_.load(std::memory_order_relaxed);
    if (head - cached_tail_ > mask_) {
      cached_tail_ = tail_.load(std::memory_order_acquire);
      if (head - cached_tail_ > mask_) return false;
    }
    slots_[head & mask_] = item;
    head_.store(head + 1, std::memory_order_release);
    return true;
  }

  // Consumer thread only.
  bool Pop(T* out) noexcept {
    const size_t tail = tail_.load(std::memory_order_relaxed);
    if (tail == cached_head_) {
      cached_head_ = head_.load(std::memory_order_acquire);
      if (tail == cached_head_) return false;
    }
    *out = slots_[tail & mask_];
    tail_.store(tail + 1, std::memory_order_release);
    return true;
  }

  size_t capacity() const noexcept { return mask_ + 1; }

 private:
  static size_t RoundUp(size_t n) {
    size_t p = 2;
    while (p < n) p <<= 1;
    return p;
  }
  static constexpr size_t kLine = 64;
  const size_t mask_;
  std::unique_ptr<T[]> slots_;
  alignas(kLine) std::atomic<size_t> head_{0};  // written by the producer
  size_t cached_tail_ = 0;                      // producer's view of tail_
  alignas(kLine) std::atomic<size_t> tail_{0};  // written by the consumer
  size_t cached_head_ = 0;                      // consumer's view of head_
};

}  // namespace gpuprof::record
