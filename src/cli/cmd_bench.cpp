// `tessera bench`: load generator and report for any OpenAI-compatible server.
#include <CLI/CLI.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

#include "bench/arrival.h"
#include "bench/bench_options.h"
#include "bench/report_vllm.h"
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
  std::string host, request_rate = "inf", backend, served_model_name, tokenizer_mode = "auto";
  int port = 0;
  std::vector<std::string> dataset;
  int max_concurrency = -1;
  int input_len = 0, output_len = 0;
  bool no_stream = false, no_progress = false, disable_tqdm = false, trust_remote_code = false;
  std::optional<double> top_p, min_p, frequency_penalty, presence_penalty, repetition_penalty;
  std::optional<int> top_k, logprobs, custom_output_len;
  std::string ramp_up_strategy;
  std::optional<int> ramp_up_start_rps, ramp_up_end_rps;
  std::vector<std::string> headers;
  bool disable_shuffle = false, no_oversample = false, skip_tokenizer_init = false;
  // vLLM flags that are accepted without effect or refused (kVllmPassiveFlags); their values are not used.
  std::vector<std::vector<std::string>> passive_values;
};

// vLLM bench serve's flags that have no meaning here: accepted without effect (advice null) or refused with
// what to do instead. Each may be given with or without values.
struct PassiveFlag {
  const char* name;
  const char* help;    // accepted: what it would do and why it does nothing here
  const char* advice;  // refused: what to use instead; nullptr when accepted
};

constexpr const char* kOtherDataset = "its dataset's option; no effect: tessera bench refuses that dataset";
constexpr const char* kUseHtml =
    "use --html FILE: tessera's report draws the latency distributions and throughput of the run";

const PassiveFlag kVllmPassiveFlags[] = {
    {"--skip-chat-template", "no effect: custom and sharegpt prompts are always sent as the file has them", nullptr},
    {"--ready-check-timeout-sec", "no effect: tessera bench sends no ready check (vLLM skips it by default)", nullptr},
    {"--insecure", "no effect: tessera bench speaks plain http (https URLs are refused)", nullptr},
    {"--enable-multimodal-chat", "no effect: tessera bench sends text only", nullptr},
    {"--custom-ensure-client-side-data", "no effect: tessera bench sends text only", nullptr},
    {"--hf-subset", kOtherDataset, nullptr},
    {"--hf-split", kOtherDataset, nullptr},
    {"--hf-name", kOtherDataset, nullptr},
    {"--hf-output-len", kOtherDataset, nullptr},
    {"--blazedit-min-distance", kOtherDataset, nullptr},
    {"--blazedit-max-distance", kOtherDataset, nullptr},
    {"--random-batch-size", kOtherDataset, nullptr},
    {"--no-reranker", kOtherDataset, nullptr},
    {"--random-mm-base-items-per-request", kOtherDataset, nullptr},
    {"--random-mm-num-mm-items-range-ratio", kOtherDataset, nullptr},
    {"--random-mm-limit-mm-per-prompt", kOtherDataset, nullptr},
    {"--random-mm-bucket-config", kOtherDataset, nullptr},
    {"--spec-bench-output-len", kOtherDataset, nullptr},
    {"--spec-bench-category", kOtherDataset, nullptr},
    {"--speed-bench-dataset-subset", kOtherDataset, nullptr},
    {"--speed-bench-category", kOtherDataset, nullptr},
    {"--speed-bench-output-len", kOtherDataset, nullptr},
    {"--asr-min-audio-len-sec", kOtherDataset, nullptr},
    {"--asr-max-audio-len-sec", kOtherDataset, nullptr},
    {"--timed-trace-chunk-hash-size", kOtherDataset, nullptr},
    {"--timed-trace-sec-multiplier", kOtherDataset, nullptr},
    {"--bfcl-categories", kOtherDataset, nullptr},
    {"--use-beam-search", nullptr, "tessera bench sends sampling requests only; drop the flag"},
    {"--profile", nullptr,
     "tessera bench does not drive a server profiler (vLLM's /start_profile); drop the flag and profile the server "
     "process itself (e.g. under nsys)"},
    {"--lora-modules", nullptr, "benchmark one adapter per run: give its name with --served-model-name"},
    {"--lora-assignment", nullptr, "benchmark one adapter per run: give its name with --served-model-name"},
    {"--plot-timeline", nullptr, kUseHtml},
    {"--timeline-itl-thresholds", nullptr, kUseHtml},
    {"--plot-dataset-stats", nullptr, kUseHtml},
    {"--self-timed", nullptr,
     "it replays the timestamps of a timed_trace dataset, which tessera bench does not read; shape the arrivals with "
     "--request-rate and --burstiness, or --ramp-up-strategy"},
    {"--no-self-timed", nullptr, "it belongs to the timed_trace dataset, which tessera bench does not read; drop it"},
    {"--probe-request-rate", nullptr,
     "run a second tessera bench with a low --request-rate beside this one and compare its latencies"},
};

// vLLM's datasets that tessera bench does not generate, with what to do instead.
const std::pair<const char*, const char*> kRefusedDatasets[] = {
    {"hf",
     "Hugging Face datasets need the network: download the dataset, write its prompts as JSONL ({\"prompt\": ...} "
     "per line) and use --dataset-name custom --dataset-path FILE (or a ShareGPT JSON file with --dataset-name "
     "sharegpt)"},
    {"burstgpt",
     "tessera bench does not read BurstGPT's CSV: use --dataset-name random with its lengths (--random-input-len, "
     "--random-output-len, --random-range-ratio)"},
    {"random-mm", "tessera bench sends text only: use --dataset-name random"},
    {"random-rerank", "tessera bench measures generation, not reranking: use --dataset-name random"},
    {"custom_audio", "tessera bench sends text only: use --dataset-name custom with text prompts"},
    {"custom_image", "tessera bench sends text only: use --dataset-name custom with text prompts"},
    {"custom_mm", "tessera bench sends text only: use --dataset-name custom with text prompts"},
    {"spec_bench",
     "write each question's first turn as {\"prompt\": ...} lines and use --dataset-name custom --dataset-path FILE"},
    {"speed_bench",
     "write each sample's prompt as {\"prompt\": ...} lines and use --dataset-name custom --dataset-path FILE"},
    {"txt-slices",
     "use --dataset-name sonnet --dataset-path FILE (prompts of lines drawn from a text file), or random"},
    {"timed_trace",
     "replaying a trace's timestamps is not supported: shape the arrivals with --request-rate and --burstiness, or "
     "--ramp-up-strategy"},
};

// The server: where, which API, which model, how long to wait.
void add_target_flags(CLI::App& app, bench::BenchOptions& options, BenchCliFlags& c) {
  app.add_option("--base-url", options.base_url, "server address, http://HOST:PORT (a trailing /v1 is fine)")
      ->capture_default_str();
  app.add_option("--host", c.host, "server host, instead of --base-url (vLLM's spelling)");
  app.add_option("--port", c.port, "server port, used with --host (default 8000)");
  app.add_option("--endpoint", options.endpoint, "API route: /v1/chat/completions or /v1/completions")
      ->capture_default_str();
  app.add_option("--backend,--endpoint-type", c.backend,
                 "vLLM benchmark_serving's spelling of the API: openai-chat (/v1/chat/completions), openai or vllm "
                 "(/v1/completions)");
  app.add_option("--api-key", options.api_key,
                 "sent as 'Authorization: Bearer KEY'; defaults to $OPENAI_API_KEY when that is set");
  app.add_option("--header", c.headers,
                 "KEY=VALUE header fields sent with every request (vLLM's form; several pairs, or the flag again); "
                 "they replace tessera's own fields of the same name, e.g. Authorization")
      ->expected(1, -1);
  app.add_option("--model", options.model, "model name sent in requests (default: the first id of GET /v1/models)");
  app.add_flag("--no-stream", c.no_stream,
               "ask for whole responses instead of SSE streams (then TTFT = latency, no ITL)");
  app.add_option("--timeout", options.timeout_s, "seconds one request may take before it counts as a timeout")
      ->capture_default_str();
}

// What is sent: the dataset, prompt lengths, sampling.
void add_workload_flags(CLI::App& app, bench::BenchOptions& options, BenchCliFlags& c) {
  app.add_option("--dataset,--dataset-name", c.dataset,
                 "workload: 'prompt' (one fixed prompt, the default), 'random' (generated prompts of chosen length), "
                 "'jsonl FILE' (one JSON object per line: prompt|text, or ShareGPT conversations; vLLM's 'sharegpt' "
                 "and 'custom' are read so), 'sonnet' (poem lines of --dataset-path, vLLM's), 'prefix_repetition' "
                 "(random prompts sharing a few prefixes, vLLM's) or 'agent' (concurrent multi-turn conversations "
                 "sharing a long system prompt, as coding agents send them: TTFT per turn and the prefix-cache hit "
                 "rate; the --agent-* flags)")
      ->expected(1, 2);
  app.add_option("--dataset-path", options.dataset_path,
                 "the file for --dataset jsonl / sharegpt / custom (JSONL, or a ShareGPT JSON array) or sonnet (a text "
                 "file of poem lines, e.g. vLLM's benchmarks/sonnet.txt)");
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
               "ask the server to generate exactly max_tokens (vLLM's ignore_eos; others may ignore it); on with "
               "--dataset random, as in vLLM");
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

// vLLM bench serve's flags beyond the ones above: its result file, percentiles, sampling, length aliases.
void add_vllm_bench_flags(CLI::App& app, bench::BenchOptions& options, BenchCliFlags& c) {
  const char* g = "vLLM bench serve";
  app.add_flag("--save-result", options.save_result,
               "write vLLM's result JSON (its keys: completed, request_throughput, mean_ttft_ms, p99_ttft_ms, ...) "
               "to --result-dir/--result-filename, default {label or backend}-{rate}qps[-concurrencyN]-{model}-"
               "{date}.json")
      ->group(g);
  app.add_flag("--save-detailed", options.save_detailed,
               "keep the per-request lists in the result JSON (input_lens, output_lens, ttfts, itls, "
               "generated_texts, errors)")
      ->group(g);
  app.add_flag("--append-result", options.append_result, "append the result JSON as a line of the file")->group(g);
  app.add_option("--result-dir", options.result_dir, "folder of the result JSON (created)")->group(g);
  app.add_option("--result-filename", options.result_filename,
                 "file name of the result JSON (several levels: -concurrencyN before .json)")
      ->group(g);
  app.add_option("--label", options.label, "the result's label and file-name prefix (default: --backend)")->group(g);
  app.add_option("--metadata", options.metadata, "KEY=VALUE pairs copied into the result JSON")
      ->expected(1, -1)
      ->group(g);
  app.add_option("--percentile-metrics", options.percentile_metrics,
                 "metrics reported with mean/median/std/percentiles: any of ttft,tpot,itl,e2el")
      ->capture_default_str()
      ->group(g);
  app.add_option("--metric-percentiles", options.metric_percentiles, "percentiles reported, e.g. 50,90,99")
      ->capture_default_str()
      ->group(g);
  app.add_flag("--disable-tqdm", c.disable_tqdm, "no progress bar (as --no-progress)")->group(g);
  app.add_option("--served-model-name", c.served_model_name,
                 "the model name sent in requests when it differs from --model (--model then names the result's "
                 "model_id and, when it is a folder with tokenizer.json, the tokenizer)")
      ->group(g);
  app.add_option("--sharegpt-output-len", options.sharegpt_output_len,
                 "max_tokens of every ShareGPT / jsonl prompt instead of its answer's length")
      ->group(g);
  app.add_option("--input-len", c.input_len, "the random dataset's --random-input-len")->group(g);
  app.add_option("--output-len", c.output_len, "--random-output-len and --sharegpt-output-len at once")->group(g);
  app.add_option("--tokenizer-mode", c.tokenizer_mode, "auto | hf | slow: tokenizer.json is read either way")->group(g);
  app.add_flag("--trust-remote-code", c.trust_remote_code, "no effect: no code from the model folder is run")->group(g);
  app.add_option("--top-p", c.top_p, "top_p of every request")->group(g);
  app.add_option("--top-k", c.top_k, "top_k of every request")->group(g);
  app.add_option("--min-p", c.min_p, "min_p of every request")->group(g);
  app.add_option("--frequency-penalty", c.frequency_penalty, "frequency_penalty of every request")->group(g);
  app.add_option("--presence-penalty", c.presence_penalty, "presence_penalty of every request")->group(g);
  app.add_option("--repetition-penalty", c.repetition_penalty, "repetition_penalty of every request")->group(g);
}

// vLLM's sonnet and prefix_repetition datasets and the options of its file datasets.
void add_vllm_dataset_flags(CLI::App& app, bench::BenchOptions& options, BenchCliFlags& c) {
  const char* g = "vLLM bench serve datasets";
  app.add_option("--sonnet-input-len", options.sonnet_input_len,
                 "sonnet: most prompt tokens (the instruction, the shared lines, then lines drawn at random)")
      ->capture_default_str()
      ->group(g);
  app.add_option("--sonnet-output-len", options.sonnet_output_len, "sonnet: max_tokens of every request")
      ->capture_default_str()
      ->group(g);
  app.add_option("--sonnet-prefix-len", options.sonnet_prefix_len,
                 "sonnet: tokens of the prefix every prompt shares (the instruction and the file's first lines)")
      ->capture_default_str()
      ->group(g);
  app.add_option("--prefix-repetition-prefix-len", options.prefix_repetition_prefix_len,
                 "prefix_repetition: tokens of each shared random prefix")
      ->capture_default_str()
      ->group(g);
  app.add_option("--prefix-repetition-suffix-len", options.prefix_repetition_suffix_len,
                 "prefix_repetition: tokens of each prompt's own random suffix after its prefix")
      ->capture_default_str()
      ->group(g);
  app.add_option("--prefix-repetition-num-prefixes", options.prefix_repetition_num_prefixes,
                 "prefix_repetition: how many prefixes --num-prompts are split among (at most --num-prompts)")
      ->capture_default_str()
      ->group(g);
  app.add_option("--prefix-repetition-output-len", options.prefix_repetition_output_len,
                 "prefix_repetition: max_tokens of every request")
      ->capture_default_str()
      ->group(g);
  app.add_flag("--disable-shuffle", c.disable_shuffle,
               "prefix_repetition: keep the prompts grouped by prefix instead of shuffling them (files are always "
               "read in order)")
      ->group(g);
  app.add_flag("--no-oversample", c.no_oversample,
               "jsonl / sharegpt / custom: at most one request per entry of the file (else the file is repeated up "
               "to --num-prompts)")
      ->group(g);
  app.add_option("--custom-output-len", c.custom_output_len,
                 "custom: max_tokens of the requests whose line gives none (default 256, vLLM's)")
      ->group(g);
  app.add_option("--chat-template-kwargs", options.chat_template_kwargs,
                 "JSON object for the chat template where tessera bench renders prompts itself (sonnet on "
                 "/v1/completions), e.g. '{\"enable_thinking\": false}'")
      ->group(g);
}

// --dataset-name agent: multi-turn conversations sharing a system prompt (vLLM's benchmarks/multi_turn calls the
// conversations clients, SGLang's multi-turn bench rounds the turns).
void add_agent_flags(CLI::App& app, bench::BenchOptions& options) {
  const char* g = "agent conversations (--dataset-name agent)";
  bench::AgentOptions& a = options.agent;
  app.add_option("--agent-conversations", a.conversations,
                 "conversations run at once, each a client sending its turns one after another")
      ->capture_default_str()
      ->group(g);
  app.add_option("--agent-turns", a.turns,
                 "turns (requests) per conversation; turn N+1 sends turn N's messages, the answer the server gave "
                 "and a new user message")
      ->capture_default_str()
      ->group(g);
  app.add_option("--agent-system-prompt-len", a.system_prompt_len,
                 "tokens of the system prompt that starts every conversation (the same text in all)")
      ->capture_default_str()
      ->group(g);
  app.add_option("--agent-turn-input-len", a.turn_input_len, "tokens of each turn's new user message")
      ->capture_default_str()
      ->group(g);
  app.add_option("--agent-turn-output-len", a.turn_output_len,
                 "max_tokens of each turn, sent with ignore_eos so that every answer has this many tokens")
      ->capture_default_str()
      ->group(g);
  app.add_option("--agent-reference-len", a.reference_len,
                 "tokens of the reference prompt: sent alone (one user message) before the conversations start; "
                 "the report divides the mean TTFT of turns 2..N by its median TTFT")
      ->capture_default_str()
      ->group(g);
  app.add_option("--agent-reference-runs", a.reference_runs,
                 "reference requests, one at a time, each with its own text (no prefix-cache hit); 0: none")
      ->capture_default_str()
      ->group(g);
  app.add_option("--agent-reference-output-len", a.reference_output_len,
                 "max_tokens of each reference request (TTFT does not depend on it)")
      ->capture_default_str()
      ->group(g);
}

// The agent flags only with --dataset-name agent; its conversations set the load, so the flags of the prompt-list
// datasets' load and prompts are refused with it.
void apply_agent_flags(const CLI::App& app, const bench::BenchOptions& options) {
  const char* agent_flags[] = {
      "--agent-conversations",   "--agent-turns",         "--agent-system-prompt-len", "--agent-turn-input-len",
      "--agent-turn-output-len", "--agent-reference-len", "--agent-reference-runs",    "--agent-reference-output-len"};
  if (options.dataset != "agent") {
    for (const char* flag : agent_flags)
      if (app.count(flag)) throw FlagError(fmt::format("{} needs --dataset-name agent", flag));
    return;
  }
  const char* refused[] = {"--num-prompts",   "--concurrency",       "--max-concurrency",   "--request-rate",
                           "--burstiness",    "--ramp-up-strategy",  "--num-warmups",       "--prompt",
                           "--max-tokens",    "--random-input-len",  "--random-output-len", "--input-len",
                           "--output-len",    "--dataset-path",      "--save-result",       "--append-result",
                           "--save-detailed", "--request-id-prefix", "--no-stream"};
  for (const char* flag : refused)
    if (app.count(flag))
      throw FlagError(fmt::format(
          "{} has no meaning with --dataset-name agent: --agent-conversations, --agent-turns and the --agent-*-len "
          "flags set its load and lengths; the per-turn report goes to the terminal and --json / --markdown / "
          "--html",
          flag));
  if (options.endpoint != "/v1/chat/completions")
    throw FlagError(fmt::format(
        "--dataset-name agent sends conversations (message lists) to /v1/chat/completions, not {}: drop --endpoint "
        "/ --backend, or give --backend openai-chat",
        options.endpoint));
  bench::check_agent_options(options.agent);
}

// vLLM's load shape and request flags beyond --request-rate / --max-concurrency.
void add_vllm_load_flags(CLI::App& app, bench::BenchOptions& options, BenchCliFlags& c) {
  const char* g = "vLLM bench serve load";
  app.add_option("--num-warmups", options.num_warmups,
                 "requests sent before each level (copies of the first prompt, all at once under the level's "
                 "concurrency limit); not counted in any result")
      ->capture_default_str()
      ->group(g);
  app.add_option("--ramp-up-strategy", c.ramp_up_strategy,
                 "linear | exponential: the request rate ramps from --ramp-up-start-rps to --ramp-up-end-rps over "
                 "the run (request i of n at start + (end - start) * i / (n - 1), or start * (end / start)^(i / "
                 "(n - 1))); excludes --request-rate")
      ->group(g);
  app.add_option("--ramp-up-start-rps", c.ramp_up_start_rps, "the ramp's first rate, requests per second (>= 1)")
      ->group(g);
  app.add_option("--ramp-up-end-rps", c.ramp_up_end_rps, "the ramp's last rate (>= --ramp-up-start-rps)")->group(g);
  app.add_option("--request-id-prefix", options.request_id_prefix,
                 "send each request with the header x-request-id PREFIX{prompt index}")
      ->group(g);
  app.add_option("--logprobs", c.logprobs,
                 "logprobs of every request: \"logprobs\": N on /v1/completions, \"logprobs\": true and "
                 "\"top_logprobs\": N on /v1/chat/completions (--extra-body wins)")
      ->group(g);
  app.add_flag("--skip-tokenizer-init", c.skip_tokenizer_init,
               "load no tokenizer (neither --tokenizer nor --model's folder): token counts come from the server's "
               "usage or estimates")
      ->group(g);
  c.passive_values.reserve(std::size(kVllmPassiveFlags));  // CLI11 keeps pointers into it
  for (const PassiveFlag& flag : kVllmPassiveFlags)
    app.add_option(flag.name, c.passive_values.emplace_back(), flag.advice ? "" : flag.help)
        ->expected(0, -1)
        ->type_name("[VALUE...]")
        ->group(flag.advice ? "" : "vLLM bench serve (accepted, no effect)");
}

// vLLM's sampling flags, the length aliases and the model/tokenizer split into `options`.
void apply_vllm_bench_flags(const CLI::App& app, bench::BenchOptions& options, const BenchCliFlags& c) {
  // A malformed --extra-body is left for the request builder, whose error names the flag.
  nlohmann::json extra =
      options.extra_body.empty() ? nlohmann::json::object() : nlohmann::json::parse(options.extra_body, nullptr, false);
  auto put = [&](const char* key, const auto& value) {
    if (value && extra.is_object() && !extra.contains(key)) extra[key] = *value;  // --extra-body wins, as in vLLM
  };
  put("top_p", c.top_p);
  put("top_k", c.top_k);
  put("min_p", c.min_p);
  put("frequency_penalty", c.frequency_penalty);
  put("presence_penalty", c.presence_penalty);
  put("repetition_penalty", c.repetition_penalty);
  if (c.logprobs && options.endpoint.find("chat") == std::string::npos) {
    put("logprobs", c.logprobs);
  } else if (c.logprobs) {
    put("logprobs", std::optional<bool>(true));
    put("top_logprobs", c.logprobs);
  }
  if (extra.is_object() && !extra.empty()) options.extra_body = extra.dump();
  if (c.input_len > 0) options.random_input_len = c.input_len;
  if (c.output_len > 0) options.random_output_len = options.sharegpt_output_len = c.output_len;
  if (c.tokenizer_mode != "auto" && c.tokenizer_mode != "hf" && c.tokenizer_mode != "slow")
    fail(ErrorKind::kUnsupported, "--tokenizer-mode {}: tessera bench reads tokenizer.json; use auto",
         c.tokenizer_mode);
  if (!c.served_model_name.empty()) {
    options.model_id = options.model;
    options.model = c.served_model_name;
  }
  // vLLM reads the tokenizer from --model: a local folder with tokenizer.json serves the same purpose here.
  const std::string& model_dir = options.model_id.empty() ? options.model : options.model_id;
  if (options.tokenizer_dir.empty() && !model_dir.empty() &&
      std::filesystem::exists(std::filesystem::path(model_dir) / "tokenizer.json"))
    options.tokenizer_dir = model_dir;
  if (c.skip_tokenizer_init) options.tokenizer_dir.clear();
  if (c.disable_tqdm) options.progress = false;
  (void)bench::parse_percentile_metrics(options.percentile_metrics);  // checked before any request
  (void)bench::parse_metric_percentiles(options.metric_percentiles);
  // vLLM's dataset names: sharegpt and custom are files tessera reads as jsonl.
  if (options.dataset == "sharegpt" || options.dataset == "custom") options.dataset = "jsonl";
  // As vLLM: random prompts run to their requested output length (agent turns likewise).
  if (options.dataset == "random" || options.dataset == "agent") options.ignore_eos = true;
  (void)app;
}

// The dataset names (vLLM's refused ones with what to use instead) and vLLM's rules between the dataset flags.
// Runs before apply_vllm_bench_flags reads sharegpt and custom as jsonl.
void apply_vllm_dataset_flags(const CLI::App& app, bench::BenchOptions& options, const BenchCliFlags& c) {
  const std::string& name = options.dataset;
  for (const auto& [refused, advice] : kRefusedDatasets)
    if (name == refused)
      throw FlagError(fmt::format("--dataset-name {} is not supported by tessera bench: {}", name, advice));
  const char* known[] = {"prompt", "random", "jsonl", "sharegpt", "custom", "sonnet", "prefix_repetition", "agent"};
  if (std::find_if(std::begin(known), std::end(known), [&](const char* k) { return name == k; }) == std::end(known))
    fail(ErrorKind::kInvalidArgument,
         "--dataset-name {}: expected prompt, random, jsonl, sharegpt, custom, sonnet, prefix_repetition or agent",
         name);
  if ((name == "random" || name == "prefix_repetition") && !options.dataset_path.empty())
    fail(ErrorKind::kInvalidArgument,
         "cannot use the {} dataset with --dataset-path: it generates its prompts; for the file {} give "
         "--dataset-name sharegpt, custom or sonnet",
         name, options.dataset_path);
  if (name == "sonnet" && options.dataset_path.empty())
    fail(ErrorKind::kInvalidArgument,
         "--dataset-name sonnet needs --dataset-path FILE: a text file of poem lines, e.g. vLLM's "
         "benchmarks/sonnet.txt");
  if (name == "sonnet" && options.sonnet_prefix_len > options.sonnet_input_len)
    fail(ErrorKind::kInvalidArgument,
         "--sonnet-prefix-len ({}) is longer than --sonnet-input-len ({}): the shared prefix is part of the prompt",
         options.sonnet_prefix_len, options.sonnet_input_len);
  if (c.output_len > 0) options.prefix_repetition_output_len = c.output_len;
  if (name == "prefix_repetition" && options.requests_per_level > 0 &&
      options.requests_per_level < static_cast<size_t>(std::max(options.prefix_repetition_num_prefixes, 0)))
    fail(ErrorKind::kInvalidArgument,
         "--num-prompts ({}) must be at least --prefix-repetition-num-prefixes ({}): every prefix is used by one "
         "prompt or more",
         options.requests_per_level, options.prefix_repetition_num_prefixes);
  // vLLM's custom dataset: --custom-output-len (default 256) tokens per request, unless the line gives its own.
  if (name == "custom" && (c.custom_output_len || !app.count("--max-tokens")))
    options.max_tokens = c.custom_output_len.value_or(256);
  options.shuffle = !c.disable_shuffle;
  options.oversample = !c.no_oversample;
}

// vLLM's --ramp-up-strategy rules: both rates, no --request-rate, 1 <= start <= end.
void apply_ramp_up_flags(bench::BenchOptions& options, const BenchCliFlags& c) {
  if (c.ramp_up_strategy.empty()) {
    if (c.ramp_up_start_rps || c.ramp_up_end_rps)
      fail(ErrorKind::kInvalidArgument,
           "--ramp-up-start-rps and --ramp-up-end-rps need --ramp-up-strategy linear or exponential");
    return;
  }
  options.ramp_up = bench::parse_ramp_up(c.ramp_up_strategy);
  if (!std::isinf(options.request_rate))
    fail(ErrorKind::kInvalidArgument,
         "--ramp-up-strategy sets the request rate over the run: drop --request-rate {} (vLLM refuses both as well)",
         c.request_rate);
  if (!c.ramp_up_start_rps || !c.ramp_up_end_rps)
    fail(ErrorKind::kInvalidArgument, "--ramp-up-strategy needs both --ramp-up-start-rps and --ramp-up-end-rps");
  const int start = *c.ramp_up_start_rps, end = *c.ramp_up_end_rps;
  if (start < 0 || end < 0)
    fail(ErrorKind::kInvalidArgument, "--ramp-up-start-rps ({}) and --ramp-up-end-rps ({}) must not be negative", start,
         end);
  if (start > end)
    fail(ErrorKind::kInvalidArgument, "--ramp-up-start-rps ({}) must not be above --ramp-up-end-rps ({})", start, end);
  if (start == 0)
    fail(ErrorKind::kInvalidArgument,
         "--ramp-up-start-rps must be at least 1: the first request is released at the start rate, and a rate of 0 "
         "releases nothing (vLLM fails on it as well)");
  options.ramp_up_start_rps = start;
  options.ramp_up_end_rps = end;
}

// --header KEY=VALUE pairs, the refused vLLM flags, --num-warmups and the ramp.
void apply_vllm_load_flags(const CLI::App& app, bench::BenchOptions& options, const BenchCliFlags& c) {
  for (const PassiveFlag& flag : kVllmPassiveFlags)
    if (flag.advice && app.count(flag.name))
      throw FlagError(fmt::format("{} is a vLLM flag tessera bench does not support: {}", flag.name, flag.advice));
  auto trim = [](std::string text) {
    text.erase(0, text.find_first_not_of(" \t"));
    text.erase(text.find_last_not_of(" \t") + 1);
    return text;
  };
  for (const std::string& item : c.headers) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos)
      fail(ErrorKind::kInvalidArgument, "--header '{}': expected KEY=VALUE, e.g. --header x-additional-info=0.3.3",
           item);
    std::string key = trim(item.substr(0, eq)), value = trim(item.substr(eq + 1));
    if (key.empty() || key.find_first_of(" :\r\n") != std::string::npos ||
        value.find_first_of("\r\n") != std::string::npos)
      fail(ErrorKind::kInvalidArgument, "--header '{}': not a header field (KEY without spaces or ':', one line)",
           item);
    options.headers.emplace_back(std::move(key), std::move(value));
  }
  if (options.num_warmups < 0)
    fail(ErrorKind::kInvalidArgument, "--num-warmups must be 0 or more, got {}", options.num_warmups);
  apply_ramp_up_flags(options, c);
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
    options.backend = backend;
  } else {
    options.backend = options.endpoint.find("chat") != std::string::npos ? "openai-chat" : "openai";
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
      "latency avg/p50/p95 per level. vLLM bench serve command lines run with the binary name swapped:\n"
      "--dataset-name random|sharegpt|custom|sonnet|prefix_repetition with --num-prompts, --request-rate (or\n"
      "--ramp-up-strategy) and --max-concurrency; vLLM flags with no meaning here are accepted without effect\n"
      "or refused with what to use instead.\n\nExamples:\n"
      "  tessera bench --base-url http://10.0.0.1:8000 --html report.html\n"
      "  tessera bench --dataset random --random-input-len 1024 --random-output-len 128 --num-prompts 100 \\\n"
      "                --request-rate 8 --goodput ttft:500 tpot:50 --json run.json\n"
      "  tessera bench --dataset-name agent --agent-conversations 8 --agent-turns 10 \\\n"
      "                --agent-system-prompt-len 20000 --agent-turn-input-len 200 --agent-turn-output-len 300 \\\n"
      "                --tokenizer MODEL_DIR --json agent.json",
      "tessera bench"};
  use_vllm_conventions(app);
  app.get_formatter()->column_width(34);

  BenchCliFlags c;
  add_target_flags(app, options, c);
  add_workload_flags(app, options, c);
  add_load_and_report_flags(app, options, c);
  add_vllm_bench_flags(app, options, c);
  add_vllm_dataset_flags(app, options, c);
  add_vllm_load_flags(app, options, c);
  add_agent_flags(app, options);
  if (int rc = parse_flags(app, argc, argv); rc >= 0) return rc;
  as_flag_errors([&] {
    apply_cli_flags(app, options, c);
    apply_vllm_dataset_flags(app, options, c);
    apply_vllm_bench_flags(app, options, c);
    apply_vllm_load_flags(app, options, c);
    apply_agent_flags(app, options);
  });
  return bench::run_benchmark(std::move(options));
}

}  // namespace tessera::cli
