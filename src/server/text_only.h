// tessera serves text only (it loads no vision or audio encoder, with or without --language-model-only):
// a request with image, video or audio content gets a 400 in one wording on every API (OpenAI chat,
// Anthropic Messages, Responses), before any chat template could turn the part into a placeholder token.
#pragma once

#include <string>
#include <string_view>

namespace tessera::server {

// "image", "video" or "audio" for a media content part or block type (OpenAI image_url / input_image /
// video_url / input_audio ..., Anthropic image, Responses input_image ...); nullptr for any other type.
const char* media_kind(std::string_view type);

// "<where>: this server serves text only; <kind> content (type '<type>') is not supported. ..."
std::string text_only_message(std::string_view where, std::string_view type);

}  // namespace tessera::server
