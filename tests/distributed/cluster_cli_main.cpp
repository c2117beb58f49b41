// The `tessera cluster` verb (src/cli/cmd_cluster.cpp) linked alone, so that the tests can
// run it without building the whole server binary.
#include "cli/verbs.h"
#include "core/error.h"
#include "core/logging.h"

#include <cstdio>

int main(int argc, char** argv) {
  tessera::init_logging("warning");
  try {
    return tessera::cli::run_cluster(argc - 1, argv + 1);
  } catch (const tessera::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
