#include "benchmarks/sim/timeline.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "benchmarks/sim/error.h"

namespace nanoddp::sim {

double Timeline::overlap_fraction() const {
  return comm_ms > 0 ? std::clamp(1.0 - exposed_comm_ms / comm_ms, 0.0, 1.0) : 0.0;
}

namespace {

void check_input(const TimelineInput& in) {
  std::size_t covered = 0;
  for (const SimBucket& b : in.buckets) {
    if (b.first != covered || b.count == 0) {
      fail("timeline: buckets must be contiguous and non-empty (bucket at {} expected at {})",
           b.first, covered);
    }
    covered += b.count;
  }
  if (covered != in.work_ms.size()) {
    fail("timeline: the buckets cover {} gradients, the profile has {}", covered,
         in.work_ms.size());
  }
  if (in.collective_ms.size() != in.buckets.size()) {
    fail("timeline: {} collective durations for {} buckets", in.collective_ms.size(),
         in.buckets.size());
  }
  for (double w : in.work_ms) {
    if (!(w >= 0 && std::isfinite(w))) fail("timeline: a gradient's compute time is {}", w);
  }
  for (double c : in.collective_ms) {
    if (!(c >= 0 && std::isfinite(c))) fail("timeline: a collective's duration is {}", c);
  }
  if (!(in.tail_ms >= 0) || !(in.overlap_slowdown >= 0)) {
    fail("timeline: negative backward tail ({}) or overlap slowdown ({})", in.tail_ms,
         in.overlap_slowdown);
  }
  for (double r : {in.rates.compute_alone, in.rates.compute_shared, in.rates.comm_alone,
                   in.rates.comm_shared}) {
    if (!(r > 0) || !std::isfinite(r)) fail("timeline: a replay rate is {}; rates must be > 0", r);
  }
  if (!in.peers_ready_ms.empty() && in.peers_ready_ms.size() != in.work_ms.size()) {
    fail("timeline: {} peer ready times for {} gradients", in.peers_ready_ms.size(),
         in.work_ms.size());
  }
  for (double p : in.peers_ready_ms) {
    if (!std::isfinite(p)) fail("timeline: a peer ready time is {}", p);
  }
}

}  // namespace

Timeline replay(const TimelineInput& in) {
  check_input(in);
  const std::size_t n_grads = in.work_ms.size();
  const std::size_t n_buckets = in.buckets.size();
  constexpr double kInf = std::numeric_limits<double>::infinity();

  // Cumulative compute needed before gradient i is ready, and before backward ends.
  std::vector<double> threshold(n_grads);
  double total = 0;
  for (std::size_t i = 0; i < n_grads; ++i) threshold[i] = total += in.work_ms[i];
  const double work_end = total + in.tail_ms;

  std::vector<std::size_t> bucket_of(n_grads);
  std::vector<std::size_t> pending(n_buckets);
  // When the slowest rank has every gradient of bucket b (-inf: identical ranks).
  std::vector<double> peers(n_buckets, -kInf);
  for (std::size_t b = 0; b < n_buckets; ++b) {
    pending[b] = in.buckets[b].count;
    for (std::size_t k = 0; k < in.buckets[b].count; ++k) {
      const std::size_t i = in.buckets[b].first + k;
      bucket_of[i] = b;
      if (!in.peers_ready_ms.empty()) peers[b] = std::max(peers[b], in.peers_ready_ms[i]);
    }
  }

  Timeline out;
  out.buckets.assign(n_buckets, BucketTiming{});
  out.grad_ready_ms.assign(n_grads, 0.0);

  double t = 0;     // wall time since backward started
  double done = 0;  // backward compute done (in undisturbed milliseconds)
  std::size_t next_grad = 0, next_launch = 0, next_start = 0;
  bool backward_done = false;
  bool comm_busy = false;
  double comm_left = 0;  // undisturbed milliseconds left of the running collective

  const auto launch_ready = [&](bool everything) {
    while (next_launch < n_buckets && (everything || pending[next_launch] == 0)) {
      out.buckets[next_launch++].launch_ms = t;
    }
  };

  // Event loop: the next event is a gradient becoming ready (or backward ending), the running
  // collective finishing, or the slowest rank catching up with the next collective; between
  // events compute and communication each advance at a constant rate.
  const ReplayRates& r = in.rates;
  const double compute_shared = r.compute_shared / (1.0 + in.overlap_slowdown);
  const double comm_shared = r.comm_shared / (1.0 + in.overlap_slowdown);
  while (true) {
    while (next_grad < n_grads && done >= threshold[next_grad]) {
      out.grad_ready_ms[next_grad] = t;
      const std::size_t b = bucket_of[next_grad++];
      if (--pending[b] == 0) {
        out.buckets[b].ready_ms = t;
        if (in.overlap) launch_ready(false);
      }
    }
    if (!backward_done && next_grad == n_grads && done >= work_end) {
      backward_done = true;
      out.backward_end_ms = t;
      launch_ready(true);  // finalize: what is left (everything, with overlap off)
    }
    if (!comm_busy && next_start < next_launch && peers[next_start] <= t) {
      out.buckets[next_start].start_ms = t;
      comm_left = in.collective_ms[next_start];
      comm_busy = true;
    }
    if (backward_done && next_start == n_buckets) break;

    const double compute_rate = comm_busy ? compute_shared : r.compute_alone;
    const double comm_rate = backward_done ? r.comm_alone : comm_shared;
    const double target = next_grad < n_grads ? threshold[next_grad] : work_end;
    const double to_compute = backward_done ? kInf : (target - done) / compute_rate;
    const double to_comm = comm_busy ? comm_left / comm_rate : kInf;
    // A launched collective waiting for the slowest rank: its arrival is an event.
    const double to_peers = !comm_busy && next_start < next_launch ? peers[next_start] - t : kInf;
    const double dt = std::min({to_compute, to_comm, to_peers});
    if (dt == to_peers && dt < to_compute && dt < to_comm) {
      // Land exactly on the arrival (t + (p - t) may round below p).
      if (!backward_done) done += dt * compute_rate;
      t = peers[next_start];
      continue;
    }
    t += dt;
    if (!backward_done) done = to_compute <= to_comm ? target : done + dt * compute_rate;
    if (comm_busy) {
      comm_left = to_comm <= to_compute ? 0.0 : comm_left - dt * comm_rate;
      if (comm_left == 0.0) {
        out.buckets[next_start++].end_ms = t;
        comm_busy = false;
      }
    }
  }
  for (std::size_t b = 0; b < n_buckets; ++b) {
    out.buckets[b].peers_ready_ms = std::max(out.buckets[b].ready_ms, peers[b]);
  }
  for (std::size_t b = 0; b < n_buckets; ++b) {
    const double taken_up =
        std::max(out.buckets[b].launch_ms, b > 0 ? out.buckets[b - 1].end_ms : 0.0);
    out.comm_ms += out.buckets[b].end_ms - taken_up;
  }
  out.comm_end_ms = n_buckets > 0 ? out.buckets.back().end_ms : 0.0;
  out.exposed_comm_ms = std::max(0.0, out.comm_end_ms - out.backward_end_ms);
  return out;
}

}  // namespace nanoddp::sim
