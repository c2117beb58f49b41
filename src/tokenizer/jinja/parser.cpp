#include "tokenizer/jinja/parser.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <initializer_list>

#include "tokenizer/jinja/error.h"
#include "tokenizer/jinja/limits.h"

namespace tessera::tokenizer::jinja {
namespace {

using Type = Token::Type;

std::shared_ptr<Expr> make_expr(Expr::Kind kind, int line) {
  auto e = std::make_shared<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

std::shared_ptr<Stmt> make_stmt(Stmt::Kind kind, int line) {
  auto s = std::make_shared<Stmt>();
  s->kind = kind;
  s->line = line;
  return s;
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Body parse_all() {
    std::string stop;
    Body body = parse_body({}, &stop);
    return body;
  }

 private:
  const Token& current() const { return tokens_[pos_]; }
  const Token& peek(size_t ahead = 1) const { return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)]; }
  Token advance() { return tokens_[pos_ < tokens_.size() - 1 ? pos_++ : pos_]; }
  bool at_operator(std::string_view op) const { return current().type == Type::kOperator && current().value == op; }
  bool at_name(std::string_view name) const { return current().type == Type::kName && current().value == name; }

  [[noreturn]] void fail(const std::string& message) const { throw TemplateError(message, current().line); }

  [[noreturn]] void fail_nesting(int line) const {
    throw TemplateError("the template nests deeper than " + std::to_string(kMaxTemplateNesting) +
                            " levels (blocks, brackets, or chains of operators, filters, attributes and calls); "
                            "parsing and rendering it would exhaust the stack",
                        line);
  }

  // One more level of the parser's own recursion (nested blocks, brackets, unary operators).
  class Nested {
   public:
    explicit Nested(Parser& parser) : parser_(parser) {
      if (parser_.nesting_ >= kMaxTemplateNesting) parser_.fail_nesting(parser_.current().line);
      ++parser_.nesting_;
    }
    ~Nested() { --parser_.nesting_; }
    Nested(const Nested&) = delete;
    Nested& operator=(const Nested&) = delete;

   private:
    Parser& parser_;
  };

  // Records how deep a finished expression is; chains built in loops (a + b + c, x.a.b, f()()) deepen the
  // tree without recursing here, and rendering recurses once per level.
  ExprPtr seal(const std::shared_ptr<Expr>& e) {
    int deepest = 0;
    for (const ExprPtr& operand : e->operands) {
      if (operand) deepest = std::max(deepest, operand->depth);
    }
    for (const auto& keyword : e->keyword_args) deepest = std::max(deepest, keyword.second->depth);
    if (deepest >= kMaxTemplateNesting) fail_nesting(e->line);
    e->depth = deepest + 1;
    return e;
  }

  std::string describe(const Token& token) const {
    switch (token.type) {
      case Type::kEnd:
        return "end of template";
      case Type::kBlockEnd:
        return "end of statement block";
      case Type::kVariableEnd:
        return "end of print statement";
      case Type::kText:
        return "template text";
      default:
        return "'" + token.value + "'";
    }
  }

  void expect_operator(std::string_view op) {
    if (!at_operator(op)) fail("expected '" + std::string(op) + "', got " + describe(current()));
    advance();
  }
  std::string expect_name() {
    if (current().type != Type::kName) fail("expected a name, got " + describe(current()));
    return advance().value;
  }
  void expect_block_end() {
    if (current().type != Type::kBlockEnd) fail("expected end of statement block, got " + describe(current()));
    advance();
  }

  // Statements until `{% <one of stop_words> ...`; leaves the cursor after the stop word's name and
  // stores it in *stop. At top level (no stop words) runs to the end of the template.
  Body parse_body(std::initializer_list<std::string_view> stop_words, std::string* stop) {
    if (stop_words.size()) {
      std::string expected;
      for (auto w : stop_words) expected += (expected.empty() ? "'" : " or '") + std::string(w) + "'";
      open_blocks_.push_back(expected);
    }
    Body body = parse_body_until(stop_words, stop);
    if (stop_words.size()) open_blocks_.pop_back();
    return body;
  }

  Body parse_body_until(std::initializer_list<std::string_view> stop_words, std::string* stop) {
    Body body;
    while (true) {
      const Token& token = current();
      if (token.type == Type::kEnd) {
        if (stop_words.size() == 0) return body;
        fail("unexpected end of template, expected " + open_blocks_.back());
      }
      if (token.type == Type::kText) {
        auto s = make_stmt(Stmt::Kind::kText, token.line);
        s->text = token.value;
        body.push_back(s);
        advance();
      } else if (token.type == Type::kVariableBegin) {
        advance();
        auto s = make_stmt(Stmt::Kind::kOutput, token.line);
        s->expr = parse_tuple(true);
        if (current().type != Type::kVariableEnd) fail("expected end of print statement, got " + describe(current()));
        advance();
        body.push_back(s);
      } else if (token.type == Type::kBlockBegin) {
        advance();
        if (current().type == Type::kName) {
          for (auto w : stop_words) {
            if (current().value == w) {
              *stop = advance().value;
              return body;
            }
          }
        }
        if (StmtPtr s = parse_statement()) body.push_back(s);
      } else {
        fail("unexpected " + describe(token));
      }
    }
  }

  // Some statements (generation) inline their body into the parent; they return null and append.
  StmtPtr parse_statement() {
    Nested nested(*this);
    int line = current().line;
    if (current().type != Type::kName) fail("expected a statement name, got " + describe(current()));
    std::string keyword = advance().value;
    if (keyword == "if") return parse_if(line);
    if (keyword == "for") return parse_for(line);
    if (keyword == "set") return parse_set(line);
    if (keyword == "macro") return parse_macro(line);
    if (keyword == "call") return parse_call_block(line);
    if (keyword == "filter") return parse_filter_block(line);
    if (keyword == "break" || keyword == "continue") {
      expect_block_end();
      return make_stmt(keyword == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue, line);
    }
    if (keyword == "generation") {
      // transformers' AssistantTracker marks assistant spans; rendering ignores the markers.
      expect_block_end();
      std::string stop;
      auto s = make_stmt(Stmt::Kind::kIf, line);
      auto always = make_expr(Expr::Kind::kLiteral, line);
      always->literal = Value(true);
      s->branches.emplace_back(always, parse_body({"endgeneration"}, &stop));
      expect_block_end();
      return s;
    }
    if (keyword == "include" || keyword == "extends" || keyword == "import" || keyword == "from" ||
        keyword == "block") {
      throw TemplateError("the '" + keyword + "' tag is not supported in chat templates", line);
    }
    if (!open_blocks_.empty()) {
      throw TemplateError("unknown tag '" + keyword + "' where " + open_blocks_.back() + " was expected", line);
    }
    throw TemplateError("unknown tag '" + keyword + "'", line);
  }

  StmtPtr parse_if(int line) {
    auto s = make_stmt(Stmt::Kind::kIf, line);
    while (true) {
      ExprPtr condition = parse_tuple(false);
      expect_block_end();
      std::string stop;
      Body body = parse_body({"elif", "else", "endif"}, &stop);
      s->branches.emplace_back(condition, std::move(body));
      if (stop == "elif") continue;
      if (stop == "else") {
        expect_block_end();
        s->else_body = parse_body({"endif"}, &stop);
      }
      expect_block_end();
      return s;
    }
  }

  std::vector<std::string> parse_assign_names() {
    std::vector<std::string> names;
    bool parenthesized = at_operator("(");
    if (parenthesized) advance();
    names.push_back(expect_name());
    while (at_operator(",")) {
      advance();
      if (current().type != Type::kName || at_name("in")) break;
      names.push_back(expect_name());
    }
    if (parenthesized) expect_operator(")");
    return names;
  }

  StmtPtr parse_for(int line) {
    auto s = make_stmt(Stmt::Kind::kFor, line);
    s->targets = parse_assign_names();
    if (!at_name("in")) fail("expected 'in' in for loop, got " + describe(current()));
    advance();
    s->expr = parse_tuple(false);
    if (at_name("if")) {
      advance();
      s->condition = parse_expression(true);
    }
    if (at_name("recursive")) fail("recursive for loops are not supported");
    expect_block_end();
    std::string stop;
    s->body = parse_body({"else", "endfor"}, &stop);
    if (stop == "else") {
      expect_block_end();
      s->else_body = parse_body({"endfor"}, &stop);
    }
    expect_block_end();
    return s;
  }

  StmtPtr parse_set(int line) {
    auto s = make_stmt(Stmt::Kind::kSet, line);
    if (current().type == Type::kName && peek().type == Type::kOperator && peek().value == "." &&
        peek(2).type == Type::kName) {
      s->targets.push_back(advance().value);
      advance();
      s->targets.push_back(advance().value);
      s->attribute_target = true;
    } else {
      s->targets = parse_assign_names();
    }
    if (at_operator("=")) {
      advance();
      s->expr = parse_tuple(true);
      expect_block_end();
      return s;
    }
    if (s->attribute_target || s->targets.size() != 1) fail("expected '=' after the set target");
    s->kind = Stmt::Kind::kSetBlock;
    if (at_operator("|")) s->expr = parse_filters(nullptr);
    expect_block_end();
    std::string stop;
    s->body = parse_body({"endset"}, &stop);
    expect_block_end();
    return s;
  }

  std::vector<MacroParam> parse_params() {
    std::vector<MacroParam> params;
    expect_operator("(");
    while (!at_operator(")")) {
      if (!params.empty()) expect_operator(",");
      if (at_operator(")")) break;
      MacroParam param{expect_name(), nullptr};
      if (at_operator("=")) {
        advance();
        param.default_value = parse_expression(true);
      }
      params.push_back(std::move(param));
    }
    advance();
    return params;
  }

  StmtPtr parse_macro(int line) {
    auto s = make_stmt(Stmt::Kind::kMacro, line);
    s->name = expect_name();
    s->params = parse_params();
    expect_block_end();
    std::string stop;
    s->body = parse_body({"endmacro"}, &stop);
    if (current().type == Type::kName) advance();  // {% endmacro name %}
    expect_block_end();
    return s;
  }

  StmtPtr parse_call_block(int line) {
    auto s = make_stmt(Stmt::Kind::kCallBlock, line);
    if (at_operator("(")) s->params = parse_params();
    s->expr = parse_expression(true);
    if (s->expr->kind != Expr::Kind::kCall) throw TemplateError("expected a macro call after 'call'", line);
    expect_block_end();
    std::string stop;
    s->body = parse_body({"endcall"}, &stop);
    expect_block_end();
    return s;
  }

  StmtPtr parse_filter_block(int line) {
    auto s = make_stmt(Stmt::Kind::kFilterBlock, line);
    s->expr = parse_filter_chain(nullptr);
    expect_block_end();
    std::string stop;
    s->body = parse_body({"endfilter"}, &stop);
    expect_block_end();
    return s;
  }

  // ---- expressions ----

  // `a, b` builds a tuple (a list here); a lone expression stays itself.
  ExprPtr parse_tuple(bool with_condexpr) {
    int line = current().line;
    ExprPtr first = parse_expression(with_condexpr);
    if (!at_operator(",")) return first;
    auto tuple = make_expr(Expr::Kind::kList, line);
    tuple->is_tuple = true;
    tuple->operands.push_back(first);
    while (at_operator(",")) {
      advance();
      if (current().type == Type::kBlockEnd || current().type == Type::kVariableEnd || at_operator(")") ||
          at_operator("=")) {
        break;
      }
      tuple->operands.push_back(parse_expression(with_condexpr));
    }
    return seal(tuple);
  }

  ExprPtr parse_expression(bool with_condexpr) {
    Nested nested(*this);
    ExprPtr expr = parse_or();
    if (!with_condexpr) return expr;
    while (at_name("if")) {
      int line = current().line;
      advance();
      auto cond = make_expr(Expr::Kind::kConditional, line);
      cond->operands.push_back(expr);
      cond->operands.push_back(parse_or());
      if (at_name("else")) {
        advance();
        cond->operands.push_back(parse_expression(true));
      } else {
        cond->operands.push_back(nullptr);
      }
      expr = seal(cond);
    }
    return expr;
  }

  ExprPtr binary(std::string op, ExprPtr left, ExprPtr right, int line) {
    auto e = make_expr(Expr::Kind::kBinary, line);
    e->name = std::move(op);
    e->operands = {std::move(left), std::move(right)};
    return seal(e);
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (at_name("or")) {
      int line = advance().line;
      left = binary("or", left, parse_and(), line);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (at_name("and")) {
      int line = advance().line;
      left = binary("and", left, parse_not(), line);
    }
    return left;
  }

  ExprPtr parse_not() {
    if (at_name("not")) {
      Nested nested(*this);
      int line = advance().line;
      auto e = make_expr(Expr::Kind::kUnary, line);
      e->name = "not";
      e->operands.push_back(parse_not());
      return seal(e);
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    ExprPtr left = parse_math1();
    // Python chains a < b < c as (a < b) and (b < c): build that, evaluating b twice (expressions have no
    // side effects worth keeping).
    ExprPtr chain;
    ExprPtr previous = left;
    while (true) {
      int line = current().line;
      std::string op;
      if (current().type == Type::kOperator &&
          (current().value == "==" || current().value == "!=" || current().value == "<" || current().value == ">" ||
           current().value == "<=" || current().value == ">=")) {
        op = advance().value;
      } else if (at_name("in")) {
        advance();
        op = "in";
      } else if (at_name("not") && peek().type == Type::kName && peek().value == "in") {
        advance();
        advance();
        op = "not in";
      } else {
        return chain ? chain : left;
      }
      ExprPtr right = parse_math1();
      ExprPtr comparison = binary(op, previous, right, line);
      chain = chain ? binary("and", chain, comparison, line) : comparison;
      previous = right;
    }
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (at_operator("+") || at_operator("-")) {
      Token op = advance();
      left = binary(op.value, left, parse_concat(), op.line);
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (at_operator("~")) {
      int line = advance().line;
      left = binary("~", left, parse_math2(), line);
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (at_operator("*") || at_operator("/") || at_operator("//") || at_operator("%")) {
      Token op = advance();
      left = binary(op.value, left, parse_pow(), op.line);
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (at_operator("**")) {
      int line = advance().line;
      left = binary("**", left, parse_unary(true), line);
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    ExprPtr node;
    if (at_operator("-") || at_operator("+")) {
      Nested nested(*this);
      Token op = advance();
      auto e = make_expr(Expr::Kind::kUnary, op.line);
      e->name = op.value;
      e->operands.push_back(parse_unary(false));
      node = seal(e);
    } else {
      node = parse_primary();
    }
    node = parse_postfix(node);
    if (with_filter) node = parse_filters(node);
    return node;
  }

  ExprPtr parse_primary() {
    const Token& token = current();
    int line = token.line;
    auto literal = [&](Value v) {
      auto e = make_expr(Expr::Kind::kLiteral, line);
      e->literal = std::move(v);
      return e;
    };
    switch (token.type) {
      case Type::kName: {
        std::string name = advance().value;
        if (name == "true" || name == "True") return literal(Value(true));
        if (name == "false" || name == "False") return literal(Value(false));
        if (name == "none" || name == "None") return literal(Value(None{}));
        auto e = make_expr(Expr::Kind::kName, line);
        e->name = name;
        return e;
      }
      case Type::kString: {
        std::string text = advance().value;
        while (current().type == Type::kString) text += advance().value;  // adjacent literals concatenate
        return literal(Value(std::move(text)));
      }
      case Type::kInteger:
        return literal(Value(integer_literal(advance().value, line)));
      case Type::kFloat: {
        std::string spelling = advance().value;
        return literal(Value(std::strtod(spelling.c_str(), nullptr)));
      }
      case Type::kOperator:
        if (token.value == "(") {
          advance();
          if (at_operator(")")) {
            advance();
            auto empty = make_expr(Expr::Kind::kList, line);
            empty->is_tuple = true;
            return empty;
          }
          ExprPtr inner = parse_expression(true);
          if (at_operator(",")) {
            auto tuple = make_expr(Expr::Kind::kList, line);
            tuple->is_tuple = true;
            tuple->operands.push_back(inner);
            while (at_operator(",")) {
              advance();
              if (at_operator(")")) break;
              tuple->operands.push_back(parse_expression(true));
            }
            inner = seal(tuple);
          }
          expect_operator(")");
          return inner;
        }
        if (token.value == "[") {
          advance();
          auto list = make_expr(Expr::Kind::kList, line);
          while (!at_operator("]")) {
            if (!list->operands.empty()) expect_operator(",");
            if (at_operator("]")) break;
            list->operands.push_back(parse_expression(true));
          }
          advance();
          return seal(list);
        }
        if (token.value == "{") {
          advance();
          auto dict = make_expr(Expr::Kind::kDict, line);
          while (!at_operator("}")) {
            if (!dict->operands.empty()) expect_operator(",");
            if (at_operator("}")) break;
            dict->operands.push_back(parse_expression(true));
            expect_operator(":");
            dict->operands.push_back(parse_expression(true));
          }
          advance();
          return seal(dict);
        }
        break;
      default:
        break;
    }
    fail("unexpected " + describe(token));
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      int line = current().line;
      if (at_operator(".")) {
        advance();
        if (current().type == Type::kName) {
          auto e = make_expr(Expr::Kind::kGetAttr, line);
          e->name = advance().value;
          e->operands.push_back(node);
          node = seal(e);
        } else if (current().type == Type::kInteger) {
          auto index = make_expr(Expr::Kind::kLiteral, line);
          index->literal = Value(integer_literal(advance().value, line));
          auto e = make_expr(Expr::Kind::kGetItem, line);
          e->operands = {node, index};
          node = seal(e);
        } else {
          fail("expected an attribute name after '.', got " + describe(current()));
        }
      } else if (at_operator("[")) {
        advance();
        node = parse_subscript(node, line);
      } else if (at_operator("(")) {
        node = parse_call(node);
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node, int line) {
    ExprPtr parts[3] = {nullptr, nullptr, nullptr};
    bool is_slice = false;
    int part = 0;
    while (!at_operator("]")) {
      if (at_operator(":")) {
        advance();
        is_slice = true;
        if (++part > 2) fail("too many ':' in slice");
        continue;
      }
      if (parts[part]) fail("expected ']' or ':', got " + describe(current()));
      parts[part] = parse_expression(true);
    }
    advance();
    if (!is_slice) {
      if (!parts[0]) fail("empty subscript");
      auto e = make_expr(Expr::Kind::kGetItem, line);
      e->operands = {node, parts[0]};
      return seal(e);
    }
    auto e = make_expr(Expr::Kind::kSlice, line);
    e->operands = {node, parts[0], parts[1], parts[2]};
    return seal(e);
  }

  // Arguments of a call, filter or test: positional, then name=value.
  void parse_args(Expr* e) {
    expect_operator("(");
    bool first = true;
    while (!at_operator(")")) {
      if (!first) expect_operator(",");
      first = false;
      if (at_operator(")")) break;
      if (at_operator("*") || at_operator("**")) fail("*args and **kwargs are not supported");
      if (current().type == Type::kName && peek().type == Type::kOperator && peek().value == "=") {
        std::string name = advance().value;
        advance();
        e->keyword_args.emplace_back(name, parse_expression(true));
      } else {
        if (!e->keyword_args.empty()) fail("positional argument after a keyword argument");
        e->operands.push_back(parse_expression(true));
      }
    }
    advance();
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = make_expr(Expr::Kind::kCall, current().line);
    e->operands.push_back(callee);
    parse_args(e.get());
    return seal(e);
  }

  std::string parse_dotted_name() {
    std::string name = expect_name();
    while (at_operator(".") && peek().type == Type::kName) {
      advance();
      name += "." + advance().value;
    }
    return name;
  }

  // `| filter(args)` and `is [not] test args` after an operand, in any order, any number of times.
  ExprPtr parse_filters(ExprPtr node) {
    while (true) {
      if (at_operator("|")) {
        node = parse_filter_chain(node);
      } else if (at_name("is")) {
        int line = advance().line;
        auto e = make_expr(Expr::Kind::kTest, line);
        if (at_name("not")) {
          advance();
          e->negated = true;
        }
        e->name = parse_dotted_name();
        e->operands.push_back(node);
        if (at_operator("(")) {
          parse_args(e.get());
        } else if ((current().type == Type::kName && !at_name("else") && !at_name("or") && !at_name("and")) ||
                   current().type == Type::kString || current().type == Type::kInteger ||
                   current().type == Type::kFloat || at_operator("[") || at_operator("{")) {
          // One argument without parentheses, as Jinja2: `x is divisibleby 3`, `x is sameas none`.
          if (at_name("is")) fail("you cannot chain multiple tests with 'is'");
          e->operands.push_back(parse_postfix(parse_primary()));
        }
        node = seal(e);
      } else if (at_operator("(")) {
        node = parse_call(node);
      } else {
        return node;
      }
    }
  }

  // One or more `| name(args)`; a leading `|` is optional (the {% filter %} tag has none).
  ExprPtr parse_filter_chain(ExprPtr node) {
    bool first = true;
    while (at_operator("|") || (first && node == nullptr)) {
      if (at_operator("|")) advance();
      first = false;
      auto e = make_expr(Expr::Kind::kFilter, current().line);
      e->name = parse_dotted_name();
      e->operands.push_back(node);
      if (at_operator("(")) parse_args(e.get());
      node = seal(e);
    }
    return node;
  }

  // Python's ints are unbounded; ours are 64-bit, and a literal that does not fit is an error, not a clamp.
  static int64_t integer_literal(const std::string& spelling, int line) {
    errno = 0;
    long long value = std::strtoll(spelling.c_str(), nullptr, 10);
    if (errno == ERANGE) {
      throw TemplateError("integer literal " + spelling + " does not fit in a signed 64-bit integer", line);
    }
    return value;
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int nesting_ = 0;                       // the parser's own recursion, bounded by kMaxTemplateNesting
  std::vector<std::string> open_blocks_;  // for each open block, the end tags that may close it
};

}  // namespace

Body parse_template(std::string_view source, const LexerOptions& options) {
  return Parser(tokenize(source, options)).parse_all();
}

}  // namespace tessera::tokenizer::jinja
