#include "tokenizer/post_processor.h"

#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"

namespace tessera::tokenizer {
namespace {

void append_template(const nlohmann::json& config, SpecialTokenFrame& frame) {
  bool after_sequence = false;
  for (const auto& piece : config.at("single")) {
    if (piece.contains("Sequence")) {
      after_sequence = true;
      continue;
    }
    const std::string name = piece.at("SpecialToken").at("id").get<std::string>();
    const auto& special = config.at("special_tokens");
    if (!special.contains(name)) {
      fail(ErrorKind::kCorrupt, "tokenizer.json: TemplateProcessing uses special token '{}' it does not define", name);
    }
    auto& target = after_sequence ? frame.suffix : frame.prefix;
    for (const auto& id : special.at(name).at("ids")) target.push_back(id.get<int32_t>());
  }
}

}  // namespace

SpecialTokenFrame parse_post_processor(const nlohmann::json& config) {
  SpecialTokenFrame frame;
  if (config.is_null()) return frame;
  const std::string type = config.value("type", "");
  if (type == "ByteLevel") return frame;
  if (type == "TemplateProcessing") {
    append_template(config, frame);
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    frame.prefix.push_back(config.at("cls").at(1).get<int32_t>());
    frame.suffix.push_back(config.at("sep").at(1).get<int32_t>());
  } else if (type == "Sequence") {
    for (const auto& step : config.at("processors")) {
      SpecialTokenFrame inner = parse_post_processor(step);
      frame.prefix.insert(frame.prefix.end(), inner.prefix.begin(), inner.prefix.end());
      frame.suffix.insert(frame.suffix.begin(), inner.suffix.begin(), inner.suffix.end());
    }
  } else {
    fail(ErrorKind::kUnsupported, "tokenizer.json: post-processor type '{}' is not supported", type);
  }
  return frame;
}

}  // namespace tessera::tokenizer
