// Runs the bench verb as a user would (a separate process with flags) against the scripted
// server, and checks the JSON, Markdown and HTML reports it writes.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "bench/scripted_server.h"

namespace tessera::bench {
namespace {

// TESSERA_BIN=/path/to/tessera tests the real binary's `bench` verb instead of the helper.
std::string bench_command() {
  if (const char* tessera = std::getenv("TESSERA_BIN")) return std::string(tessera) + " bench";
  return std::string(TESSERA_BINARY_DIR) + "/tests/bench/tessera_bench_cli";
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

TEST(BenchCli, SeedProtocolWritesParseableReports) {
  ScriptedServer server([](size_t, const nlohmann::json&) {
    ScriptedResponse r;
    r.ttft_s = 0.020;
    r.token_interval_s = 0.002;
    r.prompt_tokens = 9;
    return r;
  });
  std::string dir = ::testing::TempDir() + "bench_cli";
  std::system(("mkdir -p " + dir).c_str());
  std::string json_path = dir + "/bench_cli.json", html_path = dir + "/bench_cli.html", md_path = dir + "/bench_cli.md";
  std::string command = bench_command() + " --base-url " + server.base_url() +
                        " --concurrency 1,5,10,20 --requests-per-level 40 --prompt 'Explain parallel computing in one "
                        "sentence.' --max-tokens 16 --temperature 0 --goodput ttft:500 tpot:50 --no-progress --json " +
                        json_path + " --html " + html_path + " --markdown " + md_path + " > " + dir +
                        "/bench_cli.out 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << read_file(dir + "/bench_cli.out");
  EXPECT_EQ(server.completion_requests(), 160u);

  nlohmann::json report = nlohmann::json::parse(read_file(json_path));
  EXPECT_EQ(report["model"], ScriptedServer::kModelId);
  ASSERT_EQ(report["levels"].size(), 4u);
  std::vector<int> levels = {1, 5, 10, 20};
  for (size_t i = 0; i < 4; ++i) {
    const auto& level = report["levels"][i];
    EXPECT_EQ(level["max_concurrency"], levels[i]);
    EXPECT_EQ(level["completed"], 40);
    EXPECT_EQ(level["failed"], 0);
    EXPECT_EQ(level["completion_tokens"], 40 * 16);
    EXPECT_EQ(level["prompt_tokens"], 40 * 9);
    EXPECT_EQ(level["max_in_flight"], levels[i]);
    EXPECT_EQ(level["good_requests"], 40);
    // 20 + 15 * 2 ms scripted, plus delivery on a loaded 2-core CI box; exact checks live in
    // scripted_load_test.
    EXPECT_GE(level["e2el_ms"]["median"].get<double>(), 49.0);
    EXPECT_LE(level["e2el_ms"]["median"].get<double>(), 65.0);
  }
  std::string html = read_file(html_path);
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.find("</html>"), std::string::npos);
  EXPECT_EQ(count(html, "<svg"), 5u);
  EXPECT_EQ(count(html, "<svg"), count(html, "</svg>"));
  EXPECT_EQ(count(html, "<script"), 0u);
  EXPECT_EQ(count(html, "http://"), count(html, "http://www.w3.org/2000/svg") + 1);  // only the server's own address
  std::string markdown = read_file(md_path);
  EXPECT_NE(markdown.find("| 20 |"), std::string::npos);
  std::string out = read_file(dir + "/bench_cli.out");
  EXPECT_NE(out.find("completion tok/s"), std::string::npos);
}

// vLLM's `vllm bench serve` command line with the binary name swapped: vLLM's result block on stdout, and with
// --save-result its result JSON under vLLM's keys; a one-level HTML report draws latency distributions.
TEST(BenchCli, VllmCommandLineWritesVllmResultJson) {
  ScriptedServer server([](size_t, const nlohmann::json&) {
    ScriptedResponse r;
    r.ttft_s = 0.010;
    r.token_interval_s = 0.002;
    r.prompt_tokens = 9;
    return r;
  });
  std::string dir = ::testing::TempDir() + "bench_cli_vllm";
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  const std::string port = server.base_url().substr(server.base_url().rfind(':') + 1);
  std::string command = bench_command() + " --backend vllm --model " + ScriptedServer::kModelId +
                        " --dataset-name random --random-input-len 16 --random-output-len 8 --num-prompts 10"
                        " --max-concurrency 2 --request-rate 50 --save-result --result-dir " +
                        dir + "/results --result-filename r.json --percentile-metrics ttft,tpot,itl,e2el" +
                        " --metric-percentiles 50,90,99.9 --metadata gpu=none --disable-tqdm --port " + port +
                        " --html " + dir + "/one.html > " + dir + "/out.txt 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << read_file(dir + "/out.txt");
  const std::string out = read_file(dir + "/out.txt");
  EXPECT_NE(out.find("============ Serving Benchmark Result ============"), std::string::npos) << out;
  EXPECT_NE(out.find("Successful requests:                     10"), std::string::npos) << out;
  EXPECT_NE(out.find("P99.9 E2EL (ms):"), std::string::npos) << out;
  const nlohmann::json r = nlohmann::json::parse(read_file(dir + "/results/r.json"));
  EXPECT_EQ(r["backend"], "vllm");
  EXPECT_EQ(r["model_id"], ScriptedServer::kModelId);
  EXPECT_EQ(r["num_prompts"], 10);
  EXPECT_EQ(r["completed"], 10);
  EXPECT_EQ(r["failed"], 0);
  EXPECT_EQ(r["total_input_tokens"], 90);
  EXPECT_EQ(r["total_output_tokens"], 80);
  EXPECT_EQ(r["request_rate"], 50.0);
  EXPECT_EQ(r["max_concurrency"], 2);
  EXPECT_EQ(r["gpu"], "none");
  EXPECT_TRUE(r["request_goodput"].is_null());
  EXPECT_NEAR(r["request_throughput"].get<double>(), 10 / r["duration"].get<double>(), 1e-9);
  EXPECT_NEAR(r["output_throughput"].get<double>(), 80 / r["duration"].get<double>(), 1e-9);
  for (const char* metric : {"ttft", "tpot", "itl", "e2el"})
    for (const char* stat : {"mean", "median", "std", "p50", "p90", "p99.9"})
      EXPECT_TRUE(r.contains(fmt::format("{}_{}_ms", stat, metric))) << stat << "_" << metric;
  EXPECT_GE(r["median_ttft_ms"].get<double>(), 10.0);
  EXPECT_LE(r["p50_itl_ms"].get<double>(), r["p99.9_itl_ms"].get<double>());
  EXPECT_EQ(r["latencies"].size(), 10u);
  EXPECT_FALSE(r.contains("ttfts")) << "per-request lists only with --save-detailed";
  const std::string html = read_file(dir + "/one.html");
  EXPECT_EQ(count(html, "<svg"), 2u);
  EXPECT_NE(html.find("distribution"), std::string::npos);
}

// A fresh folder for one test's files.
std::string fresh_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + name;
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  return dir;
}

// The exit code of a command line (std::system gives the wait status).
int run(const std::string& command) {
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string port_of(const ScriptedServer& server) { return server.base_url().substr(server.base_url().rfind(':') + 1); }

ScriptedServer instant_server() {
  return ScriptedServer([](size_t, const nlohmann::json&) { return ScriptedResponse{}; });
}

const char* const kSonnet[] = {
    "From fairest creatures we desire increase,",     "That thereby beauty's rose might never die,",
    "But as the riper should by time decease,",       "His tender heir might bear his memory:",
    "But thou, contracted to thine own bright eyes,", "Feed'st thy light's flame with self-substantial fuel,",
    "Making a famine where abundance lies,",          "Thyself thy foe, to thy sweet self too cruel.",
    "Thou that art now the world's fresh ornament",   "And only herald to the gaudy spring,",
    "Within thine own bud buriest thy content",       "And, tender churl, makest waste in niggarding.",
    "Pity the world, or else this glutton be,",       "To eat the world's due, by the grave and thee."};

// vLLM's documented sonnet command line (its throughput example's dataset flags, on `bench serve`) with vLLM's
// default lengths: 550 input tokens at most, a 200-token shared prefix, 150 output tokens. Flags that mean
// nothing here (--insecure, --skip-chat-template, --ready-check-timeout-sec) are accepted.
TEST(BenchCli, VllmSonnetCommandLineRunsUnchanged) {
  ScriptedServer server = instant_server();
  const std::string dir = fresh_dir("bench_cli_sonnet");
  std::string poem;
  for (const char* line : kSonnet) poem += std::string(line) + "\n";
  std::ofstream(dir + "/sonnet.txt") << poem;
  const std::string command = bench_command() + " --backend vllm --model " + ScriptedServer::kModelId +
                              " --endpoint /v1/completions --dataset-name sonnet --dataset-path " + dir +
                              "/sonnet.txt --num-prompts 10 --insecure --skip-chat-template"
                              " --ready-check-timeout-sec 0 --save-result --result-dir " +
                              dir + " --result-filename s.json --disable-tqdm --port " + port_of(server) + " > " + dir +
                              "/out.txt 2>&1";
  ASSERT_EQ(run(command), 0) << read_file(dir + "/out.txt");
  const nlohmann::json r = nlohmann::json::parse(read_file(dir + "/s.json"));
  EXPECT_EQ(r["num_prompts"], 10);
  EXPECT_EQ(r["completed"], 10);
  EXPECT_EQ(r["total_output_tokens"], 10 * 150);  // --sonnet-output-len's default
  const std::vector<ServedTiming> served = server.served_timings();
  ASSERT_EQ(served.size(), 10u);
  // Without a tokenizer no chat template renders them: the prompt is the instruction, the whole 14-line poem
  // (the ~200-token prefix is longer than the file) and lines drawn from it.
  const std::string shared = "Pick as many lines as you can from these poem lines:\n" + poem;
  std::set<std::string> distinct;
  for (const ServedTiming& t : served) {
    EXPECT_EQ(t.prompt.rfind(shared, 0), 0u) << t.prompt.substr(0, 200);
    EXPECT_GT(t.prompt.size(), shared.size() + 800);  // about 350 more tokens of drawn lines
    EXPECT_LE(t.prompt.size(), size_t{550} * 4 + 3);  // at most 550 estimated tokens
    distinct.insert(t.prompt);
  }
  EXPECT_EQ(distinct.size(), 10u);
  EXPECT_NE(read_file(dir + "/out.txt").find("without a chat template"), std::string::npos);
}

// vLLM's documented prefix_repetition command line (docs/benchmarking/cli.md, "Prefix Repetition Dataset").
TEST(BenchCli, VllmPrefixRepetitionCommandLineRunsUnchanged) {
  ScriptedServer server = instant_server();
  const std::string dir = fresh_dir("bench_cli_prefix_repetition");
  const std::string command = bench_command() + " --backend openai --model " + ScriptedServer::kModelId +
                              " --dataset-name prefix_repetition --num-prompts 100"
                              " --prefix-repetition-prefix-len 512 --prefix-repetition-suffix-len 128"
                              " --prefix-repetition-num-prefixes 5 --prefix-repetition-output-len 128"
                              " --save-result --result-dir " +
                              dir + " --result-filename p.json --disable-tqdm --port " + port_of(server) + " > " + dir +
                              "/out.txt 2>&1";
  ASSERT_EQ(run(command), 0) << read_file(dir + "/out.txt");
  const nlohmann::json r = nlohmann::json::parse(read_file(dir + "/p.json"));
  EXPECT_EQ(r["completed"], 100);
  EXPECT_EQ(r["total_output_tokens"], 100 * 128);
  std::map<std::string, int> prefixes;
  for (const ServedTiming& t : server.served_timings()) {
    std::istringstream words(t.prompt);
    std::string prefix, word;
    size_t n = 0;
    for (; words >> word; ++n)
      if (n < 512) prefix += word + " ";
    EXPECT_EQ(n, 640u);  // 512 + 128 one-token words
    ++prefixes[prefix];
  }
  ASSERT_EQ(prefixes.size(), 5u);
  for (const auto& [prefix, uses] : prefixes) EXPECT_EQ(uses, 20);
}

// --num-warmups sends copies of the first prompt before the level; they are in no result.
TEST(BenchCli, WarmupsAreSentButNotCounted) {
  ScriptedServer server = instant_server();
  const std::string dir = fresh_dir("bench_cli_warmups");
  const std::string command = bench_command() + " --backend vllm --model " + ScriptedServer::kModelId +
                              " --dataset-name random --random-input-len 8 --random-output-len 4 --num-prompts 10"
                              " --max-concurrency 2 --num-warmups 4 --save-result --result-dir " +
                              dir + " --result-filename w.json --disable-tqdm --port " + port_of(server) + " > " + dir +
                              "/out.txt 2>&1";
  ASSERT_EQ(run(command), 0) << read_file(dir + "/out.txt");
  EXPECT_EQ(server.completion_requests(), 14u);
  const nlohmann::json r = nlohmann::json::parse(read_file(dir + "/w.json"));
  EXPECT_EQ(r["num_prompts"], 10);
  EXPECT_EQ(r["completed"], 10);
  EXPECT_EQ(r["total_output_tokens"], 40);
  const std::vector<ServedTiming> served = server.served_timings();
  ASSERT_EQ(served.size(), 14u);
  // The four warm-ups are the first prompt: it was served five times.
  size_t first = 0;
  for (const ServedTiming& t : served) first += t.prompt == served.front().prompt;
  EXPECT_EQ(first, 5u);
}

// --header KEY=VALUE reaches the server on every request (model discovery too) and replaces tessera's own field
// of that name; --request-id-prefix numbers the requests.
TEST(BenchCli, HeadersArriveAtTheServer) {
  ScriptedServer server([](size_t, const nlohmann::json&) { return ScriptedResponse{}; }, 1, "from-header");
  const std::string dir = fresh_dir("bench_cli_headers");
  const std::string command = bench_command() +
                              " --backend openai-chat --dataset-name random --random-input-len 8"
                              " --random-output-len 2 --num-prompts 5 --api-key wrong"
                              " --header x-additional-info=0.3.3 'Authorization=Bearer from-header'"
                              " --header ' X-Team = bench ' --request-id-prefix bench-x- --disable-tqdm --port " +
                              port_of(server) + " > " + dir + "/out.txt 2>&1";
  ASSERT_EQ(run(command), 0) << read_file(dir + "/out.txt");
  const auto requests = server.request_headers();
  ASSERT_EQ(requests.size(), 6u);  // GET /v1/models, then 5 completions
  std::set<std::string> ids;
  for (const auto& fields : requests) {
    EXPECT_EQ(fields.at("x-additional-info"), "0.3.3");
    EXPECT_EQ(fields.at("x-team"), "bench");
    EXPECT_EQ(fields.at("authorization"), "Bearer from-header");
    if (fields.count("x-request-id")) ids.insert(fields.at("x-request-id"));
  }
  EXPECT_EQ(ids, (std::set<std::string>{"bench-x-0", "bench-x-1", "bench-x-2", "bench-x-3", "bench-x-4"}));
}

// --ramp-up-strategy: the result JSON carries vLLM's ramp keys and rps_change_events, the file vLLM's name.
TEST(BenchCli, RampUpWritesVllmsKeysAndFileName) {
  ScriptedServer server = instant_server();
  const std::string dir = fresh_dir("bench_cli_ramp");
  const std::string command = bench_command() + " --backend vllm --model " + ScriptedServer::kModelId +
                              " --dataset-name random --random-input-len 8 --random-output-len 2 --num-prompts 21"
                              " --ramp-up-strategy linear --ramp-up-start-rps 40 --ramp-up-end-rps 240"
                              " --save-result --result-dir " +
                              dir + " --disable-tqdm --port " + port_of(server) + " > " + dir + "/out.txt 2>&1";
  ASSERT_EQ(run(command), 0) << read_file(dir + "/out.txt");
  std::string file;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    if (entry.path().extension() == ".json") file = entry.path().filename().string();
  EXPECT_EQ(file.rfind("vllm-ramp-up-linear-40qps-240qps-scripted-model-", 0), 0u) << file;
  const nlohmann::ordered_json r = nlohmann::ordered_json::parse(read_file(dir + "/" + file));
  EXPECT_EQ(r["request_rate"], "inf");
  EXPECT_EQ(r["ramp_up_strategy"], "linear");
  EXPECT_EQ(r["ramp_up_start_rps"], 40);
  EXPECT_EQ(r["ramp_up_end_rps"], 240);
  EXPECT_EQ(r["completed"], 21);
  // Keys in vLLM's order: the ramp after max_concurrency, before the results.
  std::vector<std::string> keys;
  for (const auto& item : r.items()) keys.push_back(item.key());
  const auto at = [&](const char* key) { return std::find(keys.begin(), keys.end(), key) - keys.begin(); };
  EXPECT_EQ(at("ramp_up_strategy"), at("max_concurrency") + 1);
  EXPECT_EQ(at("duration"), at("ramp_up_end_rps") + 1);
  // One event per whole rate the ramp passes, from 40 to 240 (10 more per request).
  const auto& events = r["rps_change_events"];
  ASSERT_EQ(events.size(), 201u);
  EXPECT_EQ(events.front()["rps"], 40);
  EXPECT_EQ(events.back()["rps"], 240);
  EXPECT_TRUE(events.front()["timestamp"].is_string());
  // The run took about the schedule's length: 20 gaps of about 1/40 .. 1/240 s (vs 0 for rate inf).
  EXPECT_GT(r["duration"].get<double>(), 0.03);
}

// vLLM flags without meaning here: refused with what to use instead (exit 2, as argparse), never ignored silently.
TEST(BenchCli, VllmFlagsWithoutMeaningAreRefusedWithAdvice) {
  const std::string dir = fresh_dir("bench_cli_refused");
  const std::pair<const char*, const char*> cases[] = {
      {"--dataset-name hf --dataset-path lmarena-ai/VisionArena-Chat", "--dataset-path FILE"},
      {"--dataset-name burstgpt --dataset-path b.csv", "--dataset-name random"},
      {"--dataset-name random --dataset-path x.jsonl", "sharegpt, custom or sonnet"},
      {"--dataset-name sonnet", "--dataset-path FILE"},
      {"--dataset-name sonnet --dataset-path s.txt --sonnet-prefix-len 600", "--sonnet-input-len"},
      {"--dataset-name prefix_repetition --num-prompts 3", "--prefix-repetition-num-prefixes"},
      {"--profile", "profile the server"},
      {"--lora-modules a b", "--served-model-name"},
      {"--plot-timeline", "--html"},
      {"--ramp-up-strategy linear --ramp-up-start-rps 1 --ramp-up-end-rps 9 --request-rate 4", "drop --request-rate"},
      {"--ramp-up-strategy exponential --ramp-up-start-rps 1", "--ramp-up-end-rps"},
      {"--ramp-up-strategy linear --ramp-up-start-rps 9 --ramp-up-end-rps 1", "must not be above"},
      {"--ramp-up-start-rps 3 --ramp-up-end-rps 9", "--ramp-up-strategy"},
      {"--header novalue", "KEY=VALUE"},
      {"--agent-turns 4", "--agent-turns needs --dataset-name agent"},
      {"--dataset-name agent --agent-conversations 0", "--agent-conversations must be at least 1, got 0"},
      {"--dataset-name agent --agent-turn-output-len -5", "--agent-turn-output-len must be at least 1"},
      {"--dataset-name agent --num-prompts 10", "--agent-conversations, --agent-turns"},
      {"--dataset-name agent --max-concurrency 4", "--agent-conversations, --agent-turns"},
      {"--dataset-name agent --no-stream", "--no-stream has no meaning with --dataset-name agent"},
      {"--dataset-name agent --backend openai", "/v1/chat/completions"},
      {"--dataset-name agent --save-result", "--json"},
  };
  for (const auto& [flags, advice] : cases) {
    SCOPED_TRACE(flags);
    const std::string out = dir + "/out.txt";
    EXPECT_EQ(run(bench_command() + " --base-url http://127.0.0.1:9 " + flags + " > " + out + " 2>&1"), 2);
    const std::string text = read_file(out);
    EXPECT_EQ(text.rfind("error: ", 0), 0u) << text;
    EXPECT_NE(text.find(advice), std::string::npos) << text;
  }
}

// --dataset-name agent as a user runs it: the per-turn table on the terminal and under "agent" in the JSON.
TEST(BenchCli, AgentConversationsReportEachTurn) {
  ScriptedServer server([](size_t, const nlohmann::json&) { return ScriptedResponse{}; });
  const std::string dir = fresh_dir("bench_cli_agent");
  const std::string command = bench_command() + " --base-url " + server.base_url() +
                              " --dataset-name agent --agent-conversations 3 --agent-turns 2 --agent-system-prompt-len "
                              "50 --agent-turn-input-len 5 --agent-turn-output-len 3 --agent-reference-len 8 "
                              "--agent-reference-runs 1 --no-progress --json " +
                              dir + "/agent.json > " + dir + "/out.txt 2>&1";
  ASSERT_EQ(run(command), 0) << read_file(dir + "/out.txt");
  EXPECT_EQ(server.completion_requests(), 1u + 3u * 2u);
  const std::string out = read_file(dir + "/out.txt");
  EXPECT_NE(out.find("agent conversations: 3 at once x 2 turns"), std::string::npos) << out;
  EXPECT_NE(out.find("turn 2: prefix-cache hit rate n/a"), std::string::npos) << out;
  const nlohmann::json agent = nlohmann::json::parse(read_file(dir + "/agent.json"))["agent"];
  ASSERT_EQ(agent["per_turn"].size(), 2u);
  EXPECT_EQ(agent["per_turn"][1]["completed"], 3);
  EXPECT_EQ(agent["reference"]["completed"], 1);
  EXPECT_TRUE(agent["later_turns"]["prefix_cache_hit_rate"].is_null()) << "the scripted server sends no cached tokens";
  EXPECT_GT(agent["later_turns"]["ttft_ratio_to_reference"].get<double>(), 0);
}

TEST(BenchCli, UnreachableServerSaysWhatToDo) {
  std::string dir = ::testing::TempDir() + "bench_cli";
  std::system(("mkdir -p " + dir).c_str());
  std::string command =
      bench_command() + " --base-url http://127.0.0.1:9 --no-progress > " + dir + "/bench_cli_err.out 2>&1";
  EXPECT_NE(std::system(command.c_str()), 0);
  EXPECT_NE(read_file(dir + "/bench_cli_err.out").find("check --base-url"), std::string::npos);
}

TEST(BenchCli, HelpExplainsEveryFlag) {
  std::string dir = ::testing::TempDir() + "bench_cli";
  std::system(("mkdir -p " + dir).c_str());
  std::string command = bench_command() + " --help > " + dir + "/bench_cli_help.out 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0);
  std::string help = read_file(dir + "/bench_cli_help.out");
  for (const char* flag : {"--base-url",
                           "--endpoint",
                           "--api-key",
                           "--model",
                           "--no-stream",
                           "--timeout",
                           "--dataset",
                           "--random-input-len",
                           "--random-range-ratio",
                           "--num-prompts",
                           "--request-rate",
                           "--max-concurrency",
                           "--burstiness",
                           "--seed",
                           "--ignore-eos",
                           "--goodput",
                           "--json",
                           "--markdown",
                           "--html",
                           "--concurrency",
                           "--self-test",
                           "--sonnet-input-len",
                           "--sonnet-prefix-len",
                           "--prefix-repetition-num-prefixes",
                           "--num-warmups",
                           "--ramp-up-strategy",
                           "--ramp-up-start-rps",
                           "--header",
                           "--disable-shuffle",
                           "--insecure",
                           "--agent-conversations",
                           "--agent-turns",
                           "--agent-system-prompt-len",
                           "--agent-turn-input-len",
                           "--agent-turn-output-len",
                           "--agent-reference-len",
                           "--agent-reference-runs",
                           "--agent-reference-output-len"})
    EXPECT_NE(help.find(flag), std::string::npos) << flag;
}

}  // namespace
}  // namespace tessera::bench
