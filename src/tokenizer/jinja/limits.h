// Bounds on one render. The server renders an untrusted request with a template per request, so a
// template (or a request) that would loop or grow without end fails fast instead of hanging a thread.
#pragma once
#include <cstddef>
#include <cstdint>

namespace tessera::tokenizer::jinja {

struct RenderLimits {
  size_t max_output_bytes = 32u << 20;      // the rendered prompt, and any string or list built on the way
  uint64_t max_loop_iterations = 1u << 20;  // for-loop iterations over the whole render
  int max_call_depth = 64;                  // nested macro calls
  // Statements and expressions being evaluated inside one another, macro bodies included: what bounds the
  // interpreter's recursion, so that no template can exhaust a thread's stack.
  int max_render_depth = 512;
};

// How deeply a template may nest blocks, brackets and chains of operators, filters, attributes and calls.
// Parsing and rendering recurse once per level (parsing takes a few KB of stack a level); the chat
// templates of Qwen3, Qwen3.5, Llama 3.1 and DeepSeek V3 nest at most 7 blocks and 12 expression levels.
inline constexpr int kMaxTemplateNesting = 128;
// How deeply values may nest lists and dicts (a render that wraps a list in a list in a loop): printing,
// comparing and freeing them recurse once per level.
inline constexpr int kMaxValueNesting = 512;

}  // namespace tessera::tokenizer::jinja
