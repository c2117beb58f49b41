// `tessera chat-template`: the prompt a model's chat template makes of an OpenAI chat request, for
// debugging the text side. Prints exactly the rendered text, without an added newline.
//   echo '{"messages": [{"role": "user", "content": "Hi"}]}' | tessera chat-template --model DIR
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "cli/flag_parsing.h"
#include "cli/verbs.h"
#include "core/error.h"
#include "tokenizer/chat_template.h"

namespace tessera::cli {

int run_chat_template(int argc, char** argv) {
  CLI::App app{
      "Render a model's chat template for an OpenAI chat request read from stdin (messages, tools,\n"
      "add_generation_prompt (default true), chat_template_kwargs) and print the prompt exactly, as\n"
      "transformers' apply_chat_template(..., tokenize=False) gives it.",
      "tessera chat-template"};
  use_vllm_conventions(app);
  std::string model_dir, template_file;
  app.add_option("--model", model_dir, "model directory holding tokenizer_config.json or chat_template.jinja")
      ->required();
  app.add_option("--chat-template", template_file, "a Jinja chat template file to use instead of the model's");
  bool as_vllm = false;
  app.add_flag("--vllm-messages", as_vllm,
               "first normalize the messages as vLLM's OpenAI server does (content parts to text, tool-call "
               "arguments to objects), i.e. render what `tessera serve` renders");
  if (int rc = parse_flags(app, argc, argv); rc >= 0) return rc;

  auto chat_template = tokenizer::ChatTemplate::from_model_dir(
      model_dir, template_file.empty() ? std::nullopt : std::optional<std::filesystem::path>(template_file));
  std::ios::sync_with_stdio(false);
  std::string body(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>{});
  nlohmann::ordered_json request;
  try {
    request = nlohmann::ordered_json::parse(body);
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorKind::kInvalidArgument, "stdin must hold a JSON chat request: {}", e.what());
  }
  std::string prompt = chat_template.render(as_vllm ? chat_template.vllm_request(request) : request);
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  return 0;
}

}  // namespace tessera::cli
