#include "distributed/connect.h"

#include <algorithm>
#include <thread>

#include "core/error.h"
#include "distributed/auth.h"

namespace tessera::dist {

Socket connect_to_head(const HeadAddress& head, Deadline deadline, std::chrono::milliseconds handshake_timeout) {
  Clock::time_point start = Clock::now();
  std::string last_error;
  auto pause = std::chrono::milliseconds(20);
  for (int attempt = 0; attempt < 100000; ++attempt) {
    Socket s;
    try {
      Deadline attempt_deadline = std::min(deadline, deadline_after(std::chrono::seconds(5)));
      s = connect_tcp(head.host, head.port, attempt_deadline, head.source_ip);
    } catch (const Error& e) {
      last_error = e.what();
      if (Clock::now() + pause >= deadline) break;
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(500));
      continue;
    }
    authenticate_to_server(s, head.token, deadline_after(handshake_timeout));
    return s;
  }
  auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
  fail(ErrorKind::kNetwork,
       "could not reach the head at {}:{} within {:.1f} s ({}); check --master-addr and --master-port, that the head "
       "is running, and that no firewall blocks the port",
       head.host, head.port, waited / 1000.0, last_error);
}

}  // namespace tessera::dist
