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

TEST_CASE("timeline: three CPU ranks on two cores, from a one-rank profile") {
  // The rates --cores 2 gives three ranks whose profile was measured alone and whose network was
  // fitted on three ranks (step_model.h): backward alone at share(3) = 2/3; beside a collective
  // 6 threads share 2 cores, 1/3 each; a collective alone at share(3) / share(3) = 1 and beside
  // backward at share(6) / share(3) = 1/2. All-reduces of 1 ms each.
  //   0-3      backward alone at 2/3 does 2 ms: bucket 0 ready, starts.
  //   3-5      bucket 0 at 1/2 ends at 5; backward at 1/3 reaches 2 + 2/3.
  //   5-8.5    alone: the 2 1/3 ms to gradient 2 take 3.5 ms; bucket 1 ready, starts.
  //   8.5-10.5 bucket 1 ends at 10.5; backward reaches 5 2/3.
  //   10.5-15.5  alone: 3 1/3 ms to gradient 4 take 5 ms; bucket 2 ready, starts.
  //   15.5-17.5  bucket 2 ends at 17.5; backward does 2/3 of its 1 ms tail...
  //   17.5-18  ...and the last 1/3 alone: backward ends at 18, nothing exposed.
  TimelineInput in = three_buckets({1, 1, 1});
  in.rates = {
      .compute_alone = 2.0 / 3, .compute_shared = 1.0 / 3, .comm_alone = 1, .comm_shared = 0.5};
  const Timeline t = replay(in);
  check_bucket(t.buckets[0], 3, 3, 3, 5);
  check_bucket(t.buckets[1], 8.5, 8.5, 8.5, 10.5);
  check_bucket(t.buckets[2], 15.5, 15.5, 15.5, 17.5);
  CHECK(t.backward_end_ms == doctest::Approx(18));
  CHECK(t.exposed_comm_ms == 0.0);
  CHECK(t.comm_ms == doctest::Approx(6));

  // The same rates as the overlap slowdown's: halved together, full speed apart.
  TimelineInput halved = three_buckets({4, 4, 2});
  halved.rates = {.compute_shared = 0.5, .comm_shared = 0.5};
  TimelineInput slowed = three_buckets({4, 4, 2});
  slowed.overlap_slowdown = 1.0;
  const Timeline a = replay(halved);
  const Timeline b = replay(slowed);
  for (std::size_t i = 0; i < 3; ++i)
    CHECK(a.buckets[i].end_ms == doctest::Approx(b.buckets[i].end_ms));
  CHECK(a.backward_end_ms == doctest::Approx(b.backward_end_ms));
}

TEST_CASE("timeline: a collective starts when the slowest rank has its bucket") {
  // Another rank produces the gradients at 1, 1, 7, 7, 9.5, 9.5 ms (earlier than this rank for
  // bucket 0, later for buckets 1 and 2). All-reduces of 1 ms.
  //   bucket 0: this rank is the last, at 2: runs 2-3.
  //   bucket 1: launched here at 5, the peer joins at 7: runs 7-8.
  //   bucket 2: launched at 9, the peer joins at 9.5: runs 9.5-10.5; backward ended at 10.
  TimelineInput in = three_buckets({1, 1, 1});
  in.peers_ready_ms = {1, 1, 7, 7, 9.5, 9.5};
  const Timeline t = replay(in);
  check_bucket(t.buckets[0], 2, 2, 2, 3);
  check_bucket(t.buckets[1], 5, 5, 7, 8);
  check_bucket(t.buckets[2], 9, 9, 9.5, 10.5);
  CHECK(t.buckets[0].peers_ready_ms == doctest::Approx(2));
  CHECK(t.buckets[1].peers_ready_ms == doctest::Approx(7));
  CHECK(t.backward_end_ms == doctest::Approx(10));
  CHECK(t.exposed_comm_ms == doctest::Approx(0.5));
  // As this rank's Reducer measures it, from launch (or the previous end) to the end, waits for
  // the peer included: 1 + 3 + 1.5 ms.
  CHECK(t.comm_ms == doctest::Approx(5.5));
}

TEST_CASE("timeline: waiting for the slowest rank takes no CPU from backward") {
  // Backward at half speed beside a running collective, full speed otherwise; the peer has
  // bucket 1 only at 6. All-reduces of 1 ms.
  //   0-2      alone: bucket 0 ready, runs 2-3 while backward does 0.5 ms (2.5).
  //   3-5.5    alone to 5: bucket 1 launched at 5.5, waits for the peer until 6 while backward
  //            runs alone (5.5 at 6).
  //   6-7      bucket 1; backward at half speed reaches 6.
  //   7-10     alone to 9: bucket 2 ready at 10, runs 10-11; the 1 ms tail does 0.5...
  //   11-11.5  ...and the rest alone: backward ends at 11.5, after the last collective.
  TimelineInput in = three_buckets({1, 1, 1});
  in.rates = {.compute_shared = 0.5};
  in.peers_ready_ms = {0, 0, 6, 6, 0, 0};
  const Timeline t = replay(in);
  check_bucket(t.buckets[0], 2, 2, 2, 3);
  check_bucket(t.buckets[1], 5.5, 5.5, 6, 7);
  check_bucket(t.buckets[2], 10, 10, 10, 11);
  CHECK(t.backward_end_ms == doctest::Approx(11.5));
  CHECK(t.exposed_comm_ms == 0.0);
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
  in = three_buckets({1, 1, 1});
  in.rates.comm_shared = 0;
  CHECK_THROWS_WITH_AS(replay(in), doctest::Contains("rates must be > 0"), SimError);
  in = three_buckets({1, 1, 1});
  in.peers_ready_ms = {1, 2, 3};
  CHECK_THROWS_WITH_AS(replay(in), doctest::Contains("3 peer ready times for 6 gradients"),
                       SimError);
}
