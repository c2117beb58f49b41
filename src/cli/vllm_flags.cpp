#include "cli/vllm_flags.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>

#include "cli/flag_parsing.h"

namespace tessera::cli {

namespace {

constexpr const char* kLora =
    "tessera serves one model without adapters: merge the LoRA into the weights and serve "
    "the merged checkpoint";
constexpr const char* kMultimodal = "tessera serves text only; drop the flag (--language-model-only is what it does)";
constexpr const char* kDataParallel =
    "tessera runs one engine per server: start one server per replica (each with its own --port) behind a load "
    "balancer";
constexpr const char* kProxy = "put a reverse proxy (nginx, Caddy, Envoy) in front of tessera for it";
constexpr const char* kDrop = "drop the flag; tessera has no equivalent";

// vLLM serve flags tessera refuses, with what to do instead.
const std::pair<const char*, const char*> kRefused[] = {
    {"--enable-lora", kLora},
    {"--lora-modules", kLora},
    {"--max-lora-rank", kLora},
    {"--max-loras", kLora},
    {"--max-cpu-loras", kLora},
    {"--lora-dtype", kLora},
    {"--long-lora-scaling-factors", kLora},
    {"--fully-sharded-loras", kLora},
    {"--prompt-adapters", kLora},
    {"--cpu-offload-gb",
     "the weights must fit the GPUs: add GPUs with --tensor-parallel-size / --pipeline-parallel-size, or store a "
     "bf16 checkpoint in FP8 with --quantization fp8; `tessera plan` shows what fits"},
    {"--structured-outputs-config",
     "tessera's own grammar engine serves every structured-output request; drop the flag"},
    {"--config-format", "tessera reads Hugging Face config.json; serve the checkpoint in Hugging Face format"},
    {"--code-revision", "tessera runs no code from the checkpoint; drop the flag"},
    {"--tokenizer-revision", "point --tokenizer at the tokenizer's directory (a Hugging Face snapshot folder)"},
    {"--middleware", kProxy},
    {"--enable-ssl-refresh",
     "the --ssl-certfile / --ssl-keyfile files are read at startup; restart the server after renewing them "
     "(SIGTERM drains it first)"},
    {"--response-role", "the assistant role is always \"assistant\"; drop the flag"},
    {"--enable-request-id-headers", kProxy},
    {"--mm-processor-kwargs", kMultimodal},
    {"--allowed-local-media-path", kMultimodal},
    {"--compilation-config",
     "tessera has no torch.compile; for no CUDA graphs use --enforce-eager, otherwise drop the flag"},
    {"--kv-transfer-config", "disaggregated prefill is not built; serve prefill and decode in one tessera server"},
    {"--max-num-partial-prefills", "long prompts are prefilled in chunks of --max-num-batched-tokens; drop the flag"},
    {"--tokenizer-pool-size", "tokenization runs in the server process; drop the flag"},
    {"--num-scheduler-steps", "vLLM's V1 engine removed it as well; drop the flag"},
    {"--worker-cls", kDrop},
    {"--tool-parser-plugin", "use a built-in --tool-call-parser (hermes, qwen3_coder)"},
    {"--enable-log-outputs", "log the answers at the client, or use --enable-log-requests for the prompts"},
    {"--log-config-file", "tessera logs to stderr; redirect or collect it there"},
    {"--device-id", "choose the GPUs with CUDA_VISIBLE_DEVICES"},
    {"--ray-workers-use-nsight", "run the rank under nsys yourself; drop the flag"},
    {"--max-parallel-loading-workers", "weights are read by each rank as its shard needs them; drop the flag"},
    {"--enable-sleep-mode", kDrop},
    {"--calculate-kv-scales", "use --kv-cache-dtype fp8 (scales of 1.0) or the checkpoint's own KV scales"},
    {"--logits-processors",
     "logits processors are Python code; use the request fields (logit_bias, "
     "allowed_token_ids, bad_words, structured outputs) instead"},
    {"--data-parallel-rank", kDataParallel},
    {"--data-parallel-address", kDataParallel},
    {"--data-parallel-rpc-port", kDataParallel},
    {"--data-parallel-size-local", kDataParallel},
    {"--data-parallel-start-rank", kDataParallel},
    {"--data-parallel-backend", kDataParallel},
    {"--headless",
     "the nodes other than the head run `tessera serve ... --nnodes N --node-rank R` (docs/distributed.md)"},
    {"--enable-eplb", "expert placement is fixed (--enable-expert-parallel); drop the flag"},
    {"--enable-force-include-usage",
     "ask for usage per request with stream_options: {\"include_usage\": true} (every non-streamed answer carries "
     "it)"},
    {"--enable-server-load-tracking", "read vllm:num_requests_running and vllm:num_requests_waiting on /metrics"},
    {"--h11-max-incomplete-event-size", "the request size limit is --max-request-body-bytes"},
    {"--h11-max-header-count", kProxy},
    {"--speculative-model", "use --speculative-config '{\"method\": \"ngram\", ...}' or '{\"method\": \"mtp\", ...}'"},
    {"--num-speculative-tokens", "use --speculative-config '{\"method\": ..., \"num_speculative_tokens\": N}'"},
    {"--enable-mfu-metrics", kDrop},
    {"--otlp-traces-endpoint", "tessera exports Prometheus metrics on /metrics and no OpenTelemetry traces"},
    {"--collect-detailed-traces", "tessera exports Prometheus metrics on /metrics and no OpenTelemetry traces"},
    {"--disable-async-output-proc", kDrop},
    {"--pooler-config", "tessera serves generation only, not embeddings or scores"},
    {"--task", "tessera serves generation only (vLLM's --task generate); drop the flag"},
    {"--runner", "tessera serves generation only (vLLM's --runner generate); drop the flag"},
    {"--convert", "tessera serves generation only; drop the flag"},
};

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.pop_back();
  size_t i = 0;
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
  return s.substr(i);
}

// A comment starts at a # outside quotes that follows a blank (YAML's rule).
std::string strip_comment(const std::string& line) {
  char quote = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quote) {
      if (c == quote) quote = 0;
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '#' && (i == 0 || line[i - 1] == ' ' || line[i - 1] == '\t')) {
      return line.substr(0, i);
    }
  }
  return line;
}

// A scalar's text: quotes removed. Flags take strings, so 8000 and "8000" are the same.
std::string scalar(const std::string& raw) {
  const std::string v = trim(raw);
  if (v.size() >= 2 && (v.front() == '"' || v.front() == '\'') && v.back() == v.front())
    return v.substr(1, v.size() - 2);
  return v;
}

struct ConfigLine {
  int number = 0;
  std::string text;
};

class ConfigReader {
 public:
  ConfigReader(const std::string& path, const CLI::App& app) : path_(path), app_(app) {}

  std::vector<std::string> read(const std::string& yaml_text) {
    std::vector<ConfigLine> lines;
    std::istringstream in(yaml_text);
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      line = strip_comment(line);
      if (!trim(line).empty() && trim(line) != "---") lines.push_back({n, line});
    }
    for (size_t i = 0; i < lines.size(); ++i) {
      const ConfigLine& l = lines[i];
      if (l.text[0] == ' ' || l.text[0] == '\t' || l.text[0] == '-')
        bad(l, "expected `flag-name: value` at the start of the line");
      const size_t colon = l.text.find(':');
      if (colon == std::string::npos) bad(l, "expected `flag-name: value`");
      const std::string key = trim(l.text.substr(0, colon));
      const std::string value = trim(l.text.substr(colon + 1));
      if (key.empty() || key.find(' ') != std::string::npos) bad(l, "expected `flag-name: value`");
      std::vector<std::string> items;
      size_t j = i + 1;
      while (j < lines.size() && (lines[j].text[0] == ' ' || lines[j].text[0] == '\t' || lines[j].text[0] == '-')) {
        const std::string item = trim(lines[j].text);
        if (!item.starts_with("- ") && item != "-")
          bad(lines[j], "expected a list item `- value` (nested maps: use {...})");
        items.push_back(scalar(item.substr(1)));
        ++j;
      }
      if (!items.empty() && !value.empty()) bad(l, "a key has either a value or a list of `- items` below it");
      if (!items.empty()) {
        add_list(key, items);
      } else {
        add(l, key, value);
      }
      i = j - 1;
    }
    return out_;
  }

 private:
  [[noreturn]] void bad(const ConfigLine& l, const std::string& why) const {
    throw FlagError(
        fmt::format("--config {}: line {}: {} (the file holds `flag-name: value` lines, as vLLM's "
                    "--config does)",
                    path_, l.number, why));
  }

  void add_list(const std::string& key, const std::vector<std::string>& items) {
    out_.push_back("--" + key);
    for (const std::string& item : items) out_.push_back(item);
  }

  void add(const ConfigLine& l, const std::string& key, const std::string& value) {
    if (value.empty()) bad(l, fmt::format("'{}' has no value", key));
    if (value == "true" || value == "True") {
      out_.push_back("--" + key);
    } else if (value == "false" || value == "False") {
      std::string dashed = key;
      std::replace(dashed.begin(), dashed.end(), '_', '-');
      // The flag's "off" form where it has one; a flag that is off by default is simply left out.
      for (const CLI::Option* opt : app_.get_options())
        for (const std::string& name : opt->get_fnames())
          if (name == "no-" + dashed) out_.push_back("--no-" + key);
    } else if (value.front() == '[') {
      if (value.back() != ']') bad(l, "an inline list must end with ]");
      out_.push_back("--" + key);
      std::string inner = value.substr(1, value.size() - 2);
      for (size_t at = 0; at <= inner.size();) {
        size_t comma = std::min(inner.find(',', at), inner.size());
        const std::string item = scalar(inner.substr(at, comma - at));
        if (!item.empty()) out_.push_back(item);
        at = comma + 1;
      }
    } else if (value.front() == '{') {
      try {
        out_.push_back("--" + key);
        out_.push_back(nlohmann::json::parse(value).dump());
      } catch (const nlohmann::json::exception& e) {
        bad(l, fmt::format("'{}': an inline object must be JSON ({})", key, e.what()));
      }
    } else {
      out_.push_back("--" + key);
      out_.push_back(scalar(value));
    }
  }

  std::string path_;
  const CLI::App& app_;
  std::vector<std::string> out_;
};

}  // namespace

const char* refused_vllm_flag_advice(const std::string& flag) {
  for (const auto& [name, advice] : kRefused)
    if (flag == name) return advice;
  return nullptr;
}

std::vector<std::string> refused_vllm_flags() {
  std::vector<std::string> out;
  for (const auto& entry : kRefused) out.push_back(entry.first);
  return out;
}

std::vector<std::string> config_file_flags(const std::string& yaml_text, const std::string& path, const CLI::App& app) {
  return ConfigReader(path, app).read(yaml_text);
}

std::vector<std::string> expand_config_file(std::vector<std::string> args, const CLI::App& app) {
  for (size_t i = 1; i < args.size(); ++i) {
    std::string path;
    size_t used = 0;
    if (args[i] == "--config") {
      if (i + 1 >= args.size()) throw FlagError("argument --config: expected one argument (a YAML file)");
      path = args[i + 1];
      used = 2;
    } else if (args[i].starts_with("--config=")) {
      path = args[i].substr(9);
      used = 1;
    } else {
      continue;
    }
    std::ifstream in(path);
    if (!in) throw FlagError(fmt::format("argument --config: cannot read '{}': no such file", path));
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<std::string> flags = config_file_flags(text, path, app);
    args.erase(args.begin() + static_cast<std::ptrdiff_t>(i), args.begin() + static_cast<std::ptrdiff_t>(i + used));
    // Before every command-line flag (after the program name and a leading MODEL, as vLLM places them): the
    // command line's values come later and win.
    const size_t at = args.size() > 1 && !args[1].starts_with("-") ? 2 : 1;
    args.insert(args.begin() + static_cast<std::ptrdiff_t>(at), flags.begin(), flags.end());
    return args;
  }
  return args;
}

}  // namespace tessera::cli
