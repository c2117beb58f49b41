// --dataset-name agent: the conversation builder (message lists grow as a coding agent's do, the
// system prompt shared), the request body and usage fields it reads, the per-turn figures, and the
// client loop against the scripted loopback server (what each turn sends, the answer sent back).
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>

#include "bench/agent_metrics.h"
#include "bench/agent_runner.h"
#include "bench/conversation.h"
#include "bench/openai_protocol.h"
#include "bench/scripted_server.h"
#include "core/error.h"

namespace tessera::bench {
namespace {

using nlohmann::json;

std::vector<std::string> roles(const std::vector<ChatMessage>& messages) {
  std::vector<std::string> out;
  for (const ChatMessage& m : messages) out.push_back(m.role);
  return out;
}

int words(const std::string& text) {
  int n = text.empty() ? 0 : 1;
  for (char c : text) n += c == ' ';
  return n;
}

TEST(AgentConversation, MessagesGrowByTheAnswerAndTheNextUserMessage) {
  Conversation c("SYSTEM", {"u1", "u2", "u3"});
  EXPECT_EQ(c.turns(), 3);
  EXPECT_EQ(roles(c.start_turn()), (std::vector<std::string>{"system", "user"}));
  EXPECT_THROW(c.start_turn(), Error) << "turn 2 before turn 1's answer";
  c.finish_turn("a1");
  const auto& second = c.start_turn();
  EXPECT_EQ(roles(second), (std::vector<std::string>{"system", "user", "assistant", "user"}));
  EXPECT_EQ(second[0].content, "SYSTEM");
  EXPECT_EQ(second[1].content, "u1");
  EXPECT_EQ(second[2].content, "a1");
  EXPECT_EQ(second[3].content, "u2");
  c.finish_turn("a2");
  const std::vector<ChatMessage> third = c.start_turn();
  ASSERT_EQ(third.size(), 6u);
  // Turn 3's messages start with turn 2's, unchanged: the prompt only grows at the end.
  for (size_t i = 0; i < second.size(); ++i) {
    EXPECT_EQ(third[i].role, second[i].role);
    EXPECT_EQ(third[i].content, second[i].content);
  }
  EXPECT_EQ(third[4].content, "a2");
  EXPECT_EQ(third[5].content, "u3");
  EXPECT_FALSE(c.done()) << "turn 3 is not answered yet";
  c.finish_turn("a3");
  EXPECT_TRUE(c.done());
  EXPECT_THROW(c.start_turn(), Error) << "no turn left";
  EXPECT_THROW(c.finish_turn("again"), Error) << "an answer to no turn";
}

TEST(AgentWorkload, OneSystemPromptForAllAndOwnMessagesPerTurn) {
  AgentOptions o;
  o.conversations = 3;
  o.turns = 4;
  o.system_prompt_len = 120;
  o.turn_input_len = 15;
  o.reference_len = 30;
  o.reference_runs = 2;
  o.seed = 7;
  const AgentWorkload w = agent_workload(o);
  // Without a tokenizer the text is one-token words: their count is the length asked for.
  EXPECT_EQ(words(w.system_prompt), 120);
  ASSERT_EQ(w.user_messages.size(), 3u);
  std::set<std::string> distinct;
  for (const auto& turns : w.user_messages) {
    ASSERT_EQ(turns.size(), 4u);
    for (const std::string& m : turns) {
      EXPECT_EQ(words(m), 15);
      distinct.insert(m);
    }
  }
  EXPECT_EQ(distinct.size(), 12u) << "every conversation and turn has its own message";
  ASSERT_EQ(w.reference_prompts.size(), 2u);
  EXPECT_NE(w.reference_prompts[0], w.reference_prompts[1]) << "each reference run its own text: no cache hit";
  EXPECT_EQ(words(w.reference_prompts[0]), 30);
  // Every conversation starts from the same system prompt; the same seed gives the same texts.
  std::vector<Conversation> conversations;
  for (const auto& turns : w.user_messages) conversations.emplace_back(w.system_prompt, turns);
  for (Conversation& c : conversations) EXPECT_EQ(c.start_turn().front().content, w.system_prompt);
  EXPECT_EQ(agent_workload(o).user_messages, w.user_messages);
  o.seed = 8;
  EXPECT_NE(agent_workload(o).system_prompt, w.system_prompt);
}

TEST(AgentWorkload, BadValuesNameTheirFlag) {
  auto message = [](AgentOptions o) {
    try {
      check_agent_options(o);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  AgentOptions o;
  EXPECT_EQ(message(o), "");
  o.turns = 0;
  EXPECT_NE(message(o).find("--agent-turns must be at least 1, got 0"), std::string::npos) << message(o);
  o = {};
  o.system_prompt_len = -3;
  EXPECT_NE(message(o).find("--agent-system-prompt-len"), std::string::npos);
  o = {};
  o.reference_runs = 0;
  EXPECT_EQ(message(o), "") << "no reference is allowed";
  o.reference_runs = -1;
  EXPECT_NE(message(o).find("--agent-reference-runs must be at least 0"), std::string::npos);
}

TEST(AgentProtocol, ChatBodyCarriesEveryMessageAndUsageGivesCachedTokens) {
  GenerationParams params{"m", 0.0, true, true, R"({"top_k": 5})"};
  const json body =
      json::parse(build_chat_request_body({{"system", "S"}, {"user", "U"}, {"assistant", "A"}}, 9, params));
  ASSERT_EQ(body["messages"].size(), 3u);
  EXPECT_EQ(body["messages"][2], (json{{"role", "assistant"}, {"content", "A"}}));
  EXPECT_EQ(body["max_tokens"], 9);
  EXPECT_EQ(body["ignore_eos"], true);
  EXPECT_EQ(body["stream_options"]["include_usage"], true);
  EXPECT_EQ(body["top_k"], 5);

  MessageContent usage = parse_stream_message(
      R"({"choices":[],"usage":{"prompt_tokens":40,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":32}}})",
      ApiEndpoint::kChatCompletions);
  ASSERT_TRUE(usage.usage);
  EXPECT_EQ(usage.usage->cached_tokens, 32);
  usage = parse_stream_message(R"({"choices":[],"usage":{"prompt_tokens":40,"completion_tokens":3}})",
                               ApiEndpoint::kChatCompletions);
  EXPECT_EQ(usage.usage->cached_tokens, -1) << "not reported";
  // The answer sent back is the content; reasoning is not part of it.
  const MessageContent delta =
      parse_stream_message(R"({"choices":[{"index":0,"delta":{"reasoning_content":"hmm ","content":"yes"}}]})",
                           ApiEndpoint::kChatCompletions);
  EXPECT_EQ(delta.text, "hmm yes");
  EXPECT_EQ(delta.content, "yes");
}

RequestRecord turn_record(size_t conversation, int turn, double ttft_s, int prompt, int cached) {
  RequestRecord r;
  r.success = true;
  r.usage_reported = true;
  r.prompt_index = conversation;
  r.turn = turn;
  r.ttft_s = ttft_s;
  r.prompt_tokens = prompt;
  r.cached_tokens = cached;
  return r;
}

TEST(AgentMetrics, PerTurnFiguresHitRateAndRatioToTheReference) {
  AgentOptions o;
  o.conversations = 2;
  o.turns = 3;
  AgentRunResult run;
  for (double ttft : {0.100, 0.120, 0.500}) {
    RequestRecord r;
    r.success = true;
    r.ttft_s = ttft;
    run.reference.push_back(r);
  }
  auto& records = run.conversations.records;
  records.push_back(turn_record(0, 0, 1.0, 1000, 0));
  records.push_back(turn_record(1, 0, 2.0, 1000, 992));
  records.push_back(turn_record(0, 1, 0.150, 1500, 1488));
  records.push_back(turn_record(1, 1, 0.090, 1500, 1488));
  records.push_back(turn_record(0, 2, 0.120, 2000, 1984));
  RequestRecord failed;
  failed.prompt_index = 1;
  failed.turn = 2;
  records.push_back(failed);
  const AgentMetrics m = compute_agent_metrics(run, o);
  EXPECT_DOUBLE_EQ(m.reference_ttft_ms.median, 120.0);
  ASSERT_EQ(m.turns.size(), 3u);
  EXPECT_EQ(m.turns[0].turn, 1);
  EXPECT_EQ(m.turns[0].completed, 2u);
  EXPECT_DOUBLE_EQ(m.turns[0].ttft_ms.mean, 1500.0);
  EXPECT_DOUBLE_EQ(m.turns[0].mean_cached_tokens, 496.0);
  EXPECT_DOUBLE_EQ(m.turns[1].mean_prompt_tokens, 1500.0);
  EXPECT_EQ(m.turns[2].requests, 2u);
  EXPECT_EQ(m.turns[2].failed, 1u);
  // Turns 2 and 3: (1488 + 1488 + 1984) / (1500 + 1500 + 2000); mean TTFT (150 + 90 + 120) / 3 = 120 ms.
  EXPECT_EQ(m.later_prompt_tokens, 5000);
  EXPECT_EQ(m.later_cached_tokens, 4960);
  EXPECT_DOUBLE_EQ(m.prefix_cache_hit_rate, 0.992);
  EXPECT_NEAR(m.later_ttft_mean_ms, 120.0, 1e-9);
  EXPECT_NEAR(m.ttft_ratio, 1.0, 1e-9);
  // A server that reports no cached tokens: no hit rate, and they are counted.
  for (RequestRecord& r : run.conversations.records) r.cached_tokens = -1;
  const AgentMetrics none = compute_agent_metrics(run, o);
  EXPECT_LT(none.prefix_cache_hit_rate, 0);
  EXPECT_EQ(none.later_without_cached_tokens, 3u);
  EXPECT_LT(none.turns[1].mean_cached_tokens, 0);
}

// The client loop against the loopback server: reference requests first, one at a time; then each
// conversation's turns in order, each sending the messages so far with the previous answer as the
// server streamed it. A failed turn ends its conversation.
TEST(AgentRunner, EachTurnSendsTheConversationSoFarWithTheServersAnswer) {
  std::mutex mutex;
  std::vector<json> bodies;
  ScriptedServer server(
      [&](size_t, const json& body) {
        std::lock_guard<std::mutex> lock(mutex);
        bodies.push_back(body);
        ScriptedResponse r;
        r.prompt_tokens = 100;
        // Conversation 1's second turn fails (its system prompt is shared; its first user message is its own).
        const auto& messages = body["messages"];
        if (messages.size() == 4 && messages[1]["content"].get<std::string>().rfind("c1:", 0) == 0) r.status = 500;
        return r;
      },
      2);
  boost::asio::io_context io;
  HttpClient client(io, parse_base_url(server.base_url()), "");
  AgentOptions o;
  o.conversations = 2;
  o.turns = 3;
  o.turn_output_len = 4;
  o.reference_runs = 2;
  o.reference_output_len = 2;
  AgentWorkload w;
  w.system_prompt = "the shared system prompt";
  w.user_messages = {{"c0:t0", "c0:t1", "c0:t2"}, {"c1:t0", "c1:t1", "c1:t2"}};
  w.reference_prompts = {"reference one", "reference two"};
  RequestSettings settings;
  settings.generation.model = ScriptedServer::kModelId;
  settings.generation.ignore_eos = true;
  size_t progress_calls = 0;
  ProgressHandler progress = [&](size_t, size_t total, size_t) {
    ++progress_calls;
    EXPECT_EQ(total, 6u);
  };
  const AgentRunResult run = run_agent(io, client, w, o, settings, progress);

  ASSERT_EQ(run.reference.size(), 2u);
  for (const RequestRecord& r : run.reference) EXPECT_TRUE(r.success) << r.failure_message;
  ASSERT_GE(bodies.size(), 2u);
  EXPECT_EQ(bodies[0]["messages"], json::parse(R"([{"role":"user","content":"reference one"}])"));
  EXPECT_EQ(bodies[0]["max_tokens"], 2);
  EXPECT_EQ(bodies[1]["messages"][0]["content"], "reference two");

  // Conversation 0: three turns; conversation 1: turn 1, then turn 2 failed and turn 3 was not sent.
  EXPECT_EQ(bodies.size(), 2u + 3u + 2u);
  EXPECT_EQ(run.turns_not_sent, 1u);
  EXPECT_EQ(run.conversations.records.size(), 5u);
  EXPECT_EQ(progress_calls, 5u);
  std::map<std::pair<size_t, int>, const RequestRecord*> by_turn;
  for (const RequestRecord& r : run.conversations.records) by_turn[{r.prompt_index, r.turn}] = &r;
  ASSERT_TRUE(by_turn.count({0, 2}) && by_turn.count({1, 1}));
  EXPECT_FALSE(by_turn.at({1, 1})->success);
  EXPECT_EQ(by_turn.at({1, 1})->failure_kind, "http_500");
  const std::string answer = "tok0 tok1 tok2 tok3 ";  // the scripted server's four tokens
  for (const json& body : bodies) {
    const auto& messages = body["messages"];
    if (messages.size() < 2) continue;  // a reference request
    EXPECT_EQ(messages[0], (json{{"role", "system"}, {"content", "the shared system prompt"}}));
    EXPECT_EQ(body["max_tokens"], 4);
    const size_t turn = (messages.size() - 2) / 2;
    const std::string conversation = messages[1]["content"].get<std::string>().substr(0, 2);
    for (size_t t = 0; t <= turn; ++t) {
      EXPECT_EQ(messages[1 + 2 * t]["role"], "user");
      EXPECT_EQ(messages[1 + 2 * t]["content"], conversation + ":t" + std::to_string(t));
      if (t < turn) {
        EXPECT_EQ(messages[2 + 2 * t], (json{{"role", "assistant"}, {"content", answer}}));
      }
    }
  }
  const RequestRecord& last = *by_turn.at({0, 2});
  EXPECT_TRUE(last.success);
  EXPECT_EQ(last.prompt_tokens, 100);
  EXPECT_EQ(last.completion_tokens, 4);
  EXPECT_EQ(run.conversations.max_in_flight, 2u);
}

}  // namespace
}  // namespace tessera::bench
