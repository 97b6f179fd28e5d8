// nanoddp-train --task classify: cross-entropy on class indices, the accuracy metric, labels
// from .npy files checked on load, resume and --init keeping the task. (PyTorch parity:
// classify_parity.sh.)

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "nanoddp/nn/npy.h"
#include "support/saved_parameters.h"
#include "support/subprocess.h"
#include "support/world.h"

using namespace nanoddp::testing;

namespace {

ProcessResult train(std::vector<std::string> args) {
  args.insert(args.begin(), bin_path("nanoddp-train"));
  return run_process(args);
}

std::vector<nlohmann::json> read_json_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

// A 1-D .npy of integers as numpy.save writes it ('<i8' or '<i4'; `descr` may be anything).
template <typename T>
void write_labels(const std::string& path, const std::vector<T>& values, const std::string& descr,
                  const std::string& shape = "") {
  std::string header =
      fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}", descr,
                  shape.empty() ? fmt::format("({},)", values.size()) : shape);
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  f.write("\x93NUMPY\x01\x00", 8);
  const auto length = static_cast<std::uint16_t>(header.size());
  f.put(static_cast<char>(length & 0xff));
  f.put(static_cast<char>(length >> 8));
  f << header;
  f.write(reinterpret_cast<const char*>(values.data()),
          static_cast<std::streamsize>(values.size() * sizeof(T)));
}

}  // namespace

TEST_CASE("classify: accuracy rises far above chance on the synthetic teacher's classes") {
  TempDir dir;
  const std::string metrics = dir.file("m.jsonl");
  // 4 classes: chance is 0.25. The teacher is linear, so its arg-max regions are learnable.
  const ProcessResult r = train({"--task",      "classify",
                                 "--classes",   "4",
                                 "--in",        "8",
                                 "--hidden",    "32",
                                 "--layers",    "1",
                                 "--steps",     "300",
                                 "--batch",     "64",
                                 "--lr",        "0.01",
                                 "--log-every", "50",
                                 "--metrics",   metrics,
                                 "--save",      dir.file("p.safetensors")});
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("-> 4 classes") != std::string::npos);
  CHECK(r.output.find("  accuracy 0.") != std::string::npos);        // the progress line
  CHECK(r.output.find(", train accuracy 0.") != std::string::npos);  // the final line
  const auto lines = read_json_lines(metrics);
  REQUIRE(lines.size() == 7);  // step 1, 50, ..., 300
  for (const auto& line : lines) REQUIRE(line.contains("accuracy"));
  const double first = lines.front()["accuracy"], last = lines.back()["accuracy"];
  CHECK(first < 0.6);
  CHECK(last > 0.85);
  CHECK(lines.back()["loss"].get<double>() < lines.front()["loss"].get<double>() / 3);
  // The model has one output per class.
  const auto file = nanoddp::nn::read_safetensors(dir.file("p.safetensors"));
  CHECK(file.at("layers.2.weight").shape == std::vector<std::int64_t>{4, 32});
  CHECK(file.metadata_at("task") == "classify --classes 4");
}

TEST_CASE("classify: the accuracy of 2 DDP ranks is that of 1 rank with both batches") {
  TempDir dir;
  const std::vector<std::string> common = {bin_path("nanoddp-train"),
                                           "--task",
                                           "classify",
                                           "--classes",
                                           "3",
                                           "--in",
                                           "6",
                                           "--hidden",
                                           "16",
                                           "--layers",
                                           "1",
                                           "--steps",
                                           "40",
                                           "--lr",
                                           "0.02",
                                           "--log-every",
                                           "5",
                                           "--quiet"};
  auto one = common;
  one.insert(one.end(), {"--batch", "32", "--metrics", dir.file("one.jsonl")});
  const ProcessResult r = run_process(one);
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  auto two = common;
  two.insert(two.end(), {"--batch", "16", "--metrics", dir.file("two.jsonl")});
  const auto results = run_world(two, 2);
  INFO(describe(results));
  for (const auto& w : results) REQUIRE(w.exit_code == 0);
  const auto a = read_json_lines(dir.file("one.jsonl")), b = read_json_lines(dir.file("two.jsonl"));
  REQUIRE(a.size() == b.size());
  bool moved = false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    CAPTURE(i);
    // Counts of matches over the same samples: equal unless a logit pair ties to rounding.
    CHECK(std::abs(a[i]["accuracy"].get<double>() - b[i]["accuracy"].get<double>()) <= 1.0 / 32);
    moved |= a[i]["accuracy"] != a[0]["accuracy"];
  }
  CHECK(moved);
}

TEST_CASE("classify: bad flags are refused with exit code 2, naming them") {
  struct Case {
    std::vector<std::string> args;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {{"--task", "classify"}, "--task classify needs --classes"},
      {{"--classes", "4"}, "--classes needs --task classify"},
      {{"--task", "classify", "--classes", "4", "--out", "3"}, "--out 3 differs from --classes 4"},
      {{"--task", "classify", "--classes", "1"}, "--classes"},
      {{"--task", "segment"}, "--task"},
  };
  for (const Case& c : cases) {
    const ProcessResult r = train(c.args);
    INFO(fmt::format("{}", fmt::join(c.args, " ")), "\n", r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find(c.expected) != std::string::npos);
  }
  // --out equal to --classes is allowed.
  const ProcessResult same =
      train({"--task", "classify", "--classes", "3", "--out", "3", "--steps", "2", "--quiet"});
  CHECK_MESSAGE(same.exit_code == 0, same.output);
}

TEST_CASE("classify: a bad targets file is refused (exit 2), naming it and the first bad row") {
  TempDir dir;
  const std::int64_t n = 12, in = 3;
  std::vector<float> x(n * in, 0.5f);
  const std::vector<std::int64_t> x_shape{n, in};
  nanoddp::nn::write_npy(dir.file("x.npy"), x_shape, x.data());
  std::vector<std::int64_t> good(n);
  for (std::int64_t i = 0; i < n; ++i) good[static_cast<std::size_t>(i)] = i % 4;
  auto run = [&](const std::string& targets) {
    return train({"--task", "classify", "--classes", "4", "--data", dir.file("x.npy"), "--targets",
                  dir.file(targets), "--batch", "4", "--steps", "3", "--quiet"});
  };
  write_labels(dir.file("good.npy"), good, "<i8");
  const ProcessResult ok = run("good.npy");
  CHECK_MESSAGE(ok.exit_code == 0, ok.output);
  std::vector<std::int32_t> good32(good.begin(), good.end());
  write_labels(dir.file("good32.npy"), good32, "<i4");
  const ProcessResult ok32 = run("good32.npy");
  CHECK_MESSAGE(ok32.exit_code == 0, ok32.output);

  struct Case {
    std::string file;
    std::vector<std::string> expected;
  };
  auto bad = good;
  bad[5] = 4;  // == --classes: out of range
  bad[9] = -1;
  write_labels(dir.file("big.npy"), bad, "<i8");
  auto negative = good;
  negative[7] = -3;
  write_labels(dir.file("negative.npy"),
               std::vector<std::int32_t>(negative.begin(), negative.end()), "<i4");
  write_labels(dir.file("short.npy"), std::vector<std::int64_t>(good.begin(), good.end() - 1),
               "<i8");
  write_labels(dir.file("floats.npy"), std::vector<double>(n, 1.0), "<f8");
  write_labels(dir.file("matrix.npy"), good, "<i8", fmt::format("({}, 1)", n));
  const std::vector<Case> cases = {
      {"big.npy", {"big.npy", "2 label(s) outside [0, 4)", "row 5: 4", "--targets"}},
      {"negative.npy", {"negative.npy", "row 7: -3"}},
      {"short.npy", {"short.npy", "11 class labels", "12 rows"}},
      {"floats.npy", {"floats.npy", "'<f8'", "int64"}},
      {"matrix.npy", {"matrix.npy", "1-D"}},
  };
  for (const Case& c : cases) {
    const ProcessResult r = run(c.file);
    INFO(c.file, "\n", r.output);
    CHECK(r.exit_code == 2);
    for (const std::string& e : c.expected) CHECK_MESSAGE(r.output.find(e) != std::string::npos, e);
  }
}

TEST_CASE("classify: stop after a checkpoint, resume (2 DDP ranks), the same bits, task kept") {
  TempDir dir;
  const std::vector<std::string> common = {bin_path("nanoddp-train"),
                                           "--task",
                                           "classify",
                                           "--classes",
                                           "5",
                                           "--in",
                                           "12",
                                           "--hidden",
                                           "24",
                                           "--layers",
                                           "2",
                                           "--dataset-size",
                                           "1024",
                                           "--batch",
                                           "8",
                                           "--grad-accum",
                                           "2",
                                           "--lr",
                                           "0.01",
                                           "--log-every",
                                           "1",
                                           "--quiet"};
  auto with = [&](std::vector<std::string> extra) {
    auto a = common;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  auto ok = [](const std::vector<ProcessResult>& results) {
    INFO(describe(results));
    for (const auto& r : results) REQUIRE((!r.timed_out && r.exit_code == 0));
  };
  ok(run_world(
      with({"--steps", "30", "--metrics", dir.file("full.jsonl"), "--save", dir.file("full")}), 2));
  ok(run_world(
      with({"--steps", "25", "--checkpoint-dir", dir.file("ckpt"), "--checkpoint-every", "10"}),
      2));
  ok(run_world(with({"--steps", "30", "--checkpoint-dir", dir.file("ckpt"), "--resume", "--metrics",
                     dir.file("resumed.jsonl"), "--save", dir.file("resumed")}),
               2));
  const auto full = read_json_lines(dir.file("full.jsonl"));
  const auto resumed = read_json_lines(dir.file("resumed.jsonl"));
  REQUIRE(full.size() == 30);
  REQUIRE(resumed.size() == 10);  // steps 21..30
  for (std::size_t i = 0; i < resumed.size(); ++i) {
    CAPTURE(i);
    CHECK(resumed[i]["loss"] == full[20 + i]["loss"]);  // bit for bit
    CHECK(resumed[i]["accuracy"] == full[20 + i]["accuracy"]);
  }
  CHECK(all_parameters(dir.file("resumed")) == all_parameters(dir.file("full")));

  // The same shapes as a regression with --out 5: the task tells them apart.
  auto regression = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = {"--in",     "12", "--out",          "5",    "--hidden", "24",
                                  "--layers", "2",  "--dataset-size", "1024", "--batch",  "16",
                                  "--quiet"};
    a.insert(a.end(), extra.begin(), extra.end());
    return train(a);
  };
  const ProcessResult resume =
      regression({"--steps", "30", "--checkpoint-dir", dir.file("ckpt"), "--resume"});
  CHECK(resume.exit_code == 2);
  CHECK_MESSAGE(resume.output.find("--task classify --classes 5") != std::string::npos,
                resume.output);
  const ProcessResult init = regression({"--steps", "1", "--init", dir.file("full")});
  CHECK(init.exit_code == 2);
  CHECK_MESSAGE(init.output.find("saved by a --task classify --classes 5 run") != std::string::npos,
                init.output);
  // A classifier starts from its own saved parameters.
  const ProcessResult again = run_process(with({"--steps", "1", "--init", dir.file("full")}));
  CHECK_MESSAGE(again.exit_code == 0, again.output);
}

// An outside tester's cases (session 8): each was a slow, misleading or meaningless answer.
TEST_CASE("classify: headers are checked before the data is read, and messages say what is wrong") {
  TempDir dir;
  const std::int64_t n = 12, in = 3;
  std::vector<float> x(n * in, 0.5f);
  const std::vector<std::int64_t> x_shape{n, in};
  nanoddp::nn::write_npy(dir.file("x.npy"), x_shape, x.data());
  std::vector<std::int64_t> labels(n);
  for (std::int64_t i = 0; i < n; ++i) labels[static_cast<std::size_t>(i)] = i % 4;
  write_labels(dir.file("y.npy"), labels, "<i8");
  auto expect = [&](const std::vector<std::string>& args, const std::vector<std::string>& wanted,
                    const std::vector<std::string>& unwanted = {}) {
    std::vector<std::string> all = {"--steps", "2", "--batch", "4", "--quiet"};
    all.insert(all.begin(), args.begin(), args.end());
    const ProcessResult r = train(all);
    INFO(fmt::format("{}", fmt::join(all, " ")), "\n", r.output);
    CHECK(r.exit_code == 2);
    for (const std::string& w : wanted) CHECK_MESSAGE(r.output.find(w) != std::string::npos, w);
    for (const std::string& u : unwanted) CHECK_MESSAGE(r.output.find(u) == std::string::npos, u);
  };
  const std::vector<std::string> classify = {"--task", "classify", "--classes", "4"};
  auto with = [](std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };

  // A sparse 512 GiB --data file (a valid header, no blocks on disk): reading its body would end
  // in "do not fit in memory"; the headers' mismatch must be found first.
  const std::uintmax_t huge_rows = 68719476736ull;
  {
    std::string header =
        fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, 2), }}", huge_rows);
    while ((10 + header.size() + 1) % 64 != 0) header += ' ';
    header += '\n';
    std::ofstream f(dir.file("huge.npy"), std::ios::binary);
    f.write("\x93NUMPY\x01\x00", 8);
    f.put(static_cast<char>(header.size() & 0xff));
    f.put(static_cast<char>(header.size() >> 8));
    f << header;
  }
  std::filesystem::resize_file(dir.file("huge.npy"),
                               std::filesystem::file_size(dir.file("huge.npy")) + huge_rows * 8);
  expect(with(classify, {"--data", dir.file("huge.npy"), "--targets", dir.file("y.npy")}),
         {"12 class labels", "68719476736 rows"}, {"memory"});
  {
    std::ofstream f(dir.file("text.npy"));
    f << "hello\nhello\n";
  }
  expect(with(classify, {"--data", dir.file("huge.npy"), "--targets", dir.file("text.npy")}),
         {"--targets", "text.npy", "magic bytes"}, {"memory"});
  // Regression too: the float targets' row count, from the headers.
  const std::vector<std::int64_t> y_shape{n, 1};
  std::vector<float> y(n, 1.0f);
  nanoddp::nn::write_npy(dir.file("yf.npy"), y_shape, y.data());
  expect({"--data", dir.file("huge.npy"), "--targets", dir.file("yf.npy")},
         {"68719476736 samples", "have 12"}, {"memory"});

  // 256 rows of 0 features: not "empty".
  const std::vector<std::int64_t> no_columns{n, 0};
  nanoddp::nn::write_npy(dir.file("x0.npy"), no_columns, nullptr);
  expect(with(classify, {"--data", dir.file("x0.npy"), "--targets", dir.file("y.npy")}),
         {"0 features", "x0.npy"});

  // A finite float64 beyond float32's range: not "contains inf".
  {
    std::vector<double> x64(n * in, 0.25);
    x64[7 * in + 1] = 1e300;
    std::string header =
        fmt::format("{{'descr': '<f8', 'fortran_order': False, 'shape': ({}, {}), }}", n, in);
    while ((10 + header.size() + 1) % 64 != 0) header += ' ';
    header += '\n';
    std::ofstream f(dir.file("x64.npy"), std::ios::binary);
    f.write("\x93NUMPY\x01\x00", 8);
    f.put(static_cast<char>(header.size() & 0xff));
    f.put(static_cast<char>(header.size() >> 8));
    f << header;
    f.write(reinterpret_cast<const char*>(x64.data()),
            static_cast<std::streamsize>(x64.size() * sizeof(double)));
  }
  expect(with(classify, {"--data", dir.file("x64.npy"), "--targets", dir.file("y.npy")}),
         {"1e+300", "row 7, column 1", "float32's range"}, {"non-finite"});

  // Class labels given to a regression: point at --task classify, not at a float conversion.
  expect({"--data", dir.file("x.npy"), "--targets", dir.file("y.npy")},
         {"--task classify --classes K", "class labels"}, {"astype"});

  // A truncated --init file: refused from its header, naming the flag.
  const ProcessResult saved = train(with(classify, {"--in", "3", "--hidden", "8", "--layers", "1",
                                                    "--steps", "1", "--save", dir.file("p.st")}));
  REQUIRE_MESSAGE(saved.exit_code == 0, saved.output);
  std::filesystem::resize_file(dir.file("p.st"), std::filesystem::file_size(dir.file("p.st")) - 8);
  expect(with(classify, {"--hidden", "8", "--layers", "1", "--data", dir.file("x.npy"), "--targets",
                         dir.file("y.npy"), "--init", dir.file("p.st")}),
         {"--init", "truncated"});
}

TEST_CASE(
    "classify: a checkpoint of another --classes is refused naming both, before its tensors") {
  TempDir dir;
  auto run = [&](const std::string& classes, const std::string& steps) {
    return train({"--task", "classify", "--classes", classes, "--in", "4", "--hidden", "8",
                  "--layers", "1", "--steps", steps, "--checkpoint-every", "2", "--checkpoint-dir",
                  dir.file("ck"), "--resume", "--quiet"});
  };
  const ProcessResult first = run("5", "4");
  REQUIRE_MESSAGE(first.exit_code == 0, first.output);
  const ProcessResult other = run("6", "6");
  INFO(other.output);
  CHECK(other.exit_code == 2);
  CHECK(other.output.find("--task classify --classes 5") != std::string::npos);
  CHECK(other.output.find("--task classify --classes 6") != std::string::npos);
  CHECK(other.output.find("optimizer's settings") == std::string::npos);
}

TEST_CASE("classify: ranks with another task are refused without a --classes nobody gave") {
  TempDir dir;
  const std::string train_bin = bin_path("nanoddp-train");
  const std::string script = fmt::format(
      "if [ \"$RANK\" = 1 ]; then exec {0} --in 4 --out 3 --steps 2 --quiet; fi; exec {0} --task "
      "classify --classes 3 --in 4 --steps 2 --quiet",
      train_bin);
  const auto results = run_world({"/bin/sh", "-c", script}, 2);
  INFO(describe(results));
  bool named = false;
  for (const auto& r : results) {
    CHECK(r.exit_code == 2);
    named |= r.output.find("--task classify --classes 3") != std::string::npos &&
             r.output.find("--task regression") != std::string::npos;
    CHECK(r.output.find("--classes 0") == std::string::npos);
  }
  CHECK(named);
}

TEST_CASE("classify: steps skipped for a NaN loss are left out of the accuracy") {
  TempDir dir;
  const ProcessResult r = train({"--task",
                                 "classify",
                                 "--classes",
                                 "5",
                                 "--in",
                                 "8",
                                 "--hidden",
                                 "16",
                                 "--layers",
                                 "1",
                                 "--optimizer",
                                 "sgd",
                                 "--lr",
                                 "1e30",
                                 "--steps",
                                 "20",
                                 "--log-every",
                                 "5",
                                 "--skip-nonfinite",
                                 "--metrics",
                                 dir.file("m.jsonl")});
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const auto lines = read_json_lines(dir.file("m.jsonl"));
  REQUIRE(lines.size() >= 4);
  // Past the first steps every step is skipped: the window holds no counted sample, and an
  // accuracy computed from NaN logits would be a number that means nothing.
  const auto& last = lines.back();
  CHECK(last["accuracy"].is_null());  // NaN in JSON
  CHECK(r.output.find("train accuracy nan") != std::string::npos);
}
