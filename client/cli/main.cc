// flce-client: see `flce-client --help`.
#include <unistd.h>

#include <iostream>
#include <string>
#include <vector>

#include "client/cli/cli_main.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  return flce::cli::RunCli(args, std::cout, std::cerr, isatty(STDERR_FILENO) == 1);
}
