#pragma once
#include <memory>
#include <string>
#include <vector>

#include "model/model.h"

namespace tessera {

// Builds the model named by config.architecture (weights declared, not loaded).
// Unknown architectures fail with the list of supported ones.
std::unique_ptr<Model> create_model(const ModelConfig& config, const ModelOptions& options, Backend& backend);
std::vector<std::string> supported_architectures();

// One factory per model family file.
std::unique_ptr<Model> make_llama(const ModelConfig&, const ModelOptions&, Backend&);
std::unique_ptr<Model> make_mistral(const ModelConfig&, const ModelOptions&, Backend&);
std::unique_ptr<Model> make_qwen2(const ModelConfig&, const ModelOptions&, Backend&);
std::unique_ptr<Model> make_qwen3(const ModelConfig&, const ModelOptions&, Backend&);
std::unique_ptr<Model> make_qwen2_moe(const ModelConfig&, const ModelOptions&, Backend&);
std::unique_ptr<Model> make_qwen3_moe(const ModelConfig&, const ModelOptions&, Backend&);
std::unique_ptr<Model> make_qwen3_next(const ModelConfig&, const ModelOptions&, Backend&);
std::unique_ptr<Model> make_qwen3_5_moe(const ModelConfig&, const ModelOptions&, Backend&);
std::unique_ptr<Model> make_qwen3_5(const ModelConfig&, const ModelOptions&, Backend&);

}  // namespace tessera
