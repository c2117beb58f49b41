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
};

}  // namespace tessera::tokenizer::jinja
