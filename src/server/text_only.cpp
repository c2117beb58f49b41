#include "server/text_only.h"

#include <fmt/format.h>

namespace tessera::server {

const char* media_kind(std::string_view type) {
  for (std::string_view t : {"image_url", "input_image", "image", "image_embeds", "image_pil", "image_file"})
    if (type == t) return "image";
  for (std::string_view t : {"video_url", "input_video", "video", "video_embeds"})
    if (type == t) return "video";
  for (std::string_view t : {"audio_url", "input_audio", "audio", "audio_embeds"})
    if (type == t) return "audio";
  return nullptr;
}

std::string text_only_message(std::string_view where, std::string_view type) {
  const char* kind = media_kind(type);
  return fmt::format(
      "{}: this server serves text only; {} content (type '{}') is not supported. Send the request with text "
      "content only (tessera loads no vision or audio encoder).",
      where, kind ? kind : "media", type);
}

}  // namespace tessera::server
