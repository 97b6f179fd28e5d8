#include "worker.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>

#include "common/machine_info.h"
#include "common/memory_report.h"
#include "nanoddp/comm/ddp.h"
#include "nanoddp/comm/init.h"
#include "nanoddp/comm/rendezvous.h"
#include "nanoddp/engine/cuda_device.h"
#include "nanoddp/engine/ops.h"
#include "nanoddp/engine/stream.h"
#include "nanoddp/kernels/cpu/kernels.h"
#include "nanoddp/kernels/error.h"
#include "nanoddp/nn/flat_parameters.h"
#include "nanoddp/nn/layers.h"
#include "nanoddp/nn/optimizer.h"
#include "nanoddp/nn/optimizer_in_backward.h"
#include "stats.h"

namespace nanoddp::bench_ddp {

namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// The point this worker runs: the one value of each list.
struct Point {
  nn::MlpOptions model;
  std::int64_t batch_per_rank = 0;
  std::int64_t global_batch = 0;
  comm::DdpOptions ddp;
  int threads = 1;
};

// All ranks' per-step arrays on rank 0 (index = rank); only this rank's without a group.
std::vector<RankSteps> gather_steps(const RankSteps& mine, comm::ProcessGroup* group,
                                    Device device) {
  if (group == nullptr) return {mine};
  const std::size_t n = mine.step_ms.size();
  std::vector<float> packed;
  packed.reserve(4 * n);
  for (const auto* series : {&mine.step_ms, &mine.compute_ms, &mine.comm_ms, &mine.exposed_ms}) {
    for (const double v : *series) packed.push_back(static_cast<float>(v));
  }
  const std::vector<float> all = comm::allgather_values(packed, *group, device);
  std::vector<RankSteps> ranks(static_cast<std::size_t>(group->size()));
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const float* base = all.data() + r * packed.size();
    for (auto* series :
         {&ranks[r].step_ms, &ranks[r].compute_ms, &ranks[r].comm_ms, &ranks[r].exposed_ms}) {
      series->assign(base, base + n);
      base += n;
    }
  }
  return ranks;
}

void write_result(const std::string& path, const nlohmann::ordered_json& record) {
  // Written whole, then renamed: the driver never reads half a file.
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << record.dump() << "\n";
    out.close();
    if (!out) fail("cannot write the result file '{}'", tmp);
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace

int run_worker(const Options& o) {
  const comm::WorldInfo world = comm::world_from_env();
  // --plain (the baseline): one process on its own, whatever the environment says.
  const bool distributed = world.launcher != "none" && !o.plain;
  const int per_node = o.world.front();
  if (distributed && world.world_size != per_node * o.nnodes) {
    fail("launched with WORLD_SIZE {} but the point is --world {} x --nnodes {} = {} ranks",
         world.world_size, per_node, o.nnodes, per_node * o.nnodes);
  }
  if (!distributed && per_node * o.nnodes != 1) {
    fail(
        "--world {} x --nnodes {} needs a launcher (the driver starts workers through "
        "nanoddp-run)",
        per_node, o.nnodes);
  }
  const int world_size = distributed ? world.world_size : 1;

  // One GPU per local rank (modulo the visible devices), current before anything touches CUDA.
  const Device device =
      choose_device(o.device, world.local_rank, o.device == "cuda" ? cuda_device_count() : 0)
          .device;
  set_current_device(device);
  kernels::cpu::set_gemm_threads(o.threads.front());

  std::optional<comm::Distributed> dist;
  if (distributed) {
    dist.emplace(comm::init_distributed(world, {.backend = o.backend, .device = device}));
  }
  const int rank = distributed ? dist->group->rank() : 0;

  Point p;
  p.model = nn::MlpOptions{.in_features = o.in.empty() ? o.hidden.front() : o.in.front(),
                           .out_features = o.out.empty() ? o.hidden.front() : o.out.front(),
                           .hidden = o.hidden.front(),
                           .layers = o.layers.front(),
                           .activation = nn::parse_activation(o.activation.front()),
                           .seed = 0};
  if (o.scaling == Scaling::kWeak) {
    p.batch_per_rank = o.batch.front();
    p.global_batch = p.batch_per_rank * world_size;
  } else {
    p.global_batch = o.batch.front();
    if (p.global_batch % world_size != 0) {
      fail("--batch {} --scaling strong: not divisible by the {} ranks", p.global_batch,
           world_size);
    }
    p.batch_per_rank = p.global_batch / world_size;
  }
  p.ddp.reducer = comm::ReducerOptions{.bucket_cap_mb = o.bucket_cap_mb.front(),
                                       .first_bucket_mb = o.first_bucket_mb.front(),
                                       .comm_hook = comm::parse_comm_hook(o.comm_hook.front()),
                                       .overlap = o.overlap.front()};
  p.ddp.zero_stage = o.zero.front();
  p.ddp.zero_overlap_gather = o.zero_overlap_gather.front();

  nn::Mlp model(p.model);
  nn::FlatParameters params(model, device);
  // nanoddp-train's default optimizer, so the step is the one users train with.
  nn::AdamW optimizer(params, nn::AdamWOptions{.lr = 1e-4f, .weight_decay = 0.0f});
  std::unique_ptr<comm::DistributedDataParallel> ddp;
  if (distributed) {
    // The optimizer goes to DDP, which shards it under ZeRO (as nanoddp-train wires it).
    ddp = std::make_unique<comm::DistributedDataParallel>(model, params, dist->group, dist->store,
                                                          p.ddp, &optimizer);
  }
  comm::Zero* const zero = ddp ? ddp->zero() : nullptr;
  // --optimizer-in-backward on: the update runs inside backward, per parameter on one rank, per
  // averaged bucket under DDP (as nanoddp-train wires it).
  const bool in_backward = o.optimizer_in_backward.front();
  std::unique_ptr<nn::OptimizerInBackward> fused;
  if (in_backward) {
    fused = std::make_unique<nn::OptimizerInBackward>(
        optimizer, params, nn::OptimizerInBackwardOptions{.hook_parameters = !ddp});
    if (ddp) {
      ddp->reducer().set_bucket_reduced_hook([&fused](const comm::Bucket& bucket) {
        fused->update_range(bucket.offset, bucket.numel, bucket.slots);
      });
    }
  }

  // The batch, generated once: each rank its own samples; no data loading in the timed step.
  const auto r = static_cast<std::uint64_t>(rank);
  const Tensor x = Tensor::normal({p.batch_per_rank, p.model.in_features}, 0.0f, 1.0f,
                                  RandomStream{.seed = 1, .stream = 2 * r}, device);
  const Tensor y = Tensor::normal({p.batch_per_rank, p.model.out_features}, 0.0f, 1.0f,
                                  RandomStream{.seed = 1, .stream = 2 * r + 1}, device);

  RankSteps mine;
  for (int step = 0; step < o.warmup + o.steps; ++step) {
    if (step == o.warmup && dist) dist->group->barrier()->wait();  // measured steps start together
    const auto start = Clock::now();
    optimizer.zero_grad();
    // Through DDP's forward: only the backward of its output reduces (as in PyTorch).
    Tensor loss = mse_loss(ddp ? ddp->forward(x) : model.forward(x), y);
    if (fused) fused->arm();
    loss.backward();
    if (fused) {
      fused->finish();
    } else if (zero != nullptr) {
      zero->step();  // this rank's shard, then the parameters all-gathered
    } else {
      optimizer.step();
    }
    if (device.is_cuda()) Stream::compute(device).synchronize();
    const auto end = Clock::now();
    // ZeRO's parameter all-gather after the step: communication the host waits for, none of it
    // hidden (zero.h), booked as nanoddp-train books it. Taken every step, so that a measured
    // step holds its own gather only. On a GPU its time is only the issue: not counted.
    const comm::Zero::GatherTimes gather =
        zero != nullptr && device.is_cpu() ? zero->take_gather_times() : comm::Zero::GatherTimes{};
    if (step < o.warmup) continue;
    const double step_ms = ms_between(start, end);
    double comm_ms = 0, exposed_ms = 0;
    if (ddp) {
      const comm::ReducerStats& stats = ddp->reducer().last_stats();
      comm_ms = stats.comm_ms;
      // The all-reduce time after backward ended (ReducerStats), never more than comm_ms: the
      // rest of the compute stream's wait at the end of backward (wait_ms) is the hand-off from
      // the communication thread, which is overhead of the step, not communication.
      exposed_ms = std::min(stats.exposed_comm_ms, stats.comm_ms);
    }
    comm_ms += gather.comm_ms;
    exposed_ms += std::min(gather.after_step_ms + gather.in_forward_ms, gather.comm_ms);
    mine.step_ms.push_back(step_ms);
    mine.compute_ms.push_back(step_ms - exposed_ms);
    mine.comm_ms.push_back(comm_ms);
    mine.exposed_ms.push_back(exposed_ms);
  }

  // What this rank holds, from the accessors nanoddp-train's --metrics reads (after the steps:
  // AdamW's moments exist from its first step on).
  const comm::ZeroMemory memory =
      zero != nullptr ? zero->memory() : comm::unsharded_memory(params, optimizer);

  const std::vector<RankSteps> ranks =
      gather_steps(mine, dist ? dist->group.get() : nullptr, device);
  const std::vector<comm::ZeroMemory> memory_per_rank =
      comm::gather_memory(memory, dist ? dist->group.get() : nullptr, device);
  if (rank != 0) return 0;

  const Summary s = summarize(ranks);
  const MlpShape shape{.in = p.model.in_features,
                       .out = p.model.out_features,
                       .hidden = p.model.hidden,
                       .layers = p.model.layers};
  const std::int64_t numel = params.numel();
  NANODDP_CHECK(numel == mlp_parameter_count(shape), "parameter count {} != formula {}", numel,
                mlp_parameter_count(shape));
  // What the step's collectives move: every gradient once, in the hook's dtype, and under ZeRO
  // every parameter once (float32).
  const double grad_bytes =
      static_cast<double>(numel) * (p.ddp.reducer.comm_hook == comm::CommHook::kBf16 ? 2.0 : 4.0);
  const int zero_stage = zero != nullptr ? zero->stage() : 0;
  const double bus_bytes =
      step_bus_bytes(grad_bytes, 4.0 * static_cast<double>(numel), world_size, zero_stage);
  const double step_s = s.step_ms_median / 1000.0;

  nlohmann::ordered_json config = {
      {"world_size", world_size},
      {"nnodes", o.nnodes},
      {"nproc_per_node", per_node},
      {"device", o.device},
      {"backend", dist ? dist->group->backend_name() : std::string("none")},
      {"in", p.model.in_features},
      {"out", p.model.out_features},
      {"hidden", p.model.hidden},
      {"layers", p.model.layers},
      {"activation", o.activation.front()},
      {"scaling", scaling_name(o.scaling)},
      {"batch_per_rank", p.batch_per_rank},
      {"global_batch", p.global_batch},
      {"bucket_cap_mb", p.ddp.reducer.bucket_cap_mb},
      {"first_bucket_mb", p.ddp.reducer.first_bucket_mb},
      {"overlap", p.ddp.reducer.overlap},
      {"optimizer_in_backward", in_backward},
      {"comm_hook", o.comm_hook.front()},
      {"zero_stage", zero_stage},
      {"zero_overlap_gather", p.ddp.zero_overlap_gather},
      {"threads", o.threads.front()},
      {"ddp", ddp != nullptr},
      {"params", numel},
      {"buckets", ddp ? ddp->reducer().buckets().size() : std::size_t{0}}};
  nlohmann::ordered_json record = {
      {"bench", "ddp"},
      {"machine", common::machine_info()},
      {"build", common::build_info()},
      {"config", config},
      {"baseline", o.plain},
      {"steps", s.steps},
      {"warmup", o.warmup},
      {"step_ms_median", s.step_ms_median},
      {"step_ms_p10", s.step_ms_p10},
      {"step_ms_p90", s.step_ms_p90},
      {"step_ms_ci95", {s.step_ms_ci_lo, s.step_ms_ci_hi}},
      {"median_step", {{"index", s.median_step}, {"step_ms", s.median_step_ms}}},
      {"samples_per_s", static_cast<double>(p.global_batch) / step_s},
      {"compute_ms", s.compute_ms},
      {"allreduce_ms", s.allreduce_ms},
      {"exposed_comm_ms", s.exposed_comm_ms},
      {"hidden_comm_ms", s.hidden_comm_ms},
      {"overlap_fraction", s.overlap_fraction},
      // The driver fills this in from the 1-rank run of the same configuration.
      {"scaling_efficiency", world_size == 1 ? nlohmann::ordered_json(1.0) : nullptr},
      {"gflops", mlp_training_flops(shape, p.batch_per_rank) / step_s / 1e9},
      {"busbw_gbs", busbw_gbs(bus_bytes, s.allreduce_ms)},
      // Bytes rank 0 holds (comm::ZeroMemory): the whole of each without ZeRO.
      {"parameter_bytes", memory.parameter_bytes},
      {"gradient_bytes", memory.gradient_bytes},
      {"averaged_gradient_bytes", memory.averaged_gradient_bytes},
      {"optimizer_state_bytes", memory.optimizer_state_bytes},
      // Every rank's (the last rank's shard is larger when a bucket does not divide by W).
      {"memory_per_rank", common::memory_per_rank_json<nlohmann::ordered_json>(memory_per_rank)},
      // The slowest rank's figures per measured step, for re-analysis.
      {"samples",
       {{"step_ms", s.per_step.step_ms},
        {"compute_ms", s.per_step.compute_ms},
        {"allreduce_ms", s.per_step.comm_ms},
        {"exposed_comm_ms", s.per_step.exposed_ms}}}};
  write_result(o.result_path, record);
  return 0;
}

}  // namespace nanoddp::bench_ddp
