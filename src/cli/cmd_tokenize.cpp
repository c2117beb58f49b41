// `tessera tokenize`: the tokenizer of a model directory on stdin, for debugging the text side.
//   echo -n 'Hello' | tessera tokenize --model DIR            -> [9707]
//   echo '[9707]' | tessera tokenize --model DIR --decode     -> Hello
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/flag_parsing.h"
#include "cli/verbs.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace tessera::cli {
namespace {

std::string read_all_stdin() {
  std::ios::sync_with_stdio(false);
  return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
}

std::vector<int32_t> parse_id_array(const std::string& text) {
  nlohmann::json ids;
  try {
    ids = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorKind::kInvalidArgument, "--decode expects a JSON array of token ids on stdin: {}", e.what());
  }
  if (!ids.is_array()) fail(ErrorKind::kInvalidArgument, "--decode expects a JSON array of token ids on stdin");
  std::vector<int32_t> out;
  for (const auto& id : ids) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
      fail(ErrorKind::kInvalidArgument, "--decode: '{}' is not a token id", id.dump());
    }
    out.push_back(id.get<int32_t>());
  }
  return out;
}

}  // namespace

int run_tokenize(int argc, char** argv) {
  CLI::App app{
      "Tokenize stdin (exactly as given, no newline stripping) with a model's tokenizer.json and print the ids\n"
      "as a JSON array, as HF tokenizers' encode(text, add_special_tokens=False).ids; --decode reads a JSON\n"
      "array of ids and prints the text.",
      "tessera tokenize"};
  use_vllm_conventions(app);
  std::string model_dir;
  bool decode = false, add_special_tokens = false, skip_special_tokens = false;
  app.add_option("--model", model_dir, "model directory holding tokenizer.json (and tokenizer_config.json)")
      ->required();
  app.add_flag("--decode", decode, "read a JSON array of ids and print the decoded text");
  app.add_flag("--add-special-tokens", add_special_tokens, "add bos/eos as the post-processor asks (encode only)");
  app.add_flag("--skip-special-tokens", skip_special_tokens, "leave special tokens out of the text (decode only)");
  if (int rc = parse_flags(app, argc, argv); rc >= 0) return rc;

  auto tokenizer = tokenizer::Tokenizer::from_dir(model_dir);
  std::string input = read_all_stdin();
  if (decode) {
    std::string text = tokenizer->decode(parse_id_array(input), skip_special_tokens);
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  }
  std::vector<int32_t> ids = tokenizer->encode(input, add_special_tokens);
  std::string line = "[";
  for (size_t i = 0; i < ids.size(); ++i) line.append(i ? ", " : "").append(std::to_string(ids[i]));
  line.append("]\n");
  std::fwrite(line.data(), 1, line.size(), stdout);
  return 0;
}

}  // namespace tessera::cli
