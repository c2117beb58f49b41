// Runs the load generator against the scripted loopback server and checks that what it measures
// equals what the script did: delays, token counts, failures by kind, percentiles.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "bench/load_runner.h"
#include "bench/metrics.h"
#include "bench/scripted_server.h"
#include "bench/server_probe.h"
#include "core/error.h"

namespace tessera::bench {
namespace {

// Within 2% of the truth, the acceptance bar of issue 6. The truth of each request is what the
// server actually did (ServedTiming on the same steady clock) seen from the moment the client
// sent it: on a busy 2-core machine server timers fire late and accepts queue, which is real
// latency but not the script's. A looser check confirms that the server did follow the script.
#define EXPECT_WITHIN_2_PERCENT(measured, truth) EXPECT_NEAR((measured), (truth), std::abs(truth) * 0.02)
#define EXPECT_FOLLOWED_SCRIPT(actual, scripted) EXPECT_NEAR((actual), (scripted), std::abs(scripted) * 0.15)

struct Truth {
  Summary ttft_ms, e2el_ms, itl_ms, tpot_ms;  // from the client's send to the server's writes
  Summary served_ttft_ms, served_e2el_ms;     // from the server's receipt: the script's own terms
  double last_byte_s = 0;                     // from the level's start to the server's last write
};

double ms_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

Truth truth_of(const LevelResult& result, const std::vector<PromptSpec>& prompts, const ScriptedServer& server) {
  std::map<std::string, ServedTiming> by_prompt;
  for (ServedTiming& timing : server.served_timings()) by_prompt[timing.prompt] = std::move(timing);
  std::vector<double> ttft, e2el, itl, tpot, served_ttft, served_e2el;
  double last_byte_s = 0;
  for (const RequestRecord& record : result.records) {
    if (!record.success) continue;
    auto found = by_prompt.find(prompts[record.prompt_index].prompt);
    if (found == by_prompt.end()) continue;
    const ServedTiming& t = found->second;
    Clock::time_point sent =
        result.started_at + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(record.start_s));
    ttft.push_back(ms_between(sent, t.first_text_at));
    e2el.push_back(ms_between(sent, t.last_byte_at));
    last_byte_s = std::max(last_byte_s, ms_between(result.started_at, t.last_byte_at) / 1000);
    for (size_t i = 1; i < t.text_at.size(); ++i) itl.push_back(ms_between(t.text_at[i - 1], t.text_at[i]));
    if (t.text_at.size() > 1)
      tpot.push_back(ms_between(t.first_text_at, t.last_byte_at) / static_cast<double>(t.text_at.size() - 1));
    served_ttft.push_back(t.first_text_s * 1000);
    served_e2el.push_back(t.last_byte_s * 1000);
  }
  return {summarize(ttft),        summarize(e2el),        summarize(itl), summarize(tpot),
          summarize(served_ttft), summarize(served_e2el), last_byte_s};
}

std::vector<PromptSpec> numbered_prompts(const std::string& stem, int max_tokens, size_t count) {
  std::vector<PromptSpec> prompts;
  for (size_t i = 0; i < count; ++i) prompts.push_back({stem + "#" + std::to_string(i), max_tokens, 1});
  return prompts;
}

struct Harness {
  explicit Harness(ResponseScript script) : server(std::move(script)) {}

  LevelResult run(const std::vector<PromptSpec>& prompts, int concurrency, RequestSettings settings = {},
                  ArrivalProcess arrivals = {}) {
    boost::asio::io_context io;
    HttpClient client(io, parse_base_url(server.base_url()), "");
    if (settings.generation.model.empty()) settings.generation.model = ScriptedServer::kModelId;
    LevelConfig config{"test", concurrency, arrivals, 5};
    return run_level(io, client, prompts, config, settings, nullptr);
  }

  ScriptedServer server;
};

std::string user_content(const nlohmann::json& body) {
  if (body.contains("messages")) return body["messages"][0]["content"].get<std::string>();
  return body.value("prompt", std::string());
}

TEST(ScriptedLoad, StreamingTimingMatchesTheScript) {
  // 16 requests, 8 at a time: two waves of TTFT 300 ms then 15 gaps of 30 ms (E2E 750 ms).
  // Delays are hundreds of ms so that 2% stays above the scheduling noise of a busy 2-core box.
  Harness h([](size_t, const nlohmann::json&) {
    ScriptedResponse r;
    r.ttft_s = 0.300;
    r.token_interval_s = 0.030;
    r.tokens = 16;
    r.prompt_tokens = 11;
    return r;
  });
  std::vector<PromptSpec> prompts = numbered_prompts("hi", 16, 16);
  LevelResult result = h.run(prompts, 8);
  LevelMetrics m = compute_level_metrics(result, parse_slo_targets({"ttft:400", "tpot:25"}));
  EXPECT_EQ(m.completed, 16u);
  EXPECT_EQ(m.failed, 0u);
  EXPECT_EQ(m.max_in_flight, 8u);
  EXPECT_EQ(m.prompt_tokens, 16 * 11);
  EXPECT_EQ(m.completion_tokens, 16 * 16);
  EXPECT_EQ(m.requests_without_usage, 0u);
  Truth truth = truth_of(result, prompts, h.server);
  EXPECT_FOLLOWED_SCRIPT(truth.served_ttft_ms.mean, 300.0);
  EXPECT_FOLLOWED_SCRIPT(truth.itl_ms.mean, 30.0);
  EXPECT_FOLLOWED_SCRIPT(truth.served_e2el_ms.mean, 750.0);
  EXPECT_WITHIN_2_PERCENT(m.ttft_ms.mean, truth.ttft_ms.mean);
  EXPECT_WITHIN_2_PERCENT(m.ttft_ms.median, truth.ttft_ms.median);
  EXPECT_WITHIN_2_PERCENT(m.ttft_ms.p99, truth.ttft_ms.p99);
  EXPECT_WITHIN_2_PERCENT(m.itl_ms.mean, truth.itl_ms.mean);
  EXPECT_WITHIN_2_PERCENT(m.itl_ms.median, truth.itl_ms.median);
  EXPECT_EQ(m.itl_ms.count, 16u * 15u);
  EXPECT_WITHIN_2_PERCENT(m.tpot_ms.mean, truth.tpot_ms.mean);
  EXPECT_WITHIN_2_PERCENT(m.tpot_ms.p95, truth.tpot_ms.p95);
  EXPECT_WITHIN_2_PERCENT(m.e2el_ms.mean, truth.e2el_ms.mean);
  EXPECT_WITHIN_2_PERCENT(m.e2el_ms.p95, truth.e2el_ms.p95);
  EXPECT_WITHIN_2_PERCENT(m.e2el_ms.max, truth.e2el_ms.max);
  // Each of the 8 slots ran two requests back to back; the run lasts as long as the slowest slot.
  EXPECT_GE(m.duration_s * 1000, 2 * truth.e2el_ms.min);
  EXPECT_GE(m.duration_s, truth.last_byte_s);
  EXPECT_WITHIN_2_PERCENT(m.duration_s, truth.last_byte_s);
  EXPECT_DOUBLE_EQ(m.request_throughput, 16 / m.duration_s);
  EXPECT_DOUBLE_EQ(m.completion_token_throughput, 256 / m.duration_s);
  EXPECT_DOUBLE_EQ(m.total_token_throughput, (256 + 176) / m.duration_s);
  // TTFT 300 <= 400 but TPOT 30 > 25: nobody meets both SLOs.
  EXPECT_EQ(m.good_requests, 0u);
  LevelMetrics lenient = compute_level_metrics(result, parse_slo_targets({"ttft:400", "tpot:35"}));
  EXPECT_EQ(lenient.good_requests, 16u);
  EXPECT_DOUBLE_EQ(lenient.goodput, 16 / m.duration_s);
  EXPECT_EQ(m.connections_opened, 8u);  // the second wave reused keep-alive connections
}

TEST(ScriptedLoad, PercentilesOfSpreadLatencies) {
  // Request i (in arrival order) waits 100 + 10 i ms for its first token, then one more token
  // 20 ms later; all 40 run at once, so the truth is the spread itself.
  Harness h([](size_t index, const nlohmann::json&) {
    ScriptedResponse r;
    r.ttft_s = 0.100 + 0.010 * static_cast<double>(index);
    r.token_interval_s = 0.020;
    r.tokens = 2;
    return r;
  });
  std::vector<PromptSpec> prompts = numbered_prompts("hi", 2, 40);
  LevelResult result = h.run(prompts, 0);
  LevelMetrics m = compute_level_metrics(result, {});
  std::vector<double> ttft_truth, e2el_truth;
  for (int i = 0; i < 40; ++i) {
    ttft_truth.push_back(100 + 10.0 * i);
    e2el_truth.push_back(120 + 10.0 * i);
  }
  Summary scripted_ttft = summarize(ttft_truth);
  Truth truth = truth_of(result, prompts, h.server);
  const Summary& ttft = truth.ttft_ms;
  const Summary& e2el = truth.e2el_ms;
  EXPECT_FOLLOWED_SCRIPT(truth.served_ttft_ms.median, scripted_ttft.median);
  EXPECT_FOLLOWED_SCRIPT(truth.served_ttft_ms.p99, scripted_ttft.p99);
  ASSERT_EQ(m.completed, 40u);
  EXPECT_EQ(m.max_in_flight, 40u);
  EXPECT_WITHIN_2_PERCENT(m.ttft_ms.mean, ttft.mean);
  EXPECT_WITHIN_2_PERCENT(m.ttft_ms.median, ttft.median);
  EXPECT_WITHIN_2_PERCENT(m.ttft_ms.p90, ttft.p90);
  EXPECT_WITHIN_2_PERCENT(m.ttft_ms.p95, ttft.p95);
  EXPECT_WITHIN_2_PERCENT(m.ttft_ms.p99, ttft.p99);
  EXPECT_WITHIN_2_PERCENT(m.ttft_ms.max, ttft.max);
  EXPECT_WITHIN_2_PERCENT(m.e2el_ms.median, e2el.median);
  EXPECT_WITHIN_2_PERCENT(m.e2el_ms.p95, e2el.p95);
  EXPECT_WITHIN_2_PERCENT(m.e2el_ms.p99, e2el.p99);
  // The level lasts from its start to the last byte of the last request; the 40 sends leave a
  // few ms apart on a loaded machine, so that is not the slowest request's own latency.
  EXPECT_GE(m.duration_s, truth.last_byte_s);
  EXPECT_WITHIN_2_PERCENT(m.duration_s, truth.last_byte_s);
  EXPECT_WITHIN_2_PERCENT(m.e2el_ms.max, e2el.max);
}

TEST(ScriptedLoad, FailuresAreCountedByKind) {
  // The prompt names the scripted behaviour, so a retried request meets the same fate.
  Harness h([](size_t, const nlohmann::json& body) {
    std::string prompt = user_content(body);
    std::string kind = prompt.substr(0, prompt.find('#'));
    ScriptedResponse r;
    r.ttft_s = 0.150;
    r.token_interval_s = 0.025;
    r.tokens = 4;
    if (kind == "500") r.status = 500;
    if (kind == "429") r.status = 429;
    if (kind == "drop-chunked") r.drop_after_tokens = 2;
    if (kind == "drop-close-delimited") {
      r.chunked = false;
      r.drop_after_tokens = 2;
    }
    if (kind == "garbage") r.garbage_after_first_token = true;
    if (kind == "close") r.close_without_response = true;
    if (kind == "hang") r.never_respond = true;
    return r;
  });
  const std::vector<std::string> kinds = {"ok",      "500",   "429", "drop-chunked", "drop-close-delimited",
                                          "garbage", "close", "hang"};
  std::vector<PromptSpec> prompts;
  for (int i = 0; i < 40; ++i) prompts.push_back({kinds[i % kinds.size()] + "#" + std::to_string(i), 4, 1});
  RequestSettings settings;
  settings.timeout = std::chrono::milliseconds(500);
  LevelResult result = h.run(prompts, 10, settings);
  LevelMetrics m = compute_level_metrics(result, {});
  EXPECT_EQ(m.requests, 40u);
  EXPECT_EQ(m.completed, 5u);
  EXPECT_EQ(m.failed, 35u);
  std::map<std::string, size_t> expected = {
      {"http_500", 5}, {"http_429", 5}, {"disconnected", 15}, {"bad_response", 5}, {"timeout", 5}};
  EXPECT_EQ(m.failures_by_kind, expected);
  EXPECT_EQ(m.failure_example["http_500"], "scripted failure");
  EXPECT_EQ(m.completion_tokens, 5 * 4);
  // Only successes enter the latency figures: 150 + 3 * 25 ms each (the garbage streams also
  // ran to the end on the server, on the same schedule).
  EXPECT_EQ(m.e2el_ms.count, 5u);
  Truth truth = truth_of(result, prompts, h.server);
  EXPECT_FOLLOWED_SCRIPT(truth.served_e2el_ms.median, 225.0);
  EXPECT_WITHIN_2_PERCENT(m.e2el_ms.median, truth.e2el_ms.median);
  // Timeouts fire on the client's own timer, which a busy machine also delays a little.
  for (const RequestRecord& r : result.records) {
    if (r.failure_kind == "timeout") {
      EXPECT_GE(r.latency_s, 0.500);
      EXPECT_LT(r.latency_s, 0.500 * 1.05);
    }
  }
}

TEST(ScriptedLoad, MissingUsageFallsBackToCountingChunks) {
  Harness h([](size_t, const nlohmann::json&) {
    ScriptedResponse r;
    r.tokens = 12;
    r.include_usage = false;
    return r;
  });
  LevelMetrics m = compute_level_metrics(h.run(fixed_prompt_workload("twelve chars", 12, 10), 5), {});
  EXPECT_EQ(m.completed, 10u);
  EXPECT_EQ(m.requests_without_usage, 10u);
  EXPECT_EQ(m.completion_tokens, 10 * 12);
  EXPECT_EQ(m.prompt_tokens, 10 * 3);  // estimated from 12 characters
}

TEST(ScriptedLoad, NonStreamingAndCompletionsEndpoint) {
  Harness h([](size_t, const nlohmann::json&) {
    ScriptedResponse r;
    r.ttft_s = 0.200;
    r.token_interval_s = 0.030;
    r.tokens = 11;
    return r;
  });
  RequestSettings settings;
  settings.generation.stream = false;
  std::vector<PromptSpec> chat_prompts = numbered_prompts("chat", 11, 6);
  LevelResult chat_result = h.run(chat_prompts, 3, settings);
  LevelMetrics chat = compute_level_metrics(chat_result, {});
  EXPECT_EQ(chat.completed, 6u);
  EXPECT_EQ(chat.completion_tokens, 66);
  Truth chat_truth = truth_of(chat_result, chat_prompts, h.server);
  EXPECT_FOLLOWED_SCRIPT(chat_truth.served_e2el_ms.mean, 500.0);
  EXPECT_WITHIN_2_PERCENT(chat.e2el_ms.mean, chat_truth.e2el_ms.mean);
  EXPECT_WITHIN_2_PERCENT(chat.ttft_ms.mean, chat_truth.e2el_ms.mean);  // no stream: first token comes with the last
  EXPECT_EQ(chat.itl_ms.count, 0u);

  settings.endpoint = ApiEndpoint::kCompletions;
  settings.generation.stream = true;
  std::vector<PromptSpec> text_prompts = numbered_prompts("text", 11, 6);
  LevelResult text_result = h.run(text_prompts, 3, settings);
  LevelMetrics text = compute_level_metrics(text_result, {});
  EXPECT_EQ(text.completed, 6u);
  EXPECT_EQ(text.completion_tokens, 66);
  Truth text_truth = truth_of(text_result, text_prompts, h.server);
  EXPECT_FOLLOWED_SCRIPT(text_truth.served_ttft_ms.mean, 200.0);
  EXPECT_WITHIN_2_PERCENT(text.ttft_ms.mean, text_truth.ttft_ms.mean);
  EXPECT_WITHIN_2_PERCENT(text.itl_ms.mean, text_truth.itl_ms.mean);
  EXPECT_WITHIN_2_PERCENT(text.itl_ms.median, text_truth.itl_ms.median);
}

TEST(ScriptedLoad, ServerThatIgnoresStreamIsReadAsOneResponse) {
  Harness h([](size_t, const nlohmann::json&) {
    ScriptedResponse r;
    r.tokens = 5;
    r.ignore_stream = true;
    return r;
  });
  LevelMetrics m = compute_level_metrics(h.run(fixed_prompt_workload("x", 5, 4), 2), {});
  EXPECT_EQ(m.completed, 4u);
  EXPECT_EQ(m.completion_tokens, 20);
  EXPECT_EQ(m.requests_without_usage, 0u);
}

TEST(ScriptedLoad, RequestsLeaveOnTheirArrivalSchedule) {
  Harness h([](size_t, const nlohmann::json&) {
    ScriptedResponse r;
    r.tokens = 1;
    return r;
  });
  ArrivalProcess arrivals{100.0, 1.0};
  LevelResult result = h.run(fixed_prompt_workload("x", 1, 60), 0, {}, arrivals);
  std::vector<double> starts;
  for (const RequestRecord& r : result.records) starts.push_back(r.start_s);
  std::sort(starts.begin(), starts.end());
  std::vector<double> schedule = arrival_times(arrivals, 60, 5);
  ASSERT_EQ(starts.size(), schedule.size());
  // Each release close to its schedule even on a busy machine, and no drift on average.
  double total_offset = 0;
  for (size_t i = 0; i < starts.size(); ++i) {
    EXPECT_GE(starts[i], schedule[i] - 0.001) << i;
    EXPECT_NEAR(starts[i], schedule[i], 0.030) << i;
    total_offset += starts[i] - schedule[i];
  }
  EXPECT_LT(total_offset / starts.size(), 0.008);
}

TEST(ScriptedLoad, TwoThousandConcurrentStreamsOnOneThread) {
  Harness h([](size_t, const nlohmann::json&) {
    ScriptedResponse r;
    r.ttft_s = 0.8;
    r.token_interval_s = 0.05;
    r.tokens = 4;
    return r;
  });
  LevelMetrics m = compute_level_metrics(h.run(fixed_prompt_workload("x", 4, 2000), 0), {});
  EXPECT_EQ(m.completed, 2000u);
  EXPECT_EQ(m.failed, 0u);
  EXPECT_EQ(m.max_in_flight, 2000u);
  EXPECT_EQ(m.completion_tokens, 8000);
  EXPECT_EQ(m.itl_ms.count, 6000u);
}

TEST(ServerProbe, DiscoversTheModelAndExplainsFailures) {
  ScriptedServer server([](size_t, const nlohmann::json&) { return ScriptedResponse{}; }, 1, "secret");
  boost::asio::io_context io;
  HttpClient good(io, parse_base_url(server.base_url() + "/v1/"), "secret");
  EXPECT_EQ(discover_model(io, good, std::chrono::seconds(5)), ScriptedServer::kModelId);
  HttpClient wrong_key(io, parse_base_url(server.base_url()), "wrong");
  try {
    discover_model(io, wrong_key, std::chrono::seconds(5));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--api-key"), std::string::npos) << e.what();
  }
  int closed_port = server.port();
  {
    ScriptedServer other([](size_t, const nlohmann::json&) { return ScriptedResponse{}; });
    closed_port = other.port();
  }
  HttpClient nobody(io, parse_base_url("http://127.0.0.1:" + std::to_string(closed_port)), "");
  try {
    discover_model(io, nobody, std::chrono::seconds(5));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--base-url"), std::string::npos) << e.what();
  }
}

TEST(BaseUrl, ParsesHostsPortsAndPrefixes) {
  BaseUrl a = parse_base_url("http://10.0.0.1:8000/v1");
  EXPECT_EQ(a.host, "10.0.0.1");
  EXPECT_EQ(a.port, "8000");
  EXPECT_EQ(a.path_prefix, "");
  BaseUrl b = parse_base_url("localhost/proxy/");
  EXPECT_EQ(b.port, "80");
  EXPECT_EQ(b.path_prefix, "/proxy");
  EXPECT_THROW(parse_base_url("https://example.com"), Error);
}

}  // namespace
}  // namespace tessera::bench
