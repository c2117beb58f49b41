// Structural tags (GrammarBuilder::add_triggered_tags): free text in which a trigger starts a tag whose content
// is a JSON Schema. Whole strings are accepted or refused as xgrammar's triggered tags define them, errors say
// what to change, and along random token paths every mask equals the brute-force one.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

#include "grammar/grammar.h"
#include "grammar_test_util.h"

namespace tessera::grammar {
namespace {

using testing::bit;
using testing::brute_force_mask;
using testing::byte_vocab;
using ::testing::HasSubstr;
using testing::matches;

const char* kWeather = R"({"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"], "additionalProperties": false})";
const char* kTime = R"({"type": "object", "properties": {"zone": {"type": "integer"}}, "required": ["zone"]})";

struct Tag {
  std::string begin, schema, end;
};

std::shared_ptr<const Grammar> build_tags(const std::vector<Tag>& tags, const std::vector<std::string>& triggers) {
  GrammarBuilder b;
  std::vector<TriggeredTag> items;
  for (const Tag& t : tags) items.push_back({t.begin, b.add_json_schema_text(t.schema), t.end});
  const std::string root = b.add_triggered_tags(items, triggers);
  return b.build(root);
}

std::shared_ptr<const Grammar> functions() {
  return build_tags(
      {{"<function=get_weather>", kWeather, "</function>"}, {"<function=get_time>", kTime, "</function>"}},
      {"<function="});
}

TEST(StructuralTag, FreeTextWithoutTriggers) {
  auto g = functions();
  EXPECT_TRUE(matches(g, ""));
  EXPECT_TRUE(matches(g, "Hello, world! 日本語 <b>bold</b> {\"not\": \"checked\"}\n"));
  EXPECT_TRUE(matches(g, "a < b, <func and <function but never the whole trigger"));
  EXPECT_TRUE(matches(g, "ends inside a trigger prefix <functio"));  // not yet a trigger: free text may end
  EXPECT_TRUE(matches(g, "</function> outside a tag is text"));
  EXPECT_FALSE(matches(g, std::string("\xff invalid UTF-8")));
}

TEST(StructuralTag, TaggedCallsValidate) {
  auto g = functions();
  const std::string weather = "<function=get_weather>{\"city\": \"Paris\"}</function>";
  const std::string time = "<function=get_time>{ \"zone\" : 2 }</function>";
  EXPECT_TRUE(matches(g, weather));
  EXPECT_TRUE(matches(g, "Let me look.\n" + weather + "\nDone."));
  EXPECT_TRUE(matches(g, "First " + weather + " then " + time + time + " and <fun"));
  // Wrong JSON, a schema violation, an unknown function, a missing end.
  EXPECT_FALSE(matches(g, "<function=get_weather>{\"city\": Paris}</function>"));
  EXPECT_FALSE(matches(g, "<function=get_weather>{\"city\": \"Paris\", \"days\": 3}</function>"));
  EXPECT_FALSE(matches(g, "<function=get_time>{\"zone\": \"UTC\"}</function>"));
  EXPECT_FALSE(matches(g, "<function=get_date>{}</function>"));
  EXPECT_FALSE(matches(g, "<function=get_weather>{\"city\": \"Paris\"}</func>"));
  // Text that ends inside a tag is a prefix, not a sentence.
  Matcher m(compile(g, byte_vocab()));
  ASSERT_TRUE(m.accept_bytes("Sure: <function=get_weather>{\"city\": \"Pa"));
  EXPECT_FALSE(m.can_terminate());
  ASSERT_TRUE(m.accept_bytes("ris\"}</function"));
  EXPECT_FALSE(m.can_terminate());
  ASSERT_TRUE(m.accept_bytes(">"));
  EXPECT_TRUE(m.can_terminate());
  // Once the trigger is complete, only a tag's begin may follow.
  Matcher t(compile(g, byte_vocab()));
  ASSERT_TRUE(t.accept_bytes("x <function="));
  EXPECT_FALSE(t.can_terminate());
  EXPECT_FALSE(t.accept_bytes(" "));
  EXPECT_TRUE(t.accept_bytes("get_"));
}

TEST(StructuralTag, OverlappingTriggersDispatchAtTheFirstOccurrence) {
  // A trigger that overlaps itself: in "<<<f", the trigger "<<f" starts at the second '<'.
  auto self = build_tags({{"<<f", R"({"type": "integer"})", ">"}}, {"<<f"});
  EXPECT_TRUE(matches(self, "<<<f1>"));
  EXPECT_TRUE(matches(self, "< <<f12> <<<"));
  EXPECT_FALSE(matches(self, "<<f"));
  EXPECT_FALSE(matches(self, "<<fx"));
  // Several triggers; "ab" occurs inside "xab": whichever trigger ends first dispatches.
  auto two =
      build_tags({{"ab=", R"({"type": "integer"})", ";"}, {"xyz", R"({"type": "boolean"})", "."}}, {"ab", "xyz"});
  EXPECT_TRUE(matches(two, "ab=1; xyztrue. a b x y z"));
  EXPECT_TRUE(matches(two, "xab=7;"));  // "ab" found after "x"
  EXPECT_FALSE(matches(two, "xyab"));   // "ab" must continue with "="
  EXPECT_TRUE(matches(two, "xy ab=2;"));
  // Two tags behind one trigger, and non-ASCII triggers.
  auto uni = build_tags({{"→a", R"({"type": "integer"})", "←"}, {"→b", R"({"type": "string"})", "←"}}, {"→"});
  EXPECT_TRUE(matches(uni, "x →a5← y →b\"s\"← z"));
  EXPECT_FALSE(matches(uni, "a lone → is a trigger"));
  EXPECT_FALSE(matches(uni, "→c"));
  EXPECT_TRUE(matches(uni, "arrows ← ↑ ↓ are text"));
}

TEST(StructuralTag, ErrorsSayWhatToChange) {
  auto error = [](const std::vector<Tag>& tags, const std::vector<std::string>& triggers) -> std::string {
    try {
      build_tags(tags, triggers);
    } catch (const GrammarError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_THAT(error({{"<f>", kWeather, "</f>"}}, {}), HasSubstr("'triggers' is empty"));
  EXPECT_THAT(error({{"<f>", kWeather, "</f>"}}, {""}), HasSubstr("empty string"));
  EXPECT_THAT(error({{"<f>", kWeather, "</f>"}}, {"<g"}), HasSubstr("starts with none of the triggers"));
  EXPECT_THAT(error({{"<f>", kWeather, "</f>"}}, {"<f", "<g"}), HasSubstr("trigger '<g' starts no tag"));
  EXPECT_THAT(error({{"<f>", R"({"type": "object", "not": {}})", "</f>"}}, {"<f"}), HasSubstr("keyword 'not'"));
}

// Random token paths that often take the trigger and tag tokens: each mask equals accept_token's answer.
TEST(StructuralTag, MasksEqualBruteForce) {
  auto vocab = byte_vocab({"<function=", "<function=get_weather>", "<fun", "ction=", "get_time>", "</function>",
                           "{\"city\": \"", "{\"zone\": ", "Paris", "\"}", "}</", "function>", "12", " the", "<",
                           "a<function=get_", "\"}</function>\n", "é", "\xe4\xb8"});
  auto compiled = compile(functions(), vocab);
  std::mt19937 rng(7);
  for (int walk = 0; walk < 12; ++walk) {
    Matcher m(compiled);
    for (int step = 0; step < 40; ++step) {
      std::vector<uint32_t> mask(m.mask_words());
      m.fill_next_token_bitmask(mask);
      ASSERT_EQ(mask, brute_force_mask(m, *vocab)) << "walk " << walk << " step " << step;
      std::vector<int32_t> allowed, multi;
      for (int32_t id = 0; id < static_cast<int32_t>(vocab->token_bytes.size()); ++id) {
        if (!bit(mask, id) || id == vocab->stop_ids[0]) continue;
        allowed.push_back(id);
        if (id >= 256) multi.push_back(id);
      }
      if (allowed.empty()) break;
      const auto& pool = !multi.empty() && rng() % 4 != 0 ? multi : allowed;
      ASSERT_TRUE(m.accept_token(pool[rng() % pool.size()]));
    }
  }
}

}  // namespace
}  // namespace tessera::grammar
