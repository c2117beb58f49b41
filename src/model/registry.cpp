#include "model/registry.h"

#include "core/error.h"
#include "loader/config_source.h"

namespace tessera {

namespace {
using Factory = std::unique_ptr<Model> (*)(const ModelConfig&, const ModelOptions&, Backend&);
struct Entry {
  const char* architecture;
  Factory make;
};
// One line per architecture.
constexpr Entry kArchitectures[] = {
    {"LlamaForCausalLM", make_llama},
    {"MistralForCausalLM", make_mistral},
    {"Qwen2ForCausalLM", make_qwen2},
    {"Qwen3ForCausalLM", make_qwen3},
    {"Qwen2MoeForCausalLM", make_qwen2_moe},
    {"Qwen3MoeForCausalLM", make_qwen3_moe},
    {"Qwen3NextForCausalLM", make_qwen3_next},
    {"Qwen3_5MoeForCausalLM", make_qwen3_5_moe},
    {"Qwen3_5MoeForConditionalGeneration", make_qwen3_5_moe},
    {"Qwen3_5ForCausalLM", make_qwen3_5},
    {"Qwen3_5ForConditionalGeneration", make_qwen3_5},
};
}  // namespace

std::vector<std::string> supported_architectures() {
  std::vector<std::string> v;
  for (const auto& e : kArchitectures) v.emplace_back(e.architecture);
  return v;
}

std::unique_ptr<Model> create_model(const ModelConfig& config, const ModelOptions& options, Backend& backend) {
  for (const auto& e : kArchitectures)
    if (config.architecture == e.architecture) return e.make(config, options, backend);
  std::string list;
  for (const auto& a : supported_architectures()) list += (list.empty() ? "" : ", ") + a;
  // Name the file the architecture came from (the CLI prints this one line).
  fail(ErrorKind::kUnsupported, "{}: architecture '{}' is not supported (supported: {})", config_source(config),
       config.architecture, list);
}

}  // namespace tessera
