// Runs the bench verb as a user would (a separate process with flags) against the scripted
// server, and checks the JSON, Markdown and HTML reports it writes.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
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
                           "--self-test"})
    EXPECT_NE(help.find(flag), std::string::npos) << flag;
}

}  // namespace
}  // namespace tessera::bench
