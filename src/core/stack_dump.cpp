#include "core/stack_dump.h"

#include <dirent.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace tessera {

namespace {

// A real-time signal no library of ours uses (SIGRTMIN is a libc function, not a constant).
int dump_signal() { return SIGRTMIN + 3; }
std::atomic<int> g_pending{0};

// Async-signal-safe formatting: no stdio, no allocation.
void put(const char* s) { [[maybe_unused]] ssize_t n = write(STDERR_FILENO, s, std::strlen(s)); }
void put_hex(uintptr_t v) {
  char buf[2 + 16 + 1];
  int i = sizeof buf - 1;
  buf[i] = 0;
  do {
    buf[--i] = "0123456789abcdef"[v & 15];
    v >>= 4;
  } while (v && i > 2);
  buf[--i] = 'x';
  buf[--i] = '0';
  put(buf + i);
}
void put_dec(long v) {
  char buf[24];
  int i = sizeof buf - 1;
  buf[i] = 0;
  do {
    buf[--i] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v && i > 0);
  put(buf + i);
}

// One thread's stack (runs on that thread). backtrace() is not formally async-signal-safe,
// but its first call is made at install time so that libgcc is loaded and it does not allocate.
void dump_this_thread(int) {
  void* frames[64];
  const int n = backtrace(frames, 64);
  put("--- thread ");
  put_dec(static_cast<long>(syscall(SYS_gettid)));
  put("\n");
  for (int i = 1; i < n; ++i) {  // 0 is this handler
    Dl_info info{};
    put("  #");
    put_dec(i - 1);
    put(" ");
    if (dladdr(frames[i], &info) && info.dli_fname) {
      const char* base = std::strrchr(info.dli_fname, '/');
      put(base ? base + 1 : info.dli_fname);
      put("+");
      put_hex(reinterpret_cast<uintptr_t>(frames[i]) - reinterpret_cast<uintptr_t>(info.dli_fbase));
      if (info.dli_sname) {
        put(" ");
        put(info.dli_sname);
      }
    } else {
      put_hex(reinterpret_cast<uintptr_t>(frames[i]));
    }
    put("\n");
  }
  g_pending.fetch_sub(1);
}

void on_sigquit(int) {
  put("=== tessera: stacks of every thread (SIGQUIT); frames as module+offset for addr2line -f -C -e MODULE OFFSET\n");
  DIR* d = opendir("/proc/self/task");
  if (!d) return;
  const pid_t pid = getpid();
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    const pid_t tid = static_cast<pid_t>(std::atol(e->d_name));
    g_pending.fetch_add(1);
    if (syscall(SYS_tgkill, pid, tid, dump_signal()) != 0) {
      g_pending.fetch_sub(1);
      continue;
    }
    // One at a time, so the stacks do not interleave (at most ~100 ms per thread).
    for (int i = 0; i < 100 && g_pending.load() > 0; ++i) usleep(1000);
    g_pending.store(0);
  }
  closedir(d);
  put("=== end of stacks\n");
}

}  // namespace

void install_stack_dump_on_sigquit() {
  static std::atomic<bool> done{false};
  if (done.exchange(true)) return;
  void* warm[4];
  backtrace(warm, 4);  // loads the unwinder now, not inside a handler
  struct sigaction sa {};
  sa.sa_handler = dump_this_thread;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(dump_signal(), &sa, nullptr);
  struct sigaction q {};
  q.sa_handler = on_sigquit;
  sigemptyset(&q.sa_mask);
  q.sa_flags = SA_RESTART;
  sigaction(SIGQUIT, &q, nullptr);
}

}  // namespace tessera
