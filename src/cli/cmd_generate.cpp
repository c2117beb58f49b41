// tessera generate: offline generation through the engine (vLLM's offline mode).
#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <mutex>

#include "cli/engine_flags.h"
#include "cli/flag_parsing.h"
#include "cli/node_launch.h"
#include "cli/rank_launcher.h"
#include "cli/verbs.h"
#include "core/error.h"
#include "core/logging.h"
#include "engine/async_engine.h"
#include "loader/model_config.h"
#include "server/sampling_params_json.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

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
  std::string prompt_text;          // text prompts, before tokenization
  nlohmann::ordered_json messages;  // chat prompts, before the chat template
  std::vector<int32_t> output;
  std::vector<TokenLogprob> logprobs;         // when the request asked for them
  std::vector<TokenLogprob> prompt_logprobs;  // --score: every prompt token's from the second on
  bool truncated = false;                     // --score: the text was cut to --max-model-len - 1 tokens
  std::string text;
  std::string finish_reason;
  std::chrono::steady_clock::time_point first_token, last_token;
  bool done = false;
};

// --score FILE: the texts to score, one per line: JSONL objects with "text", or plain text.
std::vector<std::string> read_score_texts(const std::string& file) {
  std::ifstream in(file);
  if (!in) fail(ErrorKind::kNotFound, "{}: cannot open --score file", file);
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") != std::string::npos) lines.push_back(line);
  }
  if (lines.empty()) fail(ErrorKind::kInvalidArgument, "{}: no text to score (one text per non-empty line)", file);
  // JSONL when the first line is a JSON object; then every line must be one with a string "text".
  nlohmann::json first = nlohmann::json::parse(lines[0], nullptr, /*allow_exceptions=*/false);
  if (!first.is_object()) return lines;
  std::vector<std::string> texts;
  for (size_t i = 0; i < lines.size(); ++i) {
    nlohmann::json j = nlohmann::json::parse(lines[i], nullptr, false);
    if (!j.is_object() || !j.contains("text") || !j["text"].is_string())
      fail(ErrorKind::kInvalidArgument, "{}: line {} is not a JSON object with a string \"text\" (JSONL input)", file,
           i + 1);
    texts.push_back(j["text"].get<std::string>());
  }
  return texts;
}

// Mean NLL and perplexity of `tokens` scored tokens whose NLLs sum to `nll` (nan when there is none).
nlohmann::json score_json(size_t tokens, double nll) {
  nlohmann::json o{{"tokens", tokens}, {"nll_sum", nll}};
  o["mean_nll"] = tokens ? nll / static_cast<double>(tokens) : std::nan("");
  o["perplexity"] = tokens ? std::exp(nll / static_cast<double>(tokens)) : std::nan("");
  return o;
}

// What `generate` takes besides the engine flags.
struct GenerateFlags {
  std::vector<std::string> prompt_ids, prompts;
  std::string input, output, tokenizer_dir, chat_template_file, score_file;
  bool chat = false, json_out = false;
  SamplingParams sp;
  std::optional<uint64_t> request_seed;
};

void add_generate_flags(CLI::App& app, EngineFlags& ef, GenerateFlags& g) {
  g.sp.temperature = 0.0f;
  app.add_option("--model,model", ef.model,
                 "model directory (config.json + safetensors); default: the demo model shipped in the repository, "
                 "models/tessera-demo");
  app.add_option("--prompt-ids", g.prompt_ids, "a prompt as comma-separated token ids; repeat for several prompts");
  app.add_option("--prompt", g.prompts, "a text prompt (needs a tokenizer); repeat for several prompts");
  app.add_flag("--chat", g.chat, "treat each --prompt as a user message and apply the model's chat template");
  app.add_option("--tokenizer", g.tokenizer_dir, "directory with tokenizer.json (default: the model directory)");
  app.add_option("--chat-template", g.chat_template_file, "a Jinja chat template file instead of the model's");
  app.add_option("--input", g.input,
                 "JSONL file: one {\"prompt_ids\": [...]}, {\"prompt\": \"...\"} or {\"messages\": [...]} per line, "
                 "plus OpenAI sampling fields (max_tokens, temperature, top_p, seed, stop, ...)");
  app.add_option("--output", g.output, "JSONL file for the results, in input order (default: stdout)");
  app.add_option("--score", g.score_file,
                 "score texts instead of generating: FILE holds one text per line (JSONL with \"text\", or plain "
                 "text); prints each text's scored tokens (all but the first), mean NLL and perplexity, then the "
                 "total over all texts. Each text is tokenized alone (the tokenizer's special tokens added, as for "
                 "--prompt) and cut to --max-model-len - 1 tokens");
  SamplingParams& sp = g.sp;
  app.add_option("--max-tokens", sp.max_tokens, "tokens to generate per prompt")->capture_default_str();
  app.add_option("--temperature", sp.temperature, "0 = greedy")->capture_default_str();
  app.add_option("--top-p", sp.top_p, "nucleus sampling mass")->capture_default_str();
  app.add_option("--top-k", sp.top_k, "sample among the k most likely tokens (0 = off)")->capture_default_str();
  app.add_option("--min-p", sp.min_p, "drop tokens below min_p times the top probability")->capture_default_str();
  app.add_option("--request-seed", g.request_seed, "per-request seed (same tokens alone or in a batch)");
  app.add_flag("--ignore-eos", sp.ignore_eos, "keep generating past end-of-sequence tokens");
  app.add_option("--logprobs", sp.logprobs,
                 "with --json: each token's logprob and the N most likely alternatives (-1 = none)")
      ->capture_default_str();
  app.add_flag("--json", g.json_out, "print one JSON object per prompt (prompt_ids, token_ids, finish_reason)");
  add_engine_flags(app, ef);
}

// One job from a line of the --input file.
Job job_from_json_line(const nlohmann::json& j, const SamplingParams& defaults, const std::string& input, int lineno) {
  Job job;
  job.params = defaults;
  if (j.contains("prompt_ids") && j["prompt_ids"].is_array()) {
    for (const auto& t : j["prompt_ids"]) {
      if (!t.is_number_integer())
        fail(ErrorKind::kInvalidArgument, "{}:{}: prompt_ids must be integers", input, lineno);
      job.prompt.push_back(t.get<int32_t>());
    }
  } else if (j.contains("prompt") && j["prompt"].is_string()) {
    job.prompt_text = j["prompt"].get<std::string>();
  } else if (j.contains("messages") && j["messages"].is_array()) {
    job.messages = nlohmann::ordered_json::parse(j["messages"].dump());
  } else {
    fail(ErrorKind::kInvalidArgument, "{}:{}: each line needs prompt_ids, prompt (text) or messages", input, lineno);
  }
  if (Status s = server::sampling_params_from_json(j, job.params); !s.ok())
    fail(ErrorKind::kInvalidArgument, "{}:{}: {}", input, lineno, s.message());
  return job;
}

void read_input_jobs(const std::string& input, const SamplingParams& sp, std::vector<Job>& jobs) {
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
    jobs.push_back(job_from_json_line(j, sp, input, lineno));
  }
}

// The prompts of --prompt-ids, --prompt and --input, in that order, or the texts of --score.
std::vector<Job> collect_jobs(const GenerateFlags& g) {
  std::vector<Job> jobs;
  for (const auto& s : g.prompt_ids) {
    Job job;
    job.prompt = parse_ids(s);
    job.params = g.sp;
    jobs.push_back(std::move(job));
  }
  for (const auto& text : g.prompts) {
    Job job;
    job.params = g.sp;
    if (g.chat)
      job.messages = nlohmann::ordered_json::array({{{"role", "user"}, {"content", text}}});
    else
      job.prompt_text = text;
    jobs.push_back(std::move(job));
  }
  if (!g.input.empty()) read_input_jobs(g.input, g.sp, jobs);
  if (!g.score_file.empty()) {
    if (!jobs.empty())
      fail(ErrorKind::kInvalidArgument, "--score scores a file's texts; drop --prompt, --prompt-ids, --input");
    for (auto& text : read_score_texts(g.score_file)) {
      Job job;
      job.params.temperature = 0;
      job.params.max_tokens = 0;       // generate nothing
      job.params.prompt_logprobs = 0;  // the logprob of every prompt token
      job.prompt_text = std::move(text);
      jobs.push_back(std::move(job));
    }
  }
  if (jobs.empty()) fail(ErrorKind::kInvalidArgument, "no prompts: pass --prompt, --prompt-ids, --input or --score");
  return jobs;
}

// The tokenizer (needed for text prompts and text output; optional for token ids), and every
// text or chat prompt turned into token ids.
std::unique_ptr<tokenizer::Tokenizer> tokenize_jobs(const GenerateFlags& g, const std::string& model_dir,
                                                    std::vector<Job>& jobs) {
  std::unique_ptr<tokenizer::Tokenizer> tok;
  const std::string tdir = g.tokenizer_dir.empty() ? model_dir : g.tokenizer_dir;
  bool needs_text = false;
  for (const auto& j : jobs) needs_text |= !j.prompt_text.empty() || !j.messages.is_null();
  if (std::filesystem::exists(std::filesystem::path(tdir) / "tokenizer.json"))
    tok = tokenizer::Tokenizer::from_dir(tdir);
  else if (needs_text)
    fail(ErrorKind::kNotFound, "{}: no tokenizer.json for the text prompts; pass --tokenizer DIR or use --prompt-ids",
         tdir);
  std::optional<tokenizer::ChatTemplate> tmpl;
  for (auto& j : jobs) {
    if (!j.messages.is_null()) {
      if (!tmpl)
        tmpl = tokenizer::ChatTemplate::from_model_dir(
            tdir,
            g.chat_template_file.empty() ? std::nullopt : std::optional<std::filesystem::path>(g.chat_template_file));
      nlohmann::ordered_json req{{"messages", j.messages}, {"add_generation_prompt", true}};
      j.prompt_text = tmpl->render(req);
    }
    if (!j.prompt_text.empty()) j.prompt = tok->encode(j.prompt_text, /*add_special_tokens=*/j.messages.is_null());
  }
  return tok;
}

// --score: every text must encode to a token; one longer than --max-model-len - 1 tokens is cut
// (the first token is not scored, so max_model_len tokens would leave no room).
void truncate_score_jobs(const EngineFlags& ef, const std::string& score_file, std::vector<Job>& jobs) {
  const int max_len = ef.max_model_len > 0 ? ef.max_model_len
                                           : load_model_config(ef.model, hf_overrides_json(ef)).max_position_embeddings;
  for (auto& j : jobs) {
    if (j.prompt.empty()) fail(ErrorKind::kInvalidArgument, "{}: a text encodes to no tokens", score_file);
    if (static_cast<int>(j.prompt.size()) > max_len - 1) {
      j.prompt.resize(static_cast<size_t>(max_len - 1));
      j.truncated = true;
    }
  }
}

// What the jobs' callbacks share; it outlives the engine that calls them.
struct Progress {
  std::mutex mu;
  std::condition_variable cv;
  size_t remaining = 0;
};

// Submits every job and waits until each has finished.
void run_jobs(AsyncEngine& engine, std::vector<Job>& jobs, Progress& progress) {
  using clock = std::chrono::steady_clock;
  progress.remaining = jobs.size();
  for (size_t i = 0; i < jobs.size(); ++i) {
    // --max-tokens is a limit here: a prompt with less room left in max_model_len generates up
    // to max_model_len (finish reason length) rather than being refused, as before the engine
    // checked prompt + max_tokens at its front door.
    const int room = engine.max_model_len() - static_cast<int>(jobs[i].prompt.size());
    if (room > 0) jobs[i].params.max_tokens = std::min(jobs[i].params.max_tokens, room);
    GenerationRequest req{std::to_string(i), jobs[i].prompt, jobs[i].params};
    SubmitResult r = engine.submit(std::move(req), [&jobs, &progress, i](const StreamDelta& d) {
      std::lock_guard<std::mutex> lk(progress.mu);
      Job& job = jobs[i];
      auto now = clock::now();
      if (job.output.empty() && !d.token_ids.empty()) job.first_token = now;
      if (!d.token_ids.empty()) job.last_token = now;
      job.output.insert(job.output.end(), d.token_ids.begin(), d.token_ids.end());
      job.logprobs.insert(job.logprobs.end(), d.logprobs.begin(), d.logprobs.end());
      job.prompt_logprobs.insert(job.prompt_logprobs.end(), d.prompt_logprobs.begin(), d.prompt_logprobs.end());
      job.text += d.text;
      if (d.finished) {
        job.finish_reason =
            d.finish_reason == FinishReason::kError ? "error: " + d.text : finish_reason_name(d.finish_reason);
        job.done = true;
        if (--progress.remaining == 0) progress.cv.notify_all();
      }
    });
    if (!r.ok()) fail(ErrorKind::kInvalidArgument, "prompt {}: {}", i, r.message);
  }
  std::unique_lock<std::mutex> lk(progress.mu);
  progress.cv.wait(lk, [&] { return progress.remaining == 0; });
}

void log_throughput(const std::vector<Job>& jobs, double seconds) {
  size_t total_in = 0, total_out = 0;
  double decode_rate_sum = 0;
  int decode_rates = 0;
  for (const auto& j : jobs) {
    total_in += j.prompt.size();
    total_out += j.output.size();
    double span = std::chrono::duration<double>(j.last_token - j.first_token).count();
    if (j.output.size() > 1 && span > 0) {
      decode_rate_sum += (j.output.size() - 1) / span;
      ++decode_rates;
    }
  }
  TLOG_INFO(
      "Processed {} prompts in {:.2f} s: input {:.1f} tok/s, output {:.1f} tok/s; decode {:.2f} tok/s per "
      "sequence",
      jobs.size(), seconds, total_in / seconds, total_out / seconds,
      decode_rates ? decode_rate_sum / decode_rates : 0.0);
}

// One result line of --json / --output.
nlohmann::json job_json(const Job& j, std::chrono::steady_clock::time_point t0, bool with_text) {
  nlohmann::json o{{"prompt_ids", j.prompt}, {"token_ids", j.output}, {"finish_reason", j.finish_reason}};
  if (!j.output.empty()) {  // seconds since the first request was queued (timing of runs)
    o["first_token_at_s"] = std::chrono::duration<double>(j.first_token - t0).count();
    o["last_token_at_s"] = std::chrono::duration<double>(j.last_token - t0).count();
  }
  if (with_text) o["text"] = j.text;
  if (!j.logprobs.empty()) {
    nlohmann::json lps = nlohmann::json::array();
    for (const TokenLogprob& lp : j.logprobs) {
      nlohmann::json top = nlohmann::json::array();
      for (const auto& [id, v] : lp.top) top.push_back({id, v});
      lps.push_back({{"token", lp.token}, {"logprob", lp.logprob}, {"top", top}});
    }
    o["logprobs"] = std::move(lps);
  }
  return o;
}

// --score's report: one line per text (a table, or JSON with --json / --output), then the total.
void write_scores(const GenerateFlags& g, const std::vector<Job>& jobs) {
  std::ofstream file;
  if (!g.output.empty()) {
    file.open(g.output);
    if (!file) fail(ErrorKind::kNotFound, "{}: cannot write --output file", g.output);
  }
  std::ostream& os = g.output.empty() ? std::cout : file;
  const bool as_json = g.json_out || !g.output.empty();
  size_t all_tokens = 0, cut = 0;
  double all_nll = 0;
  if (!as_json) os << fmt::format("{:>6} {:>8} {:>10} {:>12}\n", "text", "tokens", "mean_nll", "perplexity");
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Job& j = jobs[i];
    if (j.finish_reason != "length") fail(ErrorKind::kInternal, "text {}: scoring failed ({})", i + 1, j.finish_reason);
    double nll = 0;
    for (const TokenLogprob& lp : j.prompt_logprobs) nll -= lp.logprob;
    const size_t n = j.prompt_logprobs.size();
    all_tokens += n;
    all_nll += nll;
    cut += j.truncated;
    nlohmann::json o = score_json(n, nll);
    if (as_json) {
      o["index"] = i + 1;  // the text's line in FILE (non-empty lines counted)
      if (j.truncated) o["truncated"] = true;
      os << o.dump() << "\n";
    } else {
      os << fmt::format("{:>6} {:>8} {:>10.4f} {:>12.4f}{}\n", i + 1, n, o["mean_nll"].get<double>(),
                        o["perplexity"].get<double>(), j.truncated ? "  (cut)" : "");
    }
  }
  nlohmann::json total = score_json(all_tokens, all_nll);
  total["texts"] = jobs.size();
  total["truncated"] = cut;
  if (as_json)
    os << nlohmann::json{{"total", total}}.dump() << "\n";
  else
    os << fmt::format("total: {} texts, {} tokens scored, mean NLL {:.6f}, perplexity {:.4f}{}\n", jobs.size(),
                      all_tokens, total["mean_nll"].get<double>(), total["perplexity"].get<double>(),
                      cut ? fmt::format(" ({} texts cut to --max-model-len - 1 tokens)", cut) : "");
}

void write_results(const GenerateFlags& g, const std::vector<Job>& jobs, bool with_text,
                   std::chrono::steady_clock::time_point t0) {
  std::ofstream file;
  if (!g.output.empty()) {
    file.open(g.output);
    if (!file) fail(ErrorKind::kNotFound, "{}: cannot write --output file", g.output);
  }
  std::ostream& os = g.output.empty() ? std::cout : file;
  for (const auto& j : jobs) {
    if (g.json_out || !g.output.empty()) {
      os << job_json(j, t0, with_text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    } else if (with_text) {
      os << j.text << "\n  (" << j.output.size() << " tokens, " << j.finish_reason << ")\n";
    } else {
      os << "token_ids:";
      for (int32_t t : j.output) os << " " << t;
      os << "  (" << j.finish_reason << ")\n";
    }
  }
}

}  // namespace

int run_generate(int argc, char** argv) {
  CLI::App app{
      "Generate from prompts offline, through the same engine as `tessera serve`.\n"
      "  tessera generate --model DIR --prompt-ids 1,2,3 --max-tokens 16\n"
      "  tessera generate --model DIR --input prompts.jsonl --output out.jsonl\n"
      "  tessera generate --model DIR --score texts.jsonl   (perplexity of each text and of all)",
      "tessera generate"};
  use_vllm_conventions(app);
  EngineFlags ef;
  GenerateFlags g;
  add_generate_flags(app, ef, g);
  WorkerFlags wf;
  add_worker_flags(app, wf);
  ClusterFlags cf;
  add_cluster_flags(app, cf);
  if (int rc = parse_flags(app, argc, argv); rc >= 0) return rc;
  if (ef.model.empty()) ef.model = default_model_dir("generate");
  resolve_model(ef);
  // A rank process spawned by the head (TP x PP > 1): run the shard, nothing else.
  if (wf.worker_rank >= 0) return run_worker_rank(ef, wf);
  // Several nodes: a node other than the head only runs its ranks (the head has the prompts).
  const dist::LaunchFacts facts = resolve_cluster(ef, cf);
  // One process per rank under a launcher: the node's other local ranks run their rank only.
  if (facts.one_process_per_rank && facts.local_rank > 0) return run_launched_rank(ef, cf, facts);
  std::unique_ptr<dist::NodeSession> session;
  if (!facts.is_head()) {
    as_flag_errors([&] { (void)engine_config(ef, /*parallel_supported=*/true); });  // as the head, before joining
    session = start_node_session(ef, cf, facts);
    return run_worker_node(ef, *session, facts, argc, argv);
  }
  if (g.request_seed) g.sp.seed = g.request_seed;
  std::vector<Job> jobs = collect_jobs(g);
  std::unique_ptr<tokenizer::Tokenizer> tok = tokenize_jobs(g, ef.model, jobs);
  if (!g.score_file.empty()) truncate_score_jobs(ef, g.score_file, jobs);

  // TP x PP > 1: this process is rank 0; the launcher spawns and supervises the others.
  // Declared before the engine, so the executor's shutdown plan goes out before it waits.
  // Several nodes: the head's session (control channel on the chosen NIC) outlives the launcher.
  if (facts.nnodes > 1) {
    as_flag_errors([&] { (void)engine_config(ef, /*parallel_supported=*/true); });
    session = start_node_session(ef, cf, facts);
  }
  HeadEngine head = start_head_engine(ef, std::move(session), facts, argc, argv);
  RankLauncher* launcher = head.launcher.get();
  Progress progress;
  AsyncEngine engine(std::move(head.llm), tok.get(), AsyncEngineOptions{static_cast<int>(jobs.size()) + 1});
  const auto t0 = std::chrono::steady_clock::now();
  run_jobs(engine, jobs, progress);
  engine.drain(std::chrono::milliseconds(0));
  if (launcher) {
    // A rank that died fails the whole job (the requests ended with an engine error).
    AsyncEngineStats st = engine.stats();
    std::string f = launcher->wait_failure(st.alive ? std::chrono::milliseconds(0) : std::chrono::seconds(2));
    if (!f.empty()) fail(ErrorKind::kNetwork, "{}{}", f, st.alive ? "" : " (" + st.fatal_error + ")");
    if (!st.alive) fail(ErrorKind::kNetwork, "{}", st.fatal_error);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  log_throughput(jobs, seconds);
  // Speculative decoding: the whole run's acceptance (vLLM's periodic line, over all steps).
  if (const SpecDecodeStats spec = engine.stats().engine.spec; spec.num_drafts > 0)
    TLOG_INFO("{}", spec_decode_log_line(spec, SpecDecodeStats{}, seconds));
  if (!g.score_file.empty())
    write_scores(g, jobs);
  else
    write_results(g, jobs, tok != nullptr, t0);
  return 0;
}

}  // namespace tessera::cli
