#include "bench/scripted_server.h"

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/http/status.hpp>

#include <chrono>
#include <deque>
#include <map>
#include <mutex>
#include <string_view>
#include <thread>
#include <vector>

namespace tessera::bench {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;
using nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

struct ScriptedServer::Impl {
  Impl(ResponseScript s, std::string key) : script(std::move(s)), api_key(std::move(key)), acceptor(io) {}
  ResponseScript script;
  std::string api_key;
  asio::io_context io;
  tcp::acceptor acceptor;
  std::vector<std::thread> threads;
  std::atomic<size_t> next_index{0};
  std::atomic<size_t> completion_requests{0};
  mutable std::mutex timings_mutex;
  std::vector<ServedTiming> timings;
  std::vector<std::map<std::string, std::string>> request_headers;  // under timings_mutex
  void accept();
};

namespace {

std::string lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

std::string status_text(int status) {
  const auto b = boost::beast::http::obsolete_reason(static_cast<boost::beast::http::status>(status));
  const std::string_view r(b.data(), b.size());
  return std::string(r == "<unknown-status>" ? std::string_view("Status") : r);
}

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(ScriptedServer::Impl& server, tcp::socket socket)
      : server_(server), socket_(std::move(socket)), timer_(socket_.get_executor()) {}

  void start() { read_request(); }

 private:
  void read_request() {
    asio::async_read_until(socket_, input_, "\r\n\r\n",
                           [self = shared_from_this()](error_code ec, size_t header_bytes) {
                             if (!ec) self->on_header(header_bytes);
                           });
  }

  void on_header(size_t header_bytes) {
    std::string header(asio::buffers_begin(input_.data()), asio::buffers_begin(input_.data()) + header_bytes);
    input_.consume(header_bytes);
    size_t line_end = header.find("\r\n");
    std::string request_line = header.substr(0, line_end);
    method_ = request_line.substr(0, request_line.find(' '));
    size_t path_start = request_line.find(' ') + 1;
    path_ = request_line.substr(path_start, request_line.find(' ', path_start) - path_start);
    size_t content_length = 0;
    authorization_.clear();
    std::map<std::string, std::string> fields;
    for (size_t pos = line_end + 2; pos < header.size();) {
      size_t end = header.find("\r\n", pos);
      std::string line = header.substr(pos, end - pos);
      pos = end + 2;
      size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string name = lower(line.substr(0, colon));
      std::string value = line.substr(line.find_first_not_of(' ', colon + 1));
      if (name == "content-length") content_length = std::stoul(value);
      if (name == "authorization") authorization_ = value;
      fields[name] = value;
    }
    {
      std::lock_guard<std::mutex> lock(server_.timings_mutex);
      server_.request_headers.push_back(std::move(fields));
    }
    size_t missing = content_length > input_.size() ? content_length - input_.size() : 0;
    asio::async_read(socket_, input_, asio::transfer_exactly(missing),
                     [self = shared_from_this(), content_length](error_code ec, size_t) {
                       if (ec) return;
                       std::string body(asio::buffers_begin(self->input_.data()),
                                        asio::buffers_begin(self->input_.data()) + content_length);
                       self->input_.consume(content_length);
                       self->handle(body);
                     });
  }

  void handle(const std::string& body) {
    if (!server_.api_key.empty() && authorization_ != "Bearer " + server_.api_key) {
      return send_simple(401, R"({"error":{"message":"invalid API key","type":"authentication_error"}})");
    }
    if (method_ == "GET" && path_ == "/v1/models") {
      return send_simple(
          200, json{{"object", "list"}, {"data", {{{"id", ScriptedServer::kModelId}, {"object", "model"}}}}}.dump());
    }
    bool chat = path_ == "/v1/chat/completions";
    if (method_ != "POST" || (!chat && path_ != "/v1/completions"))
      return send_simple(404, R"({"error":{"message":"no such route"}})");
    json request = json::parse(body, nullptr, false);
    if (request.is_discarded()) return send_simple(400, R"({"error":{"message":"body is not JSON"}})");
    ++server_.completion_requests;
    chat_ = chat;
    received_at_ = SteadyClock::now();
    response_ = server_.script(server_.next_index++, request);
    prompt_ = request.contains("messages") ? request["messages"][0].value("content", std::string())
                                           : request.value("prompt", std::string());
    if (response_.tokens < 0) response_.tokens = request.value("max_tokens", 16);
    stream_ = request.value("stream", false);
    if (response_.close_without_response) return close();
    if (response_.never_respond) return wait_for_client_close();
    if (response_.status != 200)
      return send_simple(response_.status,
                         json{{"error", {{"message", "scripted failure"}, {"code", response_.status}}}}.dump());
    if (!stream_ || response_.ignore_stream) return send_whole_response();
    start_stream();
  }

  std::string text_message(int index) const {
    std::string piece = "tok" + std::to_string(index) + " ";
    json message = {{"id", "cmpl-scripted"}, {"object", chat_ ? "chat.completion.chunk" : "text_completion"}};
    json choice = {{"index", 0}, {"finish_reason", nullptr}};
    if (chat_)
      choice["delta"] = {{"content", piece}};
    else
      choice["text"] = piece;
    message["choices"] = json::array({choice});
    return message.dump();
  }

  json usage() const {
    return {{"prompt_tokens", response_.prompt_tokens},
            {"completion_tokens", response_.tokens},
            {"total_tokens", response_.prompt_tokens + response_.tokens}};
  }

  void send_simple(int status, std::string body) {
    auto text = std::make_shared<std::string>(
        "HTTP/1.1 " + std::to_string(status) + " " + status_text(status) +
        "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
    asio::async_write(socket_, asio::buffer(*text), [self = shared_from_this(), text](error_code ec, size_t) {
      if (!ec) self->read_request();
    });
  }

  void send_whole_response() {
    auto at = received_at_ + seconds(response_.ttft_s + response_.token_interval_s * std::max(0, response_.tokens - 1));
    timer_.expires_at(at);
    timer_.async_wait([self = shared_from_this()](error_code ec) {
      if (ec) return;
      std::string content;
      for (int i = 0; i < self->response_.tokens; ++i) content += "tok" + std::to_string(i) + " ";
      json message = {{"id", "cmpl-scripted"}};
      json choice = {{"index", 0}, {"finish_reason", "length"}};
      if (self->chat_)
        choice["message"] = {{"role", "assistant"}, {"content", content}};
      else
        choice["text"] = content;
      message["choices"] = json::array({choice});
      if (self->response_.include_usage) message["usage"] = self->usage();
      self->timing_ = ServedTiming{};
      self->timing_.prompt = self->prompt_;
      self->timing_.first_text_s = self->timing_.last_byte_s = self->since_received();
      self->timing_.first_text_at = self->timing_.last_byte_at = SteadyClock::now();
      {
        std::lock_guard<std::mutex> lock(self->server_.timings_mutex);
        self->server_.timings.push_back(self->timing_);
      }
      self->send_simple(200, message.dump());
    });
  }

  static SteadyClock::duration seconds(double s) {
    return std::chrono::duration_cast<SteadyClock::duration>(std::chrono::duration<double>(s));
  }

  // Headers and a content-free role chunk go out at once (as vLLM does); text chunks follow
  // on the scripted schedule.
  void start_stream() {
    std::string head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n";
    head += response_.chunked ? "Transfer-Encoding: chunked\r\n\r\n" : "Connection: close\r\n\r\n";
    std::string role =
        chat_ ? R"({"id":"cmpl-scripted","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]})"
              : R"({"id":"cmpl-scripted","choices":[{"index":0,"text":""}]})";
    sent_tokens_ = 0;
    timing_ = ServedTiming{};
    timing_.prompt = prompt_;
    write_raw(head + frame("data: " + role + "\n\n"), [this] { schedule_next_token(); });
  }

  std::string frame(const std::string& payload) const {
    if (!response_.chunked) return payload;
    char size[16];
    std::snprintf(size, sizeof size, "%zx\r\n", payload.size());
    return size + payload + "\r\n";
  }

  void schedule_next_token() {
    if (sent_tokens_ == response_.drop_after_tokens) return close();
    if (sent_tokens_ == response_.tokens) return finish_stream();
    timer_.expires_at(received_at_ + seconds(response_.ttft_s + response_.token_interval_s * sent_tokens_));
    timer_.async_wait([self = shared_from_this()](error_code ec) {
      if (ec) return;
      self->note_text_write();
      std::string payload = "data: " + self->text_message(self->sent_tokens_) + "\n\n";
      if (self->response_.garbage_after_first_token && self->sent_tokens_ == 1) payload = "data: {not json\n\n";
      ++self->sent_tokens_;
      self->write_raw(self->frame(payload), [self] { self->schedule_next_token(); });
    });
  }

  void finish_stream() {
    std::string tail;
    json last = {{"id", "cmpl-scripted"}};
    last["choices"] = json::array({chat_ ? json{{"index", 0}, {"delta", json::object()}, {"finish_reason", "length"}}
                                         : json{{"index", 0}, {"text", ""}, {"finish_reason", "length"}}});
    tail += frame("data: " + last.dump() + "\n\n");
    if (response_.include_usage)
      tail += frame("data: " + json{{"id", "cmpl-scripted"}, {"choices", json::array()}, {"usage", usage()}}.dump() +
                    "\n\n");
    tail += frame("data: [DONE]\n\n");
    if (response_.chunked) tail += "0\r\n\r\n";
    timing_.last_byte_s = since_received();
    timing_.last_byte_at = SteadyClock::now();
    {
      std::lock_guard<std::mutex> lock(server_.timings_mutex);
      server_.timings.push_back(timing_);
    }
    write_raw(tail, [this] {
      if (response_.chunked)
        read_request();
      else
        close();
    });
  }

  double since_received() const { return std::chrono::duration<double>(SteadyClock::now() - received_at_).count(); }

  void note_text_write() {
    SteadyClock::time_point at = SteadyClock::now();
    double now = std::chrono::duration<double>(at - received_at_).count();
    if (timing_.first_text_s < 0) {
      timing_.first_text_s = now;
      timing_.first_text_at = at;
    } else {
      timing_.text_gaps_s.push_back(now - last_text_s_);
    }
    timing_.text_at.push_back(at);
    last_text_s_ = now;
  }

  template <typename Next>
  void write_raw(std::string bytes, Next next) {
    auto text = std::make_shared<std::string>(std::move(bytes));
    asio::async_write(socket_, asio::buffer(*text), [self = shared_from_this(), text, next](error_code ec, size_t) {
      if (!ec) next();
    });
  }

  // Keeps the connection open and silent until the client gives up and closes it.
  void wait_for_client_close() {
    socket_.async_read_some(asio::buffer(discard_), [self = shared_from_this()](error_code ec, size_t) {
      if (!ec) self->wait_for_client_close();
    });
  }

  void close() {
    error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
  }

  ScriptedServer::Impl& server_;
  tcp::socket socket_;
  asio::steady_timer timer_;
  asio::streambuf input_;
  std::string method_, path_, authorization_, prompt_;
  ScriptedResponse response_;
  SteadyClock::time_point received_at_;
  bool chat_ = true;
  bool stream_ = true;
  int sent_tokens_ = 0;
  ServedTiming timing_;
  double last_text_s_ = 0;
  char discard_[256];
};

}  // namespace

void ScriptedServer::Impl::accept() {
  acceptor.async_accept([this](error_code ec, tcp::socket socket) {
    if (ec) return;
    error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    std::make_shared<Session>(*this, std::move(socket))->start();
    accept();
  });
}

ScriptedServer::ScriptedServer(ResponseScript script, int threads, std::string required_api_key)
    : impl_(std::make_unique<Impl>(std::move(script), std::move(required_api_key))) {
  tcp::endpoint endpoint(asio::ip::make_address("127.0.0.1"), 0);
  impl_->acceptor.open(endpoint.protocol());
  impl_->acceptor.set_option(tcp::acceptor::reuse_address(true));
  impl_->acceptor.bind(endpoint);
  impl_->acceptor.listen(asio::socket_base::max_listen_connections);
  impl_->accept();
  for (int i = 0; i < std::max(1, threads); ++i) impl_->threads.emplace_back([this] { impl_->io.run(); });
}

ScriptedServer::~ScriptedServer() {
  impl_->io.stop();
  for (std::thread& thread : impl_->threads) thread.join();
}

int ScriptedServer::port() const { return impl_->acceptor.local_endpoint().port(); }
size_t ScriptedServer::completion_requests() const { return impl_->completion_requests; }

std::vector<ServedTiming> ScriptedServer::served_timings() const {
  std::lock_guard<std::mutex> lock(impl_->timings_mutex);
  return impl_->timings;
}

std::vector<std::map<std::string, std::string>> ScriptedServer::request_headers() const {
  std::lock_guard<std::mutex> lock(impl_->timings_mutex);
  return impl_->request_headers;
}

}  // namespace tessera::bench
