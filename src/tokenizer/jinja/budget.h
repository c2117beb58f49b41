// What a filter, method or operator is about to build, charged against the render's output limit before
// it allocates: a template that asks for a terabyte fails with a named error instead of taking the memory.
#pragma once
#include <cstddef>
#include <string_view>

#include "tokenizer/jinja/limits.h"
#include "tokenizer/jinja/value.h"

namespace tessera::tokenizer::jinja {

// Byte counts that saturate at SIZE_MAX instead of wrapping around.
size_t add_bytes(size_t a, size_t b);
size_t multiply_bytes(size_t a, size_t b);

// Throws ValueError naming `what` when `bytes` exceed limits.max_output_bytes.
void charge(size_t bytes, const RenderLimits& limits, std::string_view what);

// The bytes `value` stands for when copied or printed: each list item and dict entry as one Value, plus
// the text of every string, following nested lists and dicts (a namespace counts as one Value). Stops
// counting once past `cap`, so the walk costs at most cap / sizeof(Value) steps.
size_t value_bytes(const Value& value, size_t cap);
size_t list_bytes(const List& items, size_t cap);

}  // namespace tessera::tokenizer::jinja
