// nanoddp-train: the main job. Trains an MLP regression with MSE loss on one process.
//
// One step = zero_grad, forward, loss, backward, optimizer step. The batch is filled by the
// data set outside the timed step (as a prefetching data loader would), and both times are
// reported: `step_ms` is the training step, `data_ms` the batch preparation.

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <memory>

#include "nanoddp/config.h"
#include "nanoddp/engine/backend.h"
#include "nanoddp/engine/cuda_device.h"
#include "nanoddp/engine/error.h"
#include "nanoddp/engine/ops.h"
#include "nanoddp/kernels/cpu/kernels.h"
#include "nanoddp/nn/dataset.h"
#include "nanoddp/nn/flat_parameters.h"
#include "nanoddp/nn/layers.h"
#include "nanoddp/nn/optimizer.h"
#include "nanoddp/nn/safetensors.h"
#include "nanoddp/nn/sampler.h"
#include "options.h"

namespace nanoddp::train {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

std::string format_duration(double seconds) {
  const auto s = static_cast<long long>(std::max(0.0, seconds) + 0.5);
  return fmt::format("{}:{:02}:{:02}", s / 3600, (s / 60) % 60, s % 60);
}

// Everything a run needs, built from the options before the first step. Any Error thrown
// while building it is the user's input (a bad file, a missing GPU): exit code 2.
struct Setup {
  Device device;
  std::unique_ptr<nn::Dataset> dataset;
  std::unique_ptr<nn::Mlp> model;
  std::unique_ptr<nn::FlatParameters> params;
  std::unique_ptr<nn::Optimizer> optimizer;
  std::unique_ptr<nn::Sampler> sampler;
  std::int64_t steps = 0;
  std::int64_t steps_per_epoch = 0;
};

Setup build(const TrainOptions& o) {
  Setup s;
  s.device = Device::parse(o.device);
  require_device(s.device);
  if (s.device.is_cuda()) {
    backend_for(s.device).set_gemm_backend(o.gemm == "cublas" ? GemmBackend::kCublas
                                                             : GemmBackend::kHand);
  }
  kernels::cpu::set_gemm_threads(o.threads);

  if (!o.data_path.empty()) {
    s.dataset = std::make_unique<nn::NpyDataset>(o.data_path, o.targets_path);
  } else {
    s.dataset = std::make_unique<nn::SyntheticRegression>(
        nn::SyntheticRegressionOptions{.in_features = o.in_features,
                                       .out_features = o.out_features,
                                       .size = o.dataset_size,
                                       .seed = o.seed,
                                       .noise_std = o.noise_std,
                                       .teacher_hidden = o.teacher_hidden});
  }
  s.model = std::make_unique<nn::Mlp>(nn::MlpOptions{.in_features = s.dataset->in_features(),
                                                     .out_features = s.dataset->out_features(),
                                                     .hidden = o.hidden,
                                                     .layers = o.layers,
                                                     .activation = nn::parse_activation(o.activation),
                                                     .seed = o.seed});
  s.params = std::make_unique<nn::FlatParameters>(*s.model, s.device);
  if (o.optimizer == "sgd") {
    s.optimizer = std::make_unique<nn::SGD>(
        *s.params, nn::SgdOptions{.lr = o.lr, .momentum = o.momentum, .weight_decay = o.weight_decay});
  } else {
    s.optimizer = std::make_unique<nn::AdamW>(
        *s.params, nn::AdamWOptions{.lr = o.lr, .weight_decay = o.weight_decay});
  }
  s.sampler = std::make_unique<nn::Sampler>(
      nn::SamplerOptions{.size = s.dataset->size(), .shuffle = o.shuffle, .seed = o.seed});
  s.steps_per_epoch = s.sampler->num_batches(o.batch);
  s.steps = o.epochs ? *o.epochs * s.steps_per_epoch : o.steps.value_or(1000);
  return s;
}

void save_parameters(const std::string& path, const nn::Module& model, std::int64_t step,
                     const TrainOptions& o) {
  // Host copies first: the entries point at them while the file is written.
  std::vector<nn::NamedTensor> named = model.named_parameters();
  std::vector<std::vector<float>> host;
  std::vector<nn::SafetensorsEntry> entries;
  host.reserve(named.size());
  for (const nn::NamedTensor& p : named) {
    host.push_back(p.tensor.to_vector());
    entries.push_back({.name = p.name, .dtype = "F32", .shape = p.tensor.shape(),
                       .data = host.back().data()});
  }
  nn::write_safetensors(path, entries,
                        {{"format", "nanoddp-parameters"},
                         {"nanoddp_version", NANODDP_VERSION},
                         {"step", std::to_string(step)},
                         {"seed", std::to_string(o.seed)},
                         {"activation", o.activation}});
}

int run(const TrainOptions& o, Setup& s) {
  nn::Dataset& data = *s.dataset;
  const std::int64_t in = data.in_features(), out = data.out_features();
  if (!o.quiet) {
    fmt::print("nanoddp-train {} | device {} | {} | {} parameters | {}\n", NANODDP_VERSION,
               s.device.str(), s.model->describe(), s.params->numel(), s.optimizer->describe());
    fmt::print("data: {} samples x {} -> {} | batch {} | {} steps ({} per epoch)\n", data.size(),
               in, out, o.batch, s.steps, s.steps_per_epoch);
  }
  std::ofstream metrics;
  if (!o.metrics_path.empty()) {
    metrics.open(o.metrics_path, std::ios::trunc);
    if (!metrics) fail("cannot open --metrics file '{}' for writing", o.metrics_path);
  }

  // Host staging buffers for one batch, reused every step; on the CPU the batch is written
  // straight into the input tensors.
  std::vector<float> x_host, y_host;
  Tensor x, y;
  Event step_begin(s.device), step_end(s.device);
  const Stream stream = backend_for(s.device).stream();

  const auto run_start = Clock::now();
  double window_step_ms = 0, window_data_ms = 0, window_wall_ms = 0, first_loss = NAN;
  std::int64_t window_steps = 0, window_samples = 0;
  float last_loss = NAN;
  for (std::int64_t step = 1; step <= s.steps; ++step) {
    const auto wall_start = Clock::now();
    const std::int64_t epoch = (step - 1) / s.steps_per_epoch;
    const std::int64_t step_in_epoch = (step - 1) % s.steps_per_epoch;
    if (step_in_epoch == 0) s.sampler->set_epoch(epoch);

    // ---- data ----
    const auto data_start = Clock::now();
    const std::span<const std::int64_t> indices = s.sampler->batch(step_in_epoch, o.batch);
    const auto rows = static_cast<std::int64_t>(indices.size());
    if (!x.defined() || x.size(0) != rows) {
      x = Tensor::empty({rows, in}, s.device);
      y = Tensor::empty({rows, out}, s.device);
    }
    if (s.device.is_cpu()) {
      data.fill_batch(indices, x.data(), y.data());
    } else {
      x_host.resize(static_cast<std::size_t>(rows * in));
      y_host.resize(static_cast<std::size_t>(rows * out));
      data.fill_batch(indices, x_host.data(), y_host.data());
      copy_bytes(x.raw_data(), s.device, x_host.data(), Device::cpu(), x.nbytes());
      copy_bytes(y.raw_data(), s.device, y_host.data(), Device::cpu(), y.nbytes());
    }
    const double data_ms = ms_since(data_start);

    // ---- the training step ----
    step_begin.record(stream);
    s.optimizer->zero_grad();
    Tensor loss = mse_loss(s.model->forward(x), y);
    loss.backward();
    s.optimizer->step();
    step_end.record(stream);
    step_end.synchronize();
    const double step_ms = step_begin.elapsed_ms(step_end);

    window_step_ms += step_ms;
    window_data_ms += data_ms;
    window_wall_ms += ms_since(wall_start);
    window_steps += 1;
    window_samples += rows;

    const bool log_now = step % o.log_every == 0 || step == s.steps || step == 1;
    if (!log_now) continue;
    last_loss = loss.item();
    if (std::isnan(first_loss)) first_loss = last_loss;
    if (!std::isfinite(last_loss)) {
      fail("the loss became {} at step {} (epoch {}). Lower --lr or check the data.", last_loss,
           step, epoch);
    }
    const double samples_per_s = 1000.0 * window_samples / std::max(window_wall_ms, 1e-9);
    const double mean_step_ms = window_step_ms / window_steps;
    const double mean_data_ms = window_data_ms / window_steps;
    const double eta_s = (s.steps - step) * (window_wall_ms / window_steps) / 1000.0;
    if (!o.quiet) {
      fmt::print("step {:>{}}/{}  epoch {}  loss {:.6e}  {:.0f} samples/s  step {:.3f} ms  data "
                 "{:.3f} ms  eta {}\n",
                 step, std::to_string(s.steps).size(), s.steps, epoch, last_loss, samples_per_s,
                 mean_step_ms, mean_data_ms, format_duration(eta_s));
      std::fflush(stdout);
    }
    if (metrics.is_open()) {
      metrics << nlohmann::json{{"step", step},
                                {"epoch", epoch},
                                {"loss", last_loss},
                                {"step_ms", mean_step_ms},
                                {"data_ms", mean_data_ms},
                                {"samples_per_s", samples_per_s},
                                {"steps_in_window", window_steps}}
                     .dump()
              << "\n";
      metrics.flush();
    }
    window_step_ms = window_data_ms = window_wall_ms = 0;
    window_steps = window_samples = 0;
  }

  if (!o.save_path.empty()) save_parameters(o.save_path, *s.model, s.steps, o);
  fmt::print("done: {} steps in {:.2f} s, loss {:.6e} -> {:.6e}{}\n", s.steps,
             ms_since(run_start) / 1000.0, first_loss, last_loss,
             o.save_path.empty() ? "" : fmt::format(", parameters saved to {}", o.save_path));
  return 0;
}

}  // namespace
}  // namespace nanoddp::train

int main(int argc, char** argv) {
  using namespace nanoddp::train;
  int exit_code = 0;
  const std::optional<TrainOptions> options = parse_options(argc, argv, exit_code);
  if (!options) return exit_code;
  Setup setup;
  try {
    setup = build(*options);
  } catch (const std::exception& e) {
    fmt::print(stderr, "nanoddp-train: error: {}\n", e.what());
    return 2;
  }
  try {
    return run(*options, setup);
  } catch (const std::exception& e) {
    fmt::print(stderr, "nanoddp-train: error: {}\n", e.what());
    return 1;
  }
}
