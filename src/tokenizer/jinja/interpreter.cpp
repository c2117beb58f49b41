#include "tokenizer/jinja/interpreter.h"

#include "tokenizer/jinja/budget.h"
#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/error.h"
#include "tokenizer/jinja/format.h"
#include "tokenizer/jinja/operators.h"

namespace tessera::tokenizer::jinja {
namespace {

// One more level of statements or expressions being evaluated; throws past the render's depth limit.
class NestedLevel {
 public:
  NestedLevel(int& depth, int max_depth) : depth_(depth) {
    if (depth_ >= max_depth) {
      throw ValueError("the chat template nests deeper than " + std::to_string(max_depth) +
                       " levels while rendering (blocks, expressions and macro calls together)");
    }
    ++depth_;
  }
  ~NestedLevel() { --depth_; }
  NestedLevel(const NestedLevel&) = delete;
  NestedLevel& operator=(const NestedLevel&) = delete;

 private:
  int& depth_;
};

}  // namespace

const Value* Scope::lookup(const std::string& name) const {
  for (const Scope* scope = this; scope; scope = scope->parent_.get()) {
    auto it = scope->variables_.find(name);
    if (it != scope->variables_.end()) return &it->second;
  }
  return nullptr;
}

Interpreter::~Interpreter() {
  for (const ScopePtr& scope : closure_scopes_) scope->clear();
}

std::string Interpreter::render(const Body& body, const ScopePtr& globals) {
  std::string out;
  exec_body(body, globals, out);
  return out;
}

void Interpreter::append(std::string& out, std::string_view text) const {
  if (out.size() + text.size() > limits_.max_output_bytes) {
    throw ValueError("the rendered prompt exceeds the output limit of " + std::to_string(limits_.max_output_bytes) +
                     " bytes");
  }
  out.append(text);
}

std::string Interpreter::render_nested(const Body& body, const ScopePtr& scope) {
  std::string out;
  exec_body(body, scope, out);
  return out;
}

Interpreter::Flow Interpreter::exec_body(const Body& body, const ScopePtr& scope, std::string& out) {
  for (const StmtPtr& stmt : body) {
    Flow flow = exec(*stmt, scope, out);
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

Interpreter::Flow Interpreter::exec(const Stmt& stmt, const ScopePtr& scope, std::string& out) {
  try {
    NestedLevel level(depth_, limits_.max_render_depth);
    switch (stmt.kind) {
      case Stmt::Kind::kText:
        append(out, stmt.text);
        return Flow::kNormal;
      case Stmt::Kind::kOutput:
        append(out, python_str(eval(*stmt.expr, scope), limits_.max_output_bytes));
        return Flow::kNormal;
      case Stmt::Kind::kIf:
        for (const auto& [condition, body] : stmt.branches) {
          if (truthy(eval(*condition, scope))) return exec_body(body, scope, out);
        }
        return exec_body(stmt.else_body, scope, out);
      case Stmt::Kind::kFor:
        exec_for(stmt, scope, out);
        return Flow::kNormal;
      case Stmt::Kind::kSet:
        exec_set(stmt, scope, eval(*stmt.expr, scope));
        return Flow::kNormal;
      case Stmt::Kind::kSetBlock: {
        Value value(render_nested(stmt.body, std::make_shared<Scope>(scope)));
        if (stmt.expr) {
          Value saved = block_input_;
          block_input_ = value;
          value = eval(*stmt.expr, scope);
          block_input_ = saved;
        }
        scope->set(stmt.targets[0], value);
        return Flow::kNormal;
      }
      case Stmt::Kind::kMacro:
        scope->set(stmt.name, make_macro(stmt, scope));
        return Flow::kNormal;
      case Stmt::Kind::kCallBlock: {
        const Expr& call_expr = *stmt.expr;
        Value callee = eval(*call_expr.operands[0], scope);
        Args args = eval_args(call_expr, scope, 1);
        args.keyword.emplace_back("caller", make_caller(stmt, scope));
        append(out, python_str(call(callee, args), limits_.max_output_bytes));
        return Flow::kNormal;
      }
      case Stmt::Kind::kFilterBlock: {
        Value saved = block_input_;
        block_input_ = Value(render_nested(stmt.body, std::make_shared<Scope>(scope)));
        Value value = eval(*stmt.expr, scope);
        block_input_ = saved;
        append(out, python_str(value, limits_.max_output_bytes));
        return Flow::kNormal;
      }
      case Stmt::Kind::kBreak:
        return Flow::kBreak;
      case Stmt::Kind::kContinue:
        return Flow::kContinue;
    }
  } catch (const TemplateRaised& e) {
    throw TemplateError(e.what(), stmt.line, true);
  } catch (const ValueError& e) {
    throw TemplateError(e.what(), stmt.line);
  }
  return Flow::kNormal;
}

void Interpreter::exec_for(const Stmt& stmt, const ScopePtr& scope, std::string& out) {
  List items = iterate(eval(*stmt.expr, scope), limits_);
  auto bind_targets = [&](const ScopePtr& target_scope, const Value& item) {
    if (stmt.targets.size() == 1) {
      target_scope->set(stmt.targets[0], item);
      return;
    }
    List parts = iterate(item, limits_);
    if (parts.size() != stmt.targets.size()) {
      throw ValueError("cannot unpack " + std::to_string(parts.size()) + " values into " +
                       std::to_string(stmt.targets.size()) + " loop variables");
    }
    for (size_t i = 0; i < parts.size(); ++i) target_scope->set(stmt.targets[i], parts[i]);
  };
  if (stmt.condition) {
    // `for x in xs if cond`: filtered before the loop, so loop.length and loop.last see only kept items.
    List kept;
    for (const Value& item : items) {
      auto probe = std::make_shared<Scope>(scope);
      bind_targets(probe, item);
      if (truthy(eval(*stmt.condition, probe))) kept.push_back(item);
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    exec_body(stmt.else_body, scope, out);
    return;
  }
  auto length = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < length; ++i) {
    if (++loop_iterations_ > limits_.max_loop_iterations) {
      throw ValueError("the chat template ran more than " + std::to_string(limits_.max_loop_iterations) +
                       " loop iterations");
    }
    auto body_scope = std::make_shared<Scope>(scope);
    bind_targets(body_scope, items[i]);
    ListPtr cycle_items = std::make_shared<List>();
    Value loop = make_dict({
        {"index", Value(i + 1)},
        {"index0", Value(i)},
        {"revindex", Value(length - i)},
        {"revindex0", Value(length - i - 1)},
        {"first", Value(i == 0)},
        {"last", Value(i == length - 1)},
        {"length", Value(length)},
        {"depth", Value(1)},
        {"depth0", Value(0)},
        {"previtem", i > 0 ? items[i - 1] : Value::undefined("there is no previous item")},
        {"nextitem", i + 1 < length ? items[i + 1] : Value::undefined("there is no next item")},
        {"cycle", make_function("cycle",
                                [i](Args& args) {
                                  if (args.positional.empty()) throw ValueError("no items for cycling given");
                                  return args.positional[i % args.positional.size()];
                                })},
    });
    body_scope->set("loop", loop);
    if (exec_body(stmt.body, body_scope, out) == Flow::kBreak) break;
  }
}

void Interpreter::exec_set(const Stmt& stmt, const ScopePtr& scope, Value value) {
  if (stmt.attribute_target) {
    const Value* target = scope->lookup(stmt.targets[0]);
    if (!target || !target->is_dict() || !target->as_dict().is_namespace) {
      throw ValueError("cannot assign attribute on non-namespace object '" + stmt.targets[0] + "'");
    }
    target->as_dict().set(stmt.targets[1], std::move(value));
    return;
  }
  if (stmt.targets.size() == 1) {
    scope->set(stmt.targets[0], std::move(value));
    return;
  }
  List parts = iterate(value, limits_);
  if (parts.size() != stmt.targets.size()) {
    throw ValueError("cannot unpack " + std::to_string(parts.size()) + " values into " +
                     std::to_string(stmt.targets.size()) + " names");
  }
  for (size_t i = 0; i < parts.size(); ++i) scope->set(stmt.targets[i], parts[i]);
}

Value Interpreter::make_macro(const Stmt& stmt, const ScopePtr& scope) {
  // The macro sees the scope it was defined in (Jinja2 closures), its parameters, varargs, kwargs, caller.
  const Stmt* macro = &stmt;
  closure_scopes_.push_back(scope);
  return make_function(stmt.name, [this, macro, scope](Args& args) {
    auto body_scope = std::make_shared<Scope>(scope);
    List varargs;
    auto kwargs = std::make_shared<Dict>();
    std::vector<bool> bound(macro->params.size(), false);
    for (size_t i = 0; i < args.positional.size(); ++i) {
      if (i < macro->params.size()) {
        body_scope->set(macro->params[i].name, args.positional[i]);
        bound[i] = true;
      } else {
        varargs.push_back(args.positional[i]);
      }
    }
    for (const auto& [name, value] : args.keyword) {
      if (name == "caller") {
        body_scope->set("caller", value);
        continue;
      }
      bool matched = false;
      for (size_t i = 0; i < macro->params.size(); ++i) {
        if (macro->params[i].name == name) {
          body_scope->set(name, value);
          bound[i] = matched = true;
        }
      }
      if (!matched) kwargs->set(name, value);
    }
    for (size_t i = 0; i < macro->params.size(); ++i) {
      if (bound[i]) continue;
      const MacroParam& param = macro->params[i];
      body_scope->set(param.name, param.default_value
                                      ? eval(*param.default_value, body_scope)
                                      : Value::undefined("parameter '" + param.name + "' was not provided"));
    }
    body_scope->set("varargs", Value::tuple(std::move(varargs)));
    body_scope->set("kwargs", Value(std::move(kwargs)));
    if (++call_depth_ > limits_.max_call_depth) {
      --call_depth_;
      throw ValueError("macro calls nested deeper than " + std::to_string(limits_.max_call_depth));
    }
    std::string out;
    try {
      exec_body(macro->body, body_scope, out);
    } catch (...) {
      --call_depth_;
      throw;
    }
    --call_depth_;
    return Value(std::move(out));
  });
}

Value Interpreter::make_caller(const Stmt& stmt, const ScopePtr& scope) {
  const Stmt* block = &stmt;
  closure_scopes_.push_back(scope);
  return make_function("caller", [this, block, scope](Args& args) {
    auto body_scope = std::make_shared<Scope>(scope);
    for (size_t i = 0; i < block->params.size(); ++i) {
      const MacroParam& param = block->params[i];
      Value value = args.get(i, param.name);
      if (value.is_undefined() && param.default_value) value = eval(*param.default_value, body_scope);
      body_scope->set(param.name, value);
    }
    return Value(render_nested(block->body, body_scope));
  });
}

Value Interpreter::call(const Value& callee, Args& args) {
  if (callee.is_undefined()) throw_undefined(callee);
  if (!callee.is_function()) throw ValueError("'" + type_name(callee) + "' object is not callable");
  return callee.as_function().call(args);
}

Args Interpreter::eval_args(const Expr& expr, const ScopePtr& scope, size_t first) {
  Args args;
  for (size_t i = first; i < expr.operands.size(); ++i) args.positional.push_back(eval(*expr.operands[i], scope));
  for (const auto& [name, value] : expr.keyword_args) args.keyword.emplace_back(name, eval(*value, scope));
  return args;
}

Value Interpreter::eval(const Expr& expr, const ScopePtr& scope) {
  try {
    NestedLevel level(depth_, limits_.max_render_depth);
    return eval_inner(expr, scope);
  } catch (const TemplateRaised& e) {
    throw TemplateError(e.what(), expr.line, true);
  } catch (const ValueError& e) {
    throw TemplateError(e.what(), expr.line);
  }
}

Value Interpreter::eval_inner(const Expr& expr, const ScopePtr& scope) {
  auto operand = [&](size_t i) { return expr.operands[i] ? eval(*expr.operands[i], scope) : Value(); };
  switch (expr.kind) {
    case Expr::Kind::kLiteral:
      return expr.literal;
    case Expr::Kind::kName: {
      const Value* value = scope->lookup(expr.name);
      return value ? *value : Value::undefined("'" + expr.name + "' is undefined");
    }
    case Expr::Kind::kList: {
      // Items copy their strings: [s, s, s] with a long s is charged as it is built.
      List items;
      size_t bytes = 0;
      for (const ExprPtr& item : expr.operands) {
        items.push_back(eval(*item, scope));
        bytes = add_bytes(bytes, value_bytes(items.back(), limits_.max_output_bytes));
        charge(bytes, limits_, "a list literal");
      }
      return expr.is_tuple ? Value::tuple(std::move(items)) : Value(std::move(items));
    }
    case Expr::Kind::kDict: {
      auto dict = std::make_shared<Dict>();
      size_t bytes = 0;
      for (size_t i = 0; i + 1 < expr.operands.size(); i += 2) {
        Value key = eval(*expr.operands[i], scope);
        if (!key.is_string()) throw ValueError("dict keys must be strings in chat templates");
        Value item = eval(*expr.operands[i + 1], scope);
        bytes = add_bytes(bytes, add_bytes(key.as_string().size(), value_bytes(item, limits_.max_output_bytes)));
        charge(bytes, limits_, "a dict literal");
        dict->set(key.as_string(), std::move(item));
      }
      return Value(std::move(dict));
    }
    case Expr::Kind::kGetAttr:
      return get_attribute(operand(0), expr.name, limits_);
    case Expr::Kind::kGetItem:
      return get_item(operand(0), operand(1), limits_);
    case Expr::Kind::kSlice:
      return get_slice(operand(0), operand(1), operand(2), operand(3));
    case Expr::Kind::kCall: {
      Value callee = operand(0);
      Args args = eval_args(expr, scope, 1);
      return call(callee, args);
    }
    case Expr::Kind::kFilter: {
      Value input = expr.operands[0] ? eval(*expr.operands[0], scope) : block_input_;
      Args args = eval_args(expr, scope, 1);
      return call_filter(expr.name, input, args, limits_);
    }
    case Expr::Kind::kTest: {
      Value input = operand(0);
      Args args = eval_args(expr, scope, 1);
      return Value(call_test(expr.name, input, args) != expr.negated);
    }
    case Expr::Kind::kUnary: {
      Value value = operand(0);
      if (expr.name == "not") return Value(!truthy(value));
      if (expr.name == "-") return unary_minus(value);
      if (value.is_undefined()) throw_undefined(value);
      if (!value.is_number()) throw ValueError("bad operand type for unary +: '" + type_name(value) + "'");
      return value;
    }
    case Expr::Kind::kBinary: {
      Value left = operand(0);
      if (expr.name == "and") return truthy(left) ? operand(1) : left;
      if (expr.name == "or") return truthy(left) ? left : operand(1);
      return binary_operation(expr.name, left, operand(1), limits_);
    }
    case Expr::Kind::kConditional:
      if (truthy(operand(1))) return operand(0);
      return expr.operands[2] ? operand(2) : Value::undefined("the conditional expression had no else branch");
  }
  return Value();
}

}  // namespace tessera::tokenizer::jinja
