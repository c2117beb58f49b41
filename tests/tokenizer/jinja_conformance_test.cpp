// The interpreter against real Jinja2: every case of tests/fixtures/chat/jinja_cases.json (one small template per
// feature, made by tools/make_jinja_cases.py in transformers' chat-template environment) must render byte for
// byte as Jinja2 did, or fail where Jinja2 failed.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "tokenizer/jinja/template.h"

namespace tessera::tokenizer::jinja {
namespace {

nlohmann::ordered_json load_cases() {
  std::ifstream in(std::string(TESSERA_SOURCE_DIR) + "/tests/fixtures/chat/jinja_cases.json", std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::ordered_json::parse(text.str());
}

TEST(JinjaConformance, EveryCaseRendersLikeJinja2) {
  nlohmann::ordered_json fixture = load_cases();
  ASSERT_GE(fixture["cases"].size(), 100u);
  int rendered = 0, failed_as_expected = 0;
  for (const auto& c : fixture["cases"]) {
    const std::string name = c["name"].get<std::string>();
    SCOPED_TRACE(name);
    Dict variables;
    for (const auto& [key, value] : c["context"].items()) variables.set(key, Value::from_json(value));
    std::string output, error;
    try {
      output = Template(c["template"].get<std::string>()).render(variables);
    } catch (const TemplateError& e) {
      error = e.what();
    }
    if (c.contains("expected")) {
      EXPECT_EQ(error, "") << name;
      EXPECT_EQ(output, c["expected"].get<std::string>()) << name;
      ++rendered;
    } else {
      EXPECT_NE(error, "") << name << " should fail like Jinja2 (" << c["error"].get<std::string>()
                           << ") but rendered: " << output;
      ++failed_as_expected;
    }
  }
  std::cerr << rendered << " renders and " << failed_as_expected << " expected errors compared\n";
}

}  // namespace
}  // namespace tessera::tokenizer::jinja
