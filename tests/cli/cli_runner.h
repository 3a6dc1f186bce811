// Runs the pipesched program in-process for the CLI tests: exit code and both streams.
#pragma once

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/reflection.h"
#include "cli/command.h"

namespace pipesched::cli::testing {

struct RunResult {
  int code;
  std::string out;
  std::string err;
};

// `args` without the program name; stdout is not a terminal.
inline RunResult RunCli(std::vector<std::string> args) {
  absl::FlagSaver saver;  // flags are process-global: each run starts from the defaults
  args.insert(args.begin(), "pipesched");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  std::ostringstream out, err;
  int code = RunMain(static_cast<int>(argv.size()), argv.data(), out, err, false);
  return {code, out.str(), err.str()};
}

// `base` then `more`, leaving out the flags of `base` that `more` gives again (a flag
// given twice is an error): a test's defaults with its own values on top.
inline std::vector<std::string> WithFlags(std::vector<std::string> base,
                                          const std::vector<std::string>& more) {
  auto name = [](const std::string& arg) { return arg.substr(0, arg.find('=')); };
  std::vector<std::string> out;
  for (std::string& b : base) {
    bool replaced = false;
    for (const std::string& m : more) {
      replaced |= b.rfind("--", 0) == 0 && name(m) == name(b);
    }
    if (!replaced) out.push_back(std::move(b));
  }
  out.insert(out.end(), more.begin(), more.end());
  return out;
}

// A path in $TMPDIR (or /tmp) starting with `prefix`.
inline std::string TempPath(const std::string& prefix, const std::string& name) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + prefix + name;
}

inline std::string Slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace pipesched::cli::testing
