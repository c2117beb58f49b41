// `tessera bench`: load generator and report for any OpenAI-compatible server.
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdlib>
#include <limits>

#include "bench/bench_options.h"
#include "cli/flag_parsing.h"
#include "cli/verbs.h"
#include "core/error.h"

namespace tessera::cli {
namespace {

double parse_request_rate(const std::string& text) {
  if (text == "inf" || text == "infinity") return std::numeric_limits<double>::infinity();
  try {
    size_t used = 0;
    double rate = std::stod(text, &used);
    if (used == text.size() && rate > 0 && std::isfinite(rate)) return rate;
  } catch (const std::exception&) {
  }
  fail(ErrorKind::kInvalidArgument, "--request-rate '{}': expected a positive number of requests per second or 'inf'",
       text);
}

// Flags that are not fields of BenchOptions as they are spelled.
struct BenchCliFlags {
  std::string host, request_rate = "inf", backend;
  int port = 0;
  std::vector<std::string> dataset;
  int max_concurrency = -1;
  bool no_stream = false, no_progress = false;
};

// The server: where, which API, which model, how long to wait.
void add_target_flags(CLI::App& app, bench::BenchOptions& options, BenchCliFlags& c) {
  app.add_option("--base-url", options.base_url, "server address, http://HOST:PORT (a trailing /v1 is fine)")
      ->capture_default_str();
  app.add_option("--host", c.host, "server host, instead of --base-url (vLLM's spelling)");
  app.add_option("--port", c.port, "server port, used with --host (default 8000)");
  app.add_option("--endpoint", options.endpoint, "API route: /v1/chat/completions or /v1/completions")
      ->capture_default_str();
  app.add_option("--backend", c.backend,
                 "vLLM benchmark_serving's spelling of the API: openai-chat (/v1/chat/completions), openai or vllm "
                 "(/v1/completions)");
  app.add_option("--api-key", options.api_key,
                 "sent as 'Authorization: Bearer KEY'; defaults to $OPENAI_API_KEY when that is set");
  app.add_option("--model", options.model, "model name sent in requests (default: the first id of GET /v1/models)");
  app.add_flag("--no-stream", c.no_stream,
               "ask for whole responses instead of SSE streams (then TTFT = latency, no ITL)");
  app.add_option("--timeout", options.timeout_s, "seconds one request may take before it counts as a timeout")
      ->capture_default_str();
}

// What is sent: the dataset, prompt lengths, sampling.
void add_workload_flags(CLI::App& app, bench::BenchOptions& options, BenchCliFlags& c) {
  app.add_option("--dataset,--dataset-name", c.dataset,
                 "workload: 'prompt' (one fixed prompt, the default), 'random' (generated prompts of chosen length) "
                 "or 'jsonl FILE' (one JSON object per line: prompt|text, or ShareGPT conversations)")
      ->expected(1, 2);
  app.add_option("--dataset-path", options.dataset_path,
                 "the file for --dataset jsonl (JSONL, or a ShareGPT JSON array)");
  app.add_option("--prompt", options.prompt, "the prompt of --dataset prompt")->capture_default_str();
  app.add_option("--max-tokens", options.max_tokens,
                 "max_tokens of each request (prompt and jsonl datasets; random uses --random-output-len)")
      ->capture_default_str();
  app.add_option("--temperature", options.temperature, "sampling temperature")->capture_default_str();
  app.add_option("--random-input-len", options.random_input_len, "prompt length in tokens for --dataset random")
      ->capture_default_str();
  app.add_option("--random-output-len", options.random_output_len, "max_tokens for --dataset random")
      ->capture_default_str();
  app.add_option("--random-range-ratio", options.random_range_ratio,
                 "lengths are drawn uniformly from [len*(1-r), len*(1+r)], 0 <= r < 1")
      ->capture_default_str();
  app.add_option("--random-prefix-len", options.random_prefix_len,
                 "--dataset random: every prompt starts with the same random text of this many tokens (a shared "
                 "system prompt, to measure prefix caching), then its own --random-input-len tokens")
      ->capture_default_str();
  app.add_flag("--ignore-eos", options.ignore_eos,
               "ask the server to generate exactly max_tokens (vLLM's ignore_eos; others may ignore it)");
  app.add_option("--extra-body", options.extra_body,
                 "a JSON object whose members are added to every request (vLLM bench's --extra-body), e.g. "
                 "'{\"guided_json\": {...}}' to measure structured output");
  app.add_option("--tokenizer", options.tokenizer_dir,
                 "model folder with tokenizer.json: exact prompt lengths for --dataset random, and exact token "
                 "counts for servers that send no usage (else chunks are counted and marked as estimates)");
  app.add_option("--seed", options.seed, "seed of random prompts and arrival times")->capture_default_str();
}

// How it is sent (levels, rate) and the reports.
void add_load_and_report_flags(CLI::App& app, bench::BenchOptions& options, BenchCliFlags& c) {
  app.add_option("--concurrency", options.concurrency,
                 "comma-separated concurrency levels, each a separate run (default 1,5,10,20 for --dataset prompt; "
                 "unlimited for datasets); 0 means unlimited")
      ->delimiter(',');
  app.add_option("--max-concurrency", c.max_concurrency, "one level with at most N requests in flight (vLLM's flag)");
  app.add_option("--num-prompts,--requests-per-level", options.requests_per_level,
                 "requests per level (default 40 for --dataset prompt, 1000 for datasets)");
  app.add_option("--request-rate", c.request_rate,
                 "requests released per second, as a Poisson process (gamma with --burstiness); 'inf' sends all at "
                 "once and lets concurrency alone pace them")
      ->capture_default_str();
  app.add_option("--burstiness", options.burstiness,
                 "gamma shape of the gaps between requests: 1 is Poisson, < 1 burstier, > 1 more even")
      ->capture_default_str();
  app.add_option("--goodput", options.goodput,
                 "SLOs in ms for goodput, e.g. 'ttft:500 tpot:50 e2el:3000'; goodput counts the requests meeting all")
      ->expected(1, 3);

  app.add_option("--json", options.json_path, "write every metric of every level as JSON to FILE");
  app.add_option("--markdown", options.markdown_path, "write a Markdown report to FILE");
  app.add_option("--html", options.html_path, "write a self-contained HTML report with SVG plots to FILE");
  app.add_flag("--no-progress", c.no_progress, "no progress bar on stderr");
  app.add_flag("--self-test", options.self_test,
               "aim at an in-process loopback server that answers instantly, to measure this client's own ceiling "
               "(requests/s, streams/s, CPU) on this machine");
}

// The parsed flags into `options`: vLLM's spellings, the environment's API key, the checks
// between flags.
void apply_cli_flags(const CLI::App& app, bench::BenchOptions& options, const BenchCliFlags& c) {
  const std::string& backend = c.backend;
  if (!backend.empty()) {
    std::string endpoint = backend == "openai-chat"                   ? "/v1/chat/completions"
                           : backend == "openai" || backend == "vllm" ? "/v1/completions"
                                                                      : "";
    if (endpoint.empty())
      fail(ErrorKind::kUnsupported,
           "--backend {}: tessera bench speaks the OpenAI API; use --backend openai-chat (/v1/chat/completions) or "
           "openai / vllm (/v1/completions)",
           backend);
    if (app.count("--endpoint") && options.endpoint != endpoint)
      fail(ErrorKind::kInvalidArgument, "--backend {} means --endpoint {}, but --endpoint {} was given; drop one",
           backend, endpoint, options.endpoint);
    options.endpoint = endpoint;
  }
  if (!c.host.empty() || c.port)
    options.base_url =
        "http://" + (c.host.empty() ? "127.0.0.1" : c.host) + ":" + std::to_string(c.port ? c.port : 8000);
  if (options.api_key.empty())
    if (const char* key = std::getenv("OPENAI_API_KEY")) options.api_key = key;
  options.stream = !c.no_stream;
  options.progress = !c.no_progress;
  options.request_rate = parse_request_rate(c.request_rate);
  if (!c.dataset.empty()) {
    options.dataset = c.dataset[0];
    if (c.dataset.size() == 2) options.dataset_path = c.dataset[1];
  }
  if (c.max_concurrency >= 0) {
    if (!options.concurrency.empty())
      fail(ErrorKind::kInvalidArgument, "give either --concurrency (a list of levels) or --max-concurrency, not both");
    options.concurrency = {c.max_concurrency};
  }
  for (int level : options.concurrency)
    if (level < 0) fail(ErrorKind::kInvalidArgument, "--concurrency values must be 0 (unlimited) or positive");
}

}  // namespace

int run_bench(int argc, char** argv) {
  bench::BenchOptions options;
  CLI::App app{
      "Load generator and report for any OpenAI-compatible server (tessera, vLLM, llama-server, ...).\n\n"
      "With no flags it runs the seed protocol against http://127.0.0.1:8000: concurrency 1, 5, 10 and 20,\n"
      "40 requests per level, one fixed prompt, max_tokens 64, temperature 0, and prints QPS, tok/s and\n"
      "latency avg/p50/p95 per level. vLLM benchmark_serving-style runs use --dataset random|jsonl with\n"
      "--num-prompts, --request-rate and --max-concurrency.\n\nExamples:\n"
      "  tessera bench --base-url http://10.0.0.1:8000 --html report.html\n"
      "  tessera bench --dataset random --random-input-len 1024 --random-output-len 128 --num-prompts 100 \\\n"
      "                --request-rate 8 --goodput ttft:500 tpot:50 --json run.json",
      "tessera bench"};
  use_vllm_conventions(app);
  app.get_formatter()->column_width(34);

  BenchCliFlags c;
  add_target_flags(app, options, c);
  add_workload_flags(app, options, c);
  add_load_and_report_flags(app, options, c);
  if (int rc = parse_flags(app, argc, argv); rc >= 0) return rc;
  apply_cli_flags(app, options, c);
  return bench::run_benchmark(std::move(options));
}

}  // namespace tessera::cli
