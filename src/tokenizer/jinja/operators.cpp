#include "tokenizer/jinja/operators.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

#include "tokenizer/jinja/budget.h"
#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/error.h"
#include "tokenizer/jinja/format.h"
#include "tokenizer/jinja/utf8.h"

namespace tessera::tokenizer::jinja {
namespace {

std::string object_name(const Value& value) {
  if (value.is_none()) return "None";
  return type_name(value) + " object";
}

[[noreturn]] void unsupported(std::string_view op, const Value& left, const Value& right) {
  throw ValueError("unsupported operand type(s) for " + std::string(op) + ": '" + type_name(left) + "' and '" +
                   type_name(right) + "'");
}

// Chat templates compute with signed 64-bit integers where Python has unbounded ones: a result that
// does not fit is an error, never a wrapped value or a trap (INT64_MIN // -1 raises SIGFPE on x86).
[[noreturn]] void integer_overflow(std::string_view op, int64_t a, int64_t b) {
  throw ValueError("integer overflow: " + std::to_string(a) + " " + std::string(op) + " " + std::to_string(b) +
                   " does not fit in a signed 64-bit integer (chat templates compute with 64-bit integers)");
}

int64_t checked_int_operation(std::string_view op, int64_t a, int64_t b) {
  int64_t result = 0;
  bool overflow = false;
  if (op == "+") {
    overflow = __builtin_add_overflow(a, b, &result);
  } else if (op == "-") {
    overflow = __builtin_sub_overflow(a, b, &result);
  } else if (op == "*") {
    overflow = __builtin_mul_overflow(a, b, &result);
  }
  if (overflow) integer_overflow(op, a, b);
  return result;
}

int64_t python_floor_div(int64_t a, int64_t b) {
  if (a == INT64_MIN && b == -1) integer_overflow("//", a, b);
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

int64_t python_mod(int64_t a, int64_t b) {
  if (b == -1) return 0;  // every integer is divisible by -1; INT64_MIN % -1 would trap
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

// base ** exponent for exponent >= 0 by repeated squaring, every product checked.
int64_t python_int_pow(int64_t base, int64_t exponent) {
  int64_t result = 1;
  int64_t square = base;
  for (int64_t e = exponent; e > 0; e >>= 1) {
    if ((e & 1) && __builtin_mul_overflow(result, square, &result)) integer_overflow("**", base, exponent);
    if (e > 1 && __builtin_mul_overflow(square, square, &square)) integer_overflow("**", base, exponent);
  }
  return result;
}

// Python's normalisation of slice bounds for a sequence of `length` items.
std::vector<int64_t> slice_indices(int64_t length, const Value& start, const Value& stop, const Value& step) {
  auto as_index = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    if (!v.is_int() && !v.is_bool()) throw ValueError(std::string("slice ") + what + " must be an integer or None");
    return v.as_int();
  };
  int64_t step_value = as_index(step, "step").value_or(1);
  if (step_value == 0) throw ValueError("slice step cannot be zero");
  auto clamp = [&](std::optional<int64_t> index, int64_t fallback) {
    if (!index) return fallback;
    int64_t i = *index;
    if (i < 0) i += length;
    if (step_value > 0) return std::clamp<int64_t>(i, 0, length);
    return std::clamp<int64_t>(i, -1, length - 1);
  };
  int64_t begin = clamp(as_index(start, "start"), step_value > 0 ? 0 : length - 1);
  int64_t end = clamp(as_index(stop, "stop"), step_value > 0 ? length : -1);
  std::vector<int64_t> indices;
  // begin and end lie in [-1, length]; a step larger than that range ends the slice after one item.
  if (step_value > 0) {
    for (int64_t i = begin; i<end; i = step_value> end - i ? end : i + step_value) indices.push_back(i);
  } else {
    for (int64_t i = begin; i > end; i = step_value < end - i ? end : i + step_value) indices.push_back(i);
  }
  return indices;
}

// `sequence * count` (either order): a string or list repeated, charged before it is built.
Value repeat_sequence(const Value& sequence, int64_t count, const RenderLimits& limits) {
  auto n = static_cast<size_t>(std::max<int64_t>(0, count));
  if (sequence.is_string()) {
    const std::string& text = sequence.as_string();
    if (text.empty()) return Value("");
    charge(multiply_bytes(text.size(), n), limits, "'*' (string repetition)");
    std::string out;
    out.reserve(text.size() * n);
    for (size_t i = 0; i < n; ++i) out += text;
    return Value(std::move(out));
  }
  const List& items = sequence.as_list();
  if (items.empty()) n = 0;
  charge(multiply_bytes(list_bytes(items, limits.max_output_bytes), n), limits, "'*' (list repetition)");
  List out;
  out.reserve(items.size() * n);
  for (size_t i = 0; i < n; ++i) out.insert(out.end(), items.begin(), items.end());
  return sequence.is_tuple() ? Value::tuple(std::move(out)) : Value(std::move(out));
}

}  // namespace

void throw_undefined(const Value& undefined) {
  std::string hint = undefined.is_undefined() ? undefined.undefined_hint() : "";
  throw ValueError(hint.empty() ? "value is undefined" : hint);
}

Value get_attribute(const Value& object, const std::string& name, const RenderLimits& limits) {
  if (object.is_undefined()) throw_undefined(object);
  if (std::optional<Value> method = bound_method(object, name, limits)) return *method;
  if (object.is_dict()) {
    if (const Value* found = object.as_dict().find(name)) return *found;
  }
  return Value::undefined("'" + object_name(object) + "' has no attribute '" + name + "'");
}

Value get_item(const Value& object, const Value& key, const RenderLimits& limits) {
  if (object.is_undefined()) throw_undefined(object);
  if (object.is_list() && (key.is_int() || key.is_bool())) {
    const List& list = object.as_list();
    int64_t i = key.as_int();
    if (i < 0) i += static_cast<int64_t>(list.size());
    if (i >= 0 && i < static_cast<int64_t>(list.size())) return list[i];
  } else if (object.is_string() && (key.is_int() || key.is_bool())) {
    std::u32string text = utf8_decode(object.as_string());
    int64_t i = key.as_int();
    if (i < 0) i += static_cast<int64_t>(text.size());
    if (i >= 0 && i < static_cast<int64_t>(text.size())) return Value(utf8_encode(text.substr(i, 1)));
  } else if (object.is_dict() && key.is_string()) {
    if (const Value* found = object.as_dict().find(key.as_string())) return *found;
    if (std::optional<Value> method = bound_method(object, key.as_string(), limits)) return *method;
  } else if (key.is_string()) {
    if (std::optional<Value> method = bound_method(object, key.as_string(), limits)) return *method;
  }
  return Value::undefined("'" + object_name(object) + "' has no element " + python_repr(key));
}

Value get_slice(const Value& object, const Value& start, const Value& stop, const Value& step) {
  if (object.is_undefined()) throw_undefined(object);
  if (object.is_list()) {
    const List& list = object.as_list();
    List out;
    for (int64_t i : slice_indices(static_cast<int64_t>(list.size()), start, stop, step)) out.push_back(list[i]);
    return object.is_tuple() ? Value::tuple(std::move(out)) : Value(std::move(out));
  }
  if (object.is_string()) {
    std::u32string text = utf8_decode(object.as_string());
    std::u32string out;
    for (int64_t i : slice_indices(static_cast<int64_t>(text.size()), start, stop, step)) out.push_back(text[i]);
    return Value(utf8_encode(out));
  }
  return Value::undefined("'" + object_name(object) + "' is not subscriptable");
}

List iterate(const Value& value, const RenderLimits& limits) {
  switch (value.type()) {
    case Value::Type::kUndefined:
      return {};
    case Value::Type::kList:
      return value.as_list();
    case Value::Type::kDict: {
      if (value.as_dict().is_namespace) break;
      List keys;
      for (const auto& entry : value.as_dict().entries()) keys.emplace_back(entry.first);
      return keys;
    }
    case Value::Type::kString: {
      // One short string a character: sizeof(Value) bytes each.
      std::u32string text = utf8_decode(value.as_string());
      charge(multiply_bytes(text.size(), sizeof(Value)), limits, "iterating over a string");
      List chars;
      chars.reserve(text.size());
      for (char32_t c : text) chars.emplace_back(utf8_encode(std::u32string(1, c)));
      return chars;
    }
    default:
      break;
  }
  throw ValueError("'" + type_name(value) + "' object is not iterable");
}

bool contains(const Value& container, const Value& item) {
  switch (container.type()) {
    case Value::Type::kUndefined:
      return false;
    case Value::Type::kString:
      if (item.is_undefined()) throw_undefined(item);
      if (!item.is_string()) {
        throw ValueError("'in <string>' requires string as left operand, not " + type_name(item));
      }
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Type::kList:
      for (const Value& element : container.as_list()) {
        if (values_equal(element, item)) return true;
      }
      return false;
    case Value::Type::kDict:
      if (container.as_dict().is_namespace) break;
      return item.is_string() && container.as_dict().find(item.as_string()) != nullptr;
    default:
      break;
  }
  throw ValueError("argument of type '" + type_name(container) + "' is not iterable");
}

int compare_values(const Value& left, const Value& right) {
  if (left.is_undefined()) throw_undefined(left);
  if (right.is_undefined()) throw_undefined(right);
  if (left.is_number() && right.is_number()) {
    if (left.is_float() || right.is_float()) {
      double a = left.as_float(), b = right.as_float();
      return a < b ? -1 : a > b ? 1 : 0;
    }
    int64_t a = left.as_int(), b = right.as_int();
    return a < b ? -1 : a > b ? 1 : 0;
  }
  if (left.is_string() && right.is_string()) {
    // Byte order of UTF-8 equals code point order.
    int c = left.as_string().compare(right.as_string());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (left.is_list() && right.is_list() && left.is_tuple() == right.is_tuple()) {
    const List& a = left.as_list();
    const List& b = right.as_list();
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
      if (values_equal(a[i], b[i])) continue;
      return compare_values(a[i], b[i]);
    }
    return a.size() < b.size() ? -1 : a.size() > b.size() ? 1 : 0;
  }
  throw ValueError("'<' not supported between instances of '" + type_name(left) + "' and '" + type_name(right) + "'");
}

Value unary_minus(const Value& operand) {
  if (operand.is_undefined()) throw_undefined(operand);
  if (operand.is_float()) return Value(-operand.as_float());
  if (operand.is_number()) {
    if (operand.as_int() == INT64_MIN) integer_overflow("-", 0, INT64_MIN);
    return Value(-operand.as_int());
  }
  throw ValueError("bad operand type for unary -: '" + type_name(operand) + "'");
}

Value binary_operation(std::string_view op, const Value& left, const Value& right, const RenderLimits& limits) {
  if (op == "==") return Value(values_equal(left, right));
  if (op == "!=") return Value(!values_equal(left, right));
  if (op == "in") return Value(contains(right, left));
  if (op == "not in") return Value(!contains(right, left));
  if (op == "~") {
    std::string a = python_str(left, limits.max_output_bytes);
    std::string b = python_str(right, limits.max_output_bytes);
    charge(add_bytes(a.size(), b.size()), limits, "'~'");
    return Value(a + b);
  }
  if (op == "<") return Value(compare_values(left, right) < 0);
  if (op == ">") return Value(compare_values(left, right) > 0);
  if (op == "<=") return Value(compare_values(left, right) <= 0);
  if (op == ">=") return Value(compare_values(left, right) >= 0);

  if (left.is_undefined()) throw_undefined(left);
  if (right.is_undefined()) throw_undefined(right);
  bool numbers = left.is_number() && right.is_number();
  bool floats = numbers && (left.is_float() || right.is_float());
  if (op == "+") {
    if (numbers)
      return floats ? Value(left.as_float() + right.as_float())
                    : Value(checked_int_operation(op, left.as_int(), right.as_int()));
    if (left.is_string() && right.is_string()) {
      charge(add_bytes(left.as_string().size(), right.as_string().size()), limits, "'+' (string concatenation)");
      return Value(left.as_string() + right.as_string());
    }
    if (left.is_list() && right.is_list() && left.is_tuple() == right.is_tuple()) {
      size_t cap = limits.max_output_bytes;
      charge(add_bytes(list_bytes(left.as_list(), cap), list_bytes(right.as_list(), cap)), limits,
             "'+' (list concatenation)");
      List out = left.as_list();
      out.insert(out.end(), right.as_list().begin(), right.as_list().end());
      return left.is_tuple() ? Value::tuple(std::move(out)) : Value(std::move(out));
    }
    if (left.is_string()) throw ValueError("can only concatenate str (not \"" + type_name(right) + "\") to str");
    if (left.is_list()) throw ValueError("can only concatenate list (not \"" + type_name(right) + "\") to list");
    unsupported(op, left, right);
  }
  if (op == "*") {
    if (numbers)
      return floats ? Value(left.as_float() * right.as_float())
                    : Value(checked_int_operation(op, left.as_int(), right.as_int()));
    const Value* sequence = left.is_string() || left.is_list() ? &left : &right;
    const Value* count = sequence == &left ? &right : &left;
    if ((sequence->is_string() || sequence->is_list()) && (count->is_int() || count->is_bool())) {
      return repeat_sequence(*sequence, count->as_int(), limits);
    }
    unsupported(op, left, right);
  }
  if (!numbers) {
    if (op == "%" && left.is_string()) return Value(python_percent_format(left.as_string(), right, limits));
    unsupported(op, left, right);
  }
  if (op == "-")
    return floats ? Value(left.as_float() - right.as_float())
                  : Value(checked_int_operation(op, left.as_int(), right.as_int()));
  if (op == "/") {
    if (right.as_float() == 0) throw ValueError("division by zero");
    return Value(left.as_float() / right.as_float());
  }
  if (op == "//" || op == "%") {
    if (right.as_float() == 0) throw ValueError(op == "//" ? "integer division or modulo by zero" : "modulo by zero");
    if (floats) {
      double a = left.as_float(), b = right.as_float();
      double q = std::floor(a / b);
      return op == "//" ? Value(q) : Value(a - q * b);
    }
    return op == "//" ? Value(python_floor_div(left.as_int(), right.as_int()))
                      : Value(python_mod(left.as_int(), right.as_int()));
  }
  if (op == "**") {
    if (!floats && right.as_int() >= 0) return Value(python_int_pow(left.as_int(), right.as_int()));
    return Value(std::pow(left.as_float(), right.as_float()));
  }
  throw ValueError("unknown operator " + std::string(op));
}

}  // namespace tessera::tokenizer::jinja
