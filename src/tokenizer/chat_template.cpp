#include "tokenizer/chat_template.h"

#include <fstream>
#include <sstream>

#include "core/json_depth.h"
#include "tokenizer/jinja/builtins.h"

namespace tessera::tokenizer {
namespace {

std::optional<std::string> read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

nlohmann::ordered_json parse_json_file(const std::filesystem::path& path, const std::string& text) {
  check_json_file_depth(text, path.string());
  try {
    return nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorKind::kCorrupt, "{} is not valid JSON: {}", path.string(), json_error_text(e));
  }
}

// tokenizer_config.json's "chat_template": a string, or [{"name": ..., "template": ...}] (use "default").
std::optional<std::string> template_from_config(const nlohmann::ordered_json& config, const std::string& origin) {
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    std::string names;
    for (const auto& entry : *it) {
      if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template")) {
        return entry["template"].get<std::string>();
      }
      if (entry.is_object()) names += (names.empty() ? "" : ", ") + entry.value("name", "?");
    }
    fail(ErrorKind::kUnsupported,
         "{} has named chat templates ({}) but none called \"default\"; pass one with "
         "--chat-template FILE",
         origin, names);
  }
  fail(ErrorKind::kCorrupt, "{}: \"chat_template\" must be a string or a list of named templates", origin);
}

// Does any for loop iterate over `<something>.content` or `<something>['content']` (through filters)?
bool loops_over_content(const jinja::Body& body);

bool is_content_access(const jinja::Expr* expr) {
  while (expr && (expr->kind == jinja::Expr::Kind::kFilter || expr->kind == jinja::Expr::Kind::kTest)) {
    expr = expr->operands[0].get();
  }
  if (!expr) return false;
  if (expr->kind == jinja::Expr::Kind::kGetAttr) return expr->name == "content";
  if (expr->kind == jinja::Expr::Kind::kGetItem) {
    const jinja::Expr* key = expr->operands[1].get();
    return key->kind == jinja::Expr::Kind::kLiteral && key->literal.is_string() &&
           key->literal.as_string() == "content";
  }
  return false;
}

bool loops_over_content(const jinja::Body& body) {
  for (const jinja::StmtPtr& stmt : body) {
    if (stmt->kind == jinja::Stmt::Kind::kFor && is_content_access(stmt->expr.get())) return true;
    for (const auto& branch : stmt->branches) {
      if (loops_over_content(branch.second)) return true;
    }
    if (loops_over_content(stmt->body) || loops_over_content(stmt->else_body)) return true;
  }
  return false;
}

jinja::Dict special_tokens_from_config(const nlohmann::ordered_json& config) {
  jinja::Dict tokens;
  for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
    auto it = config.find(key);
    if (it == config.end()) continue;
    // A plain string, or an AddedToken object {"content": ...}; null means the tokenizer has none.
    if (it->is_string()) tokens.set(key, jinja::Value(it->get<std::string>()));
    if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
      tokens.set(key, jinja::Value((*it)["content"].get<std::string>()));
    }
  }
  return tokens;
}

}  // namespace

ChatTemplate::ChatTemplate(std::string source, jinja::Dict special_tokens)
    : source_(std::move(source)),
      template_(std::make_shared<jinja::Template>(source_)),
      special_tokens_(std::move(special_tokens)),
      content_format_(loops_over_content(template_->body()) ? ContentFormat::kOpenAI : ContentFormat::kString) {}

ChatTemplate ChatTemplate::from_file_text(std::string source, jinja::Dict special_tokens,
                                          const std::filesystem::path& origin) {
  try {
    return ChatTemplate(std::move(source), std::move(special_tokens));
  } catch (const jinja::TemplateError& e) {
    // The syntax error's line is within the template, which may sit inside a JSON file: name the file too.
    throw jinja::TemplateError(e.message(), e.line(), e.raised_by_template(), "chat template from " + origin.string());
  }
}

ChatTemplate ChatTemplate::from_source(std::string_view source, std::string_view tokenizer_config_json) {
  jinja::Dict tokens;
  if (!tokenizer_config_json.empty()) {
    tokens = special_tokens_from_config(parse_json_file("tokenizer_config.json", std::string(tokenizer_config_json)));
  }
  return ChatTemplate(std::string(source), std::move(tokens));
}

ChatTemplate ChatTemplate::from_model_dir(const std::filesystem::path& dir,
                                          const std::optional<std::filesystem::path>& template_file) {
  nlohmann::ordered_json config = nlohmann::ordered_json::object();
  std::filesystem::path config_path = dir / "tokenizer_config.json";
  if (std::optional<std::string> text = read_file(config_path)) config = parse_json_file(config_path, *text);
  jinja::Dict tokens = special_tokens_from_config(config);

  if (template_file) {
    std::optional<std::string> source = read_file(*template_file);
    if (!source) fail(ErrorKind::kNotFound, "cannot read the chat template file {}", template_file->string());
    return from_file_text(std::move(*source), std::move(tokens), *template_file);
  }
  if (std::optional<std::string> source = read_file(dir / "chat_template.jinja")) {
    return from_file_text(std::move(*source), std::move(tokens), dir / "chat_template.jinja");
  }
  std::filesystem::path json_path = dir / "chat_template.json";
  if (std::optional<std::string> text = read_file(json_path)) {
    if (auto source = template_from_config(parse_json_file(json_path, *text), json_path.string())) {
      return from_file_text(std::move(*source), std::move(tokens), json_path);
    }
  }
  if (auto source = template_from_config(config, config_path.string())) {
    return from_file_text(std::move(*source), std::move(tokens), config_path);
  }
  fail(ErrorKind::kNotFound,
       "no chat template in {} (looked for chat_template.jinja, chat_template.json and "
       "\"chat_template\" in tokenizer_config.json); pass one with --chat-template FILE",
       dir.string());
}

namespace {

bool reserved_variable(std::string_view name) {
  static const jinja::Dict globals = [] {
    jinja::Dict d;
    jinja::install_globals(d, jinja::RenderLimits{});
    return d;
  }();
  for (const char* n :
       {"bos_token", "eos_token", "unk_token", "pad_token", "messages", "tools", "documents", "add_generation_prompt"})
    if (name == n) return true;
  return globals.find(name) != nullptr;
}

jinja::Value request_value(const nlohmann::ordered_json& json, const char* field) {
  try {
    return jinja::Value::from_json(json);
  } catch (const jinja::ValueError& e) {
    fail(ErrorKind::kInvalidArgument, "\"{}\" of the chat request: {}", field, e.what());
  }
}

}  // namespace

std::string ChatTemplate::render(const nlohmann::ordered_json& request, const jinja::RenderLimits& limits) const {
  if (!request.is_object()) fail(ErrorKind::kInvalidArgument, "the chat request must be a JSON object");
  auto messages = request.find("messages");
  if (messages == request.end() || !messages->is_array()) {
    fail(ErrorKind::kInvalidArgument, "the chat request needs \"messages\", a list of messages");
  }
  // The same variables transformers passes, in its precedence: special tokens, then the caller's kwargs,
  // then the named arguments (tools and documents are None when absent, so `tools is defined` holds).
  jinja::Dict variables = special_tokens_;
  auto kwargs = request.find("chat_template_kwargs");
  if (kwargs != request.end() && !kwargs->is_null()) {
    if (!kwargs->is_object()) fail(ErrorKind::kInvalidArgument, "\"chat_template_kwargs\" must be a JSON object");
    for (const auto& [name, value] : kwargs->items()) {
      // The caller may add variables, not replace the tokenizer's special tokens, the named arguments or the
      // template's functions (a request must not change bos_token or disable raise_exception).
      if (reserved_variable(name))
        fail(ErrorKind::kInvalidArgument, "\"chat_template_kwargs\" may not set \"{}\": the server sets it", name);
      variables.set(name, request_value(value, "chat_template_kwargs"));
    }
  }
  variables.set("messages", request_value(*messages, "messages"));
  auto tools = request.find("tools");
  variables.set("tools", tools == request.end() ? jinja::Value(jinja::None{}) : request_value(*tools, "tools"));
  if (variables.find("documents") == nullptr) variables.set("documents", jinja::Value(jinja::None{}));
  auto generation = request.find("add_generation_prompt");
  bool add_generation_prompt = true;
  if (generation != request.end() && !generation->is_null()) {
    if (!generation->is_boolean()) fail(ErrorKind::kInvalidArgument, "\"add_generation_prompt\" must be true or false");
    add_generation_prompt = generation->get<bool>();
  }
  variables.set("add_generation_prompt", jinja::Value(add_generation_prompt));
  return template_->render(variables, limits);
}

nlohmann::ordered_json ChatTemplate::vllm_request(const nlohmann::ordered_json& request) const {
  if (!request.is_object() || !request.contains("messages")) return request;  // render() reports what is wrong
  nlohmann::ordered_json out = request;
  out["messages"] = vllm_messages(request["messages"], content_format_);
  return out;
}

Status ChatTemplate::try_render(const nlohmann::ordered_json& request, std::string* prompt,
                                const jinja::RenderLimits& limits) const noexcept {
  try {
    *prompt = render(request, limits);
    return Status::Ok();
  } catch (const Error& e) {
    return Status(e.kind(), e.what());
  } catch (const std::exception& e) {
    return Status(ErrorKind::kInternal, std::string("chat template: ") + e.what());
  }
}

}  // namespace tessera::tokenizer
