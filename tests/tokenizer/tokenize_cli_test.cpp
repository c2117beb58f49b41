// `tessera tokenize` end to end: stdin exactly as given (no newline stripping) to the reference's
// ids, and --decode back. Runs the binary of this build (or $TESSERA_CLI).
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "tokenizer_test_data.h"

namespace tessera::tokenizer {
namespace {

std::filesystem::path cli_path() {
  if (const char* override_path = std::getenv("TESSERA_CLI")) return override_path;
  return std::filesystem::path(TESSERA_BINARY_DIR) / "bin" / "tessera";
}

// Runs `tessera tokenize ARGS < input` and returns stdout; fails the test on a non-zero exit.
std::string run_tokenize(const std::string& args, const std::string& input) {
  // One file per process and call: ctest runs the tests of this binary in parallel processes.
  static int calls = 0;
  std::filesystem::path input_path =
      std::filesystem::temp_directory_path() /
      ("tessera_tokenize_cli_test." + std::to_string(getpid()) + "." + std::to_string(++calls) + ".in");
  std::ofstream(input_path, std::ios::binary) << input;
  std::string command = cli_path().string() + " tokenize " + args + " < " + input_path.string();
  FILE* pipe = popen(command.c_str(), "r");
  EXPECT_NE(pipe, nullptr);
  std::string out;
  std::array<char, 4096> buffer;
  for (size_t n; pipe && (n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0;) out.append(buffer.data(), n);
  int status = pipe ? pclose(pipe) : -1;
  std::filesystem::remove(input_path);
  EXPECT_EQ(status, 0) << command;
  return out;
}

TEST(TokenizeCliTest, MatchesReferenceIdsAndDecodesBack) {
  if (!std::filesystem::exists(cli_path())) GTEST_SKIP() << cli_path() << " is not built in this build tree";
  for (const char* name : testing::kTokenizerNames) {
    const std::string model = "--model " + testing::model_dir(name).string();
    nlohmann::json ref = testing::read_json(testing::fixture(std::string(name) + "_ref.json"));
    int checked = 0;
    for (const auto& c : ref.at("cases")) {
      const std::string text = c.at("text").get<std::string>();
      // A few strings (each run loads the tokenizer): a trailing newline, special tokens, CJK or emoji.
      bool interesting = text.ends_with('\n') || text.find("<|") != std::string::npos ||
                         text.find("你") != std::string::npos || text.find("😀") != std::string::npos;
      if (!interesting || ++checked > 3) continue;
      std::vector<int32_t> expected = c.at("ids").get<std::vector<int32_t>>();
      std::string printed = run_tokenize(model, text);
      EXPECT_EQ(nlohmann::json::parse(printed).get<std::vector<int32_t>>(), expected)
          << name << ": " << nlohmann::json(text).dump();
      if (checked == 1) {
        EXPECT_EQ(run_tokenize(model + " --decode", printed), c.at("decoded").get<std::string>()) << name;
      }
    }
    EXPECT_GE(checked, 3) << name;
  }
}

TEST(TokenizeCliTest, AddsSpecialTokensWhenAsked) {
  if (!std::filesystem::exists(cli_path())) GTEST_SKIP() << cli_path() << " is not built in this build tree";
  std::string printed =
      run_tokenize("--add-special-tokens --model " + testing::model_dir("llama3_1").string(), "Hello");
  EXPECT_EQ(printed, "[128000, 9906]\n");
}

}  // namespace
}  // namespace tessera::tokenizer
