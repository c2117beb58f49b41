// The post-processor of tokenizer.json, for a single sequence: the special tokens that
// encode(..., add_special_tokens=true) puts before and after the text's ids.
#pragma once
#include <cstdint>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace tessera::tokenizer {

struct SpecialTokenFrame {
  std::vector<int32_t> prefix;
  std::vector<int32_t> suffix;
};

// Reads TemplateProcessing ("single"), RobertaProcessing/BertProcessing, ByteLevel (adds
// nothing) and Sequence. Throws tessera::Error for other types.
SpecialTokenFrame parse_post_processor(const nlohmann::json& config);

}  // namespace tessera::tokenizer
