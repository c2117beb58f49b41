// The parsed template: expressions and statements. One generic node per family keeps the parser and
// the interpreter short; `kind` says how the fields are used (see the comments on each kind).
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja/value.h"

namespace tessera::tokenizer::jinja {

struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;

struct Expr {
  enum class Kind {
    kLiteral,      // literal
    kName,         // name
    kList,         // operands = items; is_tuple for (a, b) and a, b
    kDict,         // operands = key0, value0, key1, value1, ...
    kGetAttr,      // operands[0] . name
    kGetItem,      // operands[0] [ operands[1] ]
    kSlice,        // operands[0] [ operands[1] : operands[2] : operands[3] ], absent parts are null
    kCall,         // operands[0] ( operands[1..], keyword_args )
    kFilter,       // operands[0] | name ( operands[1..], keyword_args ); operands[0] null in {% filter %}
    kTest,         // operands[0] is [not] name ( operands[1..] ); `negated` for "is not"
    kUnary,        // name ("not", "-", "+") operands[0]
    kBinary,       // operands[0] name operands[1]; name is the operator, "not in" included
    kConditional,  // operands[0] if operands[1] else operands[2] (null: undefined)
  };
  Kind kind;
  int line = 0;
  Value literal;
  std::string name;
  std::vector<ExprPtr> operands;
  std::vector<std::pair<std::string, ExprPtr>> keyword_args;
  bool negated = false;
  bool is_tuple = false;
  int depth = 1;  // levels of operands below and including this node (the parser bounds it)
};

struct Stmt;
using StmtPtr = std::shared_ptr<const Stmt>;
using Body = std::vector<StmtPtr>;

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // null: required
};

struct Stmt {
  enum class Kind {
    kText,         // text
    kOutput,       // {{ expr }}
    kIf,           // branches (condition, body); else_body
    kFor,          // for targets in expr [if condition] body [else else_body]
    kSet,          // set targets = expr; attribute_target: targets = {namespace, attribute}
    kSetBlock,     // set targets[0] [| filters in expr] body endset
    kMacro,        // macro name(params) body
    kCallBlock,    // call(params) expr body endcall: expr is the macro call, body becomes caller()
    kFilterBlock,  // filter expr body endfilter: expr is a filter chain whose innermost operand is null
    kBreak,
    kContinue,
  };
  Kind kind;
  int line = 0;
  std::string text;
  std::string name;
  ExprPtr expr;
  ExprPtr condition;
  std::vector<std::string> targets;
  bool attribute_target = false;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
  std::vector<MacroParam> params;
};

}  // namespace tessera::tokenizer::jinja
