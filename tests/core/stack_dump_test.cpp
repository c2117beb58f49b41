// kill -QUIT prints every thread's stack and the process keeps running.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "core/stack_dump.h"

namespace tessera {
namespace {

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

TEST(StackDump, SigquitPrintsEveryThreadAndTheProcessGoesOn) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(fds[1], STDERR_FILENO);
    close(fds[0]);
    install_stack_dump_on_sigquit();
    std::thread worker([] {
      for (;;) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    });
    for (;;) pause();
  }
  close(fds[1]);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_EQ(kill(pid, SIGQUIT), 0);
  std::string out;
  char buf[4096];
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (out.find("=== end of stacks") == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    ssize_t n = read(fds[0], buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const bool alive = kill(pid, 0) == 0 && waitpid(pid, nullptr, WNOHANG) == 0;
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  close(fds[0]);
  EXPECT_NE(out.find("=== tessera: stacks of every thread"), std::string::npos) << out;
  EXPECT_NE(out.find("=== end of stacks"), std::string::npos) << out;
  EXPECT_GE(count(out, "--- thread "), 2u) << out;  // the main thread and the worker
  EXPECT_GE(count(out, "  #0 "), 2u) << out;
  EXPECT_TRUE(alive) << "the process must keep running after the dump";
}

}  // namespace
}  // namespace tessera
