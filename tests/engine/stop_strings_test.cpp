// Stop strings end generation at the same token as transformers' StopStringCriteria
// (fixture made by tools/make_stop_string_refs.py on the real Qwen3 tokenizer), and the
// text is cut right before the stop string, as vLLM returns it.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace tessera {
namespace {

TEST(StopStrings, StopAtTheSameTokenAsTransformers) {
  const std::string root = TESSERA_SOURCE_DIR;
  std::ifstream f(root + "/tests/fixtures/stop/qwen3_stop_refs.json");
  ASSERT_TRUE(f) << "missing fixture tests/fixtures/stop/qwen3_stop_refs.json";
  auto ref = nlohmann::json::parse(f);
  auto tok = tokenizer::Tokenizer::from_dir(root + "/.npm-pkgs/tokenizer-qwen3/package/models");
  int stopped_cases = 0;
  for (const auto& c : ref["cases"]) {
    auto ids = c["ids"].get<std::vector<int32_t>>();
    auto stops = c["stop"].get<std::vector<std::string>>();
    tokenizer::DetokenizerOptions o;
    o.stop_strings = stops;
    tokenizer::StreamingDetokenizer d(*tok, o);
    std::string text;
    int stopped_at = -1;
    for (size_t i = 0; i < ids.size(); ++i) {
      auto r = d.push(ids[i]);
      text += r.text;
      if (r.stopped) {
        stopped_at = static_cast<int>(i) + 1;
        break;
      }
    }
    if (stopped_at < 0) text += d.finish().text;
    const std::string label = c["text_until_stop"].get<std::string>() + " / " + stops[0];
    if (c["stop_at"].is_null()) {
      EXPECT_EQ(stopped_at, -1) << label;
      EXPECT_EQ(text, c["text_until_stop"].get<std::string>()) << label;
      continue;
    }
    ++stopped_cases;
    EXPECT_EQ(stopped_at, c["stop_at"].get<int>()) << label;
    // Expected text: transformers' text at the stopping token, cut before the earliest stop string.
    std::string full = c["text_until_stop"].get<std::string>();
    size_t cut = std::string::npos;
    for (const auto& s : stops) cut = std::min(cut, full.find(s));
    ASSERT_NE(cut, std::string::npos) << label;
    EXPECT_EQ(text, full.substr(0, cut)) << label;
  }
  EXPECT_GE(stopped_cases, 15) << "the fixture should exercise many stops";
}

}  // namespace
}  // namespace tessera
