#include "tokenizer/jinja/budget.h"

#include <cstdint>
#include <string>

#include "tokenizer/jinja/error.h"

namespace tessera::tokenizer::jinja {

size_t add_bytes(size_t a, size_t b) {
  size_t sum = 0;
  return __builtin_add_overflow(a, b, &sum) ? SIZE_MAX : sum;
}

size_t multiply_bytes(size_t a, size_t b) {
  size_t product = 0;
  return __builtin_mul_overflow(a, b, &product) ? SIZE_MAX : product;
}

void charge(size_t bytes, const RenderLimits& limits, std::string_view what) {
  if (bytes <= limits.max_output_bytes) return;
  std::string size = bytes == SIZE_MAX ? "more than 2^64" : std::to_string(bytes);
  throw ValueError(std::string(what) + " would build " + size + " bytes, over the chat template's output limit of " +
                   std::to_string(limits.max_output_bytes) + " bytes");
}

namespace {

// Adds the bytes of `value` to *total, stopping once *total passes cap.
void add_value_bytes(const Value& value, size_t cap, size_t* total) {
  *total = add_bytes(*total, sizeof(Value));
  if (*total > cap) return;
  if (value.is_string()) {
    *total = add_bytes(*total, value.as_string().size());
  } else if (value.is_list()) {
    for (const Value& item : value.as_list()) {
      add_value_bytes(item, cap, total);
      if (*total > cap) return;
    }
  } else if (value.is_dict() && !value.as_dict().is_namespace) {
    for (const auto& [key, item] : value.as_dict().entries()) {
      *total = add_bytes(*total, key.size());
      add_value_bytes(item, cap, total);
      if (*total > cap) return;
    }
  }
}

}  // namespace

size_t value_bytes(const Value& value, size_t cap) {
  size_t total = 0;
  add_value_bytes(value, cap, &total);
  return total;
}

size_t list_bytes(const List& items, size_t cap) {
  size_t total = 0;
  for (const Value& item : items) {
    add_value_bytes(item, cap, &total);
    if (total > cap) break;
  }
  return total;
}

}  // namespace tessera::tokenizer::jinja
