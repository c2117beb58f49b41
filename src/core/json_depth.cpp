#include "core/json_depth.h"

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

}  // namespace tessera
