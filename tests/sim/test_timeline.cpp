// The replay of one backward pass with its bucketed all-reduces, on hand-worked cases.
//
// The common set-up: six gradients in layout order (a Linear's bias, then its weight, produced
// by the same backward node), three buckets of two. Compute since the previous gradient:
//   work = [2, 0, 3, 0, 4, 0] ms, then 1 ms of tail
// so the gradients are ready at 2, 2, 5, 5, 9, 9 ms, the buckets at 2, 5 and 9 ms, and backward
// ends at 10 ms.

#include <doctest/doctest.h>

#include "benchmarks/sim/error.h"
#include "benchmarks/sim/timeline.h"

using namespace nanoddp::sim;

namespace {

TimelineInput three_buckets(std::vector<double> collective_ms, bool overlap = true) {
  TimelineInput in;
  in.work_ms = {2, 0, 3, 0, 4, 0};
  in.tail_ms = 1;
  in.buckets = {{0, 2, 20}, {2, 2, 20}, {4, 2, 20}};
  in.collective_ms = std::move(collective_ms);
  in.overlap = overlap;
  return in;
}

void check_bucket(const BucketTiming& b, double ready, double launch, double start, double end) {
  CHECK(b.ready_ms == doctest::Approx(ready));
  CHECK(b.launch_ms == doctest::Approx(launch));
  CHECK(b.start_ms == doctest::Approx(start));
  CHECK(b.end_ms == doctest::Approx(end));
}

}  // namespace

TEST_CASE("timeline: communication fully hidden behind backward") {
  // All-reduces of 1, 1 and 0.5 ms: bucket 0 runs 2-3, bucket 1 5-6, bucket 2 9-9.5, all
  // before backward ends at 10: nothing is exposed.
  const Timeline t = replay(three_buckets({1, 1, 0.5}));
  REQUIRE(t.buckets.size() == 3);
  check_bucket(t.buckets[0], 2, 2, 2, 3);
  check_bucket(t.buckets[1], 5, 5, 5, 6);
  check_bucket(t.buckets[2], 9, 9, 9, 9.5);
  CHECK(t.grad_ready_ms == std::vector<double>{2, 2, 5, 5, 9, 9});
  CHECK(t.backward_end_ms == doctest::Approx(10));
  CHECK(t.comm_end_ms == doctest::Approx(9.5));
  CHECK(t.comm_ms == doctest::Approx(2.5));
  CHECK(t.exposed_comm_ms == 0.0);
  CHECK(t.overlap_fraction() == doctest::Approx(1.0));
}

TEST_CASE("timeline: overlap off exposes all of it") {
  // Nothing launches during backward; at 10 ms all three launch and run back to back:
  // 10-11, 11-12, 12-12.5. Exposed = 12.5 - 10 = 2.5 ms = all of the communication.
  const Timeline t = replay(three_buckets({1, 1, 0.5}, /*overlap=*/false));
  check_bucket(t.buckets[0], 2, 10, 10, 11);
  check_bucket(t.buckets[1], 5, 10, 11, 12);
  check_bucket(t.buckets[2], 9, 10, 12, 12.5);
  CHECK(t.exposed_comm_ms == doctest::Approx(2.5));
  CHECK(t.overlap_fraction() == doctest::Approx(0.0));
}

TEST_CASE("timeline: partly hidden, one collective at a time in launch order") {
  // All-reduces of 4, 4 and 2 ms. Bucket 0: ready 2, runs 2-6. Bucket 1: ready and launched at
  // 5 but the stream is busy until 6: runs 6-10. Bucket 2: ready 9, waits for bucket 1, runs
  // 10-12. Backward ends at 10: exposed 2 ms of the 10 ms of communication, overlap 80 %.
  const Timeline t = replay(three_buckets({4, 4, 2}));
  check_bucket(t.buckets[0], 2, 2, 2, 6);
  check_bucket(t.buckets[1], 5, 5, 6, 10);
  check_bucket(t.buckets[2], 9, 9, 10, 12);
  CHECK(t.backward_end_ms == doctest::Approx(10));
  CHECK(t.exposed_comm_ms == doctest::Approx(2.0));
  CHECK(t.comm_ms == doctest::Approx(10.0));
  CHECK(t.overlap_fraction() == doctest::Approx(0.8));
}

TEST_CASE("timeline: a bucket is ready with its last gradient") {
  // One bucket holding all six gradients: ready at 9 ms (the last gradient), 3 ms all-reduce:
  // 9-12, exposed 2 ms.
  TimelineInput in = three_buckets({3});
  in.buckets = {{0, 6, 60}};
  const Timeline t = replay(in);
  check_bucket(t.buckets[0], 9, 9, 9, 12);
  CHECK(t.exposed_comm_ms == doctest::Approx(2.0));
}

TEST_CASE("timeline: compute and communication slowed while they run together") {
  // The partly hidden case with slowdown 1: while backward and a collective both run, each
  // advances at half speed (two threads sharing one core).
  //   0-2    backward alone: done 2, bucket 0 ready; its 4 ms all-reduce starts at 2.
  //   2-8    both at half speed: backward reaches 5 (bucket 1 ready, queued), bucket 0 has
  //          done 3 of its 4 ms.
  //   8-10   bucket 0's last 1 ms at half speed ends at 10; backward reaches 6. Bucket 1 starts.
  //   10-16  backward reaches 9 (bucket 2 ready, queued); bucket 1 has done 3 of 4 ms.
  //   16-18  the 1 ms tail and bucket 1's last 1 ms both end at 18: backward ends.
  //   18-20  bucket 2 alone, at full speed. Exposed: 20 - 18 = 2 ms.
  TimelineInput in = three_buckets({4, 4, 2});
  in.overlap_slowdown = 1.0;
  const Timeline t = replay(in);
  check_bucket(t.buckets[0], 2, 2, 2, 10);
  check_bucket(t.buckets[1], 8, 8, 10, 18);
  check_bucket(t.buckets[2], 16, 16, 18, 20);
  CHECK(t.backward_end_ms == doctest::Approx(18));
  CHECK(t.exposed_comm_ms == doctest::Approx(2.0));
  // Communication as the Reducer measures it, start to end: 8 + 8 + 2 ms, 2 of them exposed.
  CHECK(t.comm_ms == doctest::Approx(18.0));
  CHECK(t.overlap_fraction() == doctest::Approx(1.0 - 2.0 / 18.0));
}

TEST_CASE("timeline: inputs that disagree are refused") {
  TimelineInput in = three_buckets({1, 1});
  CHECK_THROWS_WITH_AS(replay(in), doctest::Contains("2 collective durations for 3 buckets"),
                       SimError);
  in = three_buckets({1, 1, 1});
  in.buckets = {{0, 2, 20}, {3, 3, 30}};
  CHECK_THROWS_AS(replay(in), SimError);
  in = three_buckets({1, -1, 1});
  CHECK_THROWS_AS(replay(in), SimError);
}
