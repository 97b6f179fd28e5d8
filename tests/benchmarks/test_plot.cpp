// The chart scripts (benchmarks/plot) on real benchmark output: nanoddp-bench-allreduce on two
// processes, nanoddp-bench-gemm and 2-rank nanoddp-train --trace runs (plain DDP, --no-overlap,
// --zero 1 and --zero 2), all on tiny settings, then plot.py / plot_trace.py on their files. The
// PNGs must be real PNGs with a size, and each chart must be reported. nanoddp-bench-ddp is checked
// on a hand-written FIXTURE (tests/benchmarks/data/bench_ddp_sample.jsonl, host
// "hand-written-fixture"): its values are made up to look like this machine's, not measured. No
// figures are asserted (shared machine).
#include <doctest/doctest.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>
#include <vector>

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
    const ProcessResult r = run_ok({py, script("plot_trace.py"), trace, "--step", "2", "--out", png,
                                    "--footnote", "commit abc1234, 2026-12-01 18:00 UTC"});
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
    const ProcessResult typical =
        run_ok({py, script("plot_trace.py"), trace, "--out", dir.file("typical.png")});
    check_chart(typical, dir.file("typical.png"));
    const ProcessResult window = run_ok({py, script("plot_trace.py"), trace, "--from-ms", "0",
                                         "--to-ms", "5", "--out", dir.file("window.png")});
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
  const ProcessResult both =
      run_ok({py, script("plot_trace.py"), dir.file("overlap.json"), "--compare",
              dir.file("no_overlap.json"), "--step", "2", "--labels", "overlap on,overlap off",
              "--cores", "2", "--out", dir.file("both.png")});
  INFO(both.output);
  check_chart(both, dir.file("both.png"));
  CHECK(contains(both.output, "4 rank(s)"));
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
  const ProcessResult same = run_ok({py, script("plot_trace.py"), dir.file("overlap.json"),
                                     "--compare", dir.file("no_overlap.json"), "--labels",
                                     "overlap on,overlap off", "--out", dir.file("same.png")});
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
  const ProcessResult plain =
      run_ok({py, script("plot_trace.py"), bare, "--out", dir.file("bare.png")});
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
  check_chart(run_ok({py, script("plot_trace.py"), healthy, "--out", dir.file("health.png")}),
              dir.file("health.png"));
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
    const ProcessResult r =
        run_ok({py, script("plot_trace.py"), trace, "--step", "2", "--out", png});
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
      run_ok({py, script("plot_trace.py"), dir.file("zero1.json"), "--compare",
              dir.file("zero2.json"), "--labels", "zero 1,zero 2", "--out", dir.file("both.png")});
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
      run_ok({py, script("plot_trace.py"), dir.file("zero2.json"), "--compare",
              dir.file("ddp.json"), "--step", "2", "--out", dir.file("derived.png")});
  INFO(derived.output);
  check_chart(derived, dir.file("derived.png"));
  CHECK(!contains(derived.output, "overlap on"));
  CHECK(!contains(derived.output, "overlap off"));
  CHECK(contains(derived.output, "  ZeRO-2"));
  CHECK(contains(derived.output, "  DDP"));
  CHECK(contains(derived.output, "rank 0: 3 reduce-scatter(s)"));
  const ProcessResult stages =
      run_ok({py, script("plot_trace.py"), dir.file("zero1.json"), "--compare",
              dir.file("zero2.json"), "--step", "2", "--out", dir.file("stages.png")});
  CHECK(contains(stages.output, "timeline of ZeRO-1"));
  CHECK(contains(stages.output, "; ZeRO-2"));

  // --zero-overlap-gather: one gather per bucket beside the next forward, and the forward's
  // waits for them (what of it is exposed), not "all of it exposed".
  train_two_ranks({"--zero", "1", "--zero-overlap-gather", "--trace", dir.file("overlap.json")});
  const ProcessResult overlap = run_ok({py, script("plot_trace.py"), dir.file("overlap.json"),
                                        "--step", "3", "--out", dir.file("overlap.png")});
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
