#include "record/spsc_ring.h"

#include <gtest/gtest.h>

#include <thread>

namespace gpuprof::record {
namespace {

TEST(SpscRingTest, FullRingRejectsAndEmptyRingYieldsNothing) {
  // GIVEN a ring of capacity 4
  SpscRing<int> ring(4);
  ASSERT_EQ(ring.capacity(), 4u);
  int out = 0;
  EXPECT_FALSE(ring.Pop(&out));
  // WHEN five items are pushed
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(ring.Push(i));
  // THEN the fifth is rejected and the first four come out in order
  EXPECT_FALSE(ring.Push(99));
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(ring.Pop(&out));
    EXPECT_EQ(out, i);
  }
  EXPECT_FALSE(ring.Pop(&out));
}

TEST(SpscRingTest, CapacityRoundsUpToPowerOfTwo) {
  SpscRing<int> ring(100);
  EXPECT_EQ(ring.capacity(), 128u);
}

TEST(SpscRingTest, ProducerAndConsumerThreadsSeeEveryItemInOrder) {
  // GIVEN a small ring shared by a producer and a consumer thread
  SpscRing<int64_t> ring(64);
  constexpr int64_t kCount = 200000;
  int64_t rejected = 0;
  std::thread producer([&] {
    for (int64_t i = 0; i < kCount;) {
      if (ring.Push(i)) {
        ++i;
      } else {
        ++rejected;
        std::this_thread::yield();
      }
    }
  });
  // WHEN the consumer drains concurrently
  int64_t expected = 0;
  int64_t v = 0;
  while (expected < kCount) {
    if (ring.Pop(&v)) {
      ASSERT_EQ(v, expected);
      ++expected;
    }
  }
  producer.join();
  // THEN every item arrived exactly once, in order
  EXPECT_EQ(expected, kCount);
  EXPECT_FALSE(ring.Pop(&v));
}

}  // namespace
}  // namespace gpuprof::record
