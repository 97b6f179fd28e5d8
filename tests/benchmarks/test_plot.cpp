// The chart scripts (benchmarks/plot) on real benchmark output: nanoddp-bench-allreduce on two
// processes, nanoddp-bench-gemm and 2-rank nanoddp-train --trace runs (plain DDP, --no-overlap,
// --zero 1 and --zero 2, --optimizer-in-backward), all on tiny settings, then plot.py /
// plot_trace.py on their files. The PNGs must be real PNGs with a size, and each chart must be
// reported. nanoddp-bench-ddp is checked on a hand-written FIXTURE
// (tests/benchmarks/data/bench_ddp_sample.jsonl, host "hand-written-fixture"): its values are made
// up to look like this machine's, not measured; plot_trace.py also on hand-written traces (damaged
// ones, a long one, steps of known length). No measured figures are asserted (shared machine).
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "support/background_process.h"
#include "support/subprocess.h"

using namespace nanoddp::testing;
namespace fs = std::filesystem;

namespace {

std::string source_dir() {
  const char* source = std::getenv("NANODDP_SOURCE_DIR");
  REQUIRE_MESSAGE(source != nullptr, "NANODDP_SOURCE_DIR is not set (run the tests with ctest)");
  return source;
}

std::string script(const std::string& name) {
  return source_dir() + "/benchmarks/plot/" + name;
}

// Debian's python3-matplotlib is installed for /usr/bin/python3 (a python3 found first on PATH,
// e.g. pyenv's, may not have it). NANODDP_PYTHON overrides.
std::string python() {
  const char* chosen = std::getenv("NANODDP_PYTHON");
  const std::string path = chosen != nullptr ? chosen : "/usr/bin/python3";
  const ProcessResult probe = run_process({path, "-c", "import matplotlib"});
  REQUIRE_MESSAGE(probe.exit_code == 0, path << " cannot import matplotlib: install "
                                                "python3-matplotlib (scripts/install-deps.sh) or "
                                                "set NANODDP_PYTHON\n"
                                             << probe.output);
  return path;
}

ProcessOptions quick() {
  ProcessOptions options;
  options.timeout = std::chrono::seconds(60);
  options.env["NANODDP_TIMEOUT_S"] = "30";
  return options;
}

ProcessResult run_ok(const std::vector<std::string>& argv) {
  ProcessResult r = run_process(argv, quick());
  INFO(argv.front() << " " << (argv.size() > 1 ? argv[1] : ""));
  REQUIRE_MESSAGE((!r.timed_out && !r.signaled && r.exit_code == 0), r.output);
  return r;
}

std::uint32_t big_endian(const std::array<unsigned char, 24>& b, std::size_t at) {
  return (std::uint32_t{b[at]} << 24) | (std::uint32_t{b[at + 1]} << 16) |
         (std::uint32_t{b[at + 2]} << 8) | std::uint32_t{b[at + 3]};
}

// A PNG starts with its 8-byte signature, then the IHDR chunk: length 13, "IHDR", width, height.
void check_png(const std::string& path) {
  CAPTURE(path);
  REQUIRE(fs::is_regular_file(path));
  std::ifstream in(path, std::ios::binary);
  std::array<unsigned char, 24> head{};
  in.read(reinterpret_cast<char*>(head.data()), head.size());
  REQUIRE(in.gcount() == 24);
  const std::array<unsigned char, 8> signature = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  CHECK(std::equal(signature.begin(), signature.end(), head.begin()));
  CHECK(big_endian(head, 8) == 13u);
  CHECK(std::string(head.begin() + 12, head.begin() + 16) == "IHDR");
  const std::uint32_t width = big_endian(head, 16), height = big_endian(head, 20);
  CHECK(width > 0);
  CHECK(height > 0);
  // The charts are drawn at 100 dpi, about 7-12 inches wide: a few hundred to ~1200 pixels.
  CHECK(width <= 2000);
  CHECK(height <= 2000);
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

void check_chart(const ProcessResult& r, const std::string& path) {
  INFO(r.output);
  CHECK(contains(r.output, "wrote " + path + ":"));
  check_png(path);
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A hand-written trace in nanoddp-train's shape: per rank and step (1000 µs apart) its data
// (`data_us`, ending at 400), forward, one backward node and its gradient, bucket 0 ready and its
// all-reduce, the wait for it and the optimizer step (ending at 950). Each step's own time as
// nanoddp-train's step_ms counts it (from its data to the end of its optimizer step, the data
// left out) is 0.55 ms, whatever `data_us` (at most 400).
std::string crafted_trace(int steps, int ranks = 1, int data_us = 200) {
  std::string text = R"({"traceEvents": [
  {"ph": "M", "name": "run_config", "pid": 0, "args": {"batch": 8, "grad_accum": 1}})";
  const std::array<const char*, 4> tracks = {"compute", "communication", "markers", "data"};
  for (int r = 0; r < ranks; ++r) {
    const std::string pid = std::to_string(r);
    text += ",\n  {\"ph\": \"M\", \"name\": \"process_name\", \"pid\": " + pid +
            ", \"args\": {\"name\": \"rank " + pid + "\"}}";
    for (std::size_t t = 0; t < tracks.size(); ++t) {
      text += ",\n  {\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": " + pid +
              ", \"tid\": " + std::to_string(t) + ", \"args\": {\"name\": \"" + tracks[t] + "\"}}";
    }
  }
  for (int k = 0; k < steps; ++k) {
    for (int r = 0; r < ranks; ++r) {
      const std::string pid = std::to_string(r);
      const long start = 1000L * k;
      const auto event = [&](const std::string& name, int tid, long ts, long dur) {
        text += ",\n  {\"ph\": \"" + std::string(dur < 0 ? "i" : "X") + "\", \"name\": \"" + name +
                "\", \"pid\": " + pid + ", \"tid\": " + std::to_string(tid) +
                ", \"ts\": " + std::to_string(start + ts) +
                (dur < 0 ? "" : ", \"dur\": " + std::to_string(dur)) + "}";
      };
      event("data", 3, 400 - data_us, data_us);
      event("forward", 0, 400, 200);
      event("backward linear", 0, 600, 150);
      event("grad layers.0.weight", 2, 750, -1);
      event("bucket 0 ready", 2, 750, -1);
      event("all-reduce bucket 0", 1, 760, 100);
      event("wait for all-reduce", 0, 760, 110);
      event("optimizer step", 0, 900, 50);
    }
  }
  return text + "\n]}\n";
}

// `text` with each match of `pattern` replaced by what `with` makes of it.
template <typename F>
std::string replace_each(const std::string& text, const std::regex& pattern, F with) {
  std::string out;
  std::size_t done = 0;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), pattern);
       it != std::sregex_iterator(); ++it) {
    out.append(text, done, static_cast<std::size_t>(it->position()) - done);
    out += with(*it);
    done = static_cast<std::size_t>(it->position() + it->length());
  }
  return out + text.substr(done);
}

// Runs plot_trace.py with `args`, expecting bad input: exit 2, the error on one line beginning
// "plot_trace.py: error: " and holding `expected`, no traceback.
void check_refused(const std::string& py, const std::vector<std::string>& args,
                   const std::string& expected, ProcessOptions options = quick()) {
  std::vector<std::string> argv = {py, script("plot_trace.py")};
  argv.insert(argv.end(), args.begin(), args.end());
  const ProcessResult r = run_process(argv, options);
  CAPTURE(expected);
  INFO(r.output);
  CHECK(!r.timed_out);
  CHECK(r.exit_code == 2);
  const std::size_t at = r.output.find("plot_trace.py: error: ");
  CHECK(at != std::string::npos);
  if (at != std::string::npos) {
    CHECK(contains(r.output.substr(at, r.output.find('\n', at) - at), expected));
  }
  CHECK(!contains(r.output, "Traceback"));
}

// Runs plot_trace.py with `args`, which must succeed (run_ok).
ProcessResult plot_trace(const std::string& py, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {py, script("plot_trace.py")};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_ok(argv);
}

// An element plot_trace.py drew, found in its SVG by id (plot_trace.py's svg_id: a bar is
// "bar.p<pid>.<track>.<span name>[.of.<module>].n<k>", a gradient label
// "grad-label.p<pid>.<module>.n<k>"): the rectangle of a bar, the text of a label, and where in
// the document it is (later is drawn on top).
struct SvgElement {
  std::string id;
  double x0 = 0, x1 = 0, y0 = 0, y1 = 0;  // a bar's corners (SVG points, y down)
  std::string text;                       // a label's
  std::size_t at = 0;
};

// The elements whose id starts with `prefix`.
std::vector<SvgElement> svg_elements(const std::string& svg, const std::string& prefix) {
  std::vector<SvgElement> found;
  const std::string open = "<g id=\"" + prefix;
  const std::regex number("-?[0-9]+(\\.[0-9]+)?");
  const auto attribute = [](const std::string& text, const std::string& name) {
    const std::size_t at = text.find(" " + name + "=\"");
    if (at == std::string::npos) return std::string();
    const std::size_t from = at + name.size() + 3;
    return text.substr(from, text.find('"', from) - from);
  };
  for (std::size_t at = svg.find(open); at != std::string::npos; at = svg.find(open, at + 1)) {
    SvgElement e;
    e.at = at;
    e.id = attribute(svg.substr(at, 200), "id");
    // The group runs to the next element with an id.
    const std::size_t end = svg.find("<g id=\"", at + 1);
    const std::string group = svg.substr(at, end == std::string::npos ? end : end - at);
    if (const std::size_t text = group.find("<text"); text != std::string::npos) {
      const std::size_t from = group.find('>', text) + 1;
      e.text = group.substr(from, group.find("</text>", from) - from);
    }
    // A bar: a rectangle "M x y L x y ...", placed by a <use x= y=> when it has an edge.
    const std::string path = attribute(group, "d");
    std::vector<double> xy;
    for (auto it = std::sregex_iterator(path.begin(), path.end(), number);
         it != std::sregex_iterator(); ++it) {
      xy.push_back(std::stod(it->str()));
    }
    if (xy.size() >= 4) {
      const std::string use = group.substr(std::min(group.find("<use"), group.size()));
      const double dx = use.empty() ? 0 : std::stod(attribute(use, "x"));
      const double dy = use.empty() ? 0 : std::stod(attribute(use, "y"));
      e.x0 = e.x1 = xy[0] + dx;
      e.y0 = e.y1 = xy[1] + dy;
      for (std::size_t k = 0; k + 1 < xy.size(); k += 2) {
        e.x0 = std::min(e.x0, xy[k] + dx);
        e.x1 = std::max(e.x1, xy[k] + dx);
        e.y0 = std::min(e.y0, xy[k + 1] + dy);
        e.y1 = std::max(e.y1, xy[k + 1] + dy);
      }
    }
    found.push_back(e);
  }
  return found;
}

// The gradient labels of a --layers 2 model (Linear modules layers.0, .2, .4) on ranks 0 and 1:
// each rank's first (layers.4, backward's first gradient) is always drawn, every one reads
// "∇<module>" for the module its id names, and each Linear's backward bar names its module.
void check_gradient_labels(const std::string& svg) {
  for (const char* pid : {"p0", "p1"}) {
    CAPTURE(pid);
    const auto labels = svg_elements(svg, std::string("grad-label.") + pid + ".");
    CHECK(!labels.empty());
    CHECK(!svg_elements(svg, std::string("grad-label.") + pid + ".layers.4.").empty());
    for (const SvgElement& label : labels) {
      CAPTURE(label.id);
      const std::string rest = label.id.substr(label.id.find('.', 11) + 1);
      const std::string module = rest.substr(0, rest.rfind(".n"));
      CHECK((module == "layers.0" || module == "layers.2" || module == "layers.4"));
      CHECK(label.text == "∇" + module);
    }
    for (const char* module : {"layers.0", "layers.2", "layers.4"}) {
      CAPTURE(module);
      CHECK(!svg_elements(
                 svg, std::string("bar.") + pid + ".compute.backward_linear.of." + module + ".n")
                 .empty());
    }
  }
}

}  // namespace

TEST_CASE("plot.py: charts from real nanoddp-bench-allreduce and nanoddp-bench-gemm runs") {
  const std::string py = python();
  TempDir dir;
  // Two processes through the real launcher; four sizes, a few ops each; nanoddp and raw Gloo.
  const std::vector<std::string> allreduce = {bin_path("nanoddp-run"),
                                              "--nproc-per-node",
                                              "2",
                                              bin_path("nanoddp-bench-allreduce"),
                                              "-b",
                                              "8",
                                              "-e",
                                              "32K",
                                              "-f",
                                              "16",
                                              "-n",
                                              "3",
                                              "-w",
                                              "1"};
  auto nanoddp_run = allreduce;
  nanoddp_run.insert(nanoddp_run.end(), {"--json", dir.file("allreduce.jsonl")});
  run_ok(nanoddp_run);
  auto raw_run = allreduce;
  raw_run.insert(raw_run.end(), {"--raw", "--json", dir.file("raw.jsonl")});
  run_ok(raw_run);
  run_ok({bin_path("nanoddp-bench-gemm"), "--sizes", "32,64", "--repeats", "1", "--warmup", "0",
          "--batch", "8", "--hidden", "64", "--linears", "2", "--json", dir.file("gemm.jsonl")});

  const std::string out = dir.file("charts");
  const ProcessResult r = run_ok({py, script("plot.py"), "--out", out, dir.file("allreduce.jsonl"),
                                  dir.file("raw.jsonl"), dir.file("gemm.jsonl")});
  check_chart(r, out + "/allreduce_busbw.png");
  check_chart(r, out + "/gemm_gflops.png");
  check_chart(r, out + "/gemm_mlp.png");
  // Both all-reduce modes, out of place and in place, became series of the one chart.
  CHECK(contains(r.output, "(4 series)"));
  // Nothing else was written but each chart's SVG twin.
  CHECK(std::distance(fs::directory_iterator(out), fs::directory_iterator()) == 6);
  for (const char* name : {"allreduce_busbw", "gemm_gflops", "gemm_mlp"}) {
    CHECK(contains(r.output, "wrote " + out + "/" + name + ".svg: the same chart as SVG"));
  }
  // The chart says what its numbers rest on: ops, warm-up, commit, date (SVG text is text).
  std::ifstream svg(out + "/allreduce_busbw.svg");
  const std::string text((std::istreambuf_iterator<char>(svg)), std::istreambuf_iterator<char>());
  CHECK(contains(text, "3 ops/round"));
  CHECK(contains(text, "1 warm-up"));
  CHECK(contains(text, "commit "));
  CHECK(contains(text, " UTC"));
  CHECK(contains(text, " cores, "));  // the machine line: cpu, N cores, host

  // The same run again (a second launch, into another file): kept as error bars, and said so,
  // never dropped.
  auto again = allreduce;
  again.insert(again.end(), {"--json", dir.file("again.jsonl")});
  run_ok(again);
  const ProcessResult twice = run_ok(
      {py, script("plot.py"), "--out", out, dir.file("allreduce.jsonl"), dir.file("again.jsonl")});
  CHECK(contains(twice.output, "measured more than once in one series"));
  CHECK(contains(twice.output, "min-max error bars"));
}

TEST_CASE("plot.py: bench-ddp charts from the hand-written fixture") {
  const std::string py = python();
  TempDir dir;
  // A FIXTURE, not a measurement: nanoddp-bench-ddp's schema with made-up, plausible values.
  const std::string fixture = source_dir() + "/tests/benchmarks/data/bench_ddp_sample.jsonl";
  const ProcessResult r = run_ok({py, script("plot.py"), "--out", dir.path(), fixture});
  check_chart(r, dir.file("ddp_scaling.png"));
  check_chart(r, dir.file("ddp_breakdown.png"));
  // 3 bucket caps x overlap on/off, each a line across world sizes 1 and 2.
  CHECK(contains(r.output, "(6 configurations)"));
  // World size 1 has no communication to break down: one panel, for 2 ranks.
  CHECK(contains(r.output, "(1 panel)"));
}

TEST_CASE("plot.py: bench-ddp charts from a real nanoddp-bench-ddp sweep") {
  const std::string py = python();
  TempDir dir;
  // The real driver: world 1 and 2, two bucket caps, overlap on and off, a tiny model.
  run_ok({bin_path("nanoddp-bench-ddp"),
          "--world",
          "1,2",
          "--hidden",
          "32",
          "--layers",
          "2",
          "--batch",
          "8",
          "--bucket-cap-mb",
          "0.002,25",
          "--overlap",
          "on,off",
          "--steps",
          "3",
          "--warmup",
          "1",
          "--quiet",
          "--json",
          dir.file("ddp.jsonl")});
  const std::string out = dir.file("charts");
  const ProcessResult r = run_ok({py, script("plot.py"), "--out", out, dir.file("ddp.jsonl")});
  check_chart(r, out + "/ddp_scaling.png");
  check_chart(r, out + "/ddp_breakdown.png");
  // 2 bucket caps x overlap on/off, each a line across world sizes 1 and 2 (the one plain
  // baseline is every line's world-1 point).
  CHECK(contains(r.output, "(4 configurations)"));
  std::ifstream svg(out + "/ddp_scaling.svg");
  const std::string text((std::istreambuf_iterator<char>(svg)), std::istreambuf_iterator<char>());
  CHECK(contains(text, "3 steps; 1 warm-up"));
  CHECK(contains(text, "commit "));

  // A sweep run twice (the same command into two files), each with --repeats 2: both kept, as
  // error bars, with a note; the duplicated baseline is said too.
  for (const char* name : {"rep.jsonl", "rep2.jsonl"}) {
    run_ok({bin_path("nanoddp-bench-ddp"), "--world", "1,2", "--hidden", "16", "--layers", "1",
            "--batch", "8", "--steps", "3", "--warmup", "1", "--repeats", "2", "--quiet", "--json",
            dir.file(name)});
  }
  const ProcessResult rep =
      run_ok({py, script("plot.py"), "--out", out, dir.file("rep.jsonl"), dir.file("rep2.jsonl")});
  CHECK(contains(rep.output, "2 records for"));
  CHECK(contains(rep.output, "2 baseline records for"));
  CHECK(contains(rep.output, "drawn as their median with min-max error bars"));
  CHECK(contains(rep.output, "(1 configurations)"));

  // The same file twice would count double: refused. A copy of it: each record kept once.
  const ProcessResult twice = run_process(
      {py, script("plot.py"), "--out", out, dir.file("rep.jsonl"), dir.file("rep.jsonl")}, quick());
  CHECK(twice.exit_code == 2);
  CHECK(contains(twice.output, "given twice"));
  fs::copy_file(dir.file("rep.jsonl"), dir.file("copy.jsonl"));
  const ProcessResult copy =
      run_ok({py, script("plot.py"), "--out", out, dir.file("rep.jsonl"), dir.file("copy.jsonl")});
  CHECK(contains(copy.output, "the same record as " + dir.file("rep.jsonl") + ":1; kept once"));

  // A different command (another model) is another run: its own series, not a zig-zag.
  run_ok({bin_path("nanoddp-bench-ddp"), "--world", "2", "--hidden", "16", "--layers", "1",
          "--batch", "8", "--steps", "4", "--warmup", "1", "--quiet", "--json",
          dir.file("other.jsonl")});
  const ProcessResult runs =
      run_ok({py, script("plot.py"), "--out", out, dir.file("rep.jsonl"), dir.file("other.jsonl")});
  CHECK(contains(runs.output, "run 1: "));
  CHECK(contains(runs.output, "run 2: "));
  CHECK(contains(runs.output, "(2 configurations)"));
}

TEST_CASE("plot.py: values a chart cannot show, failed points and mixed builds are never silent") {
  const std::string py = python();
  TempDir dir;
  const auto line = [](const std::string& time_us, const std::string& busbw,
                       const std::string& commit) {
    return R"({"benchmark":"allreduce","backend":"gloo","mode":"nanoddp","ranks":2,"bytes":1024,)"
           R"("time_us":)" +
           time_us + R"(,"busbw_gbps":)" + busbw +
           R"(,"machine":{"hostname":"h"},"provenance":{"commit":")" + commit +
           R"(","dirty":"no"}})" + "\n";
  };
  struct Case {
    std::string text;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {line("-1", "1.5", "a"), "'time_us' is -1, expected a number > 0"},
      {line("NaN", "1.5", "a"), "'time_us' is nan, expected a finite number"},
      {line("2.0", "Infinity", "a"), "'busbw_gbps' is inf, expected a finite number"},
      {line("2.0", "0", "a"), "'busbw_gbps' is 0, expected a number > 0"},
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const std::string path = dir.file("bad" + std::to_string(i) + ".jsonl");
    write_file(path, line("2.0", "1.5", "a") + cases[i].text);
    const ProcessResult r =
        run_process({py, script("plot.py"), "--out", dir.file("out"), path}, quick());
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output, "plot.py: error: " + path + ":2: " + cases[i].expected));
    CHECK(!contains(r.output, "Traceback"));
  }

  // Two builds in one chart: refused, or (--allow-mixed-builds) separate labelled series.
  write_file(dir.file("a.jsonl"), line("2.0", "1.5", "aaaaaaa"));
  write_file(dir.file("b.jsonl"), line("3.0", "1.0", "bbbbbbb"));
  const ProcessResult mixed = run_process(
      {py, script("plot.py"), "--out", dir.file("out"), dir.file("a.jsonl"), dir.file("b.jsonl")},
      quick());
  CHECK(mixed.exit_code == 2);
  CHECK(contains(mixed.output, "come from 2 builds or hosts"));
  CHECK(contains(mixed.output, "--allow-mixed-builds"));
  const ProcessResult allowed = run_ok({py, script("plot.py"), "--allow-mixed-builds", "--out",
                                        dir.file("out"), dir.file("a.jsonl"), dir.file("b.jsonl")});
  CHECK(contains(allowed.output, "drawn as separate series"));
  CHECK(contains(allowed.output, "(2 series)"));

  // A failed bench-ddp point (an "error" row): said, not drawn, not an error.
  const std::string fixture = source_dir() + "/tests/benchmarks/data/bench_ddp_sample.jsonl";
  std::ifstream in(fixture);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  text += R"({"bench":"ddp","config":{"world_size":4,"hidden":1024,"layers":3},"baseline":false,)"
          R"("error":"the job failed: timed out","machine":{"hostname":"hand-written-fixture"}})"
          "\n";
  write_file(dir.file("failed.jsonl"), text);
  const ProcessResult failed =
      run_ok({py, script("plot.py"), "--out", dir.file("out"), dir.file("failed.jsonl")});
  CHECK(contains(failed.output, "failed.jsonl:13: a failed point, not drawn: the job failed"));
}

TEST_CASE("plot.py: collectives, ZeRO stages and commands are series of their own") {
  const std::string py = python();
  TempDir dir;
  const auto bench_allreduce = [&](const std::vector<std::string>& flags, const std::string& file) {
    std::vector<std::string> argv = {bin_path("nanoddp-bench-allreduce"),
                                     "--nproc-per-node",
                                     "2",
                                     "-b",
                                     "8",
                                     "-e",
                                     "1K",
                                     "-f",
                                     "8",
                                     "-w",
                                     "1"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.insert(argv.end(), {"--json", dir.file(file)});
    run_ok(argv);
  };
  // --collective reduce_scatter / allgather lines (refused as "not a line of ..." before): a
  // series per collective, named.
  bench_allreduce({"-n", "2", "--collective", "reduce_scatter"}, "rs.jsonl");
  bench_allreduce({"-n", "2", "--collective", "allgather"}, "ag.jsonl");
  bench_allreduce({"-n", "2"}, "ar.jsonl");
  const std::string out = dir.file("charts");
  const ProcessResult rs = run_ok({py, script("plot.py"), "--out", out, dir.file("rs.jsonl")});
  check_chart(rs, out + "/allreduce_busbw.png");
  CHECK(contains(rs.output, "reduce-scatter bus bandwidth"));
  const ProcessResult all = run_ok({py, script("plot.py"), "--out", out, dir.file("rs.jsonl"),
                                    dir.file("ag.jsonl"), dir.file("ar.jsonl")});
  check_chart(all, out + "/allreduce_busbw.png");
  CHECK(contains(all.output, "(6 series)"));  // 3 collectives x in place, out of place
  {
    std::ifstream svg(out + "/allreduce_busbw.svg");
    const std::string text((std::istreambuf_iterator<char>(svg)), std::istreambuf_iterator<char>());
    CHECK(contains(text, "reduce-scatter, gloo: nanoddp ProcessGroup"));
    CHECK(contains(text, "all-gather, gloo: nanoddp ProcessGroup"));
    CHECK(contains(text, "all-reduce, gloo: nanoddp ProcessGroup"));
  }
  // Another -n (ops per round) is another command: its own series, as docs/benchmarks.md says,
  // not one error bar over both (the footnote read "2–3 ops/round").
  bench_allreduce({"-n", "3"}, "ar3.jsonl");
  const ProcessResult runs =
      run_ok({py, script("plot.py"), "--out", out, dir.file("ar.jsonl"), dir.file("ar3.jsonl")});
  CHECK(contains(runs.output, "(4 series)"));
  CHECK(contains(runs.output, "nanoddp-bench-allreduce run 1: "));
  CHECK(contains(runs.output, "nanoddp-bench-allreduce run 2: "));
  CHECK(!contains(runs.output, "measured more than once"));
  {
    std::ifstream svg(out + "/allreduce_busbw.svg");
    const std::string text((std::istreambuf_iterator<char>(svg)), std::istreambuf_iterator<char>());
    CHECK(contains(text, "run 2"));
  }

  // ZeRO stages: a series each ("ZeRO-1", "ZeRO-2"; stage 0 unlabelled), not one line whose
  // error bars span the stages.
  run_ok({bin_path("nanoddp-bench-ddp"), "--world", "1,2", "--zero", "0,1,2", "--hidden", "16",
          "--layers", "1", "--batch", "8", "--steps", "2", "--warmup", "1", "--quiet", "--json",
          dir.file("ddp.jsonl")});
  const ProcessResult zero = run_ok({py, script("plot.py"), "--out", out, dir.file("ddp.jsonl")});
  check_chart(zero, out + "/ddp_scaling.png");
  CHECK(contains(zero.output, "(3 configurations)"));
  CHECK(contains(zero.output, "(3 panels)"));
  CHECK(!contains(zero.output, "min-max error bars"));  // nothing merged
  std::ifstream svg(out + "/ddp_scaling.svg");
  const std::string text((std::istreambuf_iterator<char>(svg)), std::istreambuf_iterator<char>());
  CHECK(contains(text, "ZeRO-1, buckets 25 MiB"));
  CHECK(contains(text, "ZeRO-2, buckets 25 MiB"));
  CHECK(!contains(text, "ZeRO-0"));
}

TEST_CASE("plot.py: files whose every point failed write no chart and exit 1, saying so") {
  const std::string py = python();
  TempDir dir;
  // A real failed point: the job overruns --timeout (nanoddp-bench-ddp writes an "error" row).
  const ProcessResult failed = run_process(
      {bin_path("nanoddp-bench-ddp"), "--world", "1", "--hidden", "16", "--layers", "1", "--steps",
       "100000000", "--warmup", "0", "--timeout", "1", "--quiet", "--json", dir.file("to.jsonl")},
      quick());
  REQUIRE_MESSAGE(failed.exit_code == 1, failed.output);
  const ProcessResult r =
      run_process({py, script("plot.py"), "--out", dir.file("out"), dir.file("to.jsonl")}, quick());
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK(contains(r.output, "a failed point, not drawn"));
  CHECK(contains(r.output, "plot.py: error: no chart written"));
  CHECK(!fs::exists(dir.file("out/ddp_scaling.png")));
}

TEST_CASE("plot_trace.py: timelines of a real 2-rank nanoddp-train trace, overlap on and off") {
  const std::string py = python();
  TempDir dir;
  for (const bool overlap : {true, false}) {
    CAPTURE(overlap);
    const std::string trace = dir.file(overlap ? "overlap.json" : "no_overlap.json");
    std::vector<std::string> train = {bin_path("nanoddp-run"), "--nproc-per-node", "2",
                                      bin_path("nanoddp-train")};
    // A small MLP with several buckets; 4 steps, all traced.
    const std::vector<std::string> model = {
        "--hidden",          "64",    "--layers",        "2",    "--batch", "16", "--steps", "4",
        "--first-bucket-mb", "0.001", "--bucket-cap-mb", "0.01", "--quiet"};
    train.insert(train.end(), model.begin(), model.end());
    train.insert(train.end(), {"--trace", trace});
    if (!overlap) train.push_back("--no-overlap");
    run_ok(train);

    const std::string png = dir.file(overlap ? "overlap.png" : "no_overlap.png");
    const ProcessResult r = plot_trace(py, {trace, "--step", "2", "--out", png, "--footnote",
                                            "commit abc1234, 2026-12-01 18:00 UTC"});
    INFO(r.output);
    check_chart(r, png);
    // The SVG twin, with the footnote (a trace holds no provenance of its own) as text.
    const std::string svg = png.substr(0, png.size() - 4) + ".svg";
    CHECK(contains(r.output, "wrote " + svg + ": the same chart as SVG"));
    std::ifstream svg_in(svg);
    const std::string svg_text((std::istreambuf_iterator<char>(svg_in)),
                               std::istreambuf_iterator<char>());
    CHECK(contains(svg_text, "commit abc1234, 2026-12-01 18:00 UTC"));
    // Plain DDP: all-reduces in the legend, and no ZeRO all-gather in the chart or the summary.
    CHECK(contains(svg_text, "all-reduce bucket b0"));
    CHECK(!contains(svg_text, "all-gather"));
    // nanoddp-train all-reduces its health once a step on 2 ranks: the grey bar is named.
    CHECK(contains(svg_text, "health all-reduce"));
    // The gradient ticks' labels and the backward bars name their modules (checked by eye
    // before).
    check_gradient_labels(svg_text);
    CHECK(!contains(r.output, "all-gather"));
    CHECK(contains(r.output, "step 2 of 4 recorded"));
    CHECK(contains(r.output, "2 rank(s)"));
    CHECK(contains(r.output, "rank 0: 3 all-reduce(s)"));  // 3 buckets at this cap
    CHECK(contains(r.output, "rank 1: 3 all-reduce(s)"));
    if (!overlap) {
      // --no-overlap launches every bucket after backward has finished: no all-reduce can start
      // before it ended, nor run while a backward node runs, whatever the timing.
      const auto count = [&](const std::string& part) {
        std::size_t n = 0;
        for (std::size_t at = r.output.find(part); at != std::string::npos;
             at = r.output.find(part, at + 1)) {
          ++n;
        }
        return n;
      };
      CHECK(count(" 0 started before backward ended") == 2);
      CHECK(count("of which 0.00 ms (0%) while a backward node ran") == 2);
    }
    // The default window (the step of median length) and the explicit time window work too.
    const ProcessResult typical = plot_trace(py, {trace, "--out", dir.file("typical.png")});
    check_chart(typical, dir.file("typical.png"));
    const ProcessResult window =
        plot_trace(py, {trace, "--from-ms", "0", "--to-ms", "5", "--out", dir.file("window.png")});
    check_chart(window, dir.file("window.png"));
    // A step the trace does not hold is a usage error naming what it does hold.
    const ProcessResult beyond = run_process(
        {py, script("plot_trace.py"), trace, "--step", "9", "--out", dir.file("beyond.png")},
        quick());
    CHECK(beyond.exit_code == 2);
    CHECK(contains(beyond.output, "--step 9: " + trace + " records 4 step(s)"));
    CHECK(!fs::exists(dir.file("beyond.png")));
  }
  // Overlap on and off on one time axis: both steps' summaries and their difference.
  const ProcessResult both = plot_trace(
      py, {dir.file("overlap.json"), "--compare", dir.file("no_overlap.json"), "--step", "2",
           "--labels", "overlap on,overlap off", "--cores", "2", "--out", dir.file("both.png")});
  INFO(both.output);
  check_chart(both, dir.file("both.png"));
  // Each run's ranks apart (they were added up: "4 rank(s)").
  CHECK(
      contains(both.output,
               "timeline of overlap on (2 rank(s)) and overlap off (2 rank(s)) on one time axis"));
  CHECK(!contains(both.output, "4 rank(s)"));
  CHECK(contains(both.output, "overlap on: rank 0: 3 all-reduce(s)"));
  CHECK(contains(both.output, "overlap off: rank 1: 3 all-reduce(s)"));
  CHECK(contains(both.output, "step overlap off:"));
  CHECK(contains(both.output, "(difference "));
  // Each run's threads apart (they ran one after the other), not the two runs' sum.
  CHECK(contains(both.output, "overlap on: 4 threads (2 rank(s)"));
  CHECK(contains(both.output, "overlap off: 4 threads (2 rank(s)"));
  // The header's step length is the step's own (the one its end mark measures), not the drawn
  // window's, which adds room on both sides.
  const std::string head = "overlap on: step 2 of 4 recorded, ";
  const std::size_t at = both.output.find(head);
  REQUIRE(at != std::string::npos);
  const std::string length =
      both.output.substr(at + head.size(), both.output.find(" ms", at) - at - head.size());
  CAPTURE(length);
  CHECK(contains(both.output, "step overlap on: " + length + " ms"));
  // Without --step both runs show the same step number (the first trace's median step).
  const ProcessResult same =
      plot_trace(py, {dir.file("overlap.json"), "--compare", dir.file("no_overlap.json"),
                      "--labels", "overlap on,overlap off", "--out", dir.file("same.png")});
  INFO(same.output);
  const std::size_t first = same.output.find("overlap on: step ");
  REQUIRE(first != std::string::npos);
  const std::string number =
      same.output.substr(first + 17, same.output.find(' ', first + 17) - first - 17);
  CHECK(contains(same.output, "overlap off (no_overlap.json): step " + number + " of 4 recorded"));
  // A trace without the trainer's health all-reduce (one rank, written by hand) has no legend
  // entry for it.
  const std::string bare = dir.file("bare.json");
  const std::string optimizer_span =
      R"({"ph": "X", "name": "optimizer step", "pid": 0, "tid": 1, "ts": 2600, "dur": 500})";
  const std::string bare_trace = R"({"traceEvents": [
    {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "rank 0"}},
    {"ph": "M", "name": "thread_name", "pid": 0, "tid": 1, "args": {"name": "compute"}},
    {"ph": "M", "name": "thread_name", "pid": 0, "tid": 2, "args": {"name": "communication"}},
    {"ph": "X", "name": "forward", "pid": 0, "tid": 1, "ts": 0, "dur": 1000},
    {"ph": "X", "name": "backward AddmmBackward0", "pid": 0, "tid": 1, "ts": 1000, "dur": 1000},
    {"ph": "X", "name": "all-reduce bucket 0", "pid": 0, "tid": 2, "ts": 1500, "dur": 1000},
    )" + optimizer_span + "]}";
  write_file(bare, bare_trace);
  const ProcessResult plain = plot_trace(py, {bare, "--out", dir.file("bare.png")});
  INFO(plain.output);
  check_chart(plain, dir.file("bare.png"));
  std::ifstream bare_svg(dir.file("bare.svg"));
  const std::string bare_text((std::istreambuf_iterator<char>(bare_svg)),
                              std::istreambuf_iterator<char>());
  CHECK(contains(bare_text, "all-reduce bucket b0"));
  CHECK(!contains(bare_text, "health all-reduce"));
  // The same with a 0.04 ms health all-reduce (too short a bar for its name): the legend names it.
  const std::string healthy = dir.file("health.json");
  std::string with_health = bare_trace;
  with_health.insert(
      with_health.find(optimizer_span),
      R"({"ph": "X", "name": "health all-reduce", "pid": 0, "tid": 2, "ts": 2550, "dur": 40},
    )");
  write_file(healthy, with_health);
  check_chart(plot_trace(py, {healthy, "--out", dir.file("health.png")}), dir.file("health.png"));
  std::ifstream health_svg(dir.file("health.svg"));
  const std::string health_text((std::istreambuf_iterator<char>(health_svg)),
                                std::istreambuf_iterator<char>());
  CHECK(contains(health_text, "health all-reduce"));
}

TEST_CASE("plot_trace.py: timelines of real 2-rank nanoddp-train --zero 1 and --zero 2 traces") {
  const std::string py = python();
  TempDir dir;
  // The model of the overlap test (3 buckets at these caps) on 2 ranks, AdamW (the default: state
  // to shard), with `extra` flags.
  const auto train_two_ranks = [](const std::vector<std::string>& extra) {
    std::vector<std::string> argv = {bin_path("nanoddp-run"),
                                     "--nproc-per-node",
                                     "2",
                                     bin_path("nanoddp-train"),
                                     "--hidden",
                                     "64",
                                     "--layers",
                                     "2",
                                     "--batch",
                                     "16",
                                     "--steps",
                                     "4",
                                     "--first-bucket-mb",
                                     "0.001",
                                     "--bucket-cap-mb",
                                     "0.01",
                                     "--quiet"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    run_ok(argv);
  };
  for (const int stage : {1, 2}) {
    CAPTURE(stage);
    const std::string name = "zero" + std::to_string(stage);
    const std::string trace = dir.file(name + ".json");
    train_two_ranks({"--zero", std::to_string(stage), "--trace", trace});
    const std::string png = dir.file(name + ".png");
    const ProcessResult r = plot_trace(py, {trace, "--step", "2", "--out", png});
    INFO(r.output);
    check_chart(r, png);
    CHECK(contains(r.output, "step 2 of 4 recorded"));
    // Stage 2 reduce-scatters each bucket, stage 1 all-reduces it; both all-gather the updated
    // parameters once per step, after the update: none of it can overlap backward.
    const std::string bucket = stage == 2 ? "3 reduce-scatter(s)" : "3 all-reduce(s)";
    for (const char* rank : {"rank 0: ", "rank 1: "}) {
      CHECK(contains(r.output, std::string(rank).append(bucket).append(", ")));
    }
    std::size_t gathers = 0;
    for (std::size_t at = r.output.find("; then all-gather parameters "); at != std::string::npos;
         at = r.output.find("; then all-gather parameters ", at + 1)) {
      ++gathers;
      CHECK(r.output.substr(at, r.output.find('\n', at) - at).ends_with(", all of it exposed"));
    }
    CHECK(gathers == 2);
    // Stage 2's spans are not all-reduces; nanoddp-train's health all-reduce is never counted.
    if (stage == 2) CHECK(!contains(r.output, "all-reduce(s)"));
    // The legend names the collective that ran, and the all-gather (SVG text is text).
    std::ifstream svg(png.substr(0, png.size() - 4) + ".svg");
    const std::string svg_text((std::istreambuf_iterator<char>(svg)),
                               std::istreambuf_iterator<char>());
    CHECK(contains(svg_text, stage == 2 ? "reduce-scatter bucket b0" : "all-reduce bucket b0"));
    CHECK(!contains(svg_text, stage == 2 ? "all-reduce bucket b0" : "reduce-scatter"));
    CHECK(contains(svg_text, "all-gather parameters (ZeRO)"));
  }
  // Stage 1 against stage 2 on one time axis: each run's own collectives, both named in the
  // legend.
  const ProcessResult both =
      plot_trace(py, {dir.file("zero1.json"), "--compare", dir.file("zero2.json"), "--labels",
                      "zero 1,zero 2", "--out", dir.file("both.png")});
  INFO(both.output);
  check_chart(both, dir.file("both.png"));
  CHECK(contains(both.output, "zero 1: rank 0: 3 all-reduce(s), "));
  CHECK(contains(both.output, "zero 2: rank 1: 3 reduce-scatter(s), "));
  std::ifstream svg(dir.file("both.svg"));
  const std::string text((std::istreambuf_iterator<char>(svg)), std::istreambuf_iterator<char>());
  CHECK(contains(text, "all-reduce / reduce-scatter bucket b0"));

  // Without --labels each trace is named by what its spans show (a trace holds no command
  // line), not "overlap on"/"overlap off" whatever it holds.
  train_two_ranks({"--trace", dir.file("ddp.json")});
  const ProcessResult derived =
      plot_trace(py, {dir.file("zero2.json"), "--compare", dir.file("ddp.json"), "--step", "2",
                      "--out", dir.file("derived.png")});
  INFO(derived.output);
  check_chart(derived, dir.file("derived.png"));
  CHECK(!contains(derived.output, "overlap on"));
  CHECK(!contains(derived.output, "overlap off"));
  CHECK(contains(derived.output, "  ZeRO-2"));
  CHECK(contains(derived.output, "  DDP"));
  CHECK(contains(derived.output, "rank 0: 3 reduce-scatter(s)"));
  const ProcessResult stages =
      plot_trace(py, {dir.file("zero1.json"), "--compare", dir.file("zero2.json"), "--step", "2",
                      "--out", dir.file("stages.png")});
  CHECK(contains(stages.output, "timeline of ZeRO-1"));
  CHECK(contains(stages.output, " (2 rank(s)) and ZeRO-2"));
  CHECK(std::regex_search(stages.output,
                          std::regex("\n  ZeRO-2[^\n]*\\(zero2\\.json\\): step 2 of 4 recorded")));

  // --zero-overlap-gather: one gather per bucket beside the next forward, and the forward's
  // waits for them (what of it is exposed), not "all of it exposed".
  train_two_ranks({"--zero", "1", "--zero-overlap-gather", "--trace", dir.file("overlap.json")});
  const ProcessResult overlap =
      plot_trace(py, {dir.file("overlap.json"), "--step", "3", "--out", dir.file("overlap.png")});
  INFO(overlap.output);
  check_chart(overlap, dir.file("overlap.png"));
  // Each rank counts the gathers its forward used (those the previous step launched), not this
  // step's own, launched at its end (an outside reader found rank 1 counting those too): the
  // same number on both ranks.
  std::vector<int> gathers;
  for (const char* rank : {"rank 0: ", "rank 1: "}) {
    const std::size_t at = overlap.output.find(rank);
    REQUIRE(at != std::string::npos);
    const std::string line = overlap.output.substr(at, overlap.output.find('\n', at) - at);
    std::smatch m;
    REQUIRE(std::regex_search(line, m,
                              std::regex("([0-9]+) all-gather\\(s\\), [0-9.]+ ms in all, beside "
                                         "the forward, which waited [0-9.]+ ms for them")));
    gathers.push_back(std::stoi(m[1]));
    CHECK(!contains(line, "all of it exposed"));
  }
  CHECK(gathers[0] > 0);
  CHECK(gathers[0] == gathers[1]);
  std::ifstream overlap_svg(dir.file("overlap.svg"));
  const std::string overlap_text((std::istreambuf_iterator<char>(overlap_svg)),
                                 std::istreambuf_iterator<char>());
  CHECK(contains(overlap_text, "all-gather gN (ZeRO, beside the forward)"));
  CHECK(contains(overlap_text, "launch all-gathers (ZeRO step)"));
  CHECK(contains(overlap_text, "wait for all-reduce / all-gather"));
  check_gradient_labels(overlap_text);
  // Each wait for an all-gather is drawn thinner than the compute row's bars, and one inside a
  // forward (most are: the forward waits for the gathers the previous step launched) on top of
  // it: inside the forward's bar, after it in the document (checked by eye before).
  for (const char* pid : {"p0", "p1"}) {
    CAPTURE(pid);
    const auto waits =
        svg_elements(overlap_text, std::string("bar.") + pid + ".compute.wait_for_all-gather.n");
    const auto forwards =
        svg_elements(overlap_text, std::string("bar.") + pid + ".compute.forward.n");
    REQUIRE(!forwards.empty());
    std::size_t nested = 0;
    for (const SvgElement& wait : waits) {
      CAPTURE(wait.id);
      CHECK(wait.y1 - wait.y0 < forwards[0].y1 - forwards[0].y0);
      for (const SvgElement& f : forwards) {
        if (!(wait.x0 < f.x1 && f.x0 < wait.x1)) continue;
        constexpr double kPt = 0.01;  // the SVG's coordinates are rounded to 1e-6 pt
        CHECK(f.x0 - kPt <= wait.x0);
        CHECK(wait.x1 <= f.x1 + kPt);
        CHECK(f.y0 < wait.y0);
        CHECK(wait.y1 < f.y1);
        CHECK(f.at < wait.at);
        ++nested;
      }
    }
    CHECK(nested > 0);
  }
}

// An outside tester: /dev/zero was read until the machine ran out of memory (24 GB), and a FIFO
// blocked the script for ever. Only a regular file of at most 256 MiB is read.
TEST_CASE("plot_trace.py: only a regular file of bounded size is read") {
  const std::string py = python();
  TempDir dir;
  const std::string fifo = dir.file("fifo");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  ProcessOptions briefly = quick();
  briefly.timeout = std::chrono::seconds(20);
  check_refused(py, {fifo, "--out", dir.file("fifo.png")}, fifo + ": not a regular file (a FIFO)",
                briefly);
  check_refused(py, {dir.path(), "--out", dir.file("dir.png")},
                dir.path() + ": not a regular file (a folder)", briefly);
  // /dev/zero under a 2 GB address-space limit: a script that reads it fails within seconds
  // (MemoryError) instead of taking the machine's memory.
  {
    const ProcessResult r =
        run_process({"/bin/sh", "-c", "ulimit -v 2000000 && exec \"$0\" \"$@\"", py,
                     script("plot_trace.py"), "/dev/zero", "--out", dir.file("zero.png")},
                    briefly);
    INFO(r.output);
    CHECK(!r.timed_out);
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output,
                   "plot_trace.py: error: /dev/zero: not a regular file (a character "
                   "device)"));
  }
  // A sparse file one byte over the bound: refused by its size, before a byte is read.
  const std::string big = dir.file("big.json");
  write_file(big, "{");
  fs::resize_file(big, (std::uintmax_t{256} << 20) + 1);
  check_refused(py, {big, "--out", dir.file("big.png")},
                big + ": 268435457 bytes, more than the 268435456 (256 MiB) this script reads",
                briefly);
  CHECK(!fs::exists(dir.file("big.png")));
  // A link to a trace is the trace.
  write_file(dir.file("real.json"), crafted_trace(3));
  fs::create_symlink(dir.file("real.json"), dir.file("link.json"));
  check_chart(plot_trace(py, {dir.file("link.json"), "--out", dir.file("link.png")}),
              dir.file("link.png"));
}

// An outside tester: a "dur" of NaN (the bar vanished), 1e300 (it covered everything) or -5, an
// optimizer step at ts -1e12 ("0.04 ms"), every event at one time ("0.00 ms") were drawn as if
// fine; every event twice, a "ts" of 401 digits and 100,000 "[" were Python tracebacks.
// nanoddp-sim refuses such traces, and so does the chart: exit 2, naming the event.
TEST_CASE("plot_trace.py: damaged times are refused, naming the event") {
  const std::string py = python();
  TempDir dir;
  const std::string good = crafted_trace(4);
  // traceEvents[0..5] are the metadata, then 8 events a step: step 2's forward is [15], its
  // optimizer step [21].
  // Step 2's forward and optimizer step (their times are unique in the trace).
  const std::string forward = R"("ts": 1400, "dur": 200)";
  const std::string optimizer = R"("ts": 1900, "dur": 50)";
  const auto with = [&](const std::string& part, const std::string& replacement) {
    std::string text = good;
    const std::size_t at = text.find(part);
    REQUIRE(at != std::string::npos);
    return text.replace(at, part.size(), replacement);
  };
  std::string at_once = replace_each(good, std::regex(R"("ts": [0-9]+)"),
                                     [](const std::smatch&) { return R"("ts": 5000)"; });
  at_once = replace_each(at_once, std::regex(R"("dur": [0-9]+)"),
                         [](const std::smatch&) { return R"("dur": 0)"; });
  const std::size_t open = good.find('['), close = good.rfind(']');
  const std::string events = good.substr(open + 1, close - open - 1);
  struct Case {
    std::string name, text, expected;
  };
  const std::vector<Case> cases = {
      {"nan", with(forward, R"("ts": 1400, "dur": NaN)"),
       R"(traceEvents[15] ('forward'): "dur" is nan; a duration is a finite number of µs >= 0)"},
      {"inf", with(forward, R"("ts": 1400, "dur": Infinity)"),
       R"(traceEvents[15] ('forward'): "dur" is inf)"},
      {"huge", with(forward, R"("ts": 1400, "dur": 1e300)"),
       "traceEvents[15] ('forward') lasts 1e+300 µs, more than a day"},
      {"negative", with(forward, R"("ts": 1400, "dur": -5)"),
       R"(traceEvents[15] ('forward'): "dur" is -5;)"},
      {"past", with(optimizer, R"("ts": -1e12, "dur": 50)"),
       R"(traceEvents[21] ('optimizer step'): "ts" is -1e+12; a time is a finite number of µs )"
       ">= 0"},
      // Positive, but before step 1's forward: it cannot end a step.
      {"early", with(optimizer, R"("ts": 100, "dur": 50)"),
       "step 1 of rank 0, ending with traceEvents[21] ('optimizer step', 0.100 ms), has no "
       "forward span since the previous optimizer step"},
      {"digits", with(forward, "\"ts\": 1" + std::string(400, '0') + ", \"dur\": 200"),
       R"(traceEvents[15] ('forward'): "ts" is inf)"},
      {"at_once", at_once, "all 24 spans start and end at 5000 µs"},
      {"twice", "{\"traceEvents\": [" + events + "," + events + "]}",
       "traceEvents[44] ('data') repeats traceEvents[6] (same pid, thread, time, duration and "
       "args)"},
      {"deep", std::string(100000, '['), "not a trace: its JSON nests deeper than Python's parser"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    const std::string path = dir.file(c.name + ".json");
    write_file(path, c.text);
    check_refused(py, {path, "--out", dir.file(c.name + ".png")}, path + ": " + c.expected);
    CHECK(!fs::exists(dir.file(c.name + ".png")));
  }
  // The same as the second trace of --compare: named too.
  write_file(dir.file("good.json"), good);
  check_refused(
      py,
      {dir.file("good.json"), "--compare", dir.file("twice.json"), "--out", dir.file("both.png")},
      dir.file("twice.json") + ": traceEvents[");
  // The undamaged trace is drawn.
  check_chart(plot_trace(py, {dir.file("good.json"), "--out", dir.file("good.png")}),
              dir.file("good.png"));
}

// An outside tester: with rank 1's times shifted 5 s (a trace merged from hosts whose steady
// clocks differ) the header read "5000.79 ms (2 ranks)"; with rank 1 relabelled pid 0 (two ranks
// merged into one pid) "step 6 of 16 recorded (1 rank(s))". Both are refused: the script cannot
// tell how far apart the clocks are, nor which events are whose.
TEST_CASE("plot_trace.py: ranks on different clocks, or two ranks under one pid, are refused") {
  const std::string py = python();
  TempDir dir;
  const std::string trace = dir.file("trace.json");
  run_ok({bin_path("nanoddp-run"), "--nproc-per-node", "2", bin_path("nanoddp-train"), "--hidden",
          "64", "--layers", "2", "--batch", "16", "--steps", "4", "--quiet", "--trace", trace});
  const std::string text = read_text(trace);
  check_chart(plot_trace(py, {trace, "--out", dir.file("trace.png")}), dir.file("trace.png"));
  // nanoddp-train writes each event on one line of JSON without spaces: "ph" first, then "ts",
  // ("dur",) "pid".
  const std::string shifted =
      replace_each(text, std::regex(R"xx("ts":([0-9.]+)((,"dur":[0-9.]+)?,"pid":1,))xx"),
                   [](const std::smatch& m) {
                     return "\"ts\":" + std::to_string(std::stod(m[1]) + 5e6) + m[2].str();
                   });
  REQUIRE(shifted != text);
  write_file(dir.file("shifted.json"), shifted);
  check_refused(py, {dir.file("shifted.json"), "--out", dir.file("shifted.png")},
                "ends before rank 1's starts");
  check_refused(py, {dir.file("shifted.json"), "--out", dir.file("shifted.png")},
                "the ranks' times are on different clocks (a trace merged from several hosts?)");
  // Rank 1 relabelled pid 0, its metadata too: pid 0 named "rank 0" and "rank 1".
  const std::string relabelled = replace_each(text, std::regex(R"("pid":1,)"),
                                              [](const std::smatch&) { return "\"pid\":0,"; });
  write_file(dir.file("relabelled.json"), relabelled);
  check_refused(py, {dir.file("relabelled.json"), "--out", dir.file("relabelled.png")},
                "names pid 0 'rank 1', an earlier event 'rank 0': two processes' events under "
                "one pid");
  // Only its spans and markers relabelled: one pid with two forwards (or optimizer steps) at a
  // time, or two forwards in one step.
  const std::string events_only =
      replace_each(text, std::regex(R"(("ph":"[Xi]"[^{}]*"pid":)1,)"),
                   [](const std::smatch& m) { return m[1].str() + "0,"; });
  REQUIRE(events_only != text);
  write_file(dir.file("events.json"), events_only);
  check_refused(py, {dir.file("events.json"), "--out", dir.file("events.png")},
                "two ranks' events under one pid");
  // More steps than the trace's run_config says it holds (nanoddp-train writes first_step and
  // last_step): two ranks' steps under one pid, or two traces joined.
  std::string counted = crafted_trace(4);
  const std::string config = R"("grad_accum": 1})";
  counted.replace(counted.find(config), config.size(),
                  R"("grad_accum": 1, "first_step": 1, "last_step": 2})");
  write_file(dir.file("counted.json"), counted);
  check_refused(py, {dir.file("counted.json"), "--out", dir.file("counted.png")},
                "rank 0 has 4 steps, but the trace's run_config says it holds steps 1 to 2: two "
                "ranks' events under one pid");
  for (const char* name : {"shifted.png", "relabelled.png", "events.png", "counted.png"}) {
    CHECK(!fs::exists(dir.file(name)));
  }
  // A step skipped by --skip-nonfinite has no optimizer step: its steps cannot be told apart,
  // and the refusal's advice, a window by time, was refused the same way (an outside tester's).
  // Rank 0's second optimizer step removed stands in for it.
  nlohmann::json doc = nlohmann::json::parse(text);
  auto& events = doc.at("traceEvents");
  int seen = 0;
  for (auto it = events.begin(); it != events.end(); ++it) {
    if ((*it).value("name", "") == "optimizer step" && (*it).value("pid", -1) == 0 && ++seen == 2) {
      events.erase(it);
      break;
    }
  }
  REQUIRE(seen == 2);
  const std::string skipped = doc.dump();
  write_file(dir.file("skipped.json"), skipped);
  check_refused(py, {dir.file("skipped.json"), "--out", dir.file("skipped.png")},
                "pass --from-ms and --to-ms");
  const ProcessResult drawn = plot_trace(py, {dir.file("skipped.json"), "--from-ms", "0", "--to-ms",
                                              "50", "--out", dir.file("skipped.png")});
  CHECK(contains(drawn.output, "note: its steps cannot be told apart, drawn by time only"));
  check_chart(drawn, dir.file("skipped.png"));
}

// An outside tester: --to-ms inf, --from-ms 1e308 --to-ms 1e309 and --out t.json were Python
// tracebacks; --out noext printed "wrote noext" and wrote noext.png and noext.svg; --out DIR (a
// folder) wrote DIR.png beside it; --out /dev/full (as root) wrote /dev/full.png and .svg (not
// run here: an old script would write into /dev again). --out names a .png.
TEST_CASE("plot_trace.py: bad windows and outputs are one-line errors, and it says what it wrote") {
  const std::string py = python();
  TempDir dir;
  const std::string trace = dir.file("t.json");
  write_file(trace, crafted_trace(3));
  fs::create_directory(dir.file("adir"));
  fs::create_directory(dir.file("bdir.png"));
  struct Case {
    std::vector<std::string> args;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {{"--from-ms", "0", "--to-ms", "inf"}, "argument --to-ms: inf is not a finite number"},
      {{"--from-ms", "1e308", "--to-ms", "1e309"}, "argument --to-ms: 1e309 is not a finite"},
      {{"--from-ms", "1e300", "--to-ms", "1e301"}, "--from-ms 1e+300: " + trace + " lasts 2.75 ms"},
      {{"--from-ms", "-1", "--to-ms", "1"}, "--from-ms -1: the window starts at or after"},
      {{"--out", dir.file("t2.json")}, "--out " + dir.file("t2.json") + ": name a .png file"},
      {{"--out", dir.file("noext")}, "--out " + dir.file("noext") + ": name a .png file"},
      {{"--out", dir.file("adir")}, "--out " + dir.file("adir") + ": name a .png file"},
      {{"--out", dir.file("bdir.png")}, dir.file("bdir.png") + " is a folder"},
      {{"--out", dir.file("missing/x.png")}, "no folder " + dir.file("missing")},
      {{"--out", "a.png", "--out", "b.png"}, "--out is given twice"},
      // A second outside tester: ignored without a word, or a trace compared with itself.
      {{"--labels", "A,B"}, "--labels names the two runs of --compare"},
      {{"--compare", trace, "--labels", ","}, "--labels ',': two names separated by a comma"},
      {{"--compare", trace}, "--compare " + trace + ": the same file as " + trace},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {trace};
    args.insert(args.end(), c.args.begin(), c.args.end());
    check_refused(py, args, c.expected);
  }
  // Nothing was written: the folder holds the trace and the two folders made above.
  CHECK(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()) == 3);
  CHECK(fs::is_empty(dir.file("adir")));
  // A trace named .png: the default --out (its name with .png) is the trace itself.
  fs::copy_file(trace, dir.file("trace.png"));
  check_refused(py, {dir.file("trace.png")}, dir.file("trace.png") + " is the trace");
  CHECK(read_text(dir.file("trace.png")) == read_text(trace));
  // --to-ms past the trace's end (2.75 ms from its first event): the window ends there, and it
  // says so (the header named 1-100 ms, and the rest of the window held nothing).
  const ProcessResult past =
      plot_trace(py, {trace, "--from-ms", "1", "--to-ms", "100", "--out", dir.file("past.png")});
  INFO(past.output);
  check_chart(past, dir.file("past.png"));
  CHECK(contains(past.output, "plot_trace.py: note: --to-ms 100 is past the end of " + trace +
                                  " (2.75 ms after its first event): the window ends there"));
  CHECK(contains(past.output, "timeline of 1–2.75 ms (the trace's end)"));
  CHECK(contains(read_text(dir.file("past.svg")), "1–2.75 ms (the trace's end)"));
  // Within the trace: no note.
  const ProcessResult within =
      plot_trace(py, {trace, "--from-ms", "1", "--to-ms", "2", "--out", dir.file("past.png")});
  CHECK(contains(within.output, "timeline of 1–2 ms (1 rank(s))"));
  CHECK(!contains(within.output, "note:"));
  fs::remove(dir.file("past.png"));
  fs::remove(dir.file("past.svg"));
  // What it prints is what it writes: the PNG and the SVG beside it, nothing else.
  fs::create_directory(dir.file("out"));
  const ProcessResult r = plot_trace(py, {trace, "--out", dir.file("out/chart.png")});
  INFO(r.output);
  check_chart(r, dir.file("out/chart.png"));
  CHECK(contains(r.output, "wrote " + dir.file("out/chart.svg") + ": the same chart as SVG"));
  CHECK(fs::is_regular_file(dir.file("out/chart.svg")));
  CHECK(std::distance(fs::directory_iterator(dir.file("out")), fs::directory_iterator()) == 2);
}

// An outside tester: 800 steps took 1.8 s, 3,200 steps 19.5 s, and 51,008 steps (100 MB) had not
// finished after 300 s: each step's window was found by a pass over the whole trace. 30,000 steps
// (240,000 events) must take seconds, not hours.
TEST_CASE("plot_trace.py: a long trace takes time linear in its steps") {
  const std::string py = python();
  TempDir dir;
  const std::string trace = dir.file("long.json");
  write_file(trace, crafted_trace(30000));
  ProcessOptions options = quick();
  options.timeout = std::chrono::seconds(90);
  const ProcessResult r =
      run_process({py, script("plot_trace.py"), trace, "--out", dir.file("long.png")}, options);
  INFO(r.output);
  CHECK(!r.timed_out);
  CHECK(r.exit_code == 0);
  CHECK(contains(r.output, " of 30000 recorded, 0.55 ms"));
  check_png(dir.file("long.png"));
}

// An outside tester: the header said 0.70 ms for a step nanoddp-train reported as step_ms
// 0.526 + data_ms 0.178, and --compare's difference mixed the data time in. The step is counted
// as step_ms is: from its data to the end of its optimizer step, the data left out.
TEST_CASE("plot_trace.py: the header's step time is nanoddp-train's step_ms, data apart") {
  const std::string py = python();
  TempDir dir;
  write_file(dir.file("a.json"), crafted_trace(3, 2, 200));
  write_file(dir.file("b.json"), crafted_trace(3, 2, 350));
  const ProcessResult one =
      plot_trace(py, {dir.file("a.json"), "--step", "2", "--out", dir.file("a.png")});
  INFO(one.output);
  CHECK(contains(one.output,
                 "step 2 of 3 recorded, 0.55 ms (rank 0's, data excluded as in "
                 "nanoddp-train's step_ms; data 0.20 ms)"));
  // The same steps after longer data: the same step time, no difference.
  const ProcessResult both =
      plot_trace(py, {dir.file("a.json"), "--compare", dir.file("b.json"), "--step", "2",
                      "--labels", "short data,long data", "--out", dir.file("ab.png")});
  INFO(both.output);
  check_chart(both, dir.file("ab.png"));
  CHECK(contains(both.output, "long data (b.json): step 2 of 3 recorded, 0.55 ms"));
  CHECK(contains(both.output, "data 0.35 ms"));
  CHECK(contains(both.output, "step long data: 0.55 ms (difference +0.00 ms)"));
  // A resumed run's trace (run_config: steps 4501 to 4503) names the run's step too.
  std::string resumed = crafted_trace(3);
  const std::string config = R"("grad_accum": 1})";
  resumed.replace(resumed.find(config), config.size(),
                  R"("grad_accum": 1, "first_step": 4501, "last_step": 4503})");
  write_file(dir.file("resumed.json"), resumed);
  const ProcessResult later =
      plot_trace(py, {dir.file("resumed.json"), "--step", "2", "--out", dir.file("resumed.png")});
  CHECK(contains(later.output, "step 2 of 3 recorded (the run's step 4502), 0.55 ms"));
}

// An outside tester: the summary of --compare A B said "(3 rank(s))" for a 1-rank run beside a
// 2-rank one. Each run is summarised apart, labelled: its step, ranks, threads and collectives.
TEST_CASE("plot_trace.py: --compare summarises each run apart") {
  const std::string py = python();
  TempDir dir;
  write_file(dir.file("one.json"), crafted_trace(3, 1));
  write_file(dir.file("two.json"), crafted_trace(3, 2));
  const ProcessResult r =
      plot_trace(py, {dir.file("one.json"), "--compare", dir.file("two.json"), "--step", "2",
                      "--labels", "alone,pair", "--cores", "2", "--out", dir.file("c.png")});
  INFO(r.output);
  check_chart(r, dir.file("c.png"));
  CHECK(contains(r.output, "wrote " + dir.file("c.png") +
                               ": timeline of alone (1 rank(s)) and pair (2 rank(s)) on one time "
                               "axis"));
  CHECK(!contains(r.output, "3 rank(s)"));
  // Each run's block: its step, its threads, then its ranks' collectives, in that order.
  const std::vector<std::string> expected = {
      "  alone: step 2 of 3 recorded, 0.55 ms",
      "  alone: 2 threads (compute + communication) on 2 core(s)",
      "  alone: rank 0: 1 all-reduce(s)",
      "  pair (two.json): step 2 of 3 recorded, 0.55 ms",
      "  pair: 4 threads (2 rank(s) x compute + communication) on 2 core(s)",
      "  pair: rank 0: 1 all-reduce(s)",
      "  pair: rank 1: 1 all-reduce(s)",
      "  step pair: 0.55 ms (difference +0.00 ms)"};
  std::size_t at = 0;
  for (const std::string& line : expected) {
    CAPTURE(line);
    const std::size_t found = r.output.find(line, at);
    CHECK(found != std::string::npos);
    if (found != std::string::npos) at = found;
  }
  CHECK(!contains(r.output, "alone: rank 1"));
}

// RFC 8259 lets a parser skip a leading byte order mark, and nanoddp-sim did; the script refused
// it ("Unexpected UTF-8 BOM"). Both read it now.
// nanoddp-train writes T.rankR.partial.json, its own events, when a run stops inside its traced
// steps. Drawn as a whole one-rank trace, its only whole step was drawn, silently: not where it
// stopped. A real one: a NaN stop in step 2 (the loss of --lr 1e30), so its step 2 has a forward
// and backward but no optimizer step.
TEST_CASE("plot_trace.py: a partial trace says so and draws the step its run stopped in") {
  const std::string py = python();
  TempDir dir;
  const ProcessResult train =
      run_process({bin_path("nanoddp-train"), "--steps", "50", "--log-every", "1", "--optimizer",
                   "sgd", "--lr", "1e30", "--trace", dir.file("n.json"), "--trace-steps", "20"},
                  quick());
  INFO(train.output);
  REQUIRE(train.exit_code != 0);
  const std::string partial = dir.file("n.rank0.partial.json");
  REQUIRE(fs::is_regular_file(partial));
  const nlohmann::json config = nlohmann::json::parse(read_text(partial))["traceEvents"][0];
  REQUIRE(config["name"] == "run_config");
  REQUIRE(config["args"]["stopped_in_step"] == 2);

  const ProcessResult r = plot_trace(py, {partial, "--out", dir.file("n.png")});
  INFO(r.output);
  check_chart(r, dir.file("n.png"));
  const std::string said =
      "partial trace: rank 0 of 1 alone, written when the run stopped in step 2";
  CHECK(contains(r.output, said));
  // The step it stopped in (was: step 1, the only one with an optimizer step), to its last event.
  CHECK(contains(r.output, "timeline of step 2 of 2 recorded, where the run stopped: "));
  CHECK(contains(r.output, "cut short: no optimizer step"));
  CHECK(contains(r.output, "rank 0 stopped in step 2: its last event '"));
  CHECK(contains(r.output, "last event (dashed line): rank 0's, "));
  const std::string svg = read_text(dir.file("n.svg"));
  CHECK(contains(svg, said));  // the chart's header says it too
  // Its forward and backward drawn in full, no optimizer step, and nothing of step 1 (the window
  // starts at step 2's data).
  CHECK(svg_elements(svg, "bar.p0.compute.forward.").size() == 1);
  CHECK(!svg_elements(svg, "bar.p0.compute.backward_linear.of.layers.0.").empty());
  CHECK(svg_elements(svg, "bar.p0.compute.optimizer_step.").empty());

  // --step 1 still draws the whole step before it; past the step it stopped in is refused.
  const ProcessResult first = plot_trace(py, {partial, "--step", "1", "--out", dir.file("1.png")});
  INFO(first.output);
  CHECK(contains(first.output, "timeline of step 1 of 2 recorded, "));
  CHECK(contains(first.output, "data excluded as in nanoddp-train's step_ms"));
  CHECK(contains(first.output, said));
  CHECK(!contains(first.output, "last event"));
  CHECK(svg_elements(read_text(dir.file("1.svg")), "bar.p0.compute.optimizer_step.").size() == 1);
  check_refused(py, {partial, "--step", "3", "--out", dir.file("3.png")},
                "--step 3: " + partial +
                    " is a partial trace of 2 step(s): 1..1 whole and 2, "
                    "where the run stopped");
  // A partial trace holds its rank's events alone: another pid's are refused (files joined).
  std::string joined = read_text(partial);
  joined.insert(joined.rfind(']'),
                R"(, {"ph": "X", "name": "forward", "pid": 1, "tid": 0, "ts": 5, "dur": 1})");
  write_file(dir.file("joined.json"), joined);
  check_refused(py, {dir.file("joined.json"), "--out", dir.file("j.png")},
                "('forward') is pid 1's, but the trace is partial, rank 0's events alone");
}

// A hung job stopped by its launcher: each rank writes its own partial trace, and the two drawn
// on one time axis show where each was. Here a 2-rank run is stopped by a SIGTERM to nanoddp-run
// (as a user stopping a hung job would), both ranks inside their traced steps.
TEST_CASE("plot_trace.py: --compare draws two ranks of a stopped run on their one clock") {
  using namespace std::chrono_literals;
  const std::string py = python();
  TempDir dir;
  BackgroundProcess launcher({"/usr/bin/env", "NANODDP_TIMEOUT_S=4", bin_path("nanoddp-run"),
                              "--nproc-per-node", "2", bin_path("nanoddp-train"), "--steps",
                              "100000", "--log-every", "100000", "--trace", dir.file("t.json"),
                              "--trace-steps", "100000"});
  REQUIRE_MESSAGE(launcher.wait_for_output(
                      [](const std::string& out) { return contains(out, " 1/100000"); }, 30s),
                  launcher.output());
  std::this_thread::sleep_for(1s);
  launcher.send(SIGTERM);
  const auto status = launcher.wait(30s);
  INFO(launcher.output());
  REQUIRE(status.has_value());
  const std::string rank0 = dir.file("t.rank0.partial.json");
  const std::string rank1 = dir.file("t.rank1.partial.json");
  REQUIRE(fs::is_regular_file(rank0));
  REQUIRE(fs::is_regular_file(rank1));
  // Each rank's last event, in ms, from the files themselves.
  const auto last_ms = [](const std::string& path) {
    const nlohmann::json doc = nlohmann::json::parse(read_text(path));
    double last = 0;
    for (const auto& e : doc["traceEvents"]) {
      if (e["ph"] == "M") continue;
      last = std::max(last, e["ts"].get<double>() + e.value("dur", 0.0));
    }
    return last / 1000.0;
  };
  const auto stopped_in = [](const std::string& path) {
    return nlohmann::json::parse(read_text(path))["traceEvents"][0]["args"]["stopped_in_step"]
        .get<long>();
  };

  // As docs/reliability.md gives it: rank 1's file is the positional TRACE.json; drawn in rank
  // order all the same.
  const ProcessResult r =
      plot_trace(py, {"--compare", rank0, rank1, "--out", dir.file("hang.png")});
  INFO(r.output);
  check_chart(r, dir.file("hang.png"));
  CHECK(contains(r.output,
                 "partial traces: rank 0 and rank 1 of 2, each alone, written when the "
                 "run stopped in step"));
  // Each rank labelled by its rank and how it stopped, with the step it stopped in as its window.
  for (const auto& [rank, path] : {std::pair{0, rank0}, std::pair{1, rank1}}) {
    CAPTURE(rank);
    CHECK(contains(r.output, "rank " + std::to_string(rank) + ", stopped "));
    CHECK(contains(r.output, "rank " + std::to_string(rank) + " stopped in step " +
                                 std::to_string(stopped_in(path)) + ": its last event '"));
    CHECK(contains(r.output, "step " + std::to_string(stopped_in(path)) + " of " +
                                 std::to_string(stopped_in(path)) +
                                 " recorded, where the run "
                                 "stopped"));
  }
  const std::string svg = read_text(dir.file("hang.svg"));
  const auto forward0 = svg_elements(svg, "bar.p0.compute.forward.");
  const auto forward1 = svg_elements(svg, "bar.p1.compute.forward.");
  REQUIRE(!forward0.empty());
  REQUIRE(!forward1.empty());
  CHECK(forward0.front().y1 < forward1.front().y0);  // rank 0's rows above rank 1's
  CHECK(contains(r.output, "timeline of rank 0, stopped "));
  CHECK(contains(svg, "partial traces: rank 0 and rank 1 of 2"));
  CHECK(contains(svg, "t.rank0.partial.json and t.rank1.partial.json: "));
  // One clock, not shifted: the gap between the ranks' last events is the files' own.
  std::smatch m;
  REQUIRE(std::regex_search(r.output, m,
                            std::regex("last events \\(dashed lines\\): rank 0's, rank 1's, "
                                       "([0-9.]+) ms (after|before) it")));
  const double gap = last_ms(rank1) - last_ms(rank0);
  CHECK(std::fabs(std::stod(m[1].str()) - std::fabs(gap)) <= 0.0051);
  CHECK((m[2].str() == "after") == (gap >= 0));

  // Not two ranks of one run: refused, naming what differs.
  const auto edited = [&](const std::string& name, const std::string& key, int value) {
    nlohmann::json doc = nlohmann::json::parse(read_text(rank1));
    doc["traceEvents"][0]["args"][key] = value;
    write_file(dir.file(name), doc.dump());
    return dir.file(name);
  };
  check_refused(py, {rank0, "--compare", edited("restart.json", "restart", 1)},
                "are partial traces of different runs (their run_config has restart 0 and 1)");
  check_refused(py, {rank0, "--compare", edited("world.json", "world_size", 3)},
                "are partial traces of different runs (their run_config has world_size 2 and 3)");
  fs::copy_file(rank0, dir.file("again.json"));
  check_refused(py, {rank0, "--compare", dir.file("again.json")},
                "are both rank 0's partial traces");
  nlohmann::json later = nlohmann::json::parse(read_text(rank1));
  for (auto& e : later["traceEvents"]) {
    if (e["ph"] != "M") e["ts"] = e["ts"].get<double>() + 3.6e9;  // an hour later
  }
  write_file(dir.file("later.json"), later.dump());
  check_refused(py, {rank0, "--compare", dir.file("later.json")}, "do not overlap in time");
  // A partial trace beside a whole one.
  write_file(dir.file("whole.json"), crafted_trace(3));
  check_refused(py, {dir.file("whole.json"), "--compare", rank1},
                rank1 + " is a partial trace (one rank of a stopped run) and " +
                    dir.file("whole.json") + " is not");
}

TEST_CASE("plot_trace.py: a trace with a UTF-8 byte order mark is drawn as without") {
  const std::string py = python();
  TempDir dir;
  write_file(dir.file("bom.json"), "\xEF\xBB\xBF" + crafted_trace(3, 2));
  write_file(dir.file("plain.json"), crafted_trace(3, 2));
  const ProcessResult bom =
      plot_trace(py, {dir.file("bom.json"), "--step", "2", "--out", dir.file("bom.png")});
  const ProcessResult plain =
      plot_trace(py, {dir.file("plain.json"), "--step", "2", "--out", dir.file("plain.png")});
  INFO(bom.output);
  check_chart(bom, dir.file("bom.png"));
  CHECK(contains(bom.output, "step 2 of 3 recorded, 0.55 ms"));
  // The same summary, but for the file names.
  const auto without_names = [&](const std::string& text) {
    std::string out = text;
    for (const char* name : {"bom", "plain"}) {
      out = replace_each(out, std::regex(dir.file(name)),
                         [](const std::smatch&) { return std::string("F"); });
    }
    return out;
  };
  CHECK(without_names(bom.output) == without_names(plain.output));
}

// An outside tester: an --optimizer-in-backward trace has no "optimizer step" spans, and --step
// was refused. Its steps are told apart by their forward passes (and, with --grad-accum, by the
// micro-batch whose backward holds the "optimizer update" spans).
TEST_CASE("plot_trace.py: --step works on an --optimizer-in-backward trace") {
  const std::string py = python();
  TempDir dir;
  for (const char* accum : {"1", "2"}) {
    CAPTURE(accum);
    const std::string trace = dir.file(std::string("oib") + accum + ".json");
    run_ok({bin_path("nanoddp-run"), "--nproc-per-node", "2", bin_path("nanoddp-train"), "--hidden",
            "64", "--layers", "2", "--batch", "16", "--steps", "4", "--grad-accum", accum,
            "--optimizer-in-backward", "--quiet", "--trace", trace});
    const std::string png = dir.file(std::string("oib") + accum + ".png");
    const ProcessResult r = plot_trace(py, {trace, "--step", "3", "--out", png});
    INFO(r.output);
    check_chart(r, png);
    CHECK(contains(r.output, "step 3 of 4 recorded, "));
    CHECK(contains(read_text(png.substr(0, png.size() - 4) + ".svg"),
                   "optimizer update (in backward)"));
    // The default (the median step) finds the steps too.
    check_chart(plot_trace(py, {trace, "--out", png}), png);
  }
}

// An outside tester: a 1-rank trace said "1 threads (1 rank(s) x compute + communication)" and its
// legend listed all-reduces, waits and buckets it did not have; with --prefetch it said nothing
// of the data thread; the --compare header ran past the right edge of the image.
TEST_CASE("plot_trace.py: the header and legend say only what the trace holds") {
  const std::string py = python();
  TempDir dir;
  for (const bool prefetch : {false, true}) {
    CAPTURE(prefetch);
    const std::string name = prefetch ? "prefetch" : "plain";
    std::vector<std::string> train = {bin_path("nanoddp-train"),
                                      "--hidden",
                                      "64",
                                      "--layers",
                                      "2",
                                      "--batch",
                                      "16",
                                      "--steps",
                                      "4",
                                      "--quiet",
                                      "--trace",
                                      dir.file(name + ".json")};
    if (prefetch) train.push_back("--prefetch");
    run_ok(train);
    const ProcessResult r =
        plot_trace(py, {dir.file(name + ".json"), "--out", dir.file(name + ".png")});
    INFO(r.output);
    check_chart(r, dir.file(name + ".png"));
    CHECK(contains(r.output, prefetch ? "  2 threads (compute + data prefetch) on "
                                      : "  1 thread (compute) on "));
    const std::string svg = read_text(dir.file(name + ".svg"));
    for (const char* absent :
         {"all-reduce", "wait for", "bucket ready", "exposed (after", "rank 0 · communication"}) {
      CAPTURE(absent);
      CHECK(!contains(svg, absent));
    }
    CHECK(contains(svg, "optimizer step"));
    CHECK(contains(svg, "gradient final"));
  }
  // Two runs compared: every line of the header fits the image (SVG text is text, a line each).
  write_file(dir.file("a.json"), crafted_trace(3, 2));
  const ProcessResult both =
      plot_trace(py, {dir.file("plain.json"), "--compare", dir.file("a.json"), "--cores", "2",
                      "--out", dir.file("both.png")});
  INFO(both.output);
  check_chart(both, dir.file("both.png"));
  const std::string svg = read_text(dir.file("both.svg"));
  const std::regex text_element(">([^<>]*)</text>");
  std::size_t longest = 0, lines = 0;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), text_element);
       it != std::sregex_iterator(); ++it) {
    longest = std::max(longest, (*it)[1].str().size());
    ++lines;
  }
  CHECK(lines > 10);
  CHECK(longest <= 140);
}

TEST_CASE("plot scripts: bad input exits 2 naming the file and the line") {
  const std::string py = python();
  TempDir dir;
  const std::string empty = dir.file("empty.jsonl");
  write_file(empty, "");
  const std::string garbage = dir.file("garbage.jsonl");
  write_file(garbage, R"({"benchmark":"gemm","backend":"eigen","shape":"square","m":8,"n":8,"k":8,)"
                      R"("gflops":1.5})"
                      "\nthis is not json\n");
  const std::string unknown = dir.file("unknown.jsonl");
  write_file(unknown, "\n{\"loss\": 0.5, \"step\": 3}\n");
  const std::string fifo = dir.file("fifo.jsonl");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const std::string partial = dir.file("partial.jsonl");
  write_file(partial, R"({"benchmark":"allreduce","backend":"gloo","mode":"nanoddp"})"
                      "\n");

  struct Case {
    std::vector<std::string> args;
    std::string expected;  // in the message
  };
  const std::vector<Case> cases = {
      {{dir.file("missing.jsonl")}, dir.file("missing.jsonl") + ": no such file"},
      {{empty}, empty + ": the file is empty"},
      {{garbage}, garbage + ":2: not a JSON line"},
      {{unknown}, unknown + ":2: not a line of nanoddp-bench-ddp"},
      {{partial}, partial + ":1: this nanoddp-bench-allreduce line has no 'ranks' field"},
      // A good file does not excuse a bad one after it.
      {{source_dir() + "/tests/benchmarks/data/bench_ddp_sample.jsonl", garbage}, garbage + ":2:"},
      // Read before any check: /dev/zero never ended and a FIFO blocked (as in plot_trace.py).
      {{"/dev/zero"}, "/dev/zero: not a regular file (a character device)"},
      {{fifo}, fifo + ": not a regular file (a FIFO)"},
      {{dir.path()}, dir.path() + ": not a regular file (a folder)"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv = {py, script("plot.py"), "--out", dir.file("out")};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    const ProcessResult r = run_process(argv, quick());
    CAPTURE(c.expected);
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output, "plot.py: error: " + c.expected));
  }
  // Nothing half-drawn was left behind.
  CHECK(!fs::exists(dir.file("out")));

  const std::vector<Case> trace_cases = {
      {{dir.file("missing.json")}, dir.file("missing.json") + ": no such file"},
      {{empty}, empty + ": the file is empty"},
      {{garbage}, garbage + ": not a JSON trace"},
      {{unknown}, unknown + ": not a Chrome trace"},
  };
  for (const Case& c : trace_cases) {
    std::vector<std::string> argv = {py, script("plot_trace.py")};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    const ProcessResult r = run_process(argv, quick());
    CAPTURE(c.expected);
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output, "plot_trace.py: error: " + c.expected));
  }
}

TEST_CASE("plot.py: --out is required, without it nothing is written where it runs") {
  // Before, the default "." wrote the charts into whatever folder plot.py ran from (an outside
  // tester's source tree).
  const std::string py = python();
  TempDir dir;
  ProcessOptions in_dir = quick();
  in_dir.working_directory = dir.path();
  const ProcessResult r = run_process(
      {py, script("plot.py"), source_dir() + "/tests/benchmarks/data/bench_ddp_sample.jsonl"},
      in_dir);
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "the following arguments are required: --out"));
  CHECK(fs::is_empty(dir.path()));
  // Given twice, the last used to win without a word.
  const ProcessResult twice =
      run_process({py, script("plot.py"), "--out", dir.file("a"), "--out", dir.file("b"),
                   source_dir() + "/tests/benchmarks/data/bench_ddp_sample.jsonl"},
                  in_dir);
  INFO(twice.output);
  CHECK(twice.exit_code == 2);
  CHECK(contains(twice.output, "--out is given twice"));
  CHECK(fs::is_empty(dir.path()));
}
