#include "core/json_depth.h"

#include "core/error.h"

namespace tessera {

int json_nesting_depth(std::string_view text, int limit) {
  int depth = 0, deepest = 0;
  JsonStringTracker strings;
  for (char c : text) {
    if (!strings.structural(c)) continue;
    switch (c) {
      case '[':
      case '{':
        if (++depth > deepest) {
          deepest = depth;
          if (deepest > limit) return limit + 1;
        }
        break;
      case ']':
      case '}':
        if (depth > 0) --depth;  // unbalanced: the parser fails here anyway
        break;
      default:
        break;
    }
  }
  return deepest;
}

std::string json_error_text(const std::exception& e) {
  std::string text = e.what();
  if (text.rfind("[json.exception.", 0) == 0) {
    size_t end = text.find("] ");
    if (end != std::string::npos) text.erase(0, end + 2);
  }
  return text;
}

void check_json_file_depth(std::string_view text, const std::string& origin, int limit) {
  if (json_nesting_depth(text, limit) > limit)
    fail(ErrorKind::kCorrupt,
         "{}: JSON nested deeper than {} levels of arrays and objects; model files nest a few levels, so this one is "
         "damaged or not the file it should be",
         origin, limit);
}

}  // namespace tessera
