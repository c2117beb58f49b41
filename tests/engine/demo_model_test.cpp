// The demo model shipped in the repository (models/tessera-demo, trained by tools/train_demo_model.py):
// tessera's held-out perplexity on the CPU equals the figure transformers recorded at training time
// (eval.json), and its greedy chat answer to a quatrain request is a five-character quatrain.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "engine/engine.h"
#include "engine/model_loader.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace tessera {
namespace {

const std::string kDir = std::string(TESSERA_SOURCE_DIR) + "/models/tessera-demo";

struct Demo {
  CpuBackend backend;
  std::unique_ptr<LLMEngine> engine;
  std::unique_ptr<tokenizer::Tokenizer> tok = tokenizer::Tokenizer::from_dir(kDir);
  explicit Demo(int max_model_len) {
    LoadOptions lo;
    lo.model_dir = kDir;
    EngineConfig ec;
    ec.num_blocks_override = 1024;
    ec.scheduler.max_num_seqs = 64;
    ec.scheduler.max_model_len = max_model_len;
    engine = std::make_unique<LLMEngine>(load_model(lo, backend), backend, ec);
  }
};

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f) << path;
  return nlohmann::json::parse(f);
}

// The first texts of heldout_texts.jsonl up to about 900 scored tokens (a few seconds on 2 cores), scored
// as eval.json says: each text tokenized alone, cut to 1024 tokens, the NLL of tokens 1..n-1. The
// perplexity over them must be transformers' (eval.json's per-text NLLs) within 0.5%, and each text's
// token count must be transformers' (the same tokenizer).
TEST(DemoModel, HeldOutPerplexityIsTheTrainingTimeFigure) {
  const nlohmann::json eval = read_json(kDir + "/eval.json");
  const auto& per_text = eval["heldout"]["per_text_tokens_nll"];
  Demo d(1025);
  std::ifstream in(kDir + "/heldout_texts.jsonl");
  ASSERT_TRUE(in);
  std::string line;
  size_t texts = 0, want_tokens = 0;
  double want_nll = 0;
  SamplingParams p;
  p.max_tokens = 0;
  p.prompt_logprobs = 0;
  while (want_tokens < 900 && std::getline(in, line)) {
    std::vector<int32_t> ids = d.tok->encode(nlohmann::json::parse(line)["text"].get<std::string>(), true);
    if (ids.size() > 1024) ids.resize(1024);
    const int n = per_text[texts][0].get<int>();
    ASSERT_EQ(static_cast<int>(ids.size()), n) << "text " << texts << ": tokenized unlike transformers";
    want_tokens += static_cast<size_t>(n - 1);
    want_nll += per_text[texts][1].get<double>();
    ASSERT_TRUE(d.engine->add_request(std::to_string(texts), ids, p).ok());
    ++texts;
  }
  ASSERT_GE(texts, 10u);
  size_t got_tokens = 0, finished = 0;
  double got_nll = 0;
  while (d.engine->has_unfinished())
    for (const auto& o : d.engine->step()) {
      EXPECT_TRUE(o.new_token_ids.empty());
      for (const auto& lp : o.prompt_logprobs) got_nll -= lp.logprob;
      got_tokens += o.prompt_logprobs.size();
      finished += o.finished;
    }
  EXPECT_EQ(finished, texts);
  ASSERT_EQ(got_tokens, want_tokens);
  const double got_ppl = std::exp(got_nll / got_tokens), want_ppl = std::exp(want_nll / want_tokens);
  EXPECT_NEAR(got_ppl / want_ppl, 1.0, 0.005) << "tessera " << got_ppl << ", transformers " << want_ppl << " over "
                                              << texts << " texts, " << got_tokens << " tokens";
  // The model card states the whole set's figure, which the per-text record adds up to.
  double all_nll = 0;
  for (const auto& t : per_text) all_nll += t[1].get<double>();
  EXPECT_NEAR(std::exp(all_nll / eval["heldout"]["tokens_scored"].get<double>()),
              eval["heldout"]["perplexity"].get<double>(), 0.5);
}

// "Write a five-character quatrain about the moon", greedy, through the model's chat template (thinking
// off): four lines of five CJK characters, each ending in a comma or a full stop.
TEST(DemoModel, GreedyQuatrainHasFourLinesOfFiveCharacters) {
  Demo d(4096);
  const auto tmpl = tokenizer::ChatTemplate::from_model_dir(kDir);
  nlohmann::ordered_json req{{"messages", {{{"role", "user"}, {"content", "写一首关于月亮的五言绝句"}}}},
                             {"add_generation_prompt", true},
                             {"chat_template_kwargs", {{"enable_thinking", false}}}};
  const std::vector<int32_t> prompt = d.tok->encode(tmpl.render(req), false);
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 64;
  ASSERT_TRUE(d.engine->add_request("poem", prompt, p).ok());
  std::vector<int32_t> out;
  while (d.engine->has_unfinished())
    for (const auto& o : d.engine->step()) out.insert(out.end(), o.new_token_ids.begin(), o.new_token_ids.end());
  const std::string text = d.tok->decode(out, /*skip_special_tokens=*/true);
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1)
    lines.push_back(text.substr(start, nl - start));
  lines.push_back(text.substr(start));
  ASSERT_EQ(lines.size(), 4u) << text;
  for (const std::string& l : lines) {
    ASSERT_TRUE(tokenizer::is_valid_utf8(l)) << l;
    std::vector<uint32_t> cps;
    for (size_t i = 0; i < l.size();) cps.push_back(tokenizer::decode_code_point(l, i));
    ASSERT_EQ(cps.size(), 6u) << "line '" << l << "' of\n" << text;
    for (int k = 0; k < 5; ++k) EXPECT_TRUE(cps[k] >= 0x4E00 && cps[k] <= 0x9FFF) << "line '" << l << "'";
    EXPECT_TRUE(cps[5] == 0xFF0C || cps[5] == 0x3002) << "line '" << l << "' ends in U+" << std::hex << cps[5];
  }
}

}  // namespace
}  // namespace tessera
