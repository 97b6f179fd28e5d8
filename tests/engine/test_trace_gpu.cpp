// Device spans on a GPU: a TraceSpan around work enqueued on cuda:0 must show when the GPU ran
// it, not the microseconds the host took to enqueue it. Runs only where a GPU is (gpu_main.cpp
// skips with 77).

#include "nanoddp/config.h"

#if NANODDP_WITH_CUDA

#include <doctest/doctest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

#include "nanoddp/engine/backend.h"
#include "nanoddp/engine/stream.h"
#include "nanoddp/engine/tensor.h"
#include "nanoddp/engine/trace.h"

using namespace nanoddp;

namespace {

// Tracer::events_json() is the body of a JSON array. (Built by append: GCC 12 reports a false
// -Wrestrict for "[" + std::string.)
std::string as_json_array(const std::string& body) {
  std::string text = "[";
  text.append(body).append("]");
  return text;
}
}  // namespace

TEST_CASE("gpu trace: a compute span is the GPU's time, not the host's enqueue time") {
  const Device gpu = Device::cuda(0);
  Backend& backend = backend_for(gpu);
  const std::int64_t n = 2048;
  Tensor a = Tensor::empty({n, n}, gpu), b = Tensor::empty({n, n}, gpu),
         c = Tensor::empty({n, n}, gpu);
  backend.fill_uniform(a.data(), n * n, 1, 0, 0, -1.0f, 1.0f);
  backend.fill_uniform(b.data(), n * n, 1, 1, 0, -1.0f, 1.0f);
  // One GEMM before the timed ones: the first launch of a kernel loads its module (CUDA's lazy
  // loading), which is host time that would count as "enqueue" below.
  backend.gemm(Transpose::kNo, Transpose::kNo, n, n, n, 1.0f, a.data(), b.data(), 0.0f, c.data());
  const Stream stream = Stream::compute(gpu);
  stream.synchronize();

  Tracer tracer(0);
  Event begin(gpu), end(gpu);
  double enqueue_ms = 0;
  {
    TraceScope scope(&tracer);
    TraceSpan span("gemms", TraceTrack::kCompute, gpu);
    const auto host_start = std::chrono::steady_clock::now();
    begin.record(stream);
    for (int i = 0; i < 20; ++i) {
      backend.gemm(Transpose::kNo, Transpose::kNo, n, n, n, 1.0f, a.data(), b.data(), 0.0f,
                   c.data());
    }
    // A marker recorded on the device: when the compute stream got past the GEMMs.
    tracer.instant_on(gpu, std::chrono::steady_clock::now(), "after the gemms",
                      TraceTrack::kMarkers);
    end.record(stream);
    enqueue_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - host_start)
            .count();
  }
  end.synchronize();
  const double gpu_ms = begin.elapsed_ms(end);
  const nlohmann::json all = nlohmann::json::parse(as_json_array(tracer.events_json()));
  const nlohmann::json* span = nullptr;
  const nlohmann::json* marker = nullptr;
  for (const nlohmann::json& e : all) {
    if (e.at("ph") == "X" && e.at("name") == "gemms") span = &e;
    if (e.at("ph") == "i" && e.at("name") == "after the gemms") marker = &e;
  }
  REQUIRE(span != nullptr);
  REQUIRE(marker != nullptr);
  const double span_ms = span->at("dur").get<double>() / 1000.0;
  INFO("span " << span_ms << " ms, GPU " << gpu_ms << " ms, host enqueue " << enqueue_ms << " ms");
  // 20 GEMMs of 2048^3 are milliseconds of GPU work; launching them is far less.
  REQUIRE(gpu_ms > 4.0 * enqueue_ms);
  // The span brackets the same work by events of its own, recorded just outside ours.
  CHECK(span_ms >= gpu_ms - 0.01);  // event timer resolution and float rounding
  CHECK(span_ms <= gpu_ms * 1.1 + 0.5);
  // The marker's event follows the GEMMs on the same stream: it is nearly their GPU time after
  // the span's start (a host-time marker would sit near the start, milliseconds early). gpu_ms
  // also holds the few microseconds from the marker to `end`, hence the slack.
  const double marker_after_us = marker->at("ts").get<double>() - span->at("ts").get<double>();
  INFO("marker " << marker_after_us << " us after the span's start");
  CHECK(marker_after_us >= 0.95 * gpu_ms * 1000.0 - 20.0);
  CHECK(marker_after_us <= span->at("dur").get<double>() + 20.0);
}

#endif  // NANODDP_WITH_CUDA
