// nanoddp-bench-gemm: GFLOP/s of the GEMMs nanoddp uses, against a raw Eigen product.
//
// Rows:
//   eigen          Eigen's product written right here: the yardstick for the CPU.
//   nanoddp-cpu    cpu_backend().gemm(...): the path every op takes on the CPU (Backend vtable
//                  -> kernels::cpu::gemm, nanoddp's own AVX-512 kernels; --gemm hand).
//   nanoddp-eigen  the same call with the backend set to Eigen (--gemm eigen): the engine's own
//                  overhead, which should be nil (it matches `eigen` to within noise).
//   cuda-hand    backend_for(cuda).gemm with the hand-written tiled kernel  } only where a
//   cuda-cublas  the same call with cuBLAS                                   } CUDA device is
// Shapes: squares (--sizes) and the three GEMMs of one linear layer of the MLP at
// --batch B, --hidden H: forward Y = X W^T (B,H,H NT), input grad dX = dY W (B,H,H NN), weight
// grad dW = dY^T X (H,H,B TN). A GEMM is 2 m n k flops.

#include <unistd.h>

// GCC 12 flags its own AVX-512 intrinsics (inlined into Eigen's kernel) with a false
// -Wmaybe-uninitialized; it fires after inlining, so only a file-wide pragma silences it.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <Eigen/Core>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/cli.h"
#include "common/machine_info.h"
#include "common/provenance.h"
#include "common/results_file.h"
#include "common/stats.h"
#include "nanoddp/config.h"
#include "nanoddp/engine/allocator.h"
#include "nanoddp/engine/backend.h"
#include "nanoddp/engine/cpu_backend.h"
#include "nanoddp/engine/cuda_device.h"
#include "nanoddp/engine/stream.h"
#include "nanoddp/kernels/cpu/kernels.h"

namespace {

using nanoddp::Transpose;

struct Shape {
  std::string name;  // "square", "mlp-forward", ...
  Transpose ta, tb;
  std::int64_t m, n, k;
  std::int64_t gemms = 1;  // GEMMs of this size one row times together (the mlp-step row)

  std::string layout() const {
    return fmt::format("{}{}", ta == Transpose::kYes ? 'T' : 'N',
                       tb == Transpose::kYes ? 'T' : 'N');
  }
  double gflop() const { return 2.0 * double(m) * double(n) * double(k) * double(gemms) * 1e-9; }
};

// The mlp-step row by kind of GEMM: the split of the median step (of the two middle steps,
// averaged, for an even count), so the kinds add up to the row's median. Medians taken per kind
// need not: on a busy machine each repetition can lose its time to a different kind.
struct StepKinds {
  double forward_ms = 0, input_grad_ms = 0, weight_grad_ms = 0;
};

struct Row {
  std::string backend;
  Shape shape;
  nanoddp::common::Spread ms;      // over the --repeats timed calls (steps, for mlp-step)
  std::optional<StepKinds> kinds;  // the mlp-step row only
  double median_ms() const { return ms.median; }
  double gflops() const { return shape.gflop() / (ms.median * 1e-3); }
};

struct Options {
  std::vector<std::int64_t> sizes = {128, 256, 512, 1024, 2048};
  std::int64_t batch = 64;
  std::int64_t hidden = 1024;
  int repeats = 10;
  int warmup = 2;
  int threads = 1;
  std::int64_t linears = 4;
  std::string json_path;
};

// Host timing of a synchronous call: warm-up (page faults, packing buffers, OpenMP pool),
// then `repeats` individually timed calls: their median (robust to a noisy shared machine) and
// spread.
nanoddp::common::Spread time_cpu_ms(const std::function<void()>& call, const Options& opt) {
  for (int i = 0; i < opt.warmup; ++i) call();
  std::vector<double> ms;
  for (int i = 0; i < opt.repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    call();
    const auto t1 = std::chrono::steady_clock::now();
    ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  return nanoddp::common::spread(ms);
}

// A buffer from nanoddp's caching allocator for `device`, returned on scope exit. Host operands
// come from it too, so the CPU rows run on the memory nanoddp-train uses (buffers of 2 MiB or
// more on 2 MiB pages), not on the 4 KiB pages of a std::vector.
class EngineBuffer {
 public:
  EngineBuffer(nanoddp::Device device, std::int64_t count)
      : device_(device),
        bytes_(static_cast<std::size_t>(count) * sizeof(float)),
        ptr_(static_cast<float*>(nanoddp::allocator_for(device).allocate(bytes_))) {}
  ~EngineBuffer() { nanoddp::allocator_for(device_).deallocate(ptr_, bytes_); }
  EngineBuffer(const EngineBuffer&) = delete;
  EngineBuffer& operator=(const EngineBuffer&) = delete;
  float* get() const { return ptr_; }

 private:
  nanoddp::Device device_;
  std::size_t bytes_;
  float* ptr_;
};

// Operand buffers of one shape on the host, filled once with uniform values in [-1, 1).
struct HostOperands {
  EngineBuffer a, b, c;
  explicit HostOperands(const Shape& s)
      : a(nanoddp::Device::cpu(), s.m * s.k),
        b(nanoddp::Device::cpu(), s.k * s.n),
        c(nanoddp::Device::cpu(), s.m * s.n) {
    std::mt19937 gen(1234);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::generate_n(a.get(), s.m * s.k, [&] { return dist(gen); });
    std::generate_n(b.get(), s.k * s.n, [&] { return dist(gen); });
    std::fill_n(c.get(), s.m * s.n, 0.0f);
  }
};

// The CPU backend's two GEMMs, each a row of its own.
const std::pair<const char*, nanoddp::GemmBackend> kCpuBackends[] = {
    {"nanoddp-cpu", nanoddp::GemmBackend::kHand}, {"nanoddp-eigen", nanoddp::GemmBackend::kEigen}};

// The yardstick: what a user of Eigen would write for C = op(A) op(B).
void eigen_gemm(const Shape& s, const float* a, const float* b, float* c) {
  using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const bool ta = s.ta == Transpose::kYes, tb = s.tb == Transpose::kYes;
  Eigen::Map<const Matrix> am(a, ta ? s.k : s.m, ta ? s.m : s.k);
  Eigen::Map<const Matrix> bm(b, tb ? s.n : s.k, tb ? s.k : s.n);
  Eigen::Map<Matrix> cm(c, s.m, s.n);
  if (!ta && !tb) {
    cm.noalias() = am * bm;
  } else if (!ta && tb) {
    cm.noalias() = am * bm.transpose();
  } else if (ta && !tb) {
    cm.noalias() = am.transpose() * bm;
  } else {
    cm.noalias() = am.transpose() * bm.transpose();
  }
}

// Eigen's own threads for the yardstick only: set, then unset (0: Eigen asks OpenMP again), so
// the library's Eigen rows, which keep each of their slices on one thread, see no setting.
struct EigenThreads {
  explicit EigenThreads(int threads) { Eigen::setNbThreads(threads); }
  ~EigenThreads() { Eigen::setNbThreads(0); }
  EigenThreads(const EigenThreads&) = delete;
  EigenThreads& operator=(const EigenThreads&) = delete;
};

void run_cpu(const Shape& s, const Options& opt, std::vector<Row>& rows) {
  HostOperands ops(s);
  {
    const EigenThreads eigen_threads(opt.threads);
    rows.push_back(
        {"eigen", s,
         time_cpu_ms([&] { eigen_gemm(s, ops.a.get(), ops.b.get(), ops.c.get()); }, opt)});
  }
  nanoddp::Backend& backend = nanoddp::cpu_backend();
  for (const auto& [name, which] : kCpuBackends) {
    backend.set_gemm_backend(which);
    rows.push_back({name, s,
                    time_cpu_ms(
                        [&] {
                          backend.gemm(s.ta, s.tb, s.m, s.n, s.k, 1.0f, ops.a.get(), ops.b.get(),
                                       0.0f, ops.c.get());
                        },
                        opt)});
  }
  backend.set_gemm_backend(nanoddp::GemmBackend::kHand);
}

// The GEMMs of one training step of an MLP of `linears` Linear(H, H) layers at batch B, in the
// order nanoddp-train runs them (forward layer by layer, then per layer from the last: dW, and
// dX except for the first layer), each layer with its own weight, gradient and activations.
//
// Why a separate row: an isolated GEMM re-reads the same operands every repetition, so they sit
// in cache. Inside a step each layer's weight and gradient are different memory (4 x 1024^2
// floats = 16 MiB of weights and 16 MiB of gradients), touched once per step, and arrive cold.
// This row is the GEMM floor of nanoddp-train's step_ms; the isolated rows are the peak.
Row run_mlp_step_gemms(const Options& opt, const char* name, nanoddp::GemmBackend which) {
  const std::int64_t b = opt.batch, h = opt.hidden, layers = opt.linears;
  const Shape unit{"mlp-step", Transpose::kNo, Transpose::kNo, b, h, h};
  const nanoddp::Device cpu = nanoddp::Device::cpu();
  std::deque<HostOperands> weights;  // a: activations [B,H], b: weight [H,H], c: output [B,H]
  std::deque<EngineBuffer> grads;
  for (std::int64_t l = 0; l < layers; ++l) {
    weights.emplace_back(unit);
    grads.emplace_back(cpu, h * h);
  }
  EngineBuffer grad_out(cpu, b * h), grad_in(cpu, b * h);
  std::fill_n(grad_out.get(), b * h, 0.01f);
  nanoddp::Backend& be = nanoddp::cpu_backend();
  be.set_gemm_backend(which);
  // Each GEMM is timed on its own (a clock read between GEMMs costs nanoseconds), so the step
  // splits by kind: which GEMMs suffer most from cold caches.
  auto timed = [](double& sum, const auto& call) {
    const auto t0 = std::chrono::steady_clock::now();
    call();
    sum += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  auto step = [&] {
    double f = 0, x = 0, w = 0;
    for (auto& layer : weights) {
      timed(f, [&] {
        be.gemm(Transpose::kNo, Transpose::kYes, b, h, h, 1.0f, layer.a.get(), layer.b.get(), 0.0f,
                layer.c.get());
      });
    }
    for (std::int64_t l = layers - 1; l >= 0; --l) {
      auto& layer = weights[static_cast<std::size_t>(l)];
      timed(w, [&] {
        be.gemm(Transpose::kYes, Transpose::kNo, h, h, b, 1.0f, grad_out.get(), layer.a.get(), 0.0f,
                grads[static_cast<std::size_t>(l)].get());
      });
      if (l > 0) {
        timed(x, [&] {
          be.gemm(Transpose::kNo, Transpose::kNo, b, h, h, 1.0f, grad_out.get(), layer.b.get(),
                  0.0f, grad_in.get());
        });
      }
    }
    return std::array{f, x, w};
  };
  for (int i = 0; i < opt.warmup; ++i) step();
  std::vector<std::array<double, 3>> steps;  // forward, input grad, weight grad
  for (int i = 0; i < opt.repeats; ++i) steps.push_back(step());
  be.set_gemm_backend(nanoddp::GemmBackend::kHand);
  auto sum = [](const std::array<double, 3>& s) { return s[0] + s[1] + s[2]; };
  std::sort(steps.begin(), steps.end(),
            [&](const auto& p, const auto& q) { return sum(p) < sum(q); });
  const std::array<double, 3>& lower = steps[(steps.size() - 1) / 2];
  const std::array<double, 3>& upper = steps[steps.size() / 2];
  const StepKinds kinds{.forward_ms = (lower[0] + upper[0]) / 2,
                        .input_grad_ms = (lower[1] + upper[1]) / 2,
                        .weight_grad_ms = (lower[2] + upper[2]) / 2};
  Shape shape = unit;
  shape.gemms = 3 * layers - 1;
  std::vector<double> step_ms;
  for (const auto& s : steps) step_ms.push_back(sum(s));
  nanoddp::common::Spread spread = nanoddp::common::spread(step_ms);
  spread.median = kinds.forward_ms + kinds.input_grad_ms + kinds.weight_grad_ms;  // the same step
  return {name, shape, spread, kinds};
}

// Device timing with events on the backend's stream: the host only enqueues, so each call is
// bracketed by two events and the GPU's own clock measures it.
void run_cuda(const Shape& s, const Options& opt, std::vector<Row>& rows) {
  const nanoddp::Device device = nanoddp::Device::cuda();
  nanoddp::Backend& backend = nanoddp::backend_for(device);
  EngineBuffer a(device, s.m * s.k), b(device, s.k * s.n), c(device, s.m * s.n);
  backend.fill_uniform(a.get(), s.m * s.k, 1, 0, 0, -1.0f, 1.0f);
  backend.fill_uniform(b.get(), s.k * s.n, 1, 1, 0, -1.0f, 1.0f);
  const nanoddp::GemmBackend before = backend.gemm_backend();
  for (auto [name, which] : {std::pair{"cuda-hand", nanoddp::GemmBackend::kHand},
                             std::pair{"cuda-cublas", nanoddp::GemmBackend::kCublas}}) {
    backend.set_gemm_backend(which);
    auto call = [&] {
      backend.gemm(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.get(), b.get(), 0.0f, c.get());
    };
    for (int i = 0; i < opt.warmup; ++i) call();
    std::vector<nanoddp::Event> starts, stops;
    for (int i = 0; i < opt.repeats; ++i) {
      starts.emplace_back(device);
      stops.emplace_back(device);
    }
    const nanoddp::Stream stream = backend.stream();
    for (int i = 0; i < opt.repeats; ++i) {
      starts[i].record(stream);
      call();
      stops[i].record(stream);
    }
    std::vector<double> ms;
    for (int i = 0; i < opt.repeats; ++i) {
      stops[i].synchronize();
      ms.push_back(starts[i].elapsed_ms(stops[i]));
    }
    rows.push_back({name, s, nanoddp::common::spread(ms)});
  }
  backend.set_gemm_backend(before);
}

// The host memory the run's buffers need, checked against what the machine has: each shape's
// three operands and the mlp-step row's per-layer buffers, all summed, because nanoddp's caching
// allocator keeps every buffer it served (a block is reused only for the same size). "" when it
// fits (or the machine does not say), else the problem, naming the flags.
std::string memory_problem(const Options& opt, const std::vector<Shape>& shapes) {
  double floats = 0;
  for (const Shape& s : shapes) {
    const double m = double(s.m), n = double(s.n), k = double(s.k);
    floats += m * k + k * n + m * n;
  }
  const double b = double(opt.batch), h = double(opt.hidden), layers = double(opt.linears);
  floats += layers * (2 * b * h + 2 * h * h) + 2 * b * h;  // mlp-step: see run_mlp_step_gemms
  const double need = floats * sizeof(float);
  const double available = nanoddp::common::available_memory_bytes();
  if (available < 0 || need <= available) return {};
  const double gib = 1024.0 * 1024.0 * 1024.0;
  std::string sizes;
  for (const std::int64_t n : opt.sizes) sizes += (sizes.empty() ? "" : ",") + std::to_string(n);
  return fmt::format(
      "--sizes {} --batch {} --hidden {} --linears {}: the buffers need {:.1f} GiB of host "
      "memory, more than the {:.1f} GiB this machine has available (MemAvailable); give smaller "
      "sizes",
      sizes, opt.batch, opt.hidden, opt.linears, need / gib, available / gib);
}

// --sizes' items: decimal integers in [1, max]. Returns the problem, naming the flag, or "".
std::string parse_sizes(const std::string& text, std::int64_t max, std::vector<std::int64_t>& out) {
  std::vector<std::string> items;
  if (std::string problem = nanoddp::cli::split_list("--sizes", text, items); !problem.empty()) {
    return problem;
  }
  out.clear();
  for (const std::string& item : items) {
    std::int64_t value = 0;
    if (const std::string problem = nanoddp::cli::detail::read_integer(item, value);
        !problem.empty()) {
      return "--sizes: " + problem;
    }
    if (value < 1 || value > max) {
      return fmt::format("--sizes: '{}' is out of range: it must be from 1 to {}", item, max);
    }
    out.push_back(value);
  }
  return "";
}

int run(int argc, char** argv) {
  Options opt;
  CLI::App app{"nanoddp-bench-gemm: GFLOP/s of Eigen, the CPU backend and the CUDA GEMMs"};
  // Bounds as nanoddp-bench-ddp's (widths up to 2^20, batches up to 2^24, 1024 threads): past
  // them a size is a typo (a 0 or a negative size gave 0 or negative GFLOP/s, --threads 100000
  // crashed); within them the buffers must still fit in memory, checked below.
  const std::int64_t max_width = std::int64_t{1} << 20;
  // A list read as bench-ddp reads its lists (common/cli.h): CLI11's own delimiter dropped an
  // empty item ("8,,16") and, given ",", took the next flag for a size.
  std::string sizes_text = "128,256,512,1024,2048";
  app.add_option("--sizes", sizes_text, "square sizes m = n = k, comma-separated")
      ->capture_default_str();
  app.add_option("--batch", opt.batch, "MLP batch size B (its shapes: B,H,H and H,H,B)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 24));
  app.add_option("--hidden", opt.hidden, "MLP hidden size H")
      ->check(CLI::Range(std::int64_t{1}, max_width));
  app.add_option("--repeats", opt.repeats,
                 "timed calls per row (the median and spread are reported)")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--warmup", opt.warmup, "untimed calls before timing")
      ->check(CLI::Range(0, 1000000));
  app.add_option("--threads", opt.threads, "GEMM threads for the CPU rows (Eigen's and nanoddp's)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--linears", opt.linears,
                 "Linear layers of the mlp-step row (nanoddp-train --layers L has L+1)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1000}));
  app.add_option("--json", opt.json_path, "also write one JSON object per row to FILE")
      ->check(nanoddp::cli::non_empty_path());
  if (const std::optional<int> code = nanoddp::cli::parse(app, argc, argv, "nanoddp-bench-gemm")) {
    return *code;
  }
  if (const std::string problem = parse_sizes(sizes_text, max_width, opt.sizes); !problem.empty()) {
    return nanoddp::cli::usage_error("nanoddp-bench-gemm", problem);
  }
  if (const std::string note = nanoddp::cli::deduplicate("--sizes", sizes_text, opt.sizes);
      !note.empty()) {
    fmt::print(stderr, "nanoddp-bench-gemm: note: {}\n", note);
  }

  std::vector<Shape> shapes;
  for (auto n : opt.sizes) shapes.push_back({"square", Transpose::kNo, Transpose::kNo, n, n, n});
  const auto b = opt.batch, h = opt.hidden;
  shapes.push_back({"mlp-forward", Transpose::kNo, Transpose::kYes, b, h, h});
  shapes.push_back({"mlp-input-grad", Transpose::kNo, Transpose::kNo, b, h, h});
  shapes.push_back({"mlp-weight-grad", Transpose::kYes, Transpose::kNo, h, h, b});
  // Refused before anything runs: an allocation that fails mid-run ended in an uncaught error.
  if (const std::string problem = memory_problem(opt, shapes); !problem.empty()) {
    return nanoddp::cli::usage_error("nanoddp-bench-gemm", problem);
  }
  const nlohmann::ordered_json machine = nanoddp::common::machine_info();
  std::vector<std::string> warnings;
  if (const int cores = machine["cores"].get<int>(); opt.threads > cores) {
    warnings.push_back(fmt::format(
        "--threads {} on {} core(s): more GEMM threads than cores, the threads time-share and the "
        "GFLOP/s understate what the cores can do",
        opt.threads, cores));
  }
  for (const std::string& w : warnings) fmt::print(stderr, "nanoddp-bench-gemm: warning: {}\n", w);

  nanoddp::kernels::cpu::set_gemm_threads(opt.threads);

  // Opened before anything is measured: a path that cannot be written is a usage error now, not
  // after the run; every write is checked (common/results_file.h).
  nanoddp::common::ResultsFile json("nanoddp-bench-gemm", "--json");
  if (!opt.json_path.empty()) {
    if (const std::string problem = json.open(opt.json_path); !problem.empty()) {
      return nanoddp::cli::usage_error("nanoddp-bench-gemm", problem);
    }
  }

  const bool cuda = nanoddp::cuda_device_count() > 0;
  fmt::print(
      "nanoddp {} on {}, {}, CPU GEMM threads {}; per row {} timed call(s) after {} warm-up "
      "call(s): their median, min, p10, p90 and max\n",
      NANODDP_VERSION, nanoddp::common::hostname(), nanoddp::common::compiler(),
      nanoddp::kernels::cpu::gemm_threads(), opt.repeats, opt.warmup);
#if !defined(__AVX2__)
  fmt::print(
      "note: this benchmark was compiled without -march=native, so the `eigen` "
      "yardstick uses baseline SIMD and under-states Eigen\n");
#endif
  if (!cuda) fmt::print("note: CUDA rows skipped: {}\n", nanoddp::cuda_status());

  std::vector<Row> rows;
  for (const auto& s : shapes) {
    run_cpu(s, opt, rows);
    if (cuda) run_cuda(s, opt, rows);
  }
  // Per CPU backend, the isolated medians of the step's GEMMs, summed: its step row's yardstick.
  std::map<std::string, double> isolated_step_ms;
  for (const auto& r : rows) {
    if (r.shape.name == "mlp-forward" || r.shape.name == "mlp-weight-grad") {
      isolated_step_ms[r.backend] += static_cast<double>(opt.linears) * r.median_ms();
    } else if (r.shape.name == "mlp-input-grad") {
      isolated_step_ms[r.backend] += static_cast<double>(opt.linears - 1) * r.median_ms();
    }
  }
  for (const auto& [name, which] : kCpuBackends)
    rows.push_back(run_mlp_step_gemms(opt, name, which));

  fmt::print("\n{:<13} {:<16} {:<6} {:>6} {:>6} {:>6} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}\n",
             "backend", "shape", "layout", "m", "n", "k", "median ms", "GFLOP/s", "vs eigen",
             "min ms", "p10 ms", "p90 ms", "max ms");
  nlohmann::ordered_json provenance = nanoddp::common::provenance(argc, argv);
  if (!opt.json_path.empty()) {
    std::error_code ec;
    provenance["json"] = std::filesystem::absolute(opt.json_path, ec).string();
  }
  const nlohmann::ordered_json build = nanoddp::common::build_info();
  fmt::print("# {}\n", nanoddp::common::provenance_line(provenance));
  double eigen_gflops = 0.0;
  double eigen_step_ms = 0.0;
  for (const auto& r : rows) {
    if (r.backend == "nanoddp-eigen" && r.shape.name == "mlp-step") eigen_step_ms = r.median_ms();
  }
  for (const auto& r : rows) {
    if (r.backend == "eigen") eigen_gflops = r.gflops();  // rows come eigen-first per shape
    double ratio = eigen_gflops > 0 ? r.gflops() / eigen_gflops : 0.0;
    // The step rows have no raw-Eigen row: theirs is the backend run with Eigen's GEMM.
    if (r.shape.name == "mlp-step") ratio = eigen_step_ms / r.median_ms();
    fmt::print(
        "{:<13} {:<16} {:<6} {:>6} {:>6} {:>6} {:>10.3f} {:>9.1f} {:>8.2f}x {:>9.3f} {:>9.3f} "
        "{:>9.3f} {:>9.3f}\n",
        r.backend, r.shape.name, r.shape.layout(), r.shape.m, r.shape.n, r.shape.k, r.median_ms(),
        r.gflops(), ratio, r.ms.min, r.ms.p10, r.ms.p90, r.ms.max);
    if (json.is_open()) {
      const nlohmann::json line = {{"benchmark", "gemm"},
                                   {"backend", r.backend},
                                   {"shape", r.shape.name},
                                   {"layout", r.shape.layout()},
                                   {"m", r.shape.m},
                                   {"n", r.shape.n},
                                   {"k", r.shape.k},
                                   {"median_ms", r.median_ms()},
                                   {"min_ms", r.ms.min},
                                   {"p10_ms", r.ms.p10},
                                   {"p90_ms", r.ms.p90},
                                   {"max_ms", r.ms.max},
                                   {"gflops", r.gflops()},
                                   {"ratio_to_eigen", ratio},
                                   {"repeats", opt.repeats},
                                   {"warmup", opt.warmup},
                                   {"threads", opt.threads},
                                   {"hostname", nanoddp::common::hostname()},
                                   {"compiler", nanoddp::common::compiler()},
                                   {"nanoddp_version", NANODDP_VERSION},
                                   {"with_cuda", bool(NANODDP_WITH_CUDA)},
                                   {"gemms", r.shape.gemms}};
      nlohmann::json out = line;
      out["warnings"] = warnings;
      out["provenance"] = provenance;
      out["machine"] = machine;
      out["build"] = build;
      if (r.kinds) {
        out["forward_ms"] = r.kinds->forward_ms;
        out["input_grad_ms"] = r.kinds->input_grad_ms;
        out["weight_grad_ms"] = r.kinds->weight_grad_ms;
        // forward/input_grad/weight_grad_ms are the step's totals per kind (all layers).
        out["isolated_ms"] = isolated_step_ms[r.backend];
        out["ratio_to_isolated"] = isolated_step_ms[r.backend] / r.median_ms();
      }
      json.write_line(out.dump());
    }
  }
  if (!json.flush()) return 1;
  fmt::print(
      "\nmlp-step: the {} GEMMs of one training step of {} x Linear({}, {}) at batch {}, in "
      "training order over per-layer buffers (cold caches, as in nanoddp-train), against the same "
      "GEMMs timed one at a time (warm caches, the rows above); per GEMM by kind, in training "
      "order (warm):\n",
      3 * opt.linears - 1, opt.linears, opt.hidden, opt.hidden, opt.batch);
  const double l = static_cast<double>(opt.linears);
  for (const auto& step : rows) {
    if (step.shape.name != "mlp-step") continue;
    auto warm = [&](const char* shape) {
      for (const auto& r : rows) {
        if (r.backend == step.backend && r.shape.name == shape) return r.median_ms();
      }
      return 0.0;
    };
    const StepKinds& kinds = *step.kinds;
    fmt::print(
        "  {:<13} {:.3f} ms ({:.3f} warm): forward {:.3f} ({:.3f}), input grad {:.3f} ({:.3f}), "
        "weight grad {:.3f} ({:.3f})\n",
        step.backend, step.median_ms(), isolated_step_ms[step.backend], kinds.forward_ms / l,
        warm("mlp-forward"), opt.linears > 1 ? kinds.input_grad_ms / (l - 1) : 0.0,
        warm("mlp-input-grad"), kinds.weight_grad_ms / l, warm("mlp-weight-grad"));
  }
  return json.close() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return nanoddp::cli::run_reporting_errors("nanoddp-bench-gemm", [&] { return run(argc, argv); });
}
