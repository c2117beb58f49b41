#include <sys/resource.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <thread>

#include "bench/agent_runner.h"
#include "bench/bench_options.h"
#include "bench/load_runner.h"
#include "bench/metrics.h"
#include "bench/report.h"
#include "bench/report_vllm.h"
#include "bench/scripted_server.h"
#include "bench/server_probe.h"
#include "bench/token_counter.h"
#include "core/error.h"
#include "core/progress.h"
#include "core/version.h"

namespace tessera::bench {
namespace {

bool fixed_prompt_mode(const BenchOptions& options) { return options.dataset == "prompt"; }

std::vector<PromptSpec> jsonl_prompts(const BenchOptions& options, size_t count, const TokenCounter* counter) {
  if (options.dataset_path.empty())
    fail(ErrorKind::kInvalidArgument, "--dataset jsonl needs --dataset-path FILE (one JSON object per line)");
  std::vector<PromptSpec> prompts = jsonl_workload(options.dataset_path, options.max_tokens, 0, counter);
  if (options.sharegpt_output_len > 0)
    for (PromptSpec& p : prompts) p.max_tokens = options.sharegpt_output_len;
  // Cycle through the file when more requests are wanted than it holds (unless --no-oversample).
  if (!options.oversample) count = std::min(count, prompts.size());
  std::vector<PromptSpec> out;
  out.reserve(count);
  for (size_t i = 0; i < count; ++i) out.push_back(prompts[i % prompts.size()]);
  return out;
}

std::vector<PromptSpec> build_workload(const BenchOptions& options, size_t count, const TokenCounter* counter) {
  if (options.dataset == "prompt") return fixed_prompt_workload(options.prompt, options.max_tokens, count, counter);
  if (options.dataset == "random") {
    RandomWorkloadOptions random{
        options.random_input_len, options.random_output_len, options.random_range_ratio, count, options.seed,
        options.random_prefix_len};
    return random_workload(random, counter);
  }
  if (options.dataset == "jsonl") return jsonl_prompts(options, count, counter);
  if (options.dataset == "sonnet") {
    SonnetWorkloadOptions sonnet;
    sonnet.path = options.dataset_path;
    sonnet.input_len = options.sonnet_input_len;
    sonnet.output_len = options.sonnet_output_len;
    sonnet.prefix_len = options.sonnet_prefix_len;
    sonnet.count = count;
    sonnet.seed = options.seed;
    // As vLLM: the completions endpoint gets the prompt rendered by the chat template, the chat endpoint the text.
    sonnet.send_formatted = parse_endpoint(options.endpoint) == ApiEndpoint::kCompletions;
    sonnet.chat_template_kwargs = options.chat_template_kwargs;
    return sonnet_workload(sonnet, counter);
  }
  if (options.dataset == "prefix_repetition") {
    PrefixRepetitionOptions prefix{options.prefix_repetition_prefix_len,
                                   options.prefix_repetition_suffix_len,
                                   options.prefix_repetition_num_prefixes,
                                   options.prefix_repetition_output_len,
                                   count,
                                   options.seed,
                                   options.shuffle};
    return prefix_repetition_workload(prefix, counter);
  }
  fail(ErrorKind::kInvalidArgument,
       "--dataset must be prompt, random, jsonl, sonnet or prefix_repetition (or vLLM's sharegpt / custom), got '{}'",
       options.dataset);
}

std::string describe_rate(const BenchOptions& options) {
  if (options.ramp_up != RampUp::kNone)
    return fmt::format("request rate ramped ({}) from {} to {} req/s, burstiness {}", ramp_up_name(options.ramp_up),
                       options.ramp_up_start_rps, options.ramp_up_end_rps, options.burstiness);
  return std::isinf(options.request_rate)
             ? "all at once"
             : fmt::format("{} req/s, burstiness {}", options.request_rate, options.burstiness);
}

std::string describe_workload(const BenchOptions& options, size_t requests) {
  const std::string rate = describe_rate(options);
  if (options.dataset == "prompt")
    return fmt::format("fixed prompt \"{}\", max_tokens {}, {} requests per level, {}", options.prompt,
                       options.max_tokens, requests, rate);
  if (options.dataset == "random")
    return fmt::format(
        "random prompts: {}input {} / output {} tokens, range ratio {}, seed {}, {} requests per level, {}",
        options.random_prefix_len > 0 ? fmt::format("a shared {}-token prefix, then ", options.random_prefix_len) : "",
        options.random_input_len, options.random_output_len, options.random_range_ratio, options.seed, requests, rate);
  if (options.dataset == "sonnet")
    return fmt::format(
        "sonnet prompts from {}: up to {} input tokens with a shared prefix of about {}, output {} tokens, seed {}, "
        "{} requests per level, {}",
        options.dataset_path, options.sonnet_input_len, options.sonnet_prefix_len, options.sonnet_output_len,
        options.seed, requests, rate);
  if (options.dataset == "agent") {
    const AgentOptions& a = options.agent;
    return fmt::format(
        "agent conversations: {} at once x {} turns, each turn a {}-token user message after the previous answer, "
        "max_tokens {}, a shared {}-token system prompt (the last turn's prompt about {} tokens before the chat "
        "template's), reference prompt {} tokens x {}, seed {}",
        a.conversations, a.turns, a.turn_input_len, a.turn_output_len, a.system_prompt_len,
        a.system_prompt_len + a.turns * a.turn_input_len + (a.turns - 1) * a.turn_output_len, a.reference_len,
        a.reference_runs, options.seed);
  }
  if (options.dataset == "prefix_repetition")
    return fmt::format(
        "prefix repetition: {} shared prefixes of {} tokens, each prompt a prefix and its own {}-token suffix, output "
        "{} tokens, seed {}, {} requests per level, {}",
        options.prefix_repetition_num_prefixes, options.prefix_repetition_prefix_len,
        options.prefix_repetition_suffix_len, options.prefix_repetition_output_len, options.seed, requests, rate);
  return fmt::format("prompts from {}, {} requests per level, {}", options.dataset_path, requests, rate);
}

// The time now in `format` (strftime), as UTC or as local time.
std::string format_now(const char* format, bool utc) {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  if (utc)
    gmtime_r(&now, &tm);
  else
    localtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof text, format, &tm);
  return text;
}

// Thousands of concurrent streams need thousands of descriptors; the soft limit is often 1024.
void raise_open_file_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
}

void write_file(const std::string& path, const std::string& text, const char* what) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out) fail(ErrorKind::kNotFound, "cannot write the {} report to '{}': check that the folder exists", what, path);
  std::cerr << "wrote " << what << " report " << path << "\n";
}

// A level in which every request failed the same way usually means a setting is wrong.
std::optional<std::string> advice_for(const LevelMetrics& level, const BenchOptions& options) {
  if (level.completed || level.failures_by_kind.size() != 1) return std::nullopt;
  const std::string& kind = level.failures_by_kind.begin()->first;
  if (kind == "http_401" || kind == "http_403") return "the server refused every request: check --api-key";
  if (kind == "http_404") return "the server answered 404 to every request: check --endpoint and --model";
  if (kind == "http_400")
    return "the server rejected every request as invalid (" + level.failure_example.begin()->second +
           "): check --model, --max-tokens and --endpoint";
  if (kind == "connect_error") return "no request could connect to " + options.base_url + ": check --base-url";
  if (kind == "timeout") return "every request timed out: raise --timeout or lower the load";
  return std::nullopt;
}

std::vector<std::string> collect_notes(const BenchOptions& options, const std::vector<LevelMetrics>& levels,
                                       bool has_template) {
  std::vector<std::string> notes;
  size_t without_usage = 0;
  for (const LevelMetrics& level : levels) without_usage += level.requests_without_usage;
  if (without_usage && options.tokenizer_dir.empty())
    notes.push_back(fmt::format(
        "{} successful requests came without 'usage': their completion tokens are the number of streamed text chunks "
        "and their prompt tokens an estimate from the prompt's length, so token throughputs are estimates "
        "(--tokenizer DIR counts them exactly)",
        without_usage));
  if (without_usage && !options.tokenizer_dir.empty())
    notes.push_back(fmt::format(
        "{} successful requests came without 'usage': their tokens were counted with the tokenizer in {} (prompt "
        "counts leave out the chat template's tokens)",
        without_usage, options.tokenizer_dir));
  if ((options.dataset == "random" || options.dataset == "prefix_repetition" || options.dataset == "agent") &&
      options.tokenizer_dir.empty())
    notes.push_back(
        fmt::format("{} prompts are words that are one token each in common BPE vocabularies, so prompt lengths "
                    "are approximate (no tokenizer is used); the server's usage gives the true counts",
                    options.dataset));
  if (options.dataset == "sonnet" && options.tokenizer_dir.empty())
    notes.push_back(
        "sonnet prompt lengths were estimated at 4 characters per token (no tokenizer, so no chat template either): "
        "--tokenizer DIR counts them as vLLM does");
  if (options.dataset == "sonnet" && !has_template && parse_endpoint(options.endpoint) == ApiEndpoint::kCompletions)
    notes.push_back(
        "sonnet prompts went to /v1/completions without a chat template (vLLM renders them with the model's): give "
        "--tokenizer DIR with a chat template to send them rendered");
  if (options.dataset == "jsonl" && options.tokenizer_dir.empty())
    notes.push_back("output lengths taken from ShareGPT answers are estimated at 4 characters per token");
  if (!options.stream) notes.push_back("streaming was off: TTFT equals end-to-end latency and ITL is not measured");
  if (options.self_test)
    notes.push_back("self-test: an in-process loopback server answered instantly; the figures measure the client");
  return notes;
}

ArrivalProcess arrival_process(const BenchOptions& options) {
  ArrivalProcess arrivals{options.request_rate, options.burstiness};
  arrivals.ramp = options.ramp_up;
  arrivals.ramp_start_rps = options.ramp_up_start_rps;
  arrivals.ramp_end_rps = options.ramp_up_end_rps;
  return arrivals;
}

// vLLM's --num-warmups: copies of the first prompt, all released at once under the level's concurrency limit,
// before the level; their results are dropped.
void warm_up(boost::asio::io_context& io, HttpClient& client, const std::vector<PromptSpec>& prompts, int level,
             const RequestSettings& settings, int count) {
  if (count <= 0 || prompts.empty()) return;
  std::cerr << "warming up with " << count << " requests\n";
  LevelConfig config;
  config.label = "warm-up";
  config.max_concurrency = level;
  const std::vector<PromptSpec> warmups(static_cast<size_t>(count), prompts.front());
  (void)run_level(io, client, warmups, config, settings, nullptr);
}

// Whether a run prints vLLM's result block: vLLM-style runs (a dataset, or --save-result).
bool vllm_output(const BenchOptions& options) {
  return options.save_result || options.append_result || !fixed_prompt_mode(options);
}

VllmResultSettings vllm_settings(const BenchOptions& options, const std::string& date, size_t requests, int level) {
  VllmResultSettings s;
  s.date = date;
  s.backend = options.backend;
  s.label = options.label;
  s.model_id = options.model_id.empty() ? options.model : options.model_id;
  s.tokenizer_id = options.tokenizer_dir.empty() ? s.model_id : options.tokenizer_dir;
  s.num_prompts = requests;
  s.request_rate = options.request_rate;
  s.burstiness = options.burstiness;
  s.arrivals = arrival_process(options);
  if (level > 0) s.max_concurrency = level;
  s.metadata = options.metadata;
  s.metrics = parse_percentile_metrics(options.percentile_metrics);
  s.percentiles = parse_metric_percentiles(options.metric_percentiles);
  s.goodput = !options.goodput.empty();
  s.detailed = options.save_detailed;
  return s;
}

// --save-result / --append-result: the level's result JSON where vLLM puts it (--result-dir,
// --result-filename; several levels add -concurrencyN to a given file name).
void save_vllm_result(const BenchOptions& options, const VllmResultSettings& s, const nlohmann::ordered_json& j,
                      size_t levels) {
  std::string name = options.result_filename.empty() ? vllm_result_filename(s) : options.result_filename;
  if (!options.result_filename.empty() && levels > 1) {
    const std::string tag = s.max_concurrency ? fmt::format("-concurrency{}", *s.max_concurrency) : "-unlimited";
    const size_t dot = name.rfind(".json");
    name = dot == std::string::npos ? name + tag : name.substr(0, dot) + tag + name.substr(dot);
  }
  if (!options.result_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(options.result_dir, ec);
    name = (std::filesystem::path(options.result_dir) / name).string();
  }
  std::ofstream out(name, options.append_result ? std::ios::app : std::ios::trunc);
  if (options.append_result && out.tellp() > 0) out << "\n";
  out << j.dump();
  if (!out) fail(ErrorKind::kNotFound, "cannot write the result JSON to '{}': check --result-dir", name);
  std::cerr << "wrote result JSON " << name << "\n";
}

std::vector<int> levels_of(const BenchOptions& options) {
  if (!options.concurrency.empty()) return options.concurrency;
  if (fixed_prompt_mode(options)) return {1, 5, 10, 20};
  return {0};
}

// Successful requests that came without usage: their completion tokens counted with --tokenizer.
void count_tokens_without_usage(std::vector<RequestRecord>& records, const TokenCounter* counter) {
  if (!counter) return;
  for (RequestRecord& record : records)
    if (record.success && !record.usage_reported) record.completion_tokens = counter->count(record.output_text);
}

// A level in which every request failed the same way: the report so far, then the advice as the error.
void stop_on_advice(const LevelMetrics& metrics, const BenchOptions& options, BenchReport& report) {
  auto advice = advice_for(metrics, options);
  if (!advice) return;
  report.levels.push_back(metrics);
  std::cout << format_terminal_report(report);
  fail(ErrorKind::kNetwork, "{}", *advice);
}

using VllmResults = std::vector<std::pair<VllmResultSettings, nlohmann::ordered_json>>;

// Every level of the prompt-list datasets, into report.levels (and vLLM's result per level).
void run_levels(const BenchOptions& options, boost::asio::io_context& io, HttpClient& client,
                const std::vector<PromptSpec>& prompts, const RequestSettings& settings, const TokenCounter* counter,
                BenchReport& report, VllmResults& vllm_results) {
  std::vector<int> levels = levels_of(options);
  const std::string date = format_now("%Y%m%d-%H%M%S", false);  // vLLM's result date
  ProgressBar progress(ProgressBar::Layout::kLevel, options.progress);
  for (size_t i = 0; i < levels.size(); ++i) {
    LevelConfig level;
    level.max_concurrency = levels[i];
    level.label = levels[i] > 0 ? fmt::format("concurrency {}", levels[i]) : std::string("unlimited");
    level.arrivals = arrival_process(options);
    level.seed = options.seed + i;
    level.request_id_prefix = options.request_id_prefix;
    warm_up(io, client, prompts, levels[i], settings, options.num_warmups);
    progress.start(level.label, prompts.size(), i, levels.size());
    ProgressHandler on_progress = [&](size_t done, size_t, size_t in_flight) { progress.update(done, in_flight); };
    LevelResult result = run_level(io, client, prompts, level, settings, on_progress);
    count_tokens_without_usage(result.records, counter);
    LevelMetrics metrics = compute_level_metrics(result, report.slo);
    if (vllm_output(options)) {
      VllmResultSettings vs = vllm_settings(options, date, prompts.size(), levels[i]);
      nlohmann::ordered_json j = vllm_result_json(result, metrics, vs);
      vllm_results.emplace_back(std::move(vs), std::move(j));
    }
    progress.finish(fmt::format("{} ok, {} failed in {:.2f} s", metrics.completed, metrics.failed, metrics.duration_s));
    stop_on_advice(metrics, options, report);
    report.levels.push_back(std::move(metrics));
  }
}

// --dataset-name agent: the reference requests, then the conversations as one level (every turn's
// request), and the per-turn figures.
void run_agent_level(const BenchOptions& options, boost::asio::io_context& io, HttpClient& client,
                     const RequestSettings& settings, const TokenCounter* counter, BenchReport& report) {
  AgentOptions agent = options.agent;
  agent.seed = options.seed;
  const AgentWorkload workload = agent_workload(agent, counter);
  if (agent.reference_runs > 0)
    std::cerr << fmt::format("reference: {} request(s) of a {}-token prompt, one at a time\n", agent.reference_runs,
                             agent.reference_len);
  ProgressBar progress(ProgressBar::Layout::kLevel, options.progress);
  progress.start(fmt::format("{} conversations", agent.conversations),
                 static_cast<size_t>(agent.conversations) * static_cast<size_t>(agent.turns));
  ProgressHandler on_progress = [&](size_t done, size_t, size_t in_flight) { progress.update(done, in_flight); };
  AgentRunResult result = run_agent(io, client, workload, agent, settings, on_progress);
  count_tokens_without_usage(result.conversations.records, counter);
  count_tokens_without_usage(result.reference, counter);
  LevelMetrics metrics = compute_level_metrics(result.conversations, report.slo);
  progress.finish(fmt::format("{} ok, {} failed, {} not sent in {:.2f} s", metrics.completed, metrics.failed,
                              result.turns_not_sent, metrics.duration_s));
  report.agent = compute_agent_metrics(result, agent);
  stop_on_advice(metrics, options, report);
  report.levels.push_back(std::move(metrics));
  if (report.agent->later_without_cached_tokens)
    report.notes.push_back(fmt::format(
        "{} successful requests of turns 2-{} came without usage.prompt_tokens_details.cached_tokens: the hit rate "
        "counts only the others",
        report.agent->later_without_cached_tokens, agent.turns));
}

}  // namespace

int run_benchmark(BenchOptions options) {
  raise_open_file_limit();
  SloTargets slo = parse_slo_targets(options.goodput);
  ApiEndpoint endpoint = parse_endpoint(options.endpoint);
  const bool agent = options.dataset == "agent";
  if (agent && endpoint != ApiEndpoint::kChatCompletions)
    fail(ErrorKind::kInvalidArgument,
         "--dataset-name agent sends conversations (message lists): it needs --endpoint /v1/chat/completions");
  if (agent && !options.stream)
    fail(ErrorKind::kInvalidArgument,
         "--dataset-name agent measures TTFT per turn: it needs streaming (drop --no-stream)");
  if (options.max_tokens < 1) fail(ErrorKind::kInvalidArgument, "--max-tokens must be at least 1");
  if (!(options.timeout_s > 0)) fail(ErrorKind::kInvalidArgument, "--timeout must be positive (seconds)");
  if (agent) check_agent_options(options.agent);
  size_t requests = options.requests_per_level ? options.requests_per_level : fixed_prompt_mode(options) ? 40 : 1000;
  std::unique_ptr<TokenCounter> counter;
  if (!options.tokenizer_dir.empty()) counter = TokenCounter::load(options.tokenizer_dir);
  std::vector<PromptSpec> prompts;
  if (!agent) prompts = build_workload(options, requests, counter.get());

  std::unique_ptr<ScriptedServer> self_test_server;
  if (options.self_test) {
    // Spare cores serve, so that the server is less likely than the client to be the limit.
    int server_threads = std::clamp(static_cast<int>(std::thread::hardware_concurrency()) - 1, 1, 4);
    self_test_server = std::make_unique<ScriptedServer>(
        [](size_t, const nlohmann::json&) { return ScriptedResponse{}; }, server_threads);
    options.base_url = self_test_server->base_url();
  }

  boost::asio::io_context io;
  HttpClient client(io, parse_base_url(options.base_url), options.api_key, options.headers);
  auto timeout = std::chrono::milliseconds(static_cast<long long>(options.timeout_s * 1000));
  if (options.model.empty())
    options.model = discover_model(io, client, std::min(timeout, std::chrono::milliseconds(30000)));

  RequestSettings settings;
  settings.endpoint = endpoint;
  settings.generation =
      GenerationParams{options.model, options.temperature, options.stream, options.ignore_eos, options.extra_body};
  build_request_body(ApiEndpoint::kChatCompletions, PromptSpec{}, settings.generation);  // a bad --extra-body fails now
  settings.timeout = timeout;
  settings.keep_output_text = counter != nullptr || options.save_detailed;

  BenchReport report;
  report.tool_version = TESSERA_VERSION_STRING;
  report.started_at_utc = format_now("%Y-%m-%dT%H:%M:%SZ", true);
  report.base_url = options.base_url;
  report.endpoint = endpoint_path(endpoint);
  report.model = options.model;
  report.stream = options.stream;
  report.temperature = options.temperature;
  report.workload = describe_workload(options, requests);
  report.slo = slo;

  VllmResults vllm_results;
  if (agent)
    run_agent_level(options, io, client, settings, counter.get(), report);
  else
    run_levels(options, io, client, prompts, settings, counter.get(), report, vllm_results);
  std::vector<std::string> notes = collect_notes(options, report.levels, counter && counter->has_chat_template());
  report.notes.insert(report.notes.begin(), notes.begin(), notes.end());

  std::cout << format_terminal_report(report) << std::flush;
  for (const auto& [vs, j] : vllm_results) {
    std::cout << "\n" << vllm_result_block(j, vs) << std::flush;
    if (options.save_result || options.append_result) save_vllm_result(options, vs, j, vllm_results.size());
  }
  if (!options.json_path.empty()) write_file(options.json_path, report_to_json(report).dump(2) + "\n", "JSON");
  if (!options.markdown_path.empty()) write_file(options.markdown_path, report_to_markdown(report), "Markdown");
  if (!options.html_path.empty()) write_file(options.html_path, report_to_html(report), "HTML");

  size_t succeeded = 0;
  for (const LevelMetrics& level : report.levels) succeeded += level.completed;
  return succeeded ? 0 : 1;
}

}  // namespace tessera::bench
