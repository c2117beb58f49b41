// Incremental parser for Server-Sent Events (text/event-stream), fed bytes as they arrive.
// Network reads split the stream anywhere (inside a line, between \r and \n, inside a UTF-8
// sequence), so the parser keeps the unfinished line and emits an event only at its blank line.
#pragma once
#include <functional>
#include <string>
#include <string_view>

namespace tessera::bench {

struct SseEvent {
  std::string event;  // the "event:" field; empty means the default "message"
  std::string data;   // "data:" lines joined with '\n'
};

class SseParser {
 public:
  using EventHandler = std::function<void(const SseEvent&)>;
  explicit SseParser(EventHandler on_event) : on_event_(std::move(on_event)) {}

  // Consumes any number of bytes; calls the handler for each event completed by them.
  void feed(std::string_view bytes);
  // End of stream: an event not closed by a blank line is dispatched anyway (servers that
  // omit the final blank line are common enough to tolerate).
  void finish();
  // Bytes received that do not belong to a complete line yet.

 private:
  void handle_line(std::string_view line);
  void dispatch();

  EventHandler on_event_;
  std::string line_;
  SseEvent current_;
  bool has_data_ = false;
  bool last_was_cr_ = false;  // a '\r' ended the previous chunk; a leading '\n' belongs to it
};

}  // namespace tessera::bench
