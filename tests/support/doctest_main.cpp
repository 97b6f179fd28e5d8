// The test programs' main: doctest's, plus one rule. ctest runs each test case as
// `--test-case=<name>`; a name that selects nothing (CMake cuts a name at ';') used to run zero
// test cases and pass. Here that is a failure.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

namespace {

int g_selected = -1;  // test cases that passed the filters in the last run

struct CountSelected : doctest::IReporter {
  explicit CountSelected(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats& stats) override {
    g_selected = static_cast<int>(stats.numTestCasesPassingFilters);
  }
  void test_case_start(const doctest::TestCaseData&) override {}
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};

REGISTER_LISTENER("count_selected", 1, CountSelected);

}  // namespace

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int result = context.run();
  if (context.shouldExit()) return result;  // --help, --list-test-cases, ...
  if (result == 0 && g_selected == 0) {
    std::fprintf(stderr,
                 "error: no test case matched the filters: nothing ran (ctest cannot select a "
                 "test whose name holds ';': rename it)\n");
    return 1;
  }
  return result;
}
