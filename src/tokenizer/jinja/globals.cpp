// Global functions: Jinja2's range/namespace/dict, and the two transformers adds for chat templates,
// raise_exception (the template rejects the conversation) and strftime_now (today's date in prompts).
#include <ctime>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/error.h"
#include "tokenizer/jinja/format.h"

namespace tessera::tokenizer::jinja {

void install_globals(Dict& globals, const RenderLimits& limits) {
  uint64_t max_items = limits.max_loop_iterations;
  globals.set("range", make_function("range", [max_items](Args& args) {
                for (const Value& v : args.positional) {
                  if (!v.is_int() && !v.is_bool()) throw ValueError("range() arguments must be integers");
                }
                int64_t start = 0, stop = 0, step = 1;
                if (args.positional.size() == 1) {
                  stop = args.positional[0].as_int();
                } else if (args.positional.size() >= 2) {
                  start = args.positional[0].as_int();
                  stop = args.positional[1].as_int();
                  if (args.positional.size() >= 3) step = args.positional[2].as_int();
                } else {
                  throw ValueError("range expected at least 1 argument, got 0");
                }
                if (step == 0) throw ValueError("range() arg 3 must not be zero");
                List out;
                for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
                  if (out.size() >= max_items) throw ValueError("range() too large for the loop iteration limit");
                  out.emplace_back(i);
                  if (__builtin_add_overflow(i, step, &i)) break;  // the next value is past any 64-bit stop
                }
                return Value(std::move(out));
              }));
  globals.set("namespace", make_function("namespace", [](Args& args) {
                auto ns = std::make_shared<Dict>();
                ns->is_namespace = true;
                for (const Value& v : args.positional) {
                  if (!v.is_dict()) throw ValueError("namespace() positional argument must be a mapping");
                  for (const auto& [key, item] : v.as_dict().entries()) ns->set(key, item);
                }
                for (const auto& [key, item] : args.keyword) ns->set(key, item);
                return Value(std::move(ns));
              }));
  globals.set("dict", make_function("dict", [](Args& args) {
                auto dict = std::make_shared<Dict>();
                for (const Value& v : args.positional) {
                  if (!v.is_dict()) throw ValueError("dict() positional argument must be a mapping");
                  for (const auto& [key, item] : v.as_dict().entries()) dict->set(key, item);
                }
                for (const auto& [key, item] : args.keyword) dict->set(key, item);
                return Value(std::move(dict));
              }));
  globals.set("raise_exception", make_function("raise_exception", [](Args& args) -> Value {
                throw TemplateRaised(python_str(args.get(0, "message")));
              }));
  globals.set("strftime_now", make_function("strftime_now", [](Args& args) {
                std::time_t now = std::time(nullptr);
                std::tm local{};
                localtime_r(&now, &local);
                char buffer[256];
                size_t n = std::strftime(buffer, sizeof(buffer), python_str(args.get(0, "format")).c_str(), &local);
                return Value(std::string(buffer, n));
              }));
}

}  // namespace tessera::tokenizer::jinja
