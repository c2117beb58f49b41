// `tessera bench` without the other verbs: argv[1..] are the bench flags.
#include <cstdio>

#include "cli/flag_parsing.h"
#include "cli/verbs.h"
#include "core/error.h"
#include "core/logging.h"

int main(int argc, char** argv) {
  tessera::init_logging();
  try {
    return tessera::cli::run_bench(argc, argv);
  } catch (const tessera::cli::FlagError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;  // a mistake on the command line, as `tessera bench` (main.cpp) answers it
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
