// The JSON Schema fixtures (tests/grammar/schemas/*.json: a schema, valid and invalid documents): the
// fixture documents are accepted / rejected, and random walks that sample only masked-in tokens (a small
// synthetic vocabulary and the real Qwen3 one) always end in JSON that an independent validator accepts.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "grammar_test_util.h"
#include "json_validator.h"
#include "qwen3_vocab.h"

namespace tessera::grammar {
namespace {

using ojson = nlohmann::ordered_json;

struct Fixture {
  std::string name;
  ojson doc;
};

std::vector<Fixture> load_fixtures() {
  std::vector<Fixture> out;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::filesystem::path(TESSERA_SOURCE_DIR) / "tests/grammar/schemas")) {
    std::ifstream in(entry.path());
    std::stringstream buffer;
    buffer << in.rdbuf();
    out.push_back({entry.path().stem().string(), ojson::parse(buffer.str())});
  }
  std::sort(out.begin(), out.end(), [](const Fixture& a, const Fixture& b) { return a.name < b.name; });
  return out;
}

class SchemaFixture : public ::testing::TestWithParam<Fixture> {};

std::shared_ptr<const Grammar> grammar_of(const ojson& schema, const JsonOptions& options = {}) {
  GrammarBuilder b;
  return b.build(b.add_json_schema(schema, options));
}

TEST_P(SchemaFixture, ValidAndInvalidDocuments) {
  const ojson& doc = GetParam().doc;
  auto g = grammar_of(doc["schema"]);
  testing::JsonValidator validator(doc["schema"]);
  for (const auto& v : doc["valid"]) {
    const auto text = v.get<std::string>();
    EXPECT_EQ(validator.validate(ojson::parse(text)), "") << "validator disagrees with the fixture: " << text;
    EXPECT_TRUE(testing::matches(g, text)) << text;
  }
  for (const auto& v : doc["invalid"]) {
    const auto text = v.get<std::string>();
    EXPECT_FALSE(testing::matches(g, text)) << text;
  }
}

void walk_and_validate(const ojson& schema, const std::shared_ptr<const TokenizerInfo>& vocab,
                       const JsonOptions& options, int walks, uint32_t seed, int max_tokens) {
  auto compiled = compile(grammar_of(schema, options), vocab);
  testing::JsonValidator validator(schema);
  std::mt19937 rng(seed);
  for (int w = 0; w < walks; ++w) {
    Matcher m(compiled);
    const testing::Walk walk = testing::random_walk(m, *vocab, rng, max_tokens);
    ASSERT_TRUE(walk.terminated) << "walk " << w << " did not end after " << walk.tokens << " tokens: " << walk.text;
    ojson value;
    try {
      value = testing::JsonValidator::parse(walk.text);
    } catch (const std::exception& e) {
      FAIL() << "not JSON: " << walk.text << " (" << e.what() << ")";
    }
    EXPECT_EQ(validator.validate(value), "") << walk.text;
    if (!options.any_whitespace) {
      EXPECT_EQ(walk.text.find("\n"), std::string::npos) << walk.text;
    }
  }
}

TEST_P(SchemaFixture, RandomWalksOnSyntheticVocabulary) {
  static auto vocab = testing::byte_vocab(testing::json_tokens());
  walk_and_validate(GetParam().doc["schema"], vocab, {}, 4, 11, 1500);
  JsonOptions compact;
  compact.any_whitespace = false;
  walk_and_validate(GetParam().doc["schema"], vocab, compact, 2, 12, 1500);
}

INSTANTIATE_TEST_SUITE_P(Schemas, SchemaFixture, ::testing::ValuesIn(load_fixtures()),
                         [](const ::testing::TestParamInfo<Fixture>& info) { return info.param.name; });

// One test for all fixtures: the Qwen3 vocabulary loads once (ctest runs each test in its own process).
TEST(GrammarSchemaWalks, RandomWalksOnQwen3Vocabulary) {
  auto vocab = testing::qwen3_vocab();
  if (!vocab) GTEST_SKIP() << "Qwen3 tokenizer absent: run scripts/fetch_test_data.sh";
  for (const Fixture& f : load_fixtures()) {
    SCOPED_TRACE(f.name);
    walk_and_validate(f.doc["schema"], vocab, {}, 2, 21, 600);
  }
}

}  // namespace
}  // namespace tessera::grammar
