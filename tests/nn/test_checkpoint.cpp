// Checkpoints: round trips, retention, and every way a file can be wrong.

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <unistd.h>
#include <chrono>
#include <cstring>
#include <iterator>
#include <regex>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include "nanoddp/engine/ops.h"
#include "nanoddp/kernels/error.h"
#include "nanoddp/nn/checkpoint.h"
#include "nanoddp/nn/file_io.h"
#include "nanoddp/nn/flat_parameters.h"
#include "nanoddp/nn/layers.h"
#include "nanoddp/nn/optimizer.h"
#include "nanoddp/nn/safetensors.h"
#include "nn/half_used.h"
#include "support/saved_parameters.h"
#include "support/subprocess.h"

using namespace nanoddp;
using nanoddp::testing::rewrite_metadata;
namespace fs = std::filesystem;

namespace {

struct Run {
  nn::Mlp model;
  nn::FlatParameters params;
  nn::AdamW adam;
  explicit Run(std::int64_t hidden = 8, std::uint64_t seed = 1)
      : model({.in_features = 4, .out_features = 2, .hidden = hidden, .layers = 1, .seed = seed}),
        params(model, Device::cpu()),
        adam(params, {.lr = 0.01f}) {}
  void steps(int n) {
    for (int i = 0; i < n; ++i) {
      adam.zero_grad();
      Tensor x =
          Tensor::normal({6, 4}, 0, 1, {.seed = 3, .offset = static_cast<std::uint64_t>(i) * 24});
      mse_loss(model(x), Tensor::zeros({6, 2})).backward();
      adam.step();
    }
  }
};

std::string expect_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  FAIL("expected an Error");
  return {};
}

void flip_byte(const std::string& path, std::uintmax_t from_end) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(fs::file_size(path) - from_end));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x10);
  f.seekp(static_cast<std::streamoff>(fs::file_size(path) - from_end));
  f.write(&c, 1);
}

// A model whose second layer never gets a gradient, under AdamW.
struct Skipping {
  Generator gen;
  nn::testing::HalfUsed model;
  nn::FlatParameters params;
  nn::AdamW adam;
  Skipping()
      : gen(2), model(gen, 4, 2), params(model, Device::cpu()), adam(params, {.lr = 0.01f}) {}
  void steps(int n) {
    for (int i = 0; i < n; ++i) {
      adam.zero_grad();
      Tensor x = Tensor::normal({6, 4}, 0, 1, {.seed = 5, .stream = 0});
      mse_loss(model(x), Tensor::zeros({6, 2})).backward();
      adam.step();
    }
  }
};

}  // namespace

TEST_CASE("checkpoint: save then load restores parameters, optimizer state and position exactly") {
  testing::TempDir dir;
  Run a;
  a.steps(5);
  const std::string path = nn::save_checkpoint(
      dir.path(), a.model, a.adam,
      {.step = 5, .epoch = 2, .epoch_samples = 96, .seed = 1, .info = {{"batch", "6"}}}, 3);
  CHECK(fs::path(path).filename() == "step-000000005.safetensors");

  Run b;  // same architecture, same init seed, but not trained
  const nn::TrainingState state = nn::load_checkpoint(path, b.model, b.adam);
  CHECK(state.step == 5);
  CHECK(state.epoch == 2);
  CHECK(state.epoch_samples == 96);
  CHECK(state.seed == 1);
  CHECK(state.info.at("batch") == "6");
  CHECK(b.adam.steps() == 5);
  CHECK(b.params.values().to_vector() == a.params.values().to_vector());
  for (std::size_t i = 0; i < a.adam.state().size(); ++i) {
    CHECK(b.adam.state()[i].tensor.to_vector() == a.adam.state()[i].tensor.to_vector());
  }
  // Continuing both gives the same bits: the trajectory goes on exactly.
  a.steps(3);
  b.steps(3);
  CHECK(b.params.values().to_vector() == a.params.values().to_vector());
}

// An outside tester's: step -5 was written and listed as a checkpoint that no load would take.
TEST_CASE("checkpoint: a negative step, epoch or sample count is refused, nothing written") {
  testing::TempDir dir;
  Run a;
  for (const nn::TrainingState& state :
       {nn::TrainingState{.step = -5}, nn::TrainingState{.step = 1, .epoch = -1},
        nn::TrainingState{.step = 1, .epoch_samples = -3}}) {
    CHECK_THROWS_WITH_AS(nn::save_checkpoint(dir.path(), a.model, a.adam, state, 3),
                         doctest::Contains("the training state has a negative count"), Error);
  }
  CHECK(nn::list_checkpoints(dir.path()).empty());
}

TEST_CASE("checkpoint: per-parameter step counts of skipped parameters survive a resume") {
  // A parameter without a gradient in a step is skipped by the optimizer, so its own step count
  // (AdamW's bias correction) falls behind; a resumed run must continue from the same counts.
  testing::TempDir dir;
  Skipping a;
  a.steps(3);
  REQUIRE(a.adam.param_steps() == std::vector<std::int64_t>{0, 0, 3, 3});
  const std::string path = nn::save_checkpoint(dir.path(), a.model, a.adam, {.step = 3}, 1);
  Skipping b;
  nn::load_checkpoint(path, b.model, b.adam);
  CHECK(b.adam.steps() == 3);
  CHECK(b.adam.param_steps() == a.adam.param_steps());

  // A count that is not one, or past the optimizer's steps, is refused before loading.
  for (const char* bad : {"0,0,x,3", "0,0,4,3", "0,0,3", "-1,0,3,3"}) {
    CAPTURE(bad);
    const std::string edited = path + ".edited.safetensors";
    rewrite_metadata(path, edited, "optimizer_param_steps", bad);
    Skipping c;
    const std::string message = expect_error([&] { nn::load_checkpoint(edited, c.model, c.adam); });
    const bool named = message.find("optimizer_param_steps") != std::string::npos ||
                       message.find("step counts for 3 parameters") != std::string::npos;
    CHECK_MESSAGE(named, message);
    CHECK(c.adam.steps() == 0);
  }
}

TEST_CASE("checkpoint: only the newest K are kept, listed oldest first") {
  testing::TempDir dir;
  Run a;
  for (int step = 1; step <= 5; ++step) {
    nn::save_checkpoint(dir.path(), a.model, a.adam, {.step = step}, 2);
  }
  const auto all = nn::list_checkpoints(dir.path());
  REQUIRE(all.size() == 2);
  CHECK(fs::path(all[0]).filename() == "step-000000004.safetensors");
  CHECK(fs::path(all[1]).filename() == "step-000000005.safetensors");
  CHECK(nn::list_checkpoints(dir.file("missing")).empty());
}

TEST_CASE("checkpoint: a save removes dead writers' temporaries from this host only") {
  // A pid above any pid_max is surely dead; on another host the same pid says nothing, and the
  // folder may be shared over the network with a writer there that is alive.
  testing::TempDir dir;
  const std::string dead_here =
      ".step-000000001.safetensors.tmp." + nn::this_host() + ".999999999.0";
  const std::string other_host = ".step-000000001.safetensors.tmp.node-7.cluster.999999999.0";
  const std::string live_here = ".step-000000001.safetensors.tmp." + nn::this_host() + "." +
                                std::to_string(::getppid()) + ".3";
  for (const auto& name : {dead_here, other_host, live_here}) std::ofstream(dir.file(name)) << "x";
  Run a;
  nn::save_checkpoint(dir.path(), a.model, a.adam, {.step = 2}, 3);
  CHECK_FALSE(fs::exists(dir.file(dead_here)));
  CHECK(fs::exists(dir.file(other_host)));
  CHECK(fs::exists(dir.file(live_here)));

  const auto w = nn::temporary_writer(other_host);
  REQUIRE(w.has_value());
  CHECK(w->host == "node-7.cluster");
  CHECK(w->pid == 999999999);
  CHECK_FALSE(nn::temporary_writer("step-000000001.safetensors").has_value());
  CHECK_FALSE(nn::temporary_writer(".step-1.safetensors.tmp.host.x.0").has_value());
}

TEST_CASE("checkpoint: a reused folder's later checkpoints never push out the one just written") {
  // An earlier run got to step 1000 in this folder; a new run (no --resume) saves step 100 with
  // keep = 2. Pruning only removes this run's earlier steps: step 100 must survive, and the
  // earlier run's files are not this run's to delete.
  testing::TempDir dir;
  Run a;
  for (int step : {900, 1000}) nn::save_checkpoint(dir.path(), a.model, a.adam, {.step = step}, 2);
  for (int step : {100, 200, 300}) {
    const std::string path = nn::save_checkpoint(dir.path(), a.model, a.adam, {.step = step}, 2);
    CHECK(fs::exists(path));
  }
  std::vector<std::string> names;
  for (const auto& p : nn::list_checkpoints(dir.path())) names.push_back(fs::path(p).filename());
  CHECK(names ==
        std::vector<std::string>{"step-000000200.safetensors", "step-000000300.safetensors",
                                 "step-000000900.safetensors", "step-000001000.safetensors"});
}

TEST_CASE("checkpoint: a bit flip, a truncation, another model or optimizer are clear errors") {
  testing::TempDir dir;
  Run a;
  a.steps(2);
  const std::string path = nn::save_checkpoint(dir.path(), a.model, a.adam, {.step = 2}, 5);
  const auto pristine = Run().params.values().to_vector();

  SUBCASE("bit flip in the tensor data") {
    flip_byte(path, 5);
    Run b;
    const std::string msg = expect_error([&] { nn::load_checkpoint(path, b.model, b.adam); });
    CHECK(msg.find("corrupted") != std::string::npos);
    CHECK(msg.find(path) != std::string::npos);
    CHECK(b.params.values().to_vector() == pristine);  // untouched
  }
  SUBCASE("truncated") {
    fs::resize_file(path, fs::file_size(path) - 10);
    Run b;
    const std::string msg = expect_error([&] { nn::load_checkpoint(path, b.model, b.adam); });
    CHECK(msg.find(path) != std::string::npos);
  }
  SUBCASE("another model") {
    Run wider(16);
    const std::string msg =
        expect_error([&] { nn::load_checkpoint(path, wider.model, wider.adam); });
    CHECK(msg.find("different model") != std::string::npos);
    CHECK(msg.find("layers.0") != std::string::npos);
  }
  SUBCASE("another optimizer") {
    Run b;
    nn::SGD sgd(b.params, {.lr = 0.1f});
    const std::string msg = expect_error([&] { nn::load_checkpoint(path, b.model, sgd); });
    CHECK(msg.find("AdamW") != std::string::npos);
    CHECK(msg.find("SGD") != std::string::npos);
  }
  SUBCASE("an older format version") {
    const std::string old = dir.file("old.safetensors");
    rewrite_metadata(path, old, "format_version", "0");
    Run b;
    const std::string msg = expect_error([&] { nn::load_checkpoint(old, b.model, b.adam); });
    CHECK(msg.find("format version 0") != std::string::npos);
  }
  SUBCASE("bad metadata is an error before the model is touched") {
    const std::pair<const char*, const char*> bad[] = {
        {"step", "five"}, {"optimizer_steps", "-3"}, {"epoch", "-1"}, {"seed", "7garbage"}};
    for (const auto& [key, value] : bad) {
      CAPTURE(key);
      const std::string edited = dir.file(std::string("bad-") + key + ".safetensors");
      rewrite_metadata(path, edited, key, value);
      Run b;
      const std::string msg = expect_error([&] { nn::load_checkpoint(edited, b.model, b.adam); });
      CHECK(msg.find(key) != std::string::npos);
      CHECK(b.params.values().to_vector() == pristine);  // untouched
      CHECK(b.adam.steps() == 0);
    }
  }
  SUBCASE("other optimizer settings: the unexpected tensors are named") {
    Run c;
    nn::SGD with_momentum(c.params, {.lr = 0.1f, .momentum = 0.9f});
    const std::string sgd_path =
        nn::save_checkpoint(dir.file("sgd"), c.model, with_momentum, {.step = 1}, 1);
    Run b;
    nn::SGD plain(b.params, {.lr = 0.1f});
    const std::string msg = expect_error([&] { nn::load_checkpoint(sgd_path, b.model, plain); });
    CHECK(msg.find("momentum") != std::string::npos);
    CHECK(msg.find("not expected: 'optimizer.") != std::string::npos);
    CHECK(b.params.values().to_vector() == pristine);
  }
  SUBCASE("not a checkpoint at all") {
    const std::string other = dir.file("params.safetensors");
    const std::vector<float> v(8, 1.0f);
    const std::vector<nn::SafetensorsEntry> entries = {
        {.name = "w", .dtype = "F32", .shape = {8}, .data = v.data()}};
    nn::write_safetensors(other, entries);
    Run b;
    const std::string msg = expect_error([&] { nn::load_checkpoint(other, b.model, b.adam); });
    CHECK(msg.find("not a nanoddp checkpoint") != std::string::npos);
  }
}

TEST_CASE("checkpoint: an unwritable directory is an error naming it") {
  testing::TempDir dir;
  const std::string file = dir.file("a-file");
  std::ofstream(file) << "x";
  Run a;
  const std::string msg =
      expect_error([&] { nn::save_checkpoint(file + "/sub", a.model, a.adam, {.step = 1}, 1); });
  CHECK(msg.find("a-file") != std::string::npos);
}

// load_parameters (nanoddp-train --init): the model's own tensors, converted from any float
// dtype, strictly by name and shape.
TEST_CASE("load_parameters: a parameter file round-trips, also from F64, mismatches are errors") {
  testing::TempDir dir;
  Run source(8, 1), target(8, 2);
  source.steps(2);
  std::vector<std::vector<float>> values;
  std::vector<nn::SafetensorsEntry> entries;
  for (const nn::NamedTensor& p : source.model.named_parameters())
    values.push_back(p.tensor.to_vector());
  std::size_t i = 0;
  for (const nn::NamedTensor& p : source.model.named_parameters()) {
    entries.push_back({p.name, "F32", p.tensor.shape(), values[i++].data()});
  }
  const std::string f32 = dir.file("f32.safetensors");
  nn::write_safetensors(f32, entries);
  nn::load_parameters(f32, target.model);
  i = 0;
  for (const nn::NamedTensor& p : target.model.named_parameters()) {
    CAPTURE(p.name);
    CHECK(p.tensor.to_vector() == values[i++]);  // bit for bit
  }

  // F64, as numpy or torch.float64 would store them: the same floats after conversion.
  std::vector<std::vector<double>> wide;
  for (const auto& v : values) wide.emplace_back(v.begin(), v.end());
  std::vector<nn::SafetensorsEntry> f64_entries = entries;
  for (std::size_t k = 0; k < entries.size(); ++k) {
    f64_entries[k].dtype = "F64";
    f64_entries[k].data = wide[k].data();
  }
  const std::string f64 = dir.file("f64.safetensors");
  nn::write_safetensors(f64, f64_entries);
  Run other(8, 3);
  nn::load_parameters(f64, other.model);
  CHECK(other.model.named_parameters()[0].tensor.to_vector() == values[0]);

  // Missing and unexpected names, a wrong shape, a non-float dtype: errors naming them, and the
  // model untouched.
  Run untouched(8, 4);
  const std::vector<float> before = untouched.model.named_parameters()[0].tensor.to_vector();
  std::vector<nn::SafetensorsEntry> renamed = entries;
  renamed[0].name = "layers.9.weight";
  const std::string bad_names = dir.file("names.safetensors");
  nn::write_safetensors(bad_names, renamed);
  std::string message = expect_error([&] { nn::load_parameters(bad_names, untouched.model); });
  CHECK(message.find("missing layers.0.weight") != std::string::npos);
  CHECK(message.find("not in the model layers.9.weight") != std::string::npos);
  CHECK(untouched.model.named_parameters()[0].tensor.to_vector() == before);

  Run wider(16, 1);
  message = expect_error([&] { nn::load_parameters(f32, wider.model); });
  CHECK(message.find("has shape [8, 4] but the model's parameter is [16, 4]") != std::string::npos);

  std::vector<std::int64_t> ints(values[0].size(), 1);
  std::vector<nn::SafetensorsEntry> int_entries = entries;
  int_entries[0].dtype = "I64";
  int_entries[0].data = ints.data();
  const std::string i64 = dir.file("i64.safetensors");
  nn::write_safetensors(i64, int_entries);
  message = expect_error([&] { nn::load_parameters(i64, untouched.model); });
  CHECK(message.find("is I64; parameters load from F32, BF16, F16 or F64") != std::string::npos);
  CHECK(untouched.model.named_parameters()[0].tensor.to_vector() == before);
}

TEST_CASE("load_parameters: NaN or Inf in the file is an error naming it, the model untouched") {
  // The .npy reader refused non-finite values; the safetensors parameter loader did not.
  testing::TempDir dir;
  Run source(8, 1), target(8, 2);
  const std::vector<float> before = target.model.named_parameters()[1].tensor.to_vector();
  for (const float bad : {NAN, INFINITY}) {
    std::vector<std::vector<float>> values;
    std::vector<nn::SafetensorsEntry> entries;
    for (const nn::NamedTensor& p : source.model.named_parameters()) {
      values.push_back(p.tensor.to_vector());
    }
    values[1][3] = bad;
    std::size_t i = 0;
    for (const nn::NamedTensor& p : source.model.named_parameters()) {
      entries.push_back({p.name, "F32", p.tensor.shape(), values[i++].data()});
    }
    const std::string path = dir.file("bad.safetensors");
    nn::write_safetensors(path, entries);
    const std::string message = expect_error([&] { nn::load_parameters(path, target.model); });
    CAPTURE(message);
    CHECK(message.find(path) != std::string::npos);
    CHECK(message.find("'" + source.model.named_parameters()[1].name + "' holds 1 non-finite") !=
          std::string::npos);
    CHECK(message.find("flat index 3") != std::string::npos);
    CHECK(target.model.named_parameters()[1].tensor.to_vector() == before);
  }
}

TEST_CASE("checkpoint: a file whose name and recorded step disagree is refused") {
  testing::TempDir dir;
  Run a;
  const std::string written = nn::save_checkpoint(dir.path(), a.model, a.adam, {.step = 4}, 3);
  const std::string renamed = dir.file("step-000000008.safetensors");
  fs::rename(written, renamed);
  Run b(8, 2);
  const std::string message = expect_error([&] { nn::load_checkpoint(renamed, b.model, b.adam); });
  CHECK(message.find("named for step 8 but its metadata records step 4") != std::string::npos);
  // Under its own name it loads.
  fs::rename(renamed, written);
  CHECK(nn::load_checkpoint(written, b.model, b.adam).step == 4);
}

TEST_CASE("checkpoint: housekeeping removes only its own run's, and never overwrites a file") {
  // Run A wrote steps 3, 6, 9 here; run B (another run_id) saves steps 3.. with keep = 2.
  testing::TempDir dir;
  Run a;
  for (int step : {3, 6, 9}) {
    nn::save_checkpoint(dir.path(), a.model, a.adam, {.step = step, .run_id = "A"}, 3);
  }
  std::map<std::string, std::uint64_t> before;
  for (const std::string& p : nn::list_checkpoints(dir.path())) before[p] = nn::file_checksum(p);
  Run b(8, 2);
  const std::string message = expect_error(
      [&] { nn::save_checkpoint(dir.path(), b.model, b.adam, {.step = 3, .run_id = "B"}, 2); });
  CHECK(message.find("step-000000003.safetensors") != std::string::npos);
  CHECK(message.find("already exists") != std::string::npos);
  for (int step : {4, 5, 7}) {
    nn::save_checkpoint(dir.path(), b.model, b.adam, {.step = step, .run_id = "B"}, 2);
  }
  // A's three are there, unchanged; of B's, the newest two.
  for (const auto& [path, sum] : before) {
    CAPTURE(path);
    REQUIRE(fs::exists(path));
    CHECK(nn::file_checksum(path) == sum);
  }
  CHECK_FALSE(fs::exists(dir.file("step-000000004.safetensors")));
  CHECK(fs::exists(dir.file("step-000000005.safetensors")));
  CHECK(fs::exists(dir.file("step-000000007.safetensors")));
  // A resumed run takes over the id it resumed, so its own earlier checkpoints are pruned.
  Run c(8, 3);
  CHECK(nn::load_checkpoint(dir.file("step-000000009.safetensors"), c.model, c.adam).run_id == "A");
}

TEST_CASE("load_parameters: a training checkpoint's parameters load for evaluation") {
  testing::TempDir dir;
  Run trained(8, 1), fresh(8, 2);
  trained.steps(3);
  const std::string path =
      nn::save_checkpoint(dir.path(), trained.model, trained.adam, {.step = 3}, 1);
  nn::load_parameters(path, fresh.model);  // the optimizer's state is skipped, not refused
  const auto a = trained.model.named_parameters(), b = fresh.model.named_parameters();
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    CHECK(a[i].tensor.to_vector() == b[i].tensor.to_vector());
}

TEST_CASE("load_parameters: a file with a tensor the model lacks is refused from its header") {
  // A huge extra tensor: refused before the body is read (it used to be read whole, 20 GiB).
  testing::TempDir dir;
  Run source(8, 1), target(8, 2);
  std::vector<std::vector<float>> values;
  std::vector<nn::SafetensorsEntry> entries;
  for (const nn::NamedTensor& p : source.model.named_parameters()) {
    values.push_back(p.tensor.to_vector());
  }
  std::size_t i = 0;
  for (const nn::NamedTensor& p : source.model.named_parameters()) {
    entries.push_back({p.name, "F32", p.tensor.shape(), values[i++].data()});
  }
  const std::vector<float> small(4, 0.0f);
  entries.push_back({"zjunk", "F32", {2, 2}, small.data()});
  const std::string file = dir.file("extra.safetensors");
  nn::write_safetensors(file, entries);
  // Make the extra tensor claim 16 GiB: rewrite its entry in the header and grow the file
  // sparsely. Reading the body would need 16 GiB of memory; the header alone tells.
  std::string bytes;
  {
    std::ifstream in(file, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::uint64_t header_length = 0;
  std::memcpy(&header_length, bytes.data(), 8);
  std::string header = bytes.substr(8, header_length);
  const std::string body = bytes.substr(8 + header_length);
  const std::regex entry(
      R"re("zjunk":\{"dtype":"F32","shape":\[2,2\],"data_offsets":\[(\d+),(\d+)\]\})re");
  std::smatch m;
  REQUIRE(std::regex_search(header, m, entry));
  const std::uint64_t begin = std::stoull(m[1]);
  const std::uint64_t huge = std::uint64_t{65536} * 65536 * 4;
  header = m.prefix().str() +
           fmt::format(R"("zjunk":{{"dtype":"F32","shape":[65536,65536],"data_offsets":[{},{}]}})",
                       begin, begin + huge) +
           m.suffix().str();
  {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    const std::uint64_t length = header.size();
    out.write(reinterpret_cast<const char*>(&length), 8);
    out << header << body.substr(0, begin);
  }
  std::filesystem::resize_file(file, 8 + header.size() + begin + huge);
  const auto start = std::chrono::steady_clock::now();
  const std::string message = expect_error([&] { nn::load_parameters(file, target.model); });
  CHECK(message.find("not in the model zjunk") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
}
