// Request readers: the body, the sampling fields, tools, structured output and the prompts of one request,
// each refusal a 400 naming the field (see request_reader.h).
#include "server/request_reader.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>

#include "core/json_depth.h"
#include "server/parsers/reasoning_parser.h"
#include "server/sampling_params_json.h"
#include "server/text_only.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace tessera::server::api {

const RefusedField kRefusedFields[6] = {
    {"thinking_token_budget",
     "a thinking budget is not enforced by this server; bound the whole output with "
     "max_tokens, or turn thinking off with chat_template_kwargs.enable_thinking"},
    {"chat_template",
     "a chat template in the request is not accepted (vLLM refuses it too unless "
     "--trust-request-chat-template); start the server with --chat-template"},
    {"return_tokens_as_token_ids",
     "tokens as 'token_id:<id>' strings are not supported; ask for logprobs, "
     "or /tokenize and /detokenize"},
    {"guided_decoding_backend", "there is one grammar engine; leave 'guided_decoding_backend' out"},
    {"logits_processors", "custom logits processors are not supported"},
    {"vllm_xargs", "'vllm_xargs' (extra arguments for custom logits processors) is not supported"},
};

namespace {

void refuse_unserved_fields(const ojson& body) {
  for (const auto& [name, why] : kRefusedFields) {
    const ojson* v = field(body, name);
    if (!v) continue;
    if ((v->is_boolean() && !v->get<bool>()) || (v->is_array() && v->empty())) continue;
    bad(fmt::format("'{}': {}", name, why), name);
  }
}

void check_messages(const ojson& msgs, int max_messages) {
  if (!msgs.is_array()) bad("'messages' must be a list of message objects", "messages");
  if (msgs.empty()) bad("'messages' must contain at least one message", "messages");
  if (static_cast<int>(msgs.size()) > max_messages)
    bad(fmt::format("'messages' has {} entries; this server accepts at most {}", msgs.size(), max_messages),
        "messages");
  for (size_t i = 0; i < msgs.size(); ++i) {
    const ojson& m = msgs[i];
    if (!m.is_object()) bad(fmt::format("messages[{}] must be an object", i), "messages");
    auto r = m.find("role");
    if (r == m.end() || !r->is_string()) bad(fmt::format("messages[{}].role must be a string", i), "messages");
    const std::string role = r->get<std::string>();
    if (role != "system" && role != "user" && role != "assistant" && role != "tool" && role != "developer" &&
        role != "function")
      bad(fmt::format("messages[{}].role '{}' is not one of system, developer, user, assistant, tool", i, role),
          "messages");
    auto c = m.find("content");
    if (c != m.end() && !c->is_null() && !c->is_string() && !c->is_array())
      bad(fmt::format("messages[{}].content must be a string or a list of content parts", i), "messages");
    if (c != m.end() && c->is_array())
      for (size_t k = 0; k < c->size(); ++k) {
        const ojson& part = (*c)[k];
        auto type = part.is_object() ? part.find("type") : part.end();
        if (type != part.end() && type->is_string() && media_kind(type->get<std::string>()))
          bad(text_only_message(fmt::format("messages[{}].content[{}]", i, k), type->get<std::string>()), "messages");
        if (type != part.end() && type->is_string() && *type == "text") {
          auto text = part.find("text");
          if (text == part.end() || !text->is_string())
            bad(fmt::format("messages[{}].content[{}]: a text part needs 'text', a string", i, k), "messages");
        }
      }
    if (role == "tool") {
      auto id = m.find("tool_call_id");
      if (id == m.end() || !id->is_string())
        bad(fmt::format("messages[{}]: a tool message needs 'tool_call_id', a string", i), "messages");
    }
    if (auto tc = m.find("tool_calls"); tc != m.end() && !tc->is_null() && !tc->is_array())
      bad(fmt::format("messages[{}].tool_calls must be a list", i), "messages");
  }
}

}  // namespace

RequestReader::RequestReader(const ApiOptions& opt, EngineClient& engine, const tokenizer::Tokenizer& tok,
                             const tokenizer::ChatTemplate* tmpl)
    : opt_(opt), engine_(engine), tok_(tok), tmpl_(tmpl) {}

RequestReader::~RequestReader() = default;

ojson RequestReader::parse_body(const HttpRequest& r) {
  if (r.body.empty()) bad("the request body is empty; send a JSON object");
  // Bounded before parsing: every later walk over the body (copies, conversions, dumps) recurses.
  if (json_nesting_depth(r.body) > kMaxJsonDepth)
    bad(
        fmt::format("the request body nests arrays and objects more than {} levels deep; this server accepts at "
                    "most {}",
                    kMaxJsonDepth, kMaxJsonDepth));
  ojson body;
  try {
    body = ojson::parse(r.body);
  } catch (const ojson::parse_error& e) {
    bad("the request body is not valid JSON: " + json_error_text(e));
  }
  if (!body.is_object()) bad("the request body must be a JSON object");
  return body;
}

void RequestReader::check_model(const ojson& body) const {
  const ojson* m = field(body, "model");
  if (!m) return;
  if (!m->is_string()) bad("'model' must be a string", "model");
  const std::string name = m->get<std::string>();
  for (const auto& n : opt_.served_model_names)
    if (n == name) return;
  throw ApiError{404, fmt::format("The model `{}` does not exist.", name), "model", {}};
}

std::shared_ptr<const TokenConstraintFactory> RequestReader::compile_constraint(const StructuredOutputSpec& spec) {
  std::call_once(structured_once_, [this] {
    structured_ = std::make_unique<StructuredOutputCompiler>(tok_, engine_.vocab_size(), engine_.eos_token_ids());
  });
  return structured_->compile(spec);
}

SamplingParams RequestReader::base_params() const {
  SamplingParams p;
  const auto& d = opt_.defaults;
  if (d.temperature) p.temperature = static_cast<float>(*d.temperature);
  if (d.top_p) p.top_p = static_cast<float>(*d.top_p);
  if (d.top_k) p.top_k = *d.top_k;
  if (d.min_p) p.min_p = static_cast<float>(*d.min_p);
  if (d.repetition_penalty) p.repetition_penalty = static_cast<float>(*d.repetition_penalty);
  return p;
}

void RequestReader::read_params(const ojson& body, PreparedRequest& pr) {
  pr.params = base_params();
  // Only the sampling fields cross over (copying the whole body would walk it recursively).
  json fields = json::object();
  for (std::string_view k : sampling_field_names())
    if (auto it = body.find(std::string(k)); it != body.end()) fields[std::string(k)] = json(*it);
  Status s = sampling_params_from_json(fields, pr.params);
  if (!s.ok()) bad(s.message());
  if (const ojson* bo = field(body, "best_of"); bo && !(bo->is_number_integer() && *bo == 1))
    bad("'best_of' is not supported; use 'n' for several completions", "best_of");
  pr.max_tokens_given = field(body, "max_tokens") || field(body, "max_completion_tokens");
  // vLLM's rule: prompt logprobs are not streamed.
  if (pr.params.prompt_logprobs > 0 && get_bool(body, "stream", false))
    bad("'prompt_logprobs' are not available when 'stream' is true", "prompt_logprobs");
  if (pr.params.n < 1 || pr.params.n > opt_.max_n)
    bad(fmt::format("'n' must be between 1 and {}, got {}", opt_.max_n, pr.params.n), "n");
  refuse_unserved_fields(body);
  if (const ojson* bw = field(body, "bad_words")) pr.params.bad_words_ids = bad_words_ids(*bw);
  if (const ojson* t = field(body, "truncate_prompt_tokens")) {
    if (!t->is_number_integer() || (t->get<int64_t>() < 1 && t->get<int64_t>() != -1))
      bad("'truncate_prompt_tokens' must be a positive integer, or -1 (the model's context length)",
          "truncate_prompt_tokens");
    const int64_t k = t->get<int64_t>();
    pr.truncate_prompt_tokens = k == -1 ? engine_.max_model_len() : static_cast<int>(std::min<int64_t>(k, 1 << 30));
  }
  if (std::optional<StructuredOutputSpec> spec = read_structured_output(body)) {
    pr.params.constraint = compile_constraint(*spec);
    pr.structured_field = spec->field;
  }
}

// vLLM's bad_words: each word as tokens, with and without a leading space (its two usual spellings).
std::vector<std::vector<int32_t>> RequestReader::bad_words_ids(const ojson& words) const {
  if (!words.is_array()) bad("'bad_words' must be a list of strings", "bad_words");
  std::vector<std::vector<int32_t>> out;
  for (const auto& w : words) {
    if (!w.is_string() || w.get_ref<const std::string&>().empty())
      bad("'bad_words' must be a list of non-empty strings", "bad_words");
    std::string word = w.get<std::string>();
    const size_t start = word.find_first_not_of(' ');
    word = start == std::string::npos ? word : word.substr(start);
    for (const std::string& spelling : {word, " " + word}) {
      std::vector<int32_t> ids = tok_.encode(spelling, false);
      if (!ids.empty() && std::find(out.begin(), out.end(), ids) == out.end()) out.push_back(std::move(ids));
    }
  }
  return out;
}

void RequestReader::check_tools(const ojson& body, ToolChoicePlan* plan) const {
  const ojson* tools = field(body, "tools");
  const ojson* choice = field(body, "tool_choice");
  if (tools) {
    if (!tools->is_array()) bad("'tools' must be a list of tool objects", "tools");
    if (tools->size() > 512) bad("'tools' has more than 512 entries", "tools");
    for (size_t i = 0; i < tools->size(); ++i) {
      const ojson& t = (*tools)[i];
      if (!t.is_object()) bad(fmt::format("tools[{}] must be an object", i), "tools");
      auto ty = t.find("type");
      if (ty != t.end() && !(ty->is_string() && *ty == "function"))
        bad(fmt::format("tools[{}].type must be \"function\"", i), "tools");
      auto f = t.find("function");
      if (f == t.end() || !f->is_object()) bad(fmt::format("tools[{}].function must be an object", i), "tools");
      auto name = f->find("name");
      if (name == f->end() || !name->is_string() || name->get<std::string>().empty())
        bad(fmt::format("tools[{}].function.name must be a non-empty string", i), "tools");
      auto params = f->find("parameters");
      if (params != f->end() && !params->is_null() && !params->is_object())
        bad(fmt::format("tools[{}].function.parameters must be a JSON Schema object", i), "tools");
    }
  }
  if (choice && !choice->is_string() && !choice->is_object())
    bad("'tool_choice' must be a string or an object", "tool_choice");
  Status st = plan_tool_choice(choice ? json(*choice) : json(nullptr), tools ? json(*tools) : json::array(),
                               opt_.enable_auto_tool_choice, !opt_.tool_call_parser.empty(), plan);
  if (!st.ok()) bad(st.message(), "tool_choice");
}

std::string RequestReader::render_chat(const ojson& body) const {
  if (!tmpl_) bad("this model has no chat template; pass one with --chat-template, or use /v1/completions");
  check_messages(body.at("messages"), opt_.max_messages);
  ojson request = tmpl_->vllm_request(body);
  bool cont = get_bool(body, "continue_final_message", false);
  if (cont) {
    if (get_bool(body, "add_generation_prompt", false) && field(body, "add_generation_prompt"))
      bad("continue_final_message and add_generation_prompt cannot both be true");
    request["add_generation_prompt"] = false;
  }
  if (const ojson* k = field(body, "chat_template_kwargs"); k && !k->is_object())
    bad("'chat_template_kwargs' must be an object", "chat_template_kwargs");
  tokenizer::jinja::RenderLimits limits;
  limits.max_output_bytes = opt_.max_prompt_bytes;
  std::string prompt;
  Status s = tmpl_->try_render(request, &prompt, limits);
  if (!s.ok()) bad("the chat template failed on this request: " + s.message(), "messages");
  if (cont) {
    // vLLM: the prompt ends right after the final (assistant) message's text.
    const ojson& last = body["messages"].back();
    if (last.contains("content") && last["content"].is_string()) {
      const std::string content = last["content"].get<std::string>();
      auto pos = prompt.rfind(content);
      if (!content.empty() && pos != std::string::npos) prompt.resize(pos + content.size());
    }
  }
  return prompt;
}

PreparedRequest RequestReader::read_chat(const ojson& body, bool clamp_max_tokens) {
  const ojson* msgs = field(body, "messages");
  if (!msgs) bad("'messages' is required", "messages");
  PreparedRequest pr;
  check_tools(body, &pr.tools);
  read_params(body, pr);
  if (std::optional<StructuredOutputSpec> calls = tool_call_structure(body, pr.tools, opt_.tool_call_parser)) {
    if (pr.params.constraint)
      bad(fmt::format("tool_choice {} and '{}' both constrain the output; send one of them",
                      dump(*field(body, "tool_choice")), pr.structured_field),
          "tool_choice");
    pr.params.constraint = compile_constraint(*calls);
  }
  // With a reasoning parser and thinking on, the constraint starts once the reasoning ends (the template
  // opened the think block in the prompt: a constraint from the first token would forbid closing it).
  if (pr.params.constraint && !opt_.reasoning_parser.empty()) {
    const ojson* k = field(body, "chat_template_kwargs");
    if (reasoning_options_from_kwargs(k ? json(*k) : json(nullptr)).enable_thinking)
      if (std::optional<int32_t> end = tok_.token_to_id("</think>")) pr.params.constraint_after_token = *end;
  }
  pr.clamp_max_tokens = clamp_max_tokens;
  std::string prompt = render_chat(body);
  const bool add_special = get_bool(body, "add_special_tokens", false);
  pr.prompts.push_back(tok_.encode(prompt, add_special));
  pr.prompt_texts.push_back(std::move(prompt));
  return pr;
}

PreparedRequest RequestReader::read_completions(const ojson& body) {
  const ojson* prompt = field(body, "prompt");
  if (!prompt) bad("'prompt' is required", "prompt");
  if (field(body, "suffix")) bad("'suffix' is not supported", "suffix");
  PreparedRequest pr;
  read_params(body, pr);
  pr.default_max_tokens = 16;  // vLLM's and OpenAI's default for /v1/completions
  pr.prompt_param = "prompt";
  const bool add_special = get_bool(body, "add_special_tokens", true);
  const bool echo = pr.echo = get_bool(body, "echo", false);
  auto add_text = [&](const ojson& s) {
    if (s.get_ref<const std::string&>().size() > opt_.max_prompt_bytes)
      bad(fmt::format("a prompt is longer than {} bytes", opt_.max_prompt_bytes), "prompt");
    pr.prompts.push_back(tok_.encode(s.get<std::string>(), add_special));
    pr.prompt_texts.push_back(s.get<std::string>());
  };
  auto add_ids = [&](const ojson& arr) {
    std::vector<int32_t> ids;
    for (const auto& t : arr) {
      if (!t.is_number_integer()) bad("'prompt' token ids must be integers", "prompt");
      // Only the narrowing is checked here; the vocabulary is the engine's to check (validate_request).
      const int64_t v =
          t.is_number_unsigned() && t.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : t.get<int64_t>();
      if (v < INT32_MIN || v > INT32_MAX) bad("'prompt' token ids must be 32-bit integers", "prompt");
      ids.push_back(static_cast<int32_t>(v));
    }
    if (echo)
      pr.prompt_texts.push_back(tok_.decode(ids, false));
    else
      pr.prompt_texts.emplace_back();
    pr.prompts.push_back(std::move(ids));
  };
  static constexpr const char* kPromptShapes =
      "'prompt' must be a string, a list of strings, a list of token ids or a list of such lists";
  if (prompt->is_string()) {
    add_text(*prompt);
  } else if (prompt->is_array()) {
    if (prompt->empty()) bad("'prompt' must not be an empty list", "prompt");
    if (static_cast<int>(prompt->size()) > opt_.max_prompts && !(*prompt)[0].is_number_integer())
      bad(fmt::format("'prompt' has {} prompts; this server accepts at most {}", prompt->size(), opt_.max_prompts),
          "prompt");
    if ((*prompt)[0].is_number_integer()) {
      add_ids(*prompt);
    } else {
      for (const auto& e : *prompt) {
        if (e.is_string())
          add_text(e);
        else if (e.is_array())
          add_ids(e);
        else
          bad(kPromptShapes, "prompt");
      }
    }
  } else {
    bad(kPromptShapes, "prompt");
  }
  if (pr.params.n * static_cast<int>(pr.prompts.size()) > opt_.max_prompts)
    bad(fmt::format("n x prompts must be at most {}", opt_.max_prompts), "n");
  return pr;
}

}  // namespace tessera::server::api
