// The values a template computes with: Python's types as Jinja2 sees them (None, bool, int, float, str,
// list, dict), plus Jinja2's Undefined, callables (builtins, bound methods, macros) and namespace().
// Lists, dicts and callables are shared by reference, as in Python, so that `ns.x = ...` is seen by
// every holder of the namespace.
#pragma once
#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace tessera::tokenizer::jinja {

class Value;
class Dict;
struct Function;
using List = std::vector<Value>;
using ListPtr = std::shared_ptr<List>;
using DictPtr = std::shared_ptr<Dict>;
using FunctionPtr = std::shared_ptr<Function>;

// Jinja2's default Undefined: renders as "", is false, iterates as empty; most other uses are errors
// whose message is `hint` (e.g. "'dict object' has no attribute 'content'").
struct Undefined {
  std::string hint;
};
struct None {};

class Value {
 public:
  enum class Type { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kFunction };

  Value() : data_(Undefined{}) {}
  Value(None) : data_(None{}) {}
  Value(bool b) : data_(b) {}
  Value(int i) : data_(static_cast<int64_t>(i)) {}
  Value(int64_t i) : data_(i) {}
  Value(double f) : data_(f) {}
  Value(std::string s) : data_(std::move(s)) {}
  Value(std::string_view s) : data_(std::string(s)) {}
  Value(const char* s) : data_(std::string(s)) {}
  // A list or dict nested deeper than kMaxValueNesting throws ValueError.
  Value(List list) : depth_(list_depth(list)), data_(std::make_shared<List>(std::move(list))) {}
  Value(ListPtr list) : depth_(list_depth(*list)), data_(std::move(list)) {}
  Value(DictPtr dict) : data_(std::move(dict)) {}
  Value(FunctionPtr function) : data_(std::move(function)) {}

  static Value undefined(std::string hint) { return Value(Undefined{std::move(hint)}); }
  // A Python tuple: a list that prints as (a, b). dict.items(), dictsort, varargs and `a, b` literals make them.
  static Value tuple(List items) {
    Value v(std::move(items));
    v.tuple_ = true;
    return v;
  }
  // Throws ValueError for JSON nested deeper than max_depth: a hostile request must not overflow the stack.
  static Value from_json(const nlohmann::ordered_json& json, int max_depth = 512);

  Type type() const { return static_cast<Type>(data_.index()); }
  bool is_undefined() const { return type() == Type::kUndefined; }
  bool is_none() const { return type() == Type::kNone; }
  bool is_bool() const { return type() == Type::kBool; }
  bool is_int() const { return type() == Type::kInt; }
  bool is_float() const { return type() == Type::kFloat; }
  bool is_number() const { return is_int() || is_float() || is_bool(); }  // Python: bool is an int
  bool is_string() const { return type() == Type::kString; }
  bool is_list() const { return type() == Type::kList; }
  bool is_tuple() const { return tuple_ && is_list(); }
  bool is_dict() const { return type() == Type::kDict; }
  bool is_function() const { return type() == Type::kFunction; }

  bool as_bool() const { return std::get<bool>(data_); }
  int64_t as_int() const { return is_bool() ? as_bool() : std::get<int64_t>(data_); }
  double as_float() const { return is_float() ? std::get<double>(data_) : static_cast<double>(as_int()); }
  const std::string& as_string() const { return std::get<std::string>(data_); }
  List& as_list() const { return *std::get<ListPtr>(data_); }
  const ListPtr& list_ptr() const { return std::get<ListPtr>(data_); }
  Dict& as_dict() const { return *std::get<DictPtr>(data_); }
  const DictPtr& dict_ptr() const { return std::get<DictPtr>(data_); }
  Function& as_function() const { return *std::get<FunctionPtr>(data_); }
  const std::string& undefined_hint() const { return std::get<Undefined>(data_).hint; }
  // Levels of lists and dicts: 0 for a scalar, 1 for [1, 2], 2 for [[1]].
  int depth() const;

 private:
  explicit Value(Undefined u) : data_(std::move(u)) {}
  static int list_depth(const List& list);
  int depth_ = 0;  // of a list; a dict keeps its own, as it changes when a namespace attribute is set
  // Order matches Type.
  std::variant<Undefined, None, bool, int64_t, double, std::string, ListPtr, DictPtr, FunctionPtr> data_;
  bool tuple_ = false;
};

// A dict with string keys in insertion order, as Python dicts parsed from JSON keep them: tojson must
// print tool schemas in the order the client sent them. Linear lookup: template dicts are small.
class Dict {
 public:
  using Entry = std::pair<std::string, Value>;
  const Value* find(std::string_view key) const;
  void set(std::string key, Value value);
  const std::vector<Entry>& entries() const { return entries_; }
  size_t size() const { return entries_.size(); }
  // 1 + the deepest value ever set (an upper bound once a key is replaced). set() throws ValueError past
  // kMaxValueNesting, which also stops chains of namespaces linked through their attributes.
  int depth() const { return depth_; }
  bool is_namespace = false;  // created by namespace(): attributes are assignable, not a mapping

 private:
  std::vector<Entry> entries_;
  int depth_ = 1;
};

// Positional and keyword arguments of a call.
struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  // The argument called `name` or at `position`; Undefined when absent.
  Value get(size_t position, std::string_view name) const;
  bool has(size_t position, std::string_view name) const;
  static constexpr size_t kKeywordOnly = SIZE_MAX;         // a `position` that no positional argument has
  static constexpr std::string_view kPositionalOnly = "";  // a `name` that no keyword argument has
};

struct Function {
  std::string name;
  std::function<Value(Args&)> call;
};

Value make_function(std::string name, std::function<Value(Args&)> call);
Value make_dict(std::vector<Dict::Entry> entries = {});

bool truthy(const Value& value);                           // Python bool()
std::string type_name(const Value& value);                 // Python type name, for error messages
bool values_equal(const Value& left, const Value& right);  // Python ==

}  // namespace tessera::tokenizer::jinja
