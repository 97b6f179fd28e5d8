// The Tracer: host spans, device spans resolved from events, and the JSON both become.
#include <doctest/doctest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "nanoddp/engine/stream.h"
#include "nanoddp/engine/trace.h"

using namespace nanoddp;
using nlohmann::json;

namespace {

using Clock = Tracer::Clock;

// Tracer::events_json() is the body of a JSON array. (Built by append: GCC 12 reports a false
// -Wrestrict for "[" + std::string.)
std::string as_json_array(const std::string& body) {
  std::string text = "[";
  text.append(body).append("]");
  return text;
}

double us(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(t.time_since_epoch()).count();
}

// The "X" (complete) events of a tracer, parsed back from its JSON.
json spans_of(const Tracer& tracer) {
  const json all = json::parse(as_json_array(tracer.events_json()));
  json spans = json::array();
  for (const json& e : all) {
    if (e.at("ph") == "X") spans.push_back(e);
  }
  return spans;
}

void busy_for(std::chrono::milliseconds d) {
  const auto until = Clock::now() + d;
  while (Clock::now() < until) std::this_thread::yield();
}

}  // namespace

TEST_CASE("trace: a TraceSpan records nothing without a tracer, its block's host time with one") {
  Tracer tracer(3);
  { TraceSpan span("untraced", TraceTrack::kCompute); }
  CHECK(tracer.size() == 0);

  const Clock::time_point before = Clock::now();
  {
    TraceScope scope(&tracer);
    TraceSpan span("work", TraceTrack::kData);
    busy_for(std::chrono::milliseconds(2));
  }
  const Clock::time_point after = Clock::now();
  const json spans = spans_of(tracer);
  REQUIRE(spans.size() == 1);
  const json& s = spans[0];
  CHECK(s.at("name") == "work");
  CHECK(s.at("cat") == "data");
  CHECK(s.at("pid") == 3);
  CHECK(s.at("tid") == static_cast<int>(TraceTrack::kData));
  CHECK(s.at("ts").get<double>() >= us(before) - 1.0);
  CHECK(s.at("dur").get<double>() >= 2000.0);
  CHECK(s.at("ts").get<double>() + s.at("dur").get<double>() <= us(after) + 1.0);
}

TEST_CASE("trace: a device span becomes its events' times, resolved when the JSON is written") {
  Tracer tracer(0);
  const Stream cpu = Stream::compute(Device::cpu());
  Event begin(Device::cpu()), end(Device::cpu());
  const Clock::time_point before = Clock::now();
  begin.record(cpu);
  busy_for(std::chrono::milliseconds(3));
  end.record(cpu);
  const double measured_ms = begin.elapsed_ms(end);
  busy_for(std::chrono::milliseconds(5));  // the span ends here, not when it is handed over
  tracer.device_span("kernel", TraceTrack::kCompute, std::move(begin), std::move(end),
                     {{"bucket", "2"}});
  CHECK(tracer.size() == 0);  // pending until resolved

  const json spans = spans_of(tracer);
  REQUIRE(spans.size() == 1);
  const json& s = spans[0];
  CHECK(s.at("name") == "kernel");
  CHECK(s.at("args").at("bucket") == "2");
  // The interval is the events' own; the start maps back onto the host clock (to within
  // nanoseconds on the CPU; allow a microsecond for the JSON's three decimals).
  CHECK(s.at("dur").get<double>() == doctest::Approx(measured_ms * 1000.0).epsilon(1e-6));
  CHECK(s.at("ts").get<double>() >= us(before) - 1.0);
  CHECK(s.at("ts").get<double>() <= us(before) + 1000.0);
  CHECK(tracer.size() == 1);  // resolved once, kept as an ordinary span
  CHECK(spans_of(tracer).size() == 1);
}

TEST_CASE("trace: a TraceSpan with a run-time name and arguments") {
  Tracer tracer(1);
  {
    TraceSpan span(&tracer, std::string("backward linear"), TraceTrack::kCompute, Device::cpu(),
                   {{"node", "7"}});
  }
  { TraceSpan span(nullptr, "ignored", TraceTrack::kCompute, Device::cpu()); }
  const json spans = spans_of(tracer);
  REQUIRE(spans.size() == 1);
  CHECK(spans[0].at("name") == "backward linear");
  CHECK(spans[0].at("args").at("node") == "7");
}

TEST_CASE("trace: instant_on the CPU is the host time it is given") {
  Tracer tracer(0);
  const Clock::time_point at = Clock::now() - std::chrono::milliseconds(4);
  tracer.instant_on(Device::cpu(), at, "bucket 0 ready", TraceTrack::kMarkers);
  const json all = json::parse(as_json_array(tracer.events_json()));
  int instants = 0;
  for (const json& e : all) {
    if (e.at("ph") != "i") continue;
    ++instants;
    CHECK(e.at("name") == "bucket 0 ready");
    CHECK(e.at("ts").get<double>() == doctest::Approx(us(at)).epsilon(1e-12));
  }
  CHECK(instants == 1);
}
