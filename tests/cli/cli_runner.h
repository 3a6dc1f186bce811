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
