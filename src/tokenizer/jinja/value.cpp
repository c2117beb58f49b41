#include "tokenizer/jinja/value.h"

#include <algorithm>
#include <string>

#include "tokenizer/jinja/error.h"
#include "tokenizer/jinja/limits.h"

namespace tessera::tokenizer::jinja {

Value Value::from_json(const nlohmann::ordered_json& json, int max_depth) {
  if (max_depth < 0) throw ValueError("JSON input is nested too deeply");
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value(None{});
    case nlohmann::ordered_json::value_t::boolean:
      return Value(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      uint64_t u = json.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
      return Value(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value(json.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List list;
      list.reserve(json.size());
      for (const auto& item : json) list.push_back(from_json(item, max_depth - 1));
      return Value(std::move(list));
    }
    case nlohmann::ordered_json::value_t::object: {
      auto dict = std::make_shared<Dict>();
      for (const auto& [key, item] : json.items()) dict->set(key, from_json(item, max_depth - 1));
      return Value(std::move(dict));
    }
    default:
      return Value(None{});
  }
}

namespace {

[[noreturn]] void too_deep() {
  throw ValueError("a value is nested deeper than " + std::to_string(kMaxValueNesting) +
                   " levels of lists and dicts; the chat template must not build such values");
}

}  // namespace

int Value::list_depth(const List& list) {
  int deepest = 0;
  for (const Value& item : list) deepest = std::max(deepest, item.depth());
  if (deepest >= kMaxValueNesting) too_deep();
  return deepest + 1;
}

int Value::depth() const {
  if (is_list()) return depth_;
  if (is_dict()) return as_dict().depth();
  return 0;
}

const Value* Dict::find(std::string_view key) const {
  for (const auto& entry : entries_) {
    if (entry.first == key) return &entry.second;
  }
  return nullptr;
}

void Dict::set(std::string key, Value value) {
  int value_depth = value.depth();
  if (value_depth >= kMaxValueNesting) too_deep();
  depth_ = std::max(depth_, value_depth + 1);
  for (auto& entry : entries_) {
    if (entry.first == key) {
      entry.second = std::move(value);
      return;
    }
  }
  entries_.emplace_back(std::move(key), std::move(value));
}

Value Args::get(size_t position, std::string_view name) const {
  for (const auto& [key, value] : keyword) {
    if (key == name) return value;
  }
  if (position < positional.size()) return positional[position];
  return Value();
}

bool Args::has(size_t position, std::string_view name) const {
  for (const auto& entry : keyword) {
    if (entry.first == name) return true;
  }
  return position < positional.size();
}

Value make_function(std::string name, std::function<Value(Args&)> call) {
  return Value(std::make_shared<Function>(Function{std::move(name), std::move(call)}));
}

Value make_dict(std::vector<Dict::Entry> entries) {
  auto dict = std::make_shared<Dict>();
  for (auto& [key, value] : entries) dict->set(std::move(key), std::move(value));
  return Value(std::move(dict));
}

bool truthy(const Value& value) {
  switch (value.type()) {
    case Value::Type::kUndefined:
    case Value::Type::kNone:
      return false;
    case Value::Type::kBool:
      return value.as_bool();
    case Value::Type::kInt:
      return value.as_int() != 0;
    case Value::Type::kFloat:
      return value.as_float() != 0.0;
    case Value::Type::kString:
      return !value.as_string().empty();
    case Value::Type::kList:
      return !value.as_list().empty();
    case Value::Type::kDict:
      return value.as_dict().is_namespace || value.as_dict().size() > 0;
    case Value::Type::kFunction:
      return true;
  }
  return false;
}

std::string type_name(const Value& value) {
  switch (value.type()) {
    case Value::Type::kUndefined:
      return "Undefined";
    case Value::Type::kNone:
      return "NoneType";
    case Value::Type::kBool:
      return "bool";
    case Value::Type::kInt:
      return "int";
    case Value::Type::kFloat:
      return "float";
    case Value::Type::kString:
      return "str";
    case Value::Type::kList:
      return "list";
    case Value::Type::kDict:
      return value.as_dict().is_namespace ? "Namespace" : "dict";
    case Value::Type::kFunction:
      return "function";
  }
  return "object";
}

bool values_equal(const Value& left, const Value& right) {
  if (left.is_number() && right.is_number()) {
    if (left.is_float() || right.is_float()) return left.as_float() == right.as_float();
    return left.as_int() == right.as_int();
  }
  if (left.type() != right.type()) return false;
  switch (left.type()) {
    case Value::Type::kUndefined:
    case Value::Type::kNone:
      return true;
    case Value::Type::kString:
      return left.as_string() == right.as_string();
    case Value::Type::kList: {
      if (left.is_tuple() != right.is_tuple()) return false;  // Python: (1, 2) != [1, 2]
      const List& a = left.as_list();
      const List& b = right.as_list();
      if (a.size() != b.size()) return false;
      for (size_t i = 0; i < a.size(); ++i) {
        if (!values_equal(a[i], b[i])) return false;
      }
      return true;
    }
    case Value::Type::kDict: {
      const Dict& a = left.as_dict();
      const Dict& b = right.as_dict();
      if (a.is_namespace || b.is_namespace) return &a == &b;
      if (a.size() != b.size()) return false;
      for (const auto& [key, value] : a.entries()) {
        const Value* other = b.find(key);
        if (!other || !values_equal(value, *other)) return false;
      }
      return true;
    }
    case Value::Type::kFunction:
      return &left.as_function() == &right.as_function();
    default:
      return false;
  }
}

}  // namespace tessera::tokenizer::jinja
