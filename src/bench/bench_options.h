// Everything `tessera bench` can be told, with the seed protocol as the defaults.
#pragma once
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "bench/arrival.h"
#include "bench/conversation.h"

namespace tessera::bench {

struct BenchOptions {
  // Server.
  std::string base_url = "http://127.0.0.1:8000";
  std::string endpoint = "/v1/chat/completions";
  std::string api_key;
  std::vector<std::pair<std::string, std::string>> headers;  // --header KEY=VALUE: on every request
  std::string request_id_prefix;                             // non-empty: x-request-id PREFIX{index}
  std::string model;                                         // empty: the first id of GET /v1/models
  bool stream = true;
  double timeout_s = 600;

  // Workload: "prompt" (one fixed prompt), "random", "jsonl", "sonnet", "prefix_repetition" or "agent"
  // (multi-turn conversations sharing a system prompt, `agent`; its seed is `seed`).
  std::string dataset = "prompt";
  std::string dataset_path;
  std::string prompt = "Explain parallel computing in one sentence.";
  int max_tokens = 64;
  double temperature = 0;
  int random_input_len = 1024;
  int random_output_len = 128;
  double random_range_ratio = 0;
  int random_prefix_len = 0;  // tokens of shared random prefix before each random prompt
  int sonnet_input_len = 550, sonnet_output_len = 150, sonnet_prefix_len = 200;  // vLLM's sonnet dataset
  int prefix_repetition_prefix_len = 256, prefix_repetition_suffix_len = 256;    // vLLM's prefix_repetition
  int prefix_repetition_num_prefixes = 10, prefix_repetition_output_len = 128;
  AgentOptions agent;
  bool shuffle = true;               // prefix_repetition's prompts in random order (vLLM's --disable-shuffle: off)
  bool oversample = true;            // jsonl: cycle through the file for more requests than it holds
  std::string chat_template_kwargs;  // JSON object for the chat template where sonnet prompts are rendered
  bool ignore_eos = false;
  std::string extra_body;  // JSON object merged into every request body
  uint64_t seed = 0;
  std::string tokenizer_dir;  // a model folder with tokenizer.json: exact counts where usage is missing

  // Load shape. Each concurrency value is one level; 0 means unlimited.
  std::vector<int> concurrency;   // empty: 1,5,10,20 for a fixed prompt, unlimited for datasets
  size_t requests_per_level = 0;  // 0: 40 for a fixed prompt, 1000 for datasets (vLLM's default)
  double request_rate = std::numeric_limits<double>::infinity();
  double burstiness = 1.0;
  RampUp ramp_up = RampUp::kNone;  // vLLM's --ramp-up-strategy, from ramp_up_start_rps to ramp_up_end_rps
  int ramp_up_start_rps = 0, ramp_up_end_rps = 0;
  int num_warmups = 0;               // requests (copies of the first prompt) sent before each level, not counted
  std::vector<std::string> goodput;  // "ttft:500", "tpot:50", "e2el:2000"

  // vLLM bench serve's result file (--save-result): its JSON keys, one file per level.
  bool save_result = false;
  bool save_detailed = false;  // with the per-request lists (input_lens, ttfts, itls, ...)
  bool append_result = false;  // append a line to the file instead of overwriting it
  std::string result_dir, result_filename, label;
  std::vector<std::string> metadata;                 // KEY=VALUE pairs copied into the result JSON
  std::string percentile_metrics = "ttft,tpot,itl";  // which metrics get percentiles (also e2el)
  std::string metric_percentiles = "99";             // which percentiles
  std::string backend = "openai-chat";               // the result JSON's backend / endpoint_type
  std::string model_id;                              // --model as given (the result's model_id); "" = model
  int sharegpt_output_len = 0;                       // > 0: max_tokens of every ShareGPT / jsonl prompt

  // Output.
  std::string json_path;
  std::string markdown_path;
  std::string html_path;
  bool progress = true;

  // Loopback self-test: start an in-process server that answers instantly and aim at it.
  bool self_test = false;
};

// Runs every level and writes the reports; returns the process exit code (0 when at least one
// request succeeded). Throws tessera::Error for bad options and unreachable servers.
int run_benchmark(BenchOptions options);

}  // namespace tessera::bench
