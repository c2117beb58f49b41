// tessera generate: offline generation through the engine (vLLM's offline mode).
#include <chrono>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/engine_flags.h"
#include "cli/verbs.h"
#include "core/error.h"
#include "core/logging.h"

namespace tessera::cli {

namespace {

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    std::string tok = s.substr(i, j - i);
    char* end = nullptr;
    long v = std::strtol(tok.c_str(), &end, 10);
    if (tok.empty() || *end) fail(ErrorKind::kInvalidArgument, "--prompt-ids: '{}' is not a token id", tok);
    ids.push_back(static_cast<int32_t>(v));
    i = j + 1;
  }
  return ids;
}

struct Job {
  std::vector<int32_t> prompt;
  SamplingParams params;
  std::vector<int32_t> output;
  std::string finish_reason;
};

}  // namespace

int run_generate(int argc, char** argv) {
  CLI::App app{"Generate from prompts offline, through the same engine as `tessera serve`.\n"
               "  tessera generate --model DIR --prompt-ids 1,2,3 --max-tokens 16\n"
               "  tessera generate --model DIR --input prompts.jsonl --output out.jsonl",
               "tessera generate"};
  EngineFlags ef;
  std::vector<std::string> prompt_ids;
  std::string input, output;
  SamplingParams sp;
  sp.temperature = 0.0f;
  bool json_out = false;
  app.add_option("--model,model", ef.model, "model directory (config.json + safetensors)")->required();
  app.add_option("--prompt-ids", prompt_ids, "a prompt as comma-separated token ids; repeat for several prompts");
  app.add_option("--input", input, "JSONL file: one {\"prompt_ids\": [...]} per line, plus OpenAI sampling fields");
  app.add_option("--output", output, "JSONL file for the results (default: stdout)");
  app.add_option("--max-tokens", sp.max_tokens, "tokens to generate per prompt")->capture_default_str();
  app.add_option("--temperature", sp.temperature, "0 = greedy")->capture_default_str();
  app.add_option("--top-p", sp.top_p, "nucleus sampling mass")->capture_default_str();
  app.add_option("--top-k", sp.top_k, "sample among the k most likely tokens (0 = off)")->capture_default_str();
  app.add_option("--min-p", sp.min_p, "drop tokens below min_p times the top probability")->capture_default_str();
  std::optional<uint64_t> request_seed;
  app.add_option("--request-seed", request_seed, "per-request seed (same tokens alone or in a batch)");
  app.add_flag("--ignore-eos", sp.ignore_eos, "keep generating past end-of-sequence tokens");
  app.add_flag("--json", json_out, "print one JSON object per prompt (prompt_ids, token_ids, finish_reason)");
  add_engine_flags(app, ef);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (request_seed) sp.seed = request_seed;

  std::vector<Job> jobs;
  for (const auto& s : prompt_ids) jobs.push_back({parse_ids(s), sp, {}, {}});
  if (!input.empty()) {
    std::ifstream in(input);
    if (!in) fail(ErrorKind::kNotFound, "{}: cannot open --input file", input);
    std::string line;
    int lineno = 0;
    while (std::getline(in, line)) {
      ++lineno;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const std::exception& e) {
        fail(ErrorKind::kInvalidArgument, "{}:{}: not JSON ({})", input, lineno, e.what());
      }
      Job job{{}, sp, {}, {}};
      if (j.contains("prompt_ids") && j["prompt_ids"].is_array()) {
        for (const auto& t : j["prompt_ids"]) {
          if (!t.is_number_integer()) fail(ErrorKind::kInvalidArgument, "{}:{}: prompt_ids must be integers", input, lineno);
          job.prompt.push_back(t.get<int32_t>());
        }
      } else if (j.contains("prompt")) {
        fail(ErrorKind::kUnsupported, "{}:{}: text prompts need a tokenizer; give prompt_ids", input, lineno);
      } else {
        fail(ErrorKind::kInvalidArgument, "{}:{}: each line needs prompt_ids", input, lineno);
      }
      if (Status s = sampling_params_from_json(j, job.params); !s.ok())
        fail(ErrorKind::kInvalidArgument, "{}:{}: {}", input, lineno, s.message());
      jobs.push_back(std::move(job));
    }
  }
  if (jobs.empty()) fail(ErrorKind::kInvalidArgument, "no prompts: pass --prompt-ids or --input");

  auto backend = make_backend_for(ef);
  LLMEngine engine(load_model(load_options(ef), *backend), *backend, engine_config(ef));
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (Status s = engine.add_request(std::to_string(i), jobs[i].prompt, jobs[i].params); !s.ok())
      fail(ErrorKind::kInvalidArgument, "prompt {}: {}", i, s.message());
  }
  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  double decode_seconds = 0;
  size_t decode_tokens = 0, total_out = 0;
  while (engine.has_unfinished()) {
    const uint64_t prompt_before = engine.stats().prompt_tokens;
    auto s0 = clock::now();
    auto outs = engine.step();
    double dt = std::chrono::duration<double>(clock::now() - s0).count();
    if (engine.stats().prompt_tokens == prompt_before && !outs.empty()) {
      decode_seconds += dt;
      decode_tokens += outs.size();
    }
    for (const auto& o : outs) {
      Job& job = jobs[std::stoul(o.request_id)];
      job.output.insert(job.output.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      total_out += o.new_token_ids.size();
      if (o.finished) job.finish_reason = finish_reason_name(o.finish_reason);
    }
  }
  double total = std::chrono::duration<double>(clock::now() - t0).count();
  size_t total_in = 0;
  for (const auto& j : jobs) total_in += j.prompt.size();
  TLOG_INFO("Processed {} prompts in {:.2f} s: input {:.1f} tok/s, output {:.1f} tok/s; decode {:.1f} tok/s",
            jobs.size(), total, total_in / total, total_out / total,
            decode_seconds > 0 ? decode_tokens / decode_seconds : 0.0);

  std::ofstream file;
  if (!output.empty()) {
    file.open(output);
    if (!file) fail(ErrorKind::kNotFound, "{}: cannot write --output file", output);
  }
  std::ostream& os = output.empty() ? std::cout : file;
  for (const auto& j : jobs) {
    if (json_out || !output.empty()) {
      nlohmann::json o{{"prompt_ids", j.prompt}, {"token_ids", j.output}, {"finish_reason", j.finish_reason}};
      os << o.dump() << "\n";
    } else {
      os << "token_ids:";
      for (int32_t t : j.output) os << " " << t;
      os << "  (" << j.finish_reason << ")\n";
    }
  }
  return 0;
}

}  // namespace tessera::cli
