// The pipesched program. All logic lives in the cli library; see command.h.
#include <unistd.h>

#include <iostream>

#include "cli/command.h"

int main(int argc, char** argv) {
  return pipesched::cli::RunMain(argc, argv, std::cout, std::cerr, ::isatty(STDOUT_FILENO) != 0);
}
