// `kill -QUIT <pid>` prints every thread's stack to stderr and the process goes on (as the
// JVM does): a hung rank can be looked into where no debugger is installed. Each frame is
// printed as module+offset, which `addr2line -f -C -e <module> <offset>` turns into a function
// on a machine with the same binary.
#pragma once

namespace tessera {

// Installs the SIGQUIT handler (idempotent). Threads that block signals are skipped.
void install_stack_dump_on_sigquit();

}  // namespace tessera
