// What nanoddp-sim accepts as a fit or a profile, from real runs made here: nanoddp-bench-allreduce
// on 2 ranks over shared memory and over TCP (NANODDP_SHM=0), with --vs-raw, and a 2-rank
// nanoddp-train --zero 2 trace. Refused: rows of two transports or modes in one fit, rows that
// failed their correctness check, a fit whose transport is not the level's or the world's, a ZeRO
// trace, --busbw with the hierarchical flags, window flags without a fit, links across nodes
// with one node. Reported: the distinct sizes a fit used, a large fit error, --busbw past the
// fitted range, and each input file's size and SHA-256.

#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "benchmarks/sim/file_digest.h"
#include "sim/sim_runs.h"
#include "support/subprocess.h"
#include "support/worst_error.h"

using namespace nanoddp::testing;

namespace {

bool has(const ProcessResult& r, const std::string& text) {
  return r.output.find(text) != std::string::npos;
}

std::vector<nlohmann::json> rows_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> rows;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) rows.push_back(nlohmann::json::parse(line));
  }
  return rows;
}

// Writes the rows; a row whose time_us a test changed gets the algbw_gbps that goes with it, as
// nanoddp-bench-allreduce writes it (the simulator refuses a row that contradicts itself).
void write_rows(const std::string& path, std::vector<nlohmann::json> rows) {
  std::ofstream out(path);
  for (auto& row : rows) {
    if (row.contains("algbw_gbps")) {
      row["algbw_gbps"] = row["bytes"].get<double>() / (row["time_us"].get<double>() * 1e3);
    }
    out << row.dump() << "\n";
  }
}

// nanoddp-bench-allreduce on 2 ranks, 64K..4M in steps of 4 (4 sizes), launched twice: each
// size has two in-place rows. `shm` false: NANODDP_SHM=0, the TCP ring. The rows are real (their
// transport, sizes, modes and checks are what these tests are about), but their times are then
// put on a clean line: a loaded machine's TCP times need not even grow with the size (CI once
// fitted a negative slope), and no test here is about the quality of a measurement.
void bench(const std::string& json, bool shm, std::vector<std::string> extra = {"--repeats", "2"}) {
  ProcessOptions options;
  options.timeout = std::chrono::seconds(120);
  options.env["NANODDP_TIMEOUT_S"] = "60";
  options.env["NANODDP_SHM"] = shm ? "1" : "0";
  std::vector<std::string> args = {bin_path("nanoddp-bench-allreduce"),
                                   "--nproc-per-node",
                                   "2",
                                   "-b",
                                   "64K",
                                   "-e",
                                   "4M",
                                   "-f",
                                   "4",
                                   "--json",
                                   json};
  args.insert(args.end(), extra.begin(), extra.end());
  const ProcessResult r = run_process(args, options);
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const auto rows = rows_of(json);
  REQUIRE(!rows.empty());
  // The premise of every case below: the file records the transport it was measured over.
  const std::string algorithm = rows[0]["algorithm"].get<std::string>();
  REQUIRE_MESSAGE(
      algorithm.find(shm ? "transport: shared memory" : "transport: TCP ring") != std::string::npos,
      algorithm);
  std::vector<nlohmann::json> timed = rows_of(json);
  for (auto& row : timed) {
    const double bytes = row["bytes"].get<double>();
    row["time_us"] = shm ? 20.0 + bytes / 4000.0 : 50.0 + bytes / 1000.0;
  }
  write_rows(json, timed);
}

}  // namespace

TEST_CASE("fit inputs: --busbw refuses --algo and the two-level fits it would ignore") {
  TempDir dir;
  const std::string shm = dir.file("ar_allreduce.jsonl"), tcp = dir.file("ar_tcp.jsonl");
  bench(shm, true);
  bench(tcp, false);
  const ProcessResult r = sim({"--busbw", "--nodes", "2", "--gpus-per-node", "2", "--algo", "hier",
                               "--fit-intra", shm, "--fit-inter", tcp});
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(has(r, "--algo hier, --fit-intra and --fit-inter are not used there"));
  CHECK(!has(r, "NVLink"));
  const ProcessResult algo = sim({"--busbw", "--nodes", "2", "--algo", "ring"});
  CHECK(algo.exit_code == 2);
  CHECK(has(algo, "--algo ring is not used there"));
  // A one-level fit is what --busbw does model: accepted, on the fitted transport.
  const ProcessResult fitted = sim({"--busbw", "--gpus-per-node", "2", "--fit-allreduce", tcp});
  CHECK_MESSAGE(fitted.exit_code == 0, fitted.output);
  CHECK(has(fitted, "fitted"));
}

TEST_CASE("fit inputs: a ZeRO trace is refused, DDP's all-reduce is all the model knows") {
  TempDir dir;
  ProcessOptions options;
  options.timeout = std::chrono::seconds(120);
  options.env["NANODDP_TIMEOUT_S"] = "60";
  const std::string tz = dir.file("tz.json");
  const ProcessResult train =
      run_process({bin_path("nanoddp-run"), "--nproc-per-node", "2", bin_path("nanoddp-train"),
                   "--hidden", "64", "--layers", "2", "--steps", "6", "--trace-steps", "6",
                   "--quiet", "--zero", "2", "--trace", tz},
                  options);
  REQUIRE_MESSAGE(train.exit_code == 0, train.output);
  const ProcessResult r = sim({"--profile", tz, "--nodes", "1", "--gpus-per-node", "2"});
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(has(r, "a ZeRO trace"));
  CHECK(has(r, "models DDP's all-reduce only"));
  CHECK(!has(r, "one DDP training step, predicted"));
}

TEST_CASE("fit inputs: one fit refuses two transports, raw beside nanoddp rows, failed checks") {
  TempDir dir;
  const std::string shm = dir.file("shm.jsonl"), tcp = dir.file("tcp.jsonl");
  bench(shm, true);
  bench(tcp, false);
  // The two files concatenated: shared memory rows, then TCP ring rows.
  auto both = rows_of(shm);
  const std::size_t shm_rows = both.size();
  for (const auto& row : rows_of(tcp)) both.push_back(row);
  const std::string mixed = dir.file("mixed.jsonl");
  write_rows(mixed, both);
  const ProcessResult m = sim(model({"--gpus-per-node", "2", "--fit-allreduce", mixed}));
  INFO(m.output);
  CHECK(m.exit_code == 2);
  CHECK(has(m, mixed));
  CHECK(has(m, "measured over TCP but line 2 over shared memory"));
  CHECK(has(m, "line " + std::to_string(shm_rows + 2)));  // the first TCP in-place row

  // --vs-raw: the process group's rows and raw Gloo's in one file.
  const std::string raw = dir.file("vsraw.jsonl");
  bench(raw, false, {"--vs-raw", "-r", "2"});
  const ProcessResult v = sim(model({"--gpus-per-node", "2", "--fit-allreduce", raw}));
  INFO(v.output);
  CHECK(v.exit_code == 2);
  CHECK(has(v, "mode \"raw\""));
  CHECK(has(v, "mode \"nanoddp\""));

  // A row whose correctness check failed: refused with its file and line.
  auto rows = rows_of(tcp);
  rows[2]["wrong"] = 3;
  const std::string wrong = dir.file("wrong.jsonl");
  write_rows(wrong, rows);
  const ProcessResult w = sim(model({"--gpus-per-node", "2", "--fit-allreduce", wrong}));
  INFO(w.output);
  CHECK(w.exit_code == 2);
  CHECK(has(w, "--fit-allreduce " + wrong + ": line 3 has \"wrong\": 3"));
  // Each file alone is fine.
  CHECK(sim(model({"--gpus-per-node", "2", "--fit-allreduce", tcp})).exit_code == 0);
  CHECK(sim(model({"--gpus-per-node", "2", "--fit-allreduce", shm})).exit_code == 0);
}

TEST_CASE("fit inputs: each fit's transport must be its level's, a same-host fit one host's") {
  TempDir dir;
  const std::string shm = dir.file("shm.jsonl"), tcp = dir.file("tcp.jsonl");
  bench(shm, true);
  bench(tcp, false);
  const std::vector<std::string> hier = {"--nodes", "2", "--gpus-per-node", "2", "--algo", "hier"};
  const auto run_hier = [&](const std::string& intra, const std::string& inter) {
    std::vector<std::string> args = model(hier);
    args.insert(args.end(), {"--fit-intra", intra, "--fit-inter", inter});
    return sim(args);
  };
  // Swapped: the intra level's file is TCP.
  const ProcessResult swapped = run_hier(tcp, shm);
  INFO(swapped.output);
  CHECK(swapped.exit_code == 2);
  CHECK(has(swapped, "--fit-intra " + tcp + ": measured over TCP"));
  CHECK(has(swapped, "expects shared memory"));
  // Shared memory for both: the leaders' level is TCP.
  const ProcessResult both_shm = run_hier(shm, shm);
  INFO(both_shm.output);
  CHECK(both_shm.exit_code == 2);
  CHECK(has(both_shm, "--fit-inter " + shm + ": measured over shared memory"));
  CHECK(has(both_shm, "expects TCP"));
  // The right way round is accepted.
  const ProcessResult right = run_hier(shm, tcp);
  CHECK_MESSAGE(right.exit_code == 0, right.output);
  // A one-level fit over shared memory (one host) for 2 nodes.
  const ProcessResult nodes =
      sim(model({"--nodes", "2", "--gpus-per-node", "1", "--fit-allreduce", shm}));
  INFO(nodes.output);
  CHECK(nodes.exit_code == 2);
  CHECK(has(nodes, "--fit-allreduce " + shm + ": measured over shared memory"));
  CHECK(has(nodes, "--nodes 2 crosses hosts"));
  // The same file for the host it was measured on, and a TCP fit across 2 nodes, are fine.
  CHECK(sim(model({"--gpus-per-node", "2", "--fit-allreduce", shm})).exit_code == 0);
  CHECK(sim(model({"--nodes", "2", "--gpus-per-node", "1", "--fit-allreduce", tcp})).exit_code ==
        0);
}

TEST_CASE("fit inputs: sizes are counted, not rows, and a short window says what it holds") {
  TempDir dir;
  const std::string tcp = dir.file("tcp.jsonl");
  bench(tcp, false);  // 4 sizes x 2 launches
  // A window holding one size (2 rows): the flag, the file, the size found and the window.
  const ProcessResult one = sim(model({"--gpus-per-node", "2", "--fit-allreduce", tcp,
                                       "--fit-min-bytes", "200K", "--fit-max-bytes", "300K"}));
  INFO(one.output);
  CHECK(one.exit_code == 2);
  CHECK(has(one, "--fit-allreduce " + tcp +
                     ": 1 distinct size(s) (2 row(s)) in the fit window "
                     "204800..307200 bytes (262144)"));
  CHECK(has(one, "--fit-min-bytes"));
  // The default window (from this model's buckets) holds one size too: widened, and said so.
  const ProcessResult wide = sim(model({"--gpus-per-node", "2", "--fit-allreduce", tcp}));
  INFO(wide.output);
  REQUIRE(wide.exit_code == 0);
  CHECK(has(wide, "(4 sizes in 8 rows, 65536..4194304 bytes, 2 ranks)"));
  CHECK(has(wide, "holds fewer than two measured sizes; widened to all 4 sizes"));
}

TEST_CASE("fit inputs: the JSON warns of a large fit error and busbw past the fit, and digests") {
  TempDir dir;
  const std::string tcp = dir.file("tcp.jsonl");
  bench(tcp, false);
  // The measured rows with their times on a clean line (a loaded machine's measurement may not
  // even grow with the size: CI once fitted a negative slope), then one size's tripled: no line
  // runs near them.
  auto rows = rows_of(tcp);
  for (auto& row : rows) {
    const double line_us = 50.0 + row["bytes"].get<double>() / 1000.0;
    row["time_us"] = row["bytes"] == 262144 ? 3 * line_us : line_us;
  }
  const std::string bent = dir.file("bent.jsonl");
  write_rows(bent, rows);
  const std::string out = dir.file("sim.json");
  const ProcessResult r = sim(model(
      {"--gpus-per-node", "2", "--fit-allreduce", bent, "--fit-min-bytes", "1", "--json", out}));
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  std::ifstream in(out);
  const nlohmann::json j = nlohmann::json::parse(in);
  bool error_warned = false;
  for (const auto& w : j["warnings"]) {
    error_warned =
        error_warned || w.get<std::string>().find("(warned above 20 %)") != std::string::npos;
  }
  CHECK(error_warned);
  // The input file beside its path: size and SHA-256, as sha256sum prints it.
  REQUIRE(j["inputs"]["files"].size() == 1);
  const auto& file = j["inputs"]["files"][0];
  CHECK(file["path"] == bent);
  CHECK(file["flag"] == "--fit-allreduce");
  std::ifstream raw(bent, std::ios::binary);
  std::stringstream text;
  text << raw.rdbuf();
  CHECK(file["bytes"].get<std::size_t>() == text.str().size());
  CHECK(file["transport"] == "TCP");
  CHECK(file["sizes"] == 4);
  CHECK(file["rows"] == 8);
  const ProcessResult sum = run_process({"sha256sum", bent});
  if (sum.exit_code == 0) {
    CHECK(sum.output.substr(0, 64) == file["sha256"].get<std::string>());
  } else {
    CHECK(file["sha256"].get<std::string>().size() == 64);
  }

  // --busbw past the fitted 64K..4M: warned in the JSON rows and on stderr; inside: not.
  const ProcessResult past = sim({"--busbw", "--gpus-per-node", "2", "--fit-allreduce", tcp,
                                  "--busbw-min", "64K", "--busbw-max", "8M", "--json", "-"});
  REQUIRE_MESSAGE(past.exit_code == 0, past.output);
  CHECK(has(past,
            "nanoddp-sim: warning: --busbw-min 64K --busbw-max 8M: the fit measured "
            "65536..4194304 bytes"));
  const auto busbw = nlohmann::json::parse(past.output.substr(past.output.find('[')));
  REQUIRE(!busbw.empty());
  bool extrapolation = false;
  for (const auto& w : busbw[0]["warnings"]) {
    extrapolation = extrapolation || w.get<std::string>().find("extrapolated") != std::string::npos;
  }
  CHECK(extrapolation);
  CHECK(busbw[0]["input_files"][0]["path"] == tcp);
  const ProcessResult inside = sim({"--busbw", "--gpus-per-node", "2", "--fit-allreduce", tcp,
                                    "--busbw-min", "64K", "--busbw-max", "4M"});
  REQUIRE_MESSAGE(inside.exit_code == 0, inside.output);
  CHECK(!has(inside, "extrapolated"));
}

TEST_CASE("fit inputs: flags that would be ignored are refused, naming the flag given") {
  struct Case {
    std::vector<std::string> args;
    const char* message;
  };
  const std::vector<Case> cases = {
      {model({"--nodes", "2", "--gpus-per-node", "2", "--opt-contention", "1.3"}),
       "--opt-contention models CPU ranks"},
      {model({"--nodes", "2", "--gpus-per-node", "2", "--mem-contention", "1.3"}),
       "--mem-contention models CPU ranks"},
      {model({"--fit-min-bytes", "1K"}), "--fit-min-bytes sets the size window of a fit"},
      {model({"--fit-max-bytes", "1M"}), "--fit-max-bytes sets the size window of a fit"},
      {model({"--inter-bw-gbs", "10"}), "--inter-bw-gbs describes the links across nodes"},
      {model({"--nodes", "1", "--inter-lat-us", "5"}),
       "--inter-lat-us describes the links across nodes"},
      {model({"--sweep", "inter-bw-gbs=10,20"}), "--nodes 1 has no links across nodes"},
      {{"--busbw", "--inter-bw-gbs", "10"}, "--inter-bw-gbs describes the links across nodes"},
      {model({"--nodes", "2", "--gpus-per-node", "1", "--intra-bw-gbs", "100"}),
       "--intra-bw-gbs describes the links inside a node"},
      {{"--busbw", "--nodes", "4", "--gpus-per-node", "1", "--intra-lat-us", "2"},
       "--intra-lat-us describes the links inside a node"},
      {model({"--nodes", "2", "--gpus-per-node", "1", "--sweep", "intra-bw-gbs=100,200"}),
       "--gpus-per-node 1 has no links inside a node"},
  };
  for (const Case& c : cases) {
    const ProcessResult r = sim(c.args);
    CAPTURE(r.output);
    CHECK(r.exit_code == 2);
    CHECK(has(r, c.message));
  }
  // With 2 nodes the inter-node flags mean something.
  CHECK(sim(model({"--nodes", "2", "--inter-bw-gbs", "10"})).exit_code == 0);
}

TEST_CASE("fit inputs: the SHA-256 of the inputs matches FIPS 180-4's test vectors") {
  using nanoddp::sim::sha256_hex;
  CHECK(sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // 56 bytes: the padding spills into a second block.
  CHECK(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(sha256_hex(std::string(1000000, 'a')) ==
        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("fit inputs: rows and fitted lines outside physics are refused, naming file and line") {
  TempDir dir;
  const std::string shm = dir.file("shm.jsonl");
  bench(shm, true, {});  // 4 sizes, one row each: 64K..4M on the line 20 us + S / 4000 B/us
  const auto fit = [&](const std::vector<nlohmann::json>& rows) {
    const std::string path = dir.file("edited.jsonl");
    std::ofstream out(path);
    for (const auto& row : rows) out << row.dump() << "\n";
    out.close();
    return sim(model({"--gpus-per-node", "2", "--fit-allreduce", path, "--fit-min-bytes", "1"}));
  };
  const auto scaled = [&](double factor, bool keep_algbw) {
    auto rows = rows_of(shm);
    for (auto& row : rows) {
      row["time_us"] = row["time_us"].get<double>() * factor;
      if (!keep_algbw) {
        row["algbw_gbps"] = row["bytes"].get<double>() / (row["time_us"].get<double>() * 1e3);
      }
    }
    return rows;
  };
  // Times written in ps (1e-6 of the real ones): 3 PB/s fitted, where --intra-bw-gbs 3e6 is
  // refused. The first in-place row already goes past 100 TB/s.
  const ProcessResult ps = fit(scaled(1e-6, false));
  CAPTURE(ps.output);
  CHECK(ps.exit_code == 2);
  CHECK(has(ps, "edited.jsonl: line 2 has 65536 bytes in time_us"));
  CHECK(has(ps, "more than 100000 GB/s per rank"));
  // The same with the rows' own algbw_gbps left as measured: the row contradicts itself.
  const ProcessResult edited = fit(scaled(1e-3, true));
  CAPTURE(edited.output);
  CHECK(edited.exit_code == 2);
  CHECK(has(edited, "edited.jsonl: line 2 has algbw_gbps"));
  CHECK(has(edited, "the row contradicts itself"));
  // Every row past an hour: named, with the file and line, not "need two sizes (got 4)".
  auto forever = rows_of(shm);
  for (auto& row : forever) {
    row["time_us"] = 1e300;
    row.erase("algbw_gbps");
  }
  const ProcessResult hour = fit(forever);
  CAPTURE(hour.output);
  CHECK(hour.exit_code == 2);
  CHECK(has(hour, "--fit-allreduce " + dir.file("edited.jsonl") +
                      ": line 2 has time_us 1e+300, more than an hour"));
  // Rows each within bounds whose line is not: almost the same time at every size (slope ~0).
  auto flat = rows_of(shm);
  for (auto& row : flat) {
    row["time_us"] = 100.0 + row["bytes"].get<double>() * 1e-12;
    row.erase("algbw_gbps");
  }
  const ProcessResult line = fit(flat);
  CAPTURE(line.output);
  CHECK(line.exit_code == 2);
  CHECK(has(line, "the line fitted to its rows gives intra-bw-gbs"));
  CHECK(has(line, "more than 100000 GB/s per GPU"));
  // Rounded by hand to 3 digits: within the slack.
  auto rounded = rows_of(shm);
  for (auto& row : rounded) {
    const double algbw = row["bytes"].get<double>() / (row["time_us"].get<double>() * 1e3);
    row["algbw_gbps"] = std::round(algbw * 1000) / 1000;
  }
  const ProcessResult ok = fit(rounded);
  CHECK_MESSAGE(ok.exit_code == 0, ok.output);
}

TEST_CASE("fit inputs: collectives below the fitted window are priced from the measured rows") {
  TempDir dir;
  // 2 ranks: 1 KiB in 10 us and 4 KiB in 12 us measured; the bucket sizes 2..8 MiB on the line
  // 200 us + S / 1000 B/us. The line's intercept (200 us) used to price the sync all-reduce of
  // 16 bytes: 20x the 10 us measured at 1 KiB.
  const std::string path = dir.file("fit.jsonl");
  {
    std::ofstream out(path);
    for (const auto& [bytes, us] :
         std::vector<std::pair<double, double>>{{1024, 10.0},
                                                {4096, 12.0},
                                                {2097152, 200.0 + 2097.152},
                                                {4194304, 200.0 + 4194.304},
                                                {8388608, 200.0 + 8388.608}}) {
      out << nlohmann::json{{"ranks", 2}, {"bytes", bytes}, {"time_us", us}}.dump() << "\n";
    }
  }
  const std::string json = dir.file("sim.json");
  const ProcessResult r = sim(model(
      {"--gpus-per-node", "2", "--fit-allreduce", path, "--fit-min-bytes", "1M", "--json", json}));
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  std::ifstream in(json);
  const nlohmann::json j = nlohmann::json::parse(in);
  // Below the smallest measured size: that size's time, and a warning that says so.
  CHECK(j["step"]["sync_ms"].get<double>() == doctest::Approx(0.010));
  CHECK(has(r,
            "the per-step sync all-reduce (16 bytes) is smaller than the smallest size it "
            "measured (1024 bytes): priced at 10.0 us, that size's measured time"));
  // A bucket between 4 KiB and the window: on the straight line from 4 KiB's time to the
  // fitted line's value at 2 MiB.
  REQUIRE(j["buckets"].size() == 1);
  const double s = j["buckets"][0]["bytes"].get<double>();
  REQUIRE(s > 4096);
  REQUIRE(s < 2097152);
  const double expected_us = 12.0 + (2297.152 - 12.0) * (s - 4096) / (2097152 - 4096);
  CHECK(j["buckets"][0]["allreduce_ms"].get<double>() ==
        doctest::Approx(expected_us / 1000.0).epsilon(1e-6));
  CHECK(has(r, "below 2097152 bytes the measured times (2 size(s) from 1024 bytes)"));
  // Measured down to 8 bytes: nothing extrapolated, nothing warned.
  {
    std::ofstream out(path, std::ios::app);
    out << nlohmann::json{{"ranks", 2}, {"bytes", 8}, {"time_us", 9.0}}.dump() << "\n";
  }
  const ProcessResult small = sim(model(
      {"--gpus-per-node", "2", "--fit-allreduce", path, "--fit-min-bytes", "1M", "--json", "-"}));
  REQUIRE_MESSAGE(small.exit_code == 0, small.output);
  const auto k = nlohmann::json::parse(small.output.substr(small.output.find("\n{") + 1));
  CHECK(k["step"]["sync_ms"].get<double>() ==
        doctest::Approx((9.0 + (10.0 - 9.0) * 8 / 1016) / 1000));
  CHECK(!has(small, "smaller than the smallest size"));

  // A line through the origin (alpha 0): --algo auto used to price the sync as a tree of the
  // fitted transport, 2S/B, nearly free; the fit is one measured transport, read as a ring.
  {
    std::ofstream out(path);
    for (const auto& [bytes, us] : std::vector<std::pair<double, double>>{
             {1024, 10.0}, {2097152, 2097.152}, {4194304, 4194.304}, {8388608, 8388.608}}) {
      out << nlohmann::json{{"ranks", 2}, {"bytes", bytes}, {"time_us", us}}.dump() << "\n";
    }
  }
  const ProcessResult origin = sim(model(
      {"--gpus-per-node", "2", "--fit-allreduce", path, "--fit-min-bytes", "1M", "--json", "-"}));
  REQUIRE_MESSAGE(origin.exit_code == 0, origin.output);
  const auto o = nlohmann::json::parse(origin.output.substr(origin.output.find("\n{") + 1));
  CHECK(o["step"]["sync_ms"].get<double>() == doctest::Approx(0.010));
  for (const auto& b : o["buckets"]) CHECK(b["algo"] == "ring");
  // Nor can a tree of it be asked for.
  const ProcessResult tree =
      sim(model({"--gpus-per-node", "2", "--fit-allreduce", path, "--algo", "tree"}));
  CHECK(tree.exit_code == 2);
  CHECK(has(tree, "--algo tree with --fit-allreduce"));
}

TEST_CASE("fit inputs: a negative intercept refits the line through the origin, and says so") {
  TempDir dir;
  // Exactly on T = -50 us + S / 1000 B/us: no ring has a negative latency. Clamping the
  // intercept to 0 kept the slope, and reported that line's error (and warned of rows on no
  // line) for a line nobody fitted.
  const std::string path = dir.file("fit.jsonl");
  std::vector<double> x, y;
  {
    std::ofstream out(path);
    for (const double bytes : {1048576.0, 2097152.0, 4194304.0, 8388608.0}) {
      const double us = -50.0 + bytes / 1000.0;
      x.push_back(bytes);
      y.push_back(us);
      out << nlohmann::json{{"ranks", 2}, {"bytes", bytes}, {"time_us", us}}.dump() << "\n";
    }
  }
  const ProcessResult r = sim(model(
      {"--gpus-per-node", "2", "--fit-allreduce", path, "--fit-min-bytes", "1", "--json", "-"}));
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const auto j = nlohmann::json::parse(r.output.substr(r.output.find("\n{") + 1));
  // Least squares of the relative error with a = 0: b = sum(x/y) / sum((x/y)^2).
  double sr = 0, srr = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    sr += x[i] / y[i];
    srr += (x[i] / y[i]) * (x[i] / y[i]);
  }
  const double b = sr / srr;
  double max_error = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    max_error = nanoddp::test::worse(max_error, std::fabs(b * x[i] - y[i]) / y[i]);
  }
  const auto& file = j["inputs"]["files"][0];
  CHECK(file["through_origin"] == true);
  CHECK(file["max_error"].get<double>() == doctest::Approx(max_error));
  CHECK(j["fabric"]["intra_lat_us"].get<double>() == 0.0);
  // 2 ranks: B = 2(n-1)/n / b = 1 / b bytes/us.
  CHECK(j["fabric"]["intra_bw_gbs"].get<double>() == doctest::Approx(1.0 / b / 1000.0));
  CHECK(j["fabric"]["description"].get<std::string>().find(
            "(fitted through the origin: the free line's intercept was -50.0 us") !=
        std::string::npos);
}

TEST_CASE("fit inputs: a --sweep on a fit leaves the ring and tree columns empty, not the fit") {
  // A researcher's: with --fit-allreduce the sweep's "ring" and "tree" columns both showed the
  // fitted transport's efficiency, as if two algorithms had been modelled.
  TempDir dir;
  const std::string tcp = dir.file("ar_tcp.jsonl"), json = dir.file("s.json");
  bench(tcp, false);
  const ProcessResult r =
      sim({"--model", "mlp", "--hidden", "256", "--layers", "2", "--gpus-per-node", "2",
           "--fit-allreduce", tcp, "--sweep", "hidden=128,512", "--json", json});
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  CHECK(has(r, "(ring, tree: not modelled apart for a fitted transport"));
  std::ifstream in(json);
  const nlohmann::json j = nlohmann::json::parse(in);
  const auto& rows = j["parameter_sweep"]["rows"];
  REQUIRE(rows.size() == 2);
  for (const auto& row : rows) {
    CHECK(row["ring_efficiency"].is_null());
    CHECK(row["tree_efficiency"].is_null());
    CHECK(row["scaling_efficiency"].get<double>() > 0.0);
  }
  // On a named fabric the columns are the two algorithms, as before.
  const ProcessResult named = sim({"--model", "mlp", "--hidden", "256", "--layers", "2", "--nodes",
                                   "2", "--sweep", "hidden=128,512", "--json", json});
  REQUIRE_MESSAGE(named.exit_code == 0, named.output);
  CHECK(has(named, "(ring, tree: the efficiency with that algorithm forced)"));
  std::ifstream again(json);
  const nlohmann::json k = nlohmann::json::parse(again);
  for (const auto& row : k["parameter_sweep"]["rows"]) {
    CHECK(row["ring_efficiency"].get<double>() > 0.0);
    CHECK(row["tree_efficiency"].get<double>() > 0.0);
  }
}
