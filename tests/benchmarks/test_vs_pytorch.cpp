// benchmarks/vs-pytorch.sh's refusals. The comparison itself runs in
// tests/benchmarks/vs_pytorch.sh, which needs PyTorch and is Skipped without it.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "support/subprocess.h"

using namespace nanoddp::testing;

namespace {

ProcessResult vs_pytorch(const std::vector<std::string>& args, const std::string& python = "") {
  const char* source = std::getenv("NANODDP_SOURCE_DIR");
  const char* bin_dir = std::getenv("NANODDP_BIN_DIR");
  REQUIRE_MESSAGE((source != nullptr && bin_dir != nullptr),
                  "NANODDP_SOURCE_DIR / NANODDP_BIN_DIR are not set (run the tests with ctest)");
  std::vector<std::string> argv = {std::string(source) + "/benchmarks/vs-pytorch.sh"};
  argv.insert(argv.end(), args.begin(), args.end());
  ProcessOptions options;
  options.timeout = std::chrono::seconds(60);
  options.env["NANODDP_BIN_DIR"] = bin_dir;
  if (!python.empty()) options.env["NANODDP_PYTHON"] = python;
  return run_process(argv, options);
}

}  // namespace

TEST_CASE("vs-pytorch.sh: a bad argument is refused with exit code 2") {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--hidden", "wide"}, std::vector<std::string>{"--frobnicate"},
        std::vector<std::string>{"--steps", "2"}, std::vector<std::string>{"--ranks", "1,,2"},
        std::vector<std::string>{"--ranks", "0"}, std::vector<std::string>{"--linears", "0"},
        // A flag without its value (bash's "unbound variable" before), given twice (the last
        // value won silently), an empty --json (nothing was written after minutes).
        std::vector<std::string>{"--steps", "10", "--hidden"},
        std::vector<std::string>{"--hidden", "32", "--hidden", "64"},
        std::vector<std::string>{"--json", ""},
        // A second tester's: a repeated --bf16 ran, and a huge batch reached PyTorch.
        std::vector<std::string>{"--bf16", "--bf16"},
        std::vector<std::string>{"--batch", "99999999999999999999"}}) {
    const ProcessResult r = vs_pytorch(args);
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find("vs-pytorch.sh:") != std::string::npos);
  }
}

TEST_CASE("vs-pytorch.sh: without PyTorch, exit code 3 and the command that installs it") {
  // A real interpreter that cannot see PyTorch: Debian's python3 with site-packages off (-S),
  // wrapped in a script because NANODDP_PYTHON names one executable.
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("nanoddp-vs-pytorch-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::filesystem::path python = dir / "python-without-site";
  {
    std::ofstream out(python);
    out << "#!/bin/sh\nexec python3 -S \"$@\"\n";
  }
  std::filesystem::permissions(python, std::filesystem::perms::owner_all);
  const ProcessResult r = vs_pytorch({"--steps", "5"}, python.string());
  std::filesystem::remove_all(dir);
  INFO(r.output);
  CHECK(r.exit_code == 3);
  CHECK(r.output.find("PyTorch is not importable by " + python.string()) != std::string::npos);
  CHECK(r.output.find("apt-get install -y python3-torch") != std::string::npos);
}

TEST_CASE("vs-pytorch.sh: PyTorch on the reference BLAS is refused, exit code 3, with the fix") {
  // Debian's torch calls whichever libblas.so.3 comes first: the reference (netlib) BLAS, more
  // than 10x slower than OpenBLAS, is put first by LD_LIBRARY_PATH, as on a machine without
  // OpenBLAS; and (an outside tester's bypass of a check by name) a copy of it in a folder of
  // another name. Skipped where PyTorch or the reference BLAS is not installed.
  const char* reference_blas = "/usr/lib/x86_64-linux-gnu/blas/libblas.so.3";
  if (!std::filesystem::exists(reference_blas) ||
      run_process({"/usr/bin/python3", "-c", "import torch"}).exit_code != 0) {
    MESSAGE("skipped: needs Debian's python3-torch and libblas3");
    return;
  }
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("nanoddp-vs-blas-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir / "renamed");
  std::filesystem::copy_file(std::filesystem::canonical(reference_blas),
                             dir / "renamed" / "libblas.so.3");
  for (const std::string& folder :
       {std::string("/usr/lib/x86_64-linux-gnu/blas"), (dir / "renamed").string()}) {
    INFO("LD_LIBRARY_PATH=", folder);
    const std::filesystem::path python = dir / "python-on-reference-blas";
    {
      std::ofstream out(python);
      out << "#!/bin/sh\nLD_LIBRARY_PATH=" << folder << " exec /usr/bin/python3 \"$@\"\n";
    }
    std::filesystem::permissions(python, std::filesystem::perms::owner_all);
    const ProcessResult r = vs_pytorch({"--steps", "5"}, python.string());
    INFO(r.output);
    CHECK(r.exit_code == 3);
    CHECK(r.output.find("PyTorch's GEMMs run at") != std::string::npos);
    CHECK(r.output.find("apt-get install -y libopenblas0-pthread") != std::string::npos);
  }
  std::filesystem::remove_all(dir);
}
