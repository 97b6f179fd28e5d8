#pragma once
// How nanoddp's executables (apps/ and benchmarks/) parse their command line with CLI11, in
// one place: --help prints the usage and exits 0; any other parse error prints
// "<program>: error: <what>" and a hint on stderr and exits 2. (CLI11's own exit codes, 105 to
// 109, mean nothing to a shell script or a launcher's summary; 2 is the usage-error convention.)
//
// Numbers are read strictly (see strict_numbers below): CLI11 itself reads "nan" into a float
// flag (and NaN passes every CLI::Range), "-1" into an unsigned one (as 2^64-1) and clamps an
// integer past 64 bits, so a typo would train with a value nobody asked for.
//
// Header-only: CLI11 is a dependency of the executables, not of the library.

#include <CLI/CLI.hpp>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "nanoddp/nn/file_io.h"

namespace nanoddp::cli {

namespace detail {

// An integer written in decimal: an optional '-' (signed flags only), then digits without a
// leading zero (CLI11 would read "010" as octal 8 and "0x10" as hex), fitting 64 bits. Returns
// the problem, or "" when the text is fine. (A narrower flag's range is checked by CLI11 after.)
inline std::string check_integer(const std::string& text, bool is_signed) {
  const std::string digits = !text.empty() && text[0] == '-' ? text.substr(1) : text;
  const bool decimal =
      !digits.empty() && digits.find_first_not_of("0123456789") == std::string::npos;
  if (!decimal) {
    return "'" + text + "' is not " + (is_signed ? "an" : "a non-negative") +
           " integer written in decimal";
  }
  if (digits.size() > 1 && digits[0] == '0') {
    return "'" + text + "' has a leading zero (it would be read as octal): write it without";
  }
  if (!is_signed && text[0] == '-') return "'" + text + "' is negative; it must be 0 or more";
  std::int64_t i = 0;
  std::uint64_t u = 0;
  const char* end = text.data() + text.size();
  const auto result =
      is_signed ? std::from_chars(text.data(), end, i) : std::from_chars(text.data(), end, u);
  if (result.ec != std::errc() || result.ptr != end) {
    // Not "from -9223372036854775808 to ...": the flag's own range is narrower, and naming the
    // 64-bit one suggested that a negative count would pass (an outside tester's).
    return "'" + text + "' is out of range (" +
           (is_signed ? std::string("it does not fit in 64 bits")
                      : "at most " + std::to_string(UINT64_MAX)) +
           ")";
  }
  return {};
}

// A signed decimal integer (check_integer's rules) into `value`; returns the problem, or "".
// For values read after parsing (a list flag's items): the range is the caller's to check.
inline std::string read_integer(const std::string& text, std::int64_t& value) {
  if (std::string problem = check_integer(text, true); !problem.empty()) return problem;
  std::from_chars(text.data(), text.data() + text.size(), value);
  return "";
}

// A number written in decimal ("0.5", "-3", "1e-4") whose magnitude is 0 or fits a 32-bit
// float. strtod alone would also take "nan", "inf" (which pass every CLI::Range check) and hex
// ("0x10"); and a flag stored as a float turns 3.5e38 into inf and 1e-300 into 0 after every
// check here has passed. No flag of these programs needs a number outside float's range, so one
// rule serves the float and the double flags alike.
inline std::string check_finite(const std::string& text) {
  std::size_t i = text.size() > 0 && (text[0] == '-' || text[0] == '+') ? 1 : 0;
  const auto digits = [&] {
    const std::size_t start = i;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
    return i - start;
  };
  std::size_t mantissa = digits();
  if (i < text.size() && text[i] == '.') {
    ++i;
    mantissa += digits();
  }
  bool decimal = mantissa > 0;
  if (decimal && i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    if (i < text.size() && (text[i] == '-' || text[i] == '+')) ++i;
    decimal = digits() > 0;
  }
  if (!decimal || i != text.size()) {
    return "'" + text + "' is not a number written in decimal (like 0.5, -3 or 1e-4)";
  }
  const double magnitude = std::fabs(std::strtod(text.c_str(), nullptr));
  if (!std::isfinite(magnitude) || magnitude > 3.4e38 || (magnitude != 0 && magnitude < 1.2e-38)) {
    return "'" + text + "' is out of range (0, or a magnitude from 1.2e-38 to 3.4e38)";
  }
  return {};
}

}  // namespace detail

// Puts a strict check in front of every numeric option of `app` (by the type CLI11 recorded:
// INT, UINT or FLOAT), so that no program can forget one: see the top of this file.
inline void strict_numbers(CLI::App& app) {
  for (CLI::Option* option : app.get_options()) {
    const std::string full = option->get_type_name();
    const std::string type = full.substr(0, full.find(':'));
    if (type == "INT" || type == "UINT") {
      const bool is_signed = type == "INT";
      option->transform(CLI::Validator(
          [is_signed](std::string& text) { return detail::check_integer(text, is_signed); }, ""));
    } else if (type == "FLOAT") {
      option->transform(
          CLI::Validator([](std::string& text) { return detail::check_finite(text); }, ""));
    }
  }
}

namespace detail {

// A bound as CLI11 prints it (std::to_string: "1.010000", "1000000.000000") without the
// trailing zeros: "1.01", "1000000".
inline std::string plain_number(std::string text) {
  if (text.find('.') == std::string::npos) return text;
  while (!text.empty() && text.back() == '0') text.pop_back();
  if (!text.empty() && text.back() == '.') text.pop_back();
  return text;
}

// CLI::Range's words ("Value 0 not in range 0.000000 to 1797...", 309 digits, for
// CLI::PositiveNumber) as a rule: "0 is out of range: it must be more than 0". PositiveNumber
// and NonNegativeNumber both print their lower bound as "0.000000": a 0 refused is the
// positive one's, a negative value breaks both ("must not be negative" is true of either).
inline std::string plain_range(const std::string& what) {
  const std::string value_word = "Value ", range_word = " not in range ", to_word = " to ";
  const auto v = what.find(value_word);
  const auto r = what.find(range_word, v == std::string::npos ? 0 : v);
  if (v == std::string::npos || r == std::string::npos) return what;
  const auto t = what.find(to_word, r + range_word.size());
  if (t == std::string::npos) return what;
  const std::string value = what.substr(v + value_word.size(), r - v - value_word.size());
  const std::string low = what.substr(r + range_word.size(), t - r - range_word.size());
  const std::string high = what.substr(t + to_word.size());
  const double low_v = std::strtod(low.c_str(), nullptr);
  const double high_v = std::strtod(high.c_str(), nullptr);
  std::string rule;
  if (high_v >= 1e300 && low_v == 0.0) {  // PositiveNumber or NonNegativeNumber
    rule = value == "0" || std::strtod(value.c_str(), nullptr) == 0.0 ? "must be more than 0"
                                                                      : "must not be negative";
  } else if (high_v >= 1e300) {
    rule = "must be at least " + plain_number(low);
  } else {
    rule = "must be from " + plain_number(low) + " to " + plain_number(high);
  }
  return what.substr(0, v) + "'" + value + "' is out of range: it " + rule;
}

// CLI11's words for a flag given twice ("--zero: At Most 1 required but received 2") say how
// many values it counted, not what to do; a range's bounds are put as a rule (plain_range);
// anything else is kept as CLI11 says it.
inline std::string plain_words(const std::string& what) {
  const std::string repeated = ": At Most 1 required but received ";
  const auto at = what.find(repeated);
  if (at == std::string::npos) return plain_range(what);
  return what.substr(0, at) + " is given " + what.substr(at + repeated.size()) +
         " times: give it once (a later value does not replace an earlier one)";
}

}  // namespace detail

// Parses argv into `app`. Returns nullopt when the program should go on; otherwise the exit
// code to return now (0 after --help, 2 after a bad flag or value).
// `problem`, when given, receives the message of a parse error (nanoddp-train tells the other
// ranks of it).
inline std::optional<int> parse(CLI::App& app, int argc, const char* const* argv,
                                const char* program, std::string* problem = nullptr) {
  strict_numbers(app);
  try {
    // "--name=" with nothing after the '=': CLI11 takes the *next* argument as its value, so
    // "--json= --vs-raw" wrote the results to a file named "--vs-raw" and dropped the flag
    // (an outside tester's). Only this program's own flags: a launcher's worker command is the
    // worker's to parse.
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      if (arg == "--") break;
      if (arg.size() > 3 && arg.rfind("--", 0) == 0 && arg.find('=') == arg.size() - 1 &&
          app.get_option_no_throw(arg.substr(0, arg.size() - 1)) != nullptr) {
        throw CLI::ParseError(
            arg + ": no value after the '='; give one (" + arg + "VALUE), or leave the flag out",
            CLI::ExitCodes::ArgumentMismatch);
      }
    }
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    if (problem != nullptr) *problem = detail::plain_words(e.what());
    std::cerr << program << ": error: " << detail::plain_words(e.what()) << "\n"
              << "Run '" << program << " --help' for the list of flags.\n";
    return 2;
  }
  return std::nullopt;
}

// For a path flag: "" (an unset shell variable in `--metrics $OUT`, say) would otherwise read as
// "not given" and the output would silently not be written.
inline CLI::Validator non_empty_path(const char* what = "a file name") {
  const std::string problem =
      std::string("an empty path; give ") + what + ", or leave the flag out";
  return CLI::Validator(
      [problem](std::string& text) { return text.empty() ? problem : std::string(); }, "");
}

// The items of a list flag ("--sizes 128,256"), into `items`; returns the problem, naming the
// flag, or "". An empty item (a doubled or a trailing comma) is a typo, not a value to drop.
inline std::string split_list(const std::string& flag, const std::string& text,
                              std::vector<std::string>& items) {
  items.clear();
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = text.find(',', start);
    items.push_back(text.substr(start, comma == std::string::npos ? comma : comma - start));
    if (items.back().empty()) {
      return flag + " '" + text + "': empty value in the list (expected e.g. " + flag + " 1,2,4)";
    }
    if (comma == std::string::npos) return "";
    start = comma + 1;
  }
}

// Keeps each value's first occurrence: a value given twice is measured once. Returns the note
// that says so, or "".
template <typename T>
std::string deduplicate(const std::string& flag, const std::string& text, std::vector<T>& values) {
  std::vector<T> kept;
  bool repeated = false;
  // Indexes, not find(): std::vector<bool> has no references to compare through.
  for (std::size_t i = 0; i < values.size(); ++i) {
    bool seen = false;
    for (std::size_t j = 0; j < kept.size(); ++j) seen = seen || kept[j] == values[i];
    if (seen) {
      repeated = true;
    } else {
      kept.push_back(values[i]);
    }
  }
  values = std::move(kept);
  return repeated ? flag + " " + text +
                        ": a value is given more than once; each point runs once (use --repeats "
                        "N to measure a point again)"
                  : "";
}

// For checks after parsing: prints "<program>: error: <problem>" and returns 2.
inline int usage_error(const char* program, const std::string& problem) {
  std::cerr << program << ": error: " << problem << "\n";
  return 2;
}

// A program's main: whatever `run` throws (an allocation that fails, a CUDA error) is said as
// "<program>: error: ..." and the exit code is 1, never std::terminate (exit 134).
template <typename Run>
int run_reporting_errors(const char* program, Run&& run) {
  try {
    return run();
  } catch (const std::exception& e) {
    // Escaped: a message may quote a file's text (nn::escape_controls).
    std::cerr << program << ": error: " << nn::escape_controls(e.what(), true) << "\n";
    return 1;
  }
}

}  // namespace nanoddp::cli
