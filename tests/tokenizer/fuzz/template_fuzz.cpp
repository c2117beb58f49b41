// libFuzzer target for the chat-template engine: the input is a template, parsed and then rendered over a
// small conversation with tight limits. A TemplateError is the expected answer to a bad or runaway
// template; a crash, a stack overflow, an over-read (ASan), undefined behaviour (UBSan: a signed
// overflow, a division trap), a timeout or memory past -rss_limit_mb is a finding.
//   scripts/fuzz.sh 60 template
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "tokenizer/jinja/template.h"

using namespace tessera::tokenizer::jinja;

namespace {

Dict variables() {
  Dict v;
  Value user = make_dict({{"role", Value("user")}, {"content", Value("What is 2 + 2?")}});
  Value call = make_dict({{"type", Value("function")},
                          {"function", make_dict({{"name", Value("add")}, {"arguments", Value("{\"a\": 2}")}})}});
  Value assistant = make_dict({{"role", Value("assistant")},
                               {"content", Value("<think>\nadd\n</think>\n\n4")},
                               {"tool_calls", Value(List{call})}});
  Value tool = make_dict({{"role", Value("tool")}, {"content", Value("4")}});
  v.set("messages", Value(List{user, assistant, tool}));
  v.set("tools",
        Value(List{make_dict({{"type", Value("function")}, {"function", make_dict({{"name", Value("add")}})}})}));
  v.set("add_generation_prompt", Value(true));
  v.set("bos_token", Value("<s>"));
  v.set("eos_token", Value("</s>"));
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Dict kVariables = variables();
  RenderLimits limits;
  limits.max_output_bytes = 1 << 20;
  limits.max_loop_iterations = 1 << 14;
  try {
    Template t(std::string_view(reinterpret_cast<const char*>(data), size));
    t.render(kVariables, limits);
  } catch (const tessera::Error&) {  // TemplateError: a syntax error, a runtime error or a limit
  }
  return 0;
}
