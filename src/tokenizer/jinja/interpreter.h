// Executes a parsed template: statements write to an output string, expressions evaluate to Values.
// Scopes follow Jinja2: for-loop bodies and macros see outer names but their `set` stays inside
// (which is why templates use namespace()).
#pragma once
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/limits.h"
#include "tokenizer/jinja/value.h"

namespace tessera::tokenizer::jinja {

class Scope {
 public:
  explicit Scope(std::shared_ptr<Scope> parent) : parent_(std::move(parent)) {}
  const Value* lookup(const std::string& name) const;
  void set(const std::string& name, Value value) { variables_[name] = std::move(value); }
  // Drops every variable: breaks the reference cycle a macro makes with the scope that holds it.
  void clear() {
    auto doomed = std::move(variables_);
    variables_.clear();
  }

 private:
  std::shared_ptr<Scope> parent_;
  std::unordered_map<std::string, Value> variables_;
};
using ScopePtr = std::shared_ptr<Scope>;

class Interpreter {
 public:
  explicit Interpreter(const RenderLimits& limits) : limits_(limits) {}
  ~Interpreter();
  std::string render(const Body& body, const ScopePtr& globals);

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  Flow exec_body(const Body& body, const ScopePtr& scope, std::string& out);
  Flow exec(const Stmt& stmt, const ScopePtr& scope, std::string& out);
  void exec_for(const Stmt& stmt, const ScopePtr& scope, std::string& out);
  void exec_set(const Stmt& stmt, const ScopePtr& scope, Value value);
  Value make_macro(const Stmt& stmt, const ScopePtr& scope);
  Value make_caller(const Stmt& stmt, const ScopePtr& scope);
  std::string render_nested(const Body& body, const ScopePtr& scope);

  Value eval(const Expr& expr, const ScopePtr& scope);
  Value eval_inner(const Expr& expr, const ScopePtr& scope);
  Args eval_args(const Expr& expr, const ScopePtr& scope, size_t first);
  Value call(const Value& callee, Args& args);
  void append(std::string& out, std::string_view text) const;

  RenderLimits limits_;
  uint64_t loop_iterations_ = 0;
  int call_depth_ = 0;
  int depth_ = 0;      // statements and expressions being evaluated, bounded by limits_.max_render_depth
  Value block_input_;  // the rendered body that {% filter %} and filtered {% set %} blocks pass to their filters
  // Scopes captured by macros and caller() blocks. A macro lives in the scope it captures, a shared_ptr
  // cycle; the destructor clears these scopes so that a render frees everything it allocated.
  std::vector<ScopePtr> closure_scopes_;
};

}  // namespace tessera::tokenizer::jinja
