// tessera serve MODEL: the OpenAI- and Anthropic-compatible HTTP server, with `vllm serve`'s flags.
#include <fmt/ranges.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "cli/engine_flags.h"
#include "cli/flag_parsing.h"
#include "cli/node_launch.h"
#include "cli/plan_flags.h"
#include "cli/rank_launcher.h"
#include "cli/verbs.h"
#include "cli/vllm_flags.h"
#include "core/error.h"
#include "core/logging.h"
#include "core/version.h"
#include "engine/async_engine.h"
#include "server/access_log.h"
#include "server/api_server.h"
#include "server/http_server.h"
#include "server/parsers/reasoning_parser.h"
#include "server/parsers/tool_parser.h"
#include "server/stats_log.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace tessera::cli {

namespace {

namespace fs = std::filesystem;

int g_signal_pipe[2] = {-1, -1};
std::atomic<int> g_signals{0};
void on_signal(int sig) {
  // Async-signal-safe: the first signal wakes the main thread; later ones only say so.
  const unsigned char b = static_cast<unsigned char>(sig);
  if (g_signals.fetch_add(1) == 0) {
    [[maybe_unused]] auto n = write(g_signal_pipe[1], &b, 1);
  } else {
    static const char msg[] = "tessera serve: already shutting down\n";
    [[maybe_unused]] auto n = write(2, msg, sizeof msg - 1);
  }
}

std::vector<std::string> split_keys(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    std::string k = s.substr(i, j - i);
    while (!k.empty() && k.front() == ' ') k.erase(0, 1);
    while (!k.empty() && k.back() == ' ') k.pop_back();
    if (!k.empty()) out.push_back(k);
    i = j + 1;
  }
  return out;
}

// vLLM's --generation-config auto (or DIR): sampling defaults from DIR/generation_config.json.
GenerationDefaults read_generation_config(const std::string& dir) {
  GenerationDefaults d = load_generation_config(dir);
  if (d.sets_sampling()) {
    std::vector<std::string> set;
    if (d.temperature) set.push_back(fmt::format("temperature={}", *d.temperature));
    if (d.top_p) set.push_back(fmt::format("top_p={}", *d.top_p));
    if (d.top_k) set.push_back(fmt::format("top_k={}", *d.top_k));
    if (d.min_p) set.push_back(fmt::format("min_p={}", *d.min_p));
    if (d.repetition_penalty) set.push_back(fmt::format("repetition_penalty={}", *d.repetition_penalty));
    TLOG_INFO(
        "Default sampling parameters have been overridden by the model's generation_config.json ({}). "
        "Relaunch with `--generation-config vllm` to use tessera's defaults instead.",
        fmt::join(set, ", "));
  }
  return d;
}

// The flags of tessera serve beyond the engine's (add_engine_flags), the cluster's and the worker's.
struct ServeFlags {
  std::string host = "0.0.0.0", api_key, tokenizer_dir, chat_template, tool_call_parser, reasoning_parser;
  std::string generation_config = "auto";
  std::string uvicorn_log_level = "info";
  std::vector<std::string> served_model_names;
  int port = 8000, max_waiting_requests = 1024, http_threads = 0;
  size_t max_body = 10u << 20;
  double read_timeout = 30, write_timeout = 60, drain_timeout = 30;
  bool enable_auto_tool_choice = false, trust_remote_code = false, disable_log_requests = false,
       disable_access_log = false, language_model_only = false;
  // vLLM's request log and stats line.
  bool enable_log_requests = false, disable_log_stats = false;
  int max_log_len = 0;
  double log_stats_interval = 10;
  // vLLM flags that change nothing here (kNoOpFlags says why); read so their values are checked.
  double swap_space = 4, mm_processor_cache_gb = 4;
  int max_seq_len_to_capture = 8192, optimization_level = 2, long_prefill_token_threshold = 0;
  bool disable_fastapi_docs = false, enable_prompt_tokens_details = false, async_scheduling = false,
       disable_frontend_multiprocessing = false;
  std::vector<std::string> cuda_graph_sizes;
  std::string root_path, guided_decoding_backend = "auto", mm_encoder_tp_mode = "weights";
  // vLLM flags that act, or take only the values that describe what tessera does (check_vllm_flag_values).
  std::string tokenizer_mode = "auto", scheduling_policy = "fcfs", model_impl = "auto",
              chat_template_content_format = "auto", limit_mm_per_prompt, default_chat_template_kwargs,
              override_generation_config;
  int api_server_count = 1;
  std::string config_file;  // --config: read by expand_config_file before parsing (shown in --help)
  bool enable_reasoning = false, exclude_tools_when_tool_choice_none = false;
  // vLLM's frontend flags that act: the logprobs cap, CORS (JSON lists), HTTPS.
  int max_logprobs = 20;
  std::string allowed_origins = R"(["*"])", allowed_methods = R"(["*"])", allowed_headers = R"(["*"])";
  bool allow_credentials = false;
  std::string ssl_keyfile, ssl_certfile, ssl_ca_certs, ssl_ciphers;
  int ssl_cert_reqs = 0;
};

// vLLM flags accepted with no effect, and why (logged once when given; docs/server.md lists them).
constexpr std::pair<const char*, const char*> kNoOpFlags[] = {
    {"--swap-space", "preempted sequences are recomputed, never swapped to CPU memory"},
    {"--disable-fastapi-docs", "tessera serves no /docs, /redoc or /openapi.json pages"},
    {"--max-seq-len-to-capture", "CUDA graphs are captured per batch size and serve every sequence length"},
    {"--enable-prompt-tokens-details", "usage always carries prompt_tokens_details.cached_tokens"},
    {"--async-scheduling", "each step is scheduled after the previous one (asynchronous scheduling is not built)"},
    {"--optimization-level",
     "tessera's kernels are compiled ahead of time (no torch.compile); CUDA graphs follow "
     "--enforce-eager"},
    {"--cuda-graph-sizes",
     "a CUDA graph is captured for each decode batch size up to min(--max-num-seqs, 256) "
     "when first used"},
    {"--root-path",
     "routes are served at /; behind a proxy that strips the prefix nothing else is needed, and there "
     "are no docs pages whose links it would fix"},
    {"--guided-decoding-backend", "tessera's own grammar engine serves every structured-output request"},
    {"--mm-encoder-tp-mode", "no vision encoder is loaded (text only)"},
    {"--mm-processor-cache-gb", "no multimodal inputs are processed (text only)"},
    {"--disable-frontend-multiprocessing", "the API server and the engine share one process already"},
    {"--long-prefill-token-threshold",
     "each step prefills prompts in arrival order within "
     "--max-num-batched-tokens (per-prompt chunk caps are not built)"},
    {"--enable-reasoning", "reasoning is parsed whenever --reasoning-parser is given"},
};

void add_vllm_compat_flags(CLI::App& app, ServeFlags& sf) {
  const char* g = "vLLM flags with no effect (docs/server.md)";
  app.add_option("--swap-space", sf.swap_space, "GiB of CPU swap space per GPU in vLLM; no effect")->group(g);
  app.add_flag("--disable-fastapi-docs", sf.disable_fastapi_docs, "no effect: there are no API docs pages")->group(g);
  app.add_option("--max-seq-len-to-capture", sf.max_seq_len_to_capture, "no effect: graphs serve every length")
      ->group(g);
  app.add_flag("--enable-prompt-tokens-details", sf.enable_prompt_tokens_details,
               "no effect: prompt_tokens_details.cached_tokens is always reported")
      ->group(g);
  app.add_flag("--async-scheduling", sf.async_scheduling, "no effect: steps are scheduled one after another")->group(g);
  app.add_option("--optimization-level,-O", sf.optimization_level,
                 "vLLM's -O0..-O3 (torch.compile level); no effect: kernels are compiled ahead of time")
      ->check(CLI::Range(0, 3))
      ->group(g);
  app.add_option("--cuda-graph-sizes", sf.cuda_graph_sizes, "no effect: graphs are captured per batch size on use")
      ->expected(1, -1)
      ->group(g);
  app.add_option("--root-path", sf.root_path, "no effect: routes are served at / (for proxies that strip a prefix)")
      ->group(g);
  app.add_option("--guided-decoding-backend", sf.guided_decoding_backend,
                 "no effect: tessera's grammar engine serves structured outputs")
      ->group(g);
  app.add_option("--mm-encoder-tp-mode", sf.mm_encoder_tp_mode, "no effect: no vision encoder is loaded")->group(g);
  app.add_option("--mm-processor-cache-gb", sf.mm_processor_cache_gb, "no effect: text only")->group(g);
  app.add_flag("--disable-frontend-multiprocessing", sf.disable_frontend_multiprocessing,
               "no effect: one process serves")
      ->group(g);
  app.add_option("--long-prefill-token-threshold", sf.long_prefill_token_threshold,
                 "no effect: prefills share --max-num-batched-tokens in arrival order")
      ->group(g);
  app.add_flag("--enable-reasoning", sf.enable_reasoning,
               "no effect (vLLM's older flag): reasoning is parsed whenever --reasoning-parser is given")
      ->group(g);
}

// vLLM flags that act, or accept exactly the values that describe what tessera does.
void add_vllm_value_flags(CLI::App& app, ServeFlags& sf) {
  app.add_option("--tokenizer-mode", sf.tokenizer_mode,
                 "auto | hf | slow: tessera reads the checkpoint's tokenizer.json (the same tokens as the Hugging "
                 "Face tokenizer); mistral and custom modes are refused")
      ->capture_default_str();
  app.add_option("--scheduling-policy", sf.scheduling_policy,
                 "fcfs: requests are scheduled first come, first served (priority is refused)")
      ->capture_default_str();
  app.add_option("--model-impl", sf.model_impl, "auto | vllm: tessera's own model code (transformers is refused)")
      ->capture_default_str();
  app.add_option("--chat-template-content-format", sf.chat_template_content_format,
                 "auto: message content is given to the template as a string or as a list of parts, as the "
                 "template reads it (vLLM's auto detection; other values are refused)")
      ->capture_default_str();
  app.add_option("--limit-mm-per-prompt", sf.limit_mm_per_prompt,
                 "JSON object of per-prompt media limits: only zeros are accepted ({\"image\": 0, \"video\": 0}), "
                 "as tessera serves text only");
  app.add_option("--api-server-count", sf.api_server_count,
                 "1: one HTTP server process (its I/O threads: --http-threads)")
      ->capture_default_str();
  app.add_option("--default-chat-template-kwargs", sf.default_chat_template_kwargs,
                 "JSON object passed to the chat template of every chat request, under the request's own "
                 "chat_template_kwargs (which win), e.g. '{\"enable_thinking\": false}'");
  app.add_flag("--exclude-tools-when-tool-choice-none", sf.exclude_tools_when_tool_choice_none,
               "with tool_choice \"none\", leave the request's tools out of the prompt");
  app.add_option("--override-generation-config", sf.override_generation_config,
                 "JSON object overriding the sampling defaults of --generation-config: temperature, top_p, top_k, "
                 "min_p, repetition_penalty, max_new_tokens, e.g. '{\"temperature\": 0.6}'");
}

// vLLM's --max-logprobs, CORS and TLS flags (the server acts on each).
void add_vllm_frontend_flags(CLI::App& app, ServeFlags& sf) {
  app.add_option("--max-logprobs", sf.max_logprobs,
                 "most log probabilities per token a request may ask for (logprobs, top_logprobs, prompt_logprobs; "
                 "more is a 400); -1: the vocabulary size")
      ->capture_default_str();
  app.add_option("--allowed-origins", sf.allowed_origins,
                 "CORS: JSON list of origins allowed to call the API from a browser (\"*\": any)")
      ->capture_default_str();
  app.add_option("--allowed-methods", sf.allowed_methods, "CORS: JSON list of methods allowed (\"*\": any)")
      ->capture_default_str();
  app.add_option("--allowed-headers", sf.allowed_headers, "CORS: JSON list of request headers allowed (\"*\": any)")
      ->capture_default_str();
  app.add_flag("--allow-credentials", sf.allow_credentials,
               "CORS: allow credentials (cookies, Authorization) in cross-origin requests");
  app.add_option("--ssl-certfile", sf.ssl_certfile,
                 "serve HTTPS with this PEM certificate (the server's, then its chain)");
  app.add_option("--ssl-keyfile", sf.ssl_keyfile,
                 "the certificate's PEM private key, unencrypted (default: in --ssl-certfile)");
  app.add_option("--ssl-ca-certs", sf.ssl_ca_certs,
                 "PEM CA certificates that client certificates are verified against");
  app.add_option("--ssl-cert-reqs", sf.ssl_cert_reqs,
                 "client certificates, as Python's ssl.CERT_*: 0 none, 1 optional (verified if sent), 2 required")
      ->capture_default_str();
  app.add_option("--ssl-ciphers", sf.ssl_ciphers, "OpenSSL cipher list for TLS 1.2 (TLS 1.3 uses its own suites)");
}

void add_serve_flags(CLI::App& app, EngineFlags& ef, ServeFlags& sf) {
  app.add_option("model,--model", ef.model,
                 "model directory (config.json + safetensors); default: the demo model shipped in the repository, "
                 "models/tessera-demo (served as tessera-demo)");
  app.add_option("--host", sf.host, "address to listen on")->capture_default_str();
  app.add_option("--port", sf.port, "port to listen on (0: any free port, logged at startup)")->capture_default_str();
  app.add_option("--served-model-name", sf.served_model_names,
                 "model name(s) the API answers to (default: the model path); the first is reported");
  app.add_option("--api-key", sf.api_key,
                 "require this key (Authorization: Bearer, or x-api-key); several comma-separated; "
                 "default from $TESSERA_API_KEY or $VLLM_API_KEY");
  app.add_option("--tokenizer", sf.tokenizer_dir, "directory with tokenizer.json (default: the model directory)");
  app.add_option("--chat-template", sf.chat_template, "chat template file (or inline Jinja) overriding the model's");
  app.add_flag("--enable-auto-tool-choice", sf.enable_auto_tool_choice, "let the model call tools (tool_choice auto)");
  app.add_option("--tool-call-parser", sf.tool_call_parser, "hermes | qwen3_coder (aliases qwen3, qwen3_xml)");
  app.add_option("--reasoning-parser", sf.reasoning_parser, "qwen3 | deepseek_r1");
  app.add_option("--generation-config", sf.generation_config,
                 "auto: sampling defaults from the model's generation_config.json; vllm: none; or a directory")
      ->capture_default_str();
  app.add_flag("--trust-remote-code", sf.trust_remote_code, "accepted for vLLM compatibility; no effect");
  app.add_option("--config", sf.config_file,
                 "a YAML file of flags (`max-model-len: 32k`, `enable-prefix-caching: true`, lists as `- item`), "
                 "as vLLM's --config; flags on the command line win");
  app.add_option("--max-waiting-requests", sf.max_waiting_requests,
                 "requests that may wait for a batch slot; beyond it the server answers 429 with Retry-After")
      ->capture_default_str();
  app.add_option("--uvicorn-log-level", sf.uvicorn_log_level,
                 "level of the HTTP server's log: critical, error, warning, info, debug, trace (the per-request "
                 "access lines are info: warning and above turn them off)")
      ->capture_default_str();
  app.add_flag("--disable-log-requests", sf.disable_log_requests,
               "no log line per request (neither the access line nor --enable-log-requests' line)");
  app.add_flag("--enable-log-requests", sf.enable_log_requests,
               "log each generation request: its prompt (see --max-log-len), token ids and sampling parameters");
  app.add_option("--max-log-len", sf.max_log_len,
                 "with --enable-log-requests: characters and token ids of the prompt logged (default: all)");
  app.add_flag("--disable-log-stats", sf.disable_log_stats,
               "no periodic stats line (throughput, running and waiting requests, KV cache usage, prefix cache hit "
               "rate; logged every --log-stats-interval seconds while there is work)");
  app.add_option("--log-stats-interval", sf.log_stats_interval, "seconds between two stats lines")
      ->capture_default_str();
  app.add_flag("--language-model-only", sf.language_model_only,
               "accepted for vLLM compatibility: tessera loads only a checkpoint's language model (text in, text "
               "out) anyway; the vision tower of multimodal checkpoints is never loaded");
  app.add_flag("--disable-uvicorn-access-log", sf.disable_access_log, "no access log line per request");
  app.add_option("--max-request-body-bytes", sf.max_body, "largest request body; larger ones get 413")
      ->capture_default_str();
  app.add_option("--http-threads", sf.http_threads, "I/O threads of the HTTP server (default: min(4, cores))");
  app.add_option("--http-read-timeout", sf.read_timeout,
                 "seconds to receive a whole request, and the idle keep-alive limit (slow clients are closed)")
      ->capture_default_str();
  app.add_option("--http-write-timeout", sf.write_timeout, "seconds for one write to a client before it is dropped")
      ->capture_default_str();
  app.add_option("--drain-timeout", sf.drain_timeout,
                 "on SIGTERM/SIGINT: seconds in-flight requests may take to finish before they are aborted")
      ->capture_default_str();
}

// Arguments CLI11 left over: a vLLM flag tessera lacks is named as such, anything else is an error.
void reject_extras(const CLI::App& app) {
  for (const auto& extra : app.remaining()) {
    if (extra.empty() || extra[0] != '-') continue;
    std::string name = extra.substr(0, extra.find('='));
    if (const char* advice = refused_vllm_flag_advice(name))
      throw FlagError(fmt::format("{} is a vLLM flag tessera does not support: {}", name, advice));
    const std::string close = closest_flag(app, name);
    throw FlagError(fmt::format("{} is not a flag of tessera serve{} (see tessera serve --help)", name,
                                close.empty() ? "" : fmt::format("; did you mean {}?", close)));
  }
  if (!app.remaining().empty())
    throw FlagError(fmt::format("unexpected argument '{}' (tessera serve takes one MODEL)", app.remaining()[0]));
}

// A JSON object flag's value, or a FlagError naming the flag.
nlohmann::json json_object_flag(const std::string& text, const char* flag) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorKind::kInvalidArgument, "{} is not valid JSON ({}): {}", flag, e.what(), text);
  }
  if (!j.is_object()) fail(ErrorKind::kInvalidArgument, "{} must be a JSON object, got: {}", flag, text);
  return j;
}

// The vLLM flags that take only the values describing what tessera does (add_vllm_value_flags).
void check_vllm_flag_values(const ServeFlags& sf) {
  auto only = [](const std::string& value, std::initializer_list<const char*> ok, const char* flag,
                 const char* advice) {
    for (const char* v : ok)
      if (value == v) return;
    fail(ErrorKind::kUnsupported, "{} {}: {}", flag, value, advice);
  };
  only(sf.tokenizer_mode, {"auto", "hf", "slow"}, "--tokenizer-mode",
       "tessera reads the checkpoint's Hugging Face tokenizer.json; use --tokenizer-mode auto (or leave it out) with "
       "a checkpoint that ships tokenizer.json");
  only(sf.scheduling_policy, {"fcfs"}, "--scheduling-policy",
       "requests are scheduled first come, first served; drop the flag (request priorities are not built)");
  only(sf.model_impl, {"auto", "vllm"}, "--model-impl", "tessera runs its own model code; drop the flag");
  only(sf.chat_template_content_format, {"auto"}, "--chat-template-content-format",
       "the content format is detected from the template, as vLLM's auto does; drop the flag");
  if (sf.api_server_count != 1)
    fail(ErrorKind::kUnsupported,
         "--api-server-count {}: one HTTP server process serves; raise --http-threads for more I/O threads",
         sf.api_server_count);
  if (!sf.limit_mm_per_prompt.empty()) {
    const nlohmann::json limits = json_object_flag(sf.limit_mm_per_prompt, "--limit-mm-per-prompt");
    for (const auto& item : limits.items()) {
      const nlohmann::json& limit = item.value();
      if (!(limit.is_number() && limit.get<double>() == 0) && !(limit.is_object() && limit.value("count", 1) == 0))
        fail(ErrorKind::kUnsupported,
             "--limit-mm-per-prompt: {} {}: tessera serves text only; give 0 for every media type or drop the flag",
             item.key(), limit.dump());
    }
  }
  if (!sf.default_chat_template_kwargs.empty())
    (void)json_object_flag(sf.default_chat_template_kwargs, "--default-chat-template-kwargs");
  if (sf.enable_reasoning && sf.reasoning_parser.empty())
    fail(ErrorKind::kInvalidArgument, "--enable-reasoning needs --reasoning-parser (qwen3 or deepseek_r1)");
  if (!sf.override_generation_config.empty()) {
    static const std::set<std::string> kKeys = {"temperature",        "top_p",         "top_k", "min_p",
                                                "repetition_penalty", "max_new_tokens"};
    const nlohmann::json j = json_object_flag(sf.override_generation_config, "--override-generation-config");
    for (const auto& item : j.items())
      if (const std::string& key = item.key(); !kKeys.count(key) || !item.value().is_number())
        fail(ErrorKind::kInvalidArgument,
             "--override-generation-config: '{}': {} (tessera reads temperature, top_p, top_k, min_p, "
             "repetition_penalty, max_new_tokens, each a number)",
             key, kKeys.count(key) ? "must be a number" : "not a generation setting");
  }
}

// --override-generation-config's values over the defaults read from generation_config.json.
void apply_generation_overrides(GenerationDefaults& d, const std::string& text) {
  if (text.empty()) return;
  const nlohmann::json j = nlohmann::json::parse(text);
  if (j.contains("temperature")) d.temperature = j["temperature"].get<double>();
  if (j.contains("top_p")) d.top_p = j["top_p"].get<double>();
  if (j.contains("top_k")) d.top_k = j["top_k"].get<int>();
  if (j.contains("min_p")) d.min_p = j["min_p"].get<double>();
  if (j.contains("repetition_penalty")) d.repetition_penalty = j["repetition_penalty"].get<double>();
  if (j.contains("max_new_tokens")) d.max_new_tokens = j["max_new_tokens"].get<int>();
  TLOG_INFO("--override-generation-config: sampling defaults {}", j.dump());
}

// A CORS flag's list: vLLM's JSON list of strings (a bare value is one item).
std::vector<std::string> json_list_flag(const std::string& text, const char* flag) {
  if (text.empty() || text.front() != '[') return {text};
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    j = nullptr;
  }
  std::vector<std::string> out;
  for (const auto& item : j.is_array() ? j : nlohmann::json::array({nullptr})) {
    if (!item.is_string())
      fail(ErrorKind::kInvalidArgument, "{} {}: give a JSON list of strings, e.g. '[\"https://example.com\"]'", flag,
           text);
    out.push_back(item.get<std::string>());
  }
  return out;
}

server::CorsOptions cors_options(const ServeFlags& sf) {
  server::CorsOptions c;
  c.allowed_origins = json_list_flag(sf.allowed_origins, "--allowed-origins");
  c.allowed_methods = json_list_flag(sf.allowed_methods, "--allowed-methods");
  c.allowed_headers = json_list_flag(sf.allowed_headers, "--allowed-headers");
  c.allow_credentials = sf.allow_credentials;
  return c;
}

server::TlsOptions tls_options(const ServeFlags& sf) {
  return server::TlsOptions{sf.ssl_certfile, sf.ssl_keyfile, sf.ssl_ca_certs, sf.ssl_cert_reqs, sf.ssl_ciphers};
}

// --max-logprobs, the CORS lists and which TLS flags go together (the files are the head's to load:
// check_tls_files).
void check_frontend_flags(const CLI::App& app, const ServeFlags& sf) {
  if (sf.max_logprobs < -1)
    fail(ErrorKind::kInvalidArgument, "--max-logprobs must be -1 (the vocabulary) or a count >= 0, got {}",
         sf.max_logprobs);
  (void)cors_options(sf);
  if (sf.ssl_certfile.empty()) {
    for (const char* flag : {"--ssl-keyfile", "--ssl-ca-certs", "--ssl-ciphers"})
      if (app.count(flag))
        fail(ErrorKind::kInvalidArgument, "{} needs --ssl-certfile (HTTPS is served with a certificate); give it",
             flag);
    if (sf.ssl_cert_reqs != 0)
      fail(ErrorKind::kInvalidArgument,
           "--ssl-cert-reqs needs --ssl-certfile (HTTPS is served with a certificate); give it");
  }
}

// The head serves HTTP: its TLS files are loaded as the server will, so that a bad one is a flag error (exit 2)
// naming it, before the model loads. Other nodes need no certificate.
void check_tls_files(const ServeFlags& sf) {
  if (!sf.ssl_certfile.empty()) as_flag_errors([&] { server::check_tls_options(tls_options(sf)); });
}

// The values of the serve flags (their mistakes are command-line errors, exit code 2).
void check_serve_flag_values(const CLI::App& app, const ServeFlags& sf) {
  // Creating one validates the name (the error lists the supported parsers).
  auto named = [](const char* flag, const std::string& value, auto&& make) {
    try {
      (void)make(value);
    } catch (const Error& e) {
      fail(ErrorKind::kInvalidArgument, "{} {}: {}; use one of those", flag, value, e.what());
    }
  };
  if (!sf.tool_call_parser.empty())
    named("--tool-call-parser", sf.tool_call_parser, [](const std::string& v) { return server::make_tool_parser(v); });
  if (!sf.reasoning_parser.empty())
    named("--reasoning-parser", sf.reasoning_parser,
          [](const std::string& v) { return server::make_reasoning_parser(v); });
  if (sf.enable_auto_tool_choice && sf.tool_call_parser.empty())
    fail(ErrorKind::kInvalidArgument, "--enable-auto-tool-choice requires --tool-call-parser");
  if (sf.max_waiting_requests < 0) fail(ErrorKind::kInvalidArgument, "--max-waiting-requests must be >= 0");
  if (sf.port < 0 || sf.port > 65535) fail(ErrorKind::kInvalidArgument, "--port {} is not a port number", sf.port);
  static const std::set<std::string> kUvicornLevels = {"critical", "error", "warning", "info", "debug", "trace"};
  if (!kUvicornLevels.count(sf.uvicorn_log_level))
    fail(ErrorKind::kInvalidArgument, "--uvicorn-log-level {}: not one of critical, error, warning, info, debug, trace",
         sf.uvicorn_log_level);
  if (sf.language_model_only)
    TLOG_INFO(
        "--language-model-only: tessera loads only the language model of a checkpoint (text in, text out); vision "
        "and audio encoders are never loaded, with or without this flag");
  if (sf.trust_remote_code)
    TLOG_INFO(
        "--trust-remote-code is accepted for vLLM compatibility and has no effect: tessera runs no Python "
        "code from the checkpoint");
  if (sf.max_log_len < 0) fail(ErrorKind::kInvalidArgument, "--max-log-len must be >= 0, got {}", sf.max_log_len);
  if (!(sf.log_stats_interval > 0))
    fail(ErrorKind::kInvalidArgument, "--log-stats-interval must be above 0 seconds, got {}", sf.log_stats_interval);
  if (!(sf.swap_space >= 0)) fail(ErrorKind::kInvalidArgument, "--swap-space must be >= 0, got {}", sf.swap_space);
  if (sf.max_seq_len_to_capture < 1)
    fail(ErrorKind::kInvalidArgument, "--max-seq-len-to-capture must be >= 1, got {}", sf.max_seq_len_to_capture);
  check_vllm_flag_values(sf);
  check_frontend_flags(app, sf);
  for (const auto& [flag, why] : kNoOpFlags)
    if (app.count(flag)) TLOG_INFO("{} is accepted for vLLM compatibility and has no effect: {}", flag, why);
}

// The head's own checks (after the engine's and the cluster's), then the defaults that depend on others.
void check_serve_flags(const EngineFlags& ef, ServeFlags& sf) {
  if (!fs::is_directory(ef.model))
    fail(ErrorKind::kNotFound, "{}: not a model directory (tessera serve needs a local directory with config.json)",
         ef.model);
  plan_or_fail(ef);  // an impossible configuration fails here, before the tokenizer and any weight
  if (sf.api_key.empty()) {
    if (const char* e = std::getenv("TESSERA_API_KEY"))
      sf.api_key = e;
    else if (const char* v = std::getenv("VLLM_API_KEY"))
      sf.api_key = v;
  }
  if (sf.served_model_names.empty()) sf.served_model_names.push_back(ef.model);
  if (sf.tokenizer_dir.empty()) sf.tokenizer_dir = ef.model;
}

// What the API needs besides the engine: tokenizer, chat template, generation defaults (with their eos ids).
struct TextSide {
  std::unique_ptr<tokenizer::Tokenizer> tok;
  std::optional<tokenizer::ChatTemplate> tmpl;
  GenerationDefaults defaults;
};

std::optional<tokenizer::ChatTemplate> load_chat_template(const ServeFlags& sf) {
  const std::string& flag = sf.chat_template;
  if (!flag.empty() && !fs::exists(flag) &&
      (flag.find("{%") != std::string::npos || flag.find("{{") != std::string::npos)) {
    std::string cfg;
    if (std::ifstream in(fs::path(sf.tokenizer_dir) / "tokenizer_config.json"); in)
      cfg.assign(std::istreambuf_iterator<char>(in), {});
    return tokenizer::ChatTemplate::from_source(flag, cfg);
  }
  if (!flag.empty()) {
    if (!fs::exists(flag)) fail(ErrorKind::kNotFound, "--chat-template {}: no such file", flag);
    return tokenizer::ChatTemplate::from_model_dir(sf.tokenizer_dir, fs::path(flag));
  }
  try {
    return tokenizer::ChatTemplate::from_model_dir(sf.tokenizer_dir);
  } catch (const Error& e) {
    TLOG_WARN(
        "no chat template ({}); /v1/chat/completions and /v1/messages will answer 400 until one is given "
        "with --chat-template",
        e.what());
  }
  return std::nullopt;
}

TextSide load_text_side(const EngineFlags& ef, const ServeFlags& sf) {
  if (!fs::exists(fs::path(sf.tokenizer_dir) / "tokenizer.json"))
    fail(ErrorKind::kNotFound, "{}: no tokenizer.json; pass --tokenizer DIR", sf.tokenizer_dir);
  TextSide t;
  t.tok = tokenizer::Tokenizer::from_dir(sf.tokenizer_dir);
  t.tmpl = load_chat_template(sf);
  if (sf.generation_config == "auto") {
    t.defaults = read_generation_config(ef.model);
  } else if (sf.generation_config != "vllm") {
    if (!fs::is_directory(sf.generation_config))
      fail(ErrorKind::kNotFound, "--generation-config {}: not a directory (auto, vllm or a directory)",
           sf.generation_config);
    t.defaults = read_generation_config(sf.generation_config);
  }
  apply_generation_overrides(t.defaults, sf.override_generation_config);
  return t;
}

// Build the engine: rank 0 of TP x PP (the launcher spawns and supervises this node's other ranks;
// several nodes: the session, the head's control channel, outlives the launcher) behind the AsyncEngine.
std::unique_ptr<AsyncEngine> build_engine(const EngineFlags& ef, const ClusterFlags& cf, const dist::LaunchFacts& facts,
                                          const ServeFlags& sf, const TextSide& text, int argc, char** argv,
                                          HeadEngine& head) {
  std::unique_ptr<dist::NodeSession> session = start_node_session(ef, cf, facts);
  head = start_head_engine(ef, std::move(session), facts, argc, argv);
  std::unique_ptr<LLMEngine>& llm = head.llm;
  // The model's own generation_config.json eos ids are in its ModelConfig already; another directory's are added.
  if (!text.defaults.eos_token_ids.empty()) {
    std::vector<int32_t> eos = llm->eos_token_ids();
    for (int32_t id : text.defaults.eos_token_ids)
      if (std::find(eos.begin(), eos.end(), id) == eos.end()) eos.push_back(id);
    llm->set_eos_token_ids(eos);
  }
  AsyncEngineOptions aeo;
  aeo.max_waiting_requests = sf.max_waiting_requests;
  aeo.max_logprobs = sf.max_logprobs;
  return std::make_unique<AsyncEngine>(std::move(llm), text.tok.get(), aeo);
}

// Build the API: the protocol options and the HTTP front end's.
server::ApiOptions api_options(const EngineFlags& ef, const ServeFlags& sf, const TextSide& text) {
  server::ApiOptions ao;
  ao.served_model_names = sf.served_model_names;
  ao.model_path = ef.model;
  ao.api_keys = split_keys(sf.api_key);
  ao.defaults = text.defaults;
  ao.enable_auto_tool_choice = sf.enable_auto_tool_choice;
  ao.tool_call_parser = sf.tool_call_parser;
  ao.reasoning_parser = sf.reasoning_parser;
  ao.log_requests = sf.enable_log_requests && !sf.disable_log_requests;
  ao.max_log_len = sf.max_log_len;
  if (!sf.default_chat_template_kwargs.empty())
    ao.default_chat_template_kwargs = nlohmann::ordered_json::parse(sf.default_chat_template_kwargs);
  ao.exclude_tools_when_tool_choice_none = sf.exclude_tools_when_tool_choice_none;
  ao.max_logprobs = sf.max_logprobs;
  ao.cors = cors_options(sf);  // always, as vLLM installs its CORS middleware with the defaults
  return ao;
}

server::HttpServerOptions http_options(const ServeFlags& sf) {
  server::HttpServerOptions ho;
  ho.host = sf.host;
  ho.port = sf.port;
  ho.threads =
      sf.http_threads > 0 ? sf.http_threads : static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 4u));
  ho.max_body_bytes = sf.max_body;
  ho.read_timeout = std::chrono::milliseconds(static_cast<int64_t>(sf.read_timeout * 1000));
  ho.write_timeout = std::chrono::milliseconds(static_cast<int64_t>(sf.write_timeout * 1000));
  ho.tls = tls_options(sf);
  return ho;
}

// One line per request unless turned off: by --disable-uvicorn-access-log, by --disable-log-requests, or by
// an HTTP log level above info (uvicorn's access log is info).
bool access_log_on(const ServeFlags& sf) {
  return !sf.disable_access_log && !sf.disable_log_requests &&
         (sf.uvicorn_log_level == "info" || sf.uvicorn_log_level == "debug" || sf.uvicorn_log_level == "trace");
}

// From here SIGINT/SIGTERM drain instead of killing. A handler (not a signal mask) because threads started
// before main (OpenBLAS's pool) would otherwise take the signal with its default action.
void install_signal_handlers() {
  if (pipe(g_signal_pipe) != 0) fail(ErrorKind::kInternal, "pipe() failed");
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

// Rank processes: a dead rank (or a lost node) ends the server with a non-zero exit. The watcher turns
// /health to 503 at once and wakes the main thread with kRankFailed.
constexpr unsigned char kRankFailed = 0xff;

std::thread watch_ranks(RankLauncher& launcher, AsyncEngine& engine, server::ApiServer& api,
                        const std::atomic<bool>& stop, std::string& failure) {
  return std::thread([&] {
    while (!stop) {
      std::string what = launcher.failure();
      if (what.empty()) {
        AsyncEngineStats st = engine.stats();
        if (!st.alive) {
          // A collective can fail before the supervisor has reaped the rank that caused
          // it: the rank's own fate ("rank 1 (pid N) was killed by signal 9") says more.
          what = launcher.wait_failure(std::chrono::milliseconds(500));
          if (what.empty()) what = "the engine failed: " + st.fatal_error;
        }
      }
      if (!what.empty()) {
        api.set_draining();  // /health: 503
        failure = what;
        [[maybe_unused]] auto n = write(g_signal_pipe[1], &kRankFailed, 1);
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
}

// Serve until SIGINT/SIGTERM (drain, then 0) or a failed rank (throws).
int serve_until_signal(server::HttpServer& http, server::ApiServer& api, AsyncEngine& engine, RankLauncher* launcher,
                       const ServeFlags& sf) {
  install_signal_handlers();
  http.start();
  TLOG_INFO("Starting tessera API server on {}://{}:{}", http.scheme(), sf.host, http.port());
  TLOG_INFO("Available routes: {}", fmt::join(server::ApiServer::route_list(), ", "));
  TLOG_INFO("Application startup complete.");

  std::atomic<bool> watch_stop{false};
  std::string job_failure;
  std::thread watcher;
  if (launcher) watcher = watch_ranks(*launcher, engine, api, watch_stop, job_failure);

  unsigned char sig = 0;
  while (read(g_signal_pipe[0], &sig, 1) < 0 && errno == EINTR) {
  }
  if (sig == kRankFailed) {
    TLOG_ERROR("{}; /health answers 503, shutting the server down", job_failure);
    const auto failed_at = std::chrono::steady_clock::now();
    // Every request in flight ends with an error naming the failure (a stream gets an error event),
    // not a silent abort; the last events reach the sockets, and /health answers 503 for a second
    // before the listener closes (the launcher ends the process 5 s after the failure at the latest).
    engine.fail(job_failure);
    for (int i = 0; i < 200 && api.active_requests() > 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::this_thread::sleep_until(failed_at + std::chrono::seconds(1));
    http.stop_accepting();
    http.stop();
    watcher.join();
    fail(ErrorKind::kNetwork, "{}", job_failure);
  }
  watch_stop = true;
  if (watcher.joinable()) watcher.join();
  TLOG_INFO("Received {}; shutting down: no new requests, in-flight ones get up to {} s",
            sig == SIGINT ? "SIGINT" : "SIGTERM", sf.drain_timeout);
  // The listener stays open while in-flight requests finish: /health answers 503 (and new generation
  // requests 503) until it closes, so load balancers see the drain instead of refused connections.
  api.set_draining();
  engine.drain(std::chrono::milliseconds(static_cast<int64_t>(sf.drain_timeout * 1000)));
  http.stop_accepting();
  // The last outputs are posted to connection strands; let them reach the sockets.
  for (int i = 0; i < 200 && api.active_requests() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  http.stop();
  TLOG_INFO("Shutdown complete.");
  return 0;
}

}  // namespace

int run_serve(int argc, char** argv) {
  CLI::App app{
      "OpenAI- and Anthropic-compatible HTTP server (flags as `vllm serve`).\n"
      "  tessera serve            (the demo model in the repository, models/tessera-demo)\n"
      "  tessera serve Qwen/Qwen3-8B-dir --port 8000 --api-key KEY\n"
      "  tessera serve configs/qwen3-tiny --tokenizer .npm-pkgs/tokenizer-qwen3/package/models "
      "--load-format dummy",
      "tessera serve"};
  app.allow_extras();
  use_vllm_conventions(app);
  EngineFlags ef;
  ServeFlags sf;
  add_serve_flags(app, ef, sf);
  add_engine_flags(app, ef);
  add_vllm_compat_flags(app, sf);
  add_vllm_value_flags(app, sf);
  add_vllm_frontend_flags(app, sf);
  ClusterFlags cf;
  add_cluster_flags(app, cf);
  WorkerFlags wf;
  add_worker_flags(app, wf);
  if (int rc = parse_flags(app, expand_config_file(std::vector<std::string>(argv, argv + argc), app)); rc >= 0)
    return rc;
  reject_extras(app);
  if (ef.model.empty()) {
    ef.model = default_model_dir("serve");
    if (sf.served_model_names.empty()) sf.served_model_names.push_back(kDemoModelName);
  }
  // A rank process spawned by a launcher (TP x PP > 1): run the shard, nothing else.
  if (wf.worker_rank >= 0) {
    resolve_model(ef);
    return run_worker_rank(ef, wf);
  }
  as_flag_errors([&] {  // flag checks before anything starts
    (void)engine_config(ef, /*parallel_supported=*/true);
    check_serve_flag_values(app, sf);
  });
  if (ef.dtype == "half" || ef.dtype == "float16")
    TLOG_INFO("--dtype {}: tessera computes in bfloat16 on GPUs (float32 on the CPU backend)", ef.dtype);
  // An org/name id is served under that name (vLLM's default), from its snapshot in the hub cache.
  if (const std::string given = resolve_model(ef); given != ef.model && sf.served_model_names.empty())
    sf.served_model_names.push_back(given);
  const dist::LaunchFacts facts = resolve_cluster(ef, cf);
  // One process per rank under a launcher: the node's other local ranks run their rank only.
  if (facts.one_process_per_rank && facts.local_rank > 0) return run_launched_rank(ef, cf, facts);
  if (!facts.is_head()) {  // another node: only its ranks run here; the head serves HTTP
    if (!fs::is_directory(ef.model)) fail(ErrorKind::kNotFound, "{}: not a model directory", ef.model);
    auto session = start_node_session(ef, cf, facts);
    return run_worker_node(ef, *session, facts, argc, argv);
  }
  check_tls_files(sf);
  check_serve_flags(ef, sf);

  TLOG_INFO(
      "tessera serve {} ({}): model={} served-model-name={} tokenizer={} host={} port={} max-model-len={} "
      "max-num-seqs={} load-format={} device={} kv-cache-dtype={} prefix-caching={} api-key={}",
      TESSERA_VERSION_STRING, TESSERA_GIT_COMMIT, ef.model, fmt::join(sf.served_model_names, ","), sf.tokenizer_dir,
      sf.host, sf.port, ef.max_model_len > 0 ? std::to_string(ef.max_model_len) : std::string("auto"), ef.max_num_seqs,
      ef.load_format, ef.device, ef.kv_cache_dtype, ef.enable_prefix_caching, sf.api_key.empty() ? "none" : "set");

  // The port first, as vLLM binds its socket before building the engine: a second server on a port in use
  // fails at once instead of after the model loaded. Connections wait in the backlog until the API starts.
  std::unique_ptr<server::ApiServer> api;
  const bool access_log = access_log_on(sf);
  server::HttpServer http(
      http_options(sf),
      [&api, access_log](server::HttpRequest&& r, std::shared_ptr<server::Exchange> ex) {
        if (access_log) ex = server::with_access_log(r, std::move(ex));
        api->handle(std::move(r), std::move(ex));
      },
      &server::ApiServer::error_body);
  http.listen();

  // Text side next: a missing tokenizer should fail before minutes of weight loading.
  TextSide text = load_text_side(ef, sf);
  HeadEngine head;
  std::unique_ptr<AsyncEngine> engine = build_engine(ef, cf, facts, sf, text, argc, argv, head);

  server::Metrics metrics(sf.served_model_names.front(), engine->max_model_len());
  api = std::make_unique<server::ApiServer>(api_options(ef, sf, text), *engine, *text.tok,
                                            text.tmpl ? &*text.tmpl : nullptr, metrics);
  // Keys are checked on each request's headers, before its body is read.
  http.set_header_check([&api, access_log](const server::HttpRequest& r) {
    std::optional<server::HttpResponse> refusal = api->check_headers(r);
    if (refusal && access_log) server::log_access(r, refusal->status);
    return refusal;
  });
  // The API goes before the engine and the metrics it refers to, after the I/O threads that call it.
  auto close_api = [&] {
    http.stop();
    api.reset();
  };
  try {
    std::optional<server::StatsLogger> stats_log;
    if (!sf.disable_log_stats)
      stats_log.emplace([&engine] { return engine->stats(); },
                        std::chrono::milliseconds(static_cast<int64_t>(sf.log_stats_interval * 1000)));
    const int rc = serve_until_signal(http, *api, *engine, head.launcher.get(), sf);
    close_api();
    return rc;
  } catch (...) {
    close_api();
    throw;
  }
}

}  // namespace tessera::cli
