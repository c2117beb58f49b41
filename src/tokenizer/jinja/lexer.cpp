#include "tokenizer/jinja/lexer.h"

#include <algorithm>
#include <cctype>
#include <cstring>

#include "tokenizer/jinja/error.h"
#include "tokenizer/jinja/utf8.h"

namespace tessera::tokenizer::jinja {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
bool is_name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

std::string normalize_newlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out.push_back(source[i]);
    }
  }
  return out;
}

int hex_value(char c) {
  if (is_digit(c)) return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Python's unicode-escape decoding, which Jinja2 applies to string literals.
std::string decode_string_literal(std::string_view body) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    char c = body[i];
    if (c != '\\' || i + 1 == body.size()) {
      out.push_back(c);
      continue;
    }
    char e = body[++i];
    switch (e) {
      case 'n':
        out.push_back('\n');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'v':
        out.push_back('\v');
        break;
      case 'a':
        out.push_back('\a');
        break;
      case '\\':
        out.push_back('\\');
        break;
      case '\'':
        out.push_back('\'');
        break;
      case '"':
        out.push_back('"');
        break;
      case '\n':
        break;  // line continuation
      case 'x':
      case 'u':
      case 'U': {
        size_t digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        char32_t cp = 0;
        bool ok = i + digits < body.size() + 1;
        for (size_t k = 1; ok && k <= digits; ++k) {
          int h = i + k < body.size() ? hex_value(body[i + k]) : -1;
          if (h < 0) ok = false;
          cp = cp * 16 + (h < 0 ? 0 : h);
        }
        if (!ok) {
          out.push_back('\\');
          out.push_back(e);
          break;
        }
        utf8_append(out, cp);
        i += digits;
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          char32_t cp = e - '0';
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7'; ++k) {
            cp = cp * 8 + (body[++i] - '0');
          }
          utf8_append(out, cp);
        } else {
          out.push_back('\\');
          out.push_back(e);
        }
    }
  }
  return out;
}

class Lexer {
 public:
  Lexer(std::string_view source, const LexerOptions& options) : source_(normalize_newlines(source)), options_(options) {
    if (!options_.keep_trailing_newline && !source_.empty() && source_.back() == '\n') source_.pop_back();
  }

  std::vector<Token> run() {
    size_t pos = 0;
    bool strip_next_text = false;  // set by `-%}`: the next text loses its leading whitespace
    while (pos <= source_.size()) {
      size_t start = find_tag(pos);
      std::string text = source_.substr(pos, start - pos);
      if (strip_next_text) {
        size_t first = 0;
        while (first < text.size() && is_space(text[first])) ++first;
        text.erase(0, first);
      }
      strip_next_text = false;
      if (start == source_.size()) {
        emit_text(text, pos);
        break;
      }
      char kind = source_[start + 1];
      char sign = start + 2 < source_.size() ? source_[start + 2] : 0;
      if (sign == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (sign != '+' && options_.lstrip_blocks && kind != '{') {
        size_t line_begin = text.rfind('\n');
        bool at_line_start = line_begin != std::string::npos || pos == 0 || source_[pos - 1] == '\n';
        line_begin = line_begin == std::string::npos ? 0 : line_begin + 1;
        if (at_line_start && std::all_of(text.begin() + line_begin, text.end(), is_space)) text.erase(line_begin);
      }
      emit_text(text, pos);
      size_t inner = start + 2 + (sign == '-' || sign == '+');
      size_t end;
      if (kind == '#') {
        end = lex_comment(inner, start, &strip_next_text);
      } else if (kind == '%' && is_raw_start(inner)) {
        end = lex_raw(inner, start, &strip_next_text);
      } else {
        end = lex_tag(kind, inner, start, &strip_next_text);
      }
      pos = end;
    }
    tokens_.push_back({Token::Type::kEnd, "", line_at(source_.size())});
    return std::move(tokens_);
  }

 private:
  size_t find_tag(size_t pos) const {
    while (true) {
      size_t p = source_.find('{', pos);
      if (p == std::string::npos || p + 1 >= source_.size()) return source_.size();
      char next = source_[p + 1];
      if (next == '{' || next == '%' || next == '#') return p;
      pos = p + 1;
    }
  }

  int line_at(size_t offset) {
    // Tokens are produced left to right, so count newlines incrementally.
    while (line_offset_ < offset && line_offset_ < source_.size()) {
      if (source_[line_offset_++] == '\n') ++line_;
    }
    return line_;
  }

  void emit_text(const std::string& text, size_t offset) {
    if (!text.empty()) tokens_.push_back({Token::Type::kText, text, line_at(offset)});
  }

  // After a block or comment end: trim_blocks eats one newline unless the tag ended with `+`.
  size_t after_block_end(size_t end, bool plus) {
    if (options_.trim_blocks && !plus && end < source_.size() && source_[end] == '\n') return end + 1;
    return end;
  }

  size_t lex_comment(size_t inner, size_t start, bool* strip_next_text) {
    size_t close = source_.find("#}", inner);
    if (close == std::string::npos) throw TemplateError("unterminated comment", line_at(start));
    bool minus = close > inner && source_[close - 1] == '-';
    bool plus = close > inner && source_[close - 1] == '+';
    *strip_next_text = minus;
    return minus ? close + 2 : after_block_end(close + 2, plus);
  }

  bool is_raw_start(size_t inner) const {
    size_t p = inner;
    while (p < source_.size() && is_space(source_[p])) ++p;
    if (source_.compare(p, 3, "raw") != 0 || (p + 3 < source_.size() && is_name_char(source_[p + 3]))) return false;
    // Jinja2 opens a raw block only with `%}` or `-%}` (a `+%}` makes it an unknown "raw" tag).
    p += 3;
    while (p < source_.size() && is_space(source_[p])) ++p;
    return source_.compare(p, 2, "%}") == 0 || source_.compare(p, 3, "-%}") == 0;
  }

  size_t lex_raw(size_t inner, size_t start, bool* strip_next_text) {
    int line = line_at(start);
    size_t open_end = source_.find("%}", inner);
    if (open_end == std::string::npos) throw TemplateError("unterminated raw block", line);
    bool strip_inside_start = source_[open_end - 1] == '-';
    size_t body_begin = open_end + 2;
    // Find `{%[-+]? endraw [-+]?%}`.
    size_t search = body_begin;
    while (true) {
      size_t tag = source_.find("{%", search);
      if (tag == std::string::npos) throw TemplateError("missing endraw for raw block", line);
      size_t p = tag + 2;
      bool strip_before = p < source_.size() && source_[p] == '-';
      bool keep_before = p < source_.size() && source_[p] == '+';
      if (strip_before || keep_before) ++p;
      while (p < source_.size() && is_space(source_[p])) ++p;
      if (source_.compare(p, 6, "endraw") == 0) {
        p += 6;
        while (p < source_.size() && is_space(source_[p])) ++p;
        char sign = p < source_.size() ? source_[p] : 0;
        if (sign == '-' || sign == '+') ++p;
        if (source_.compare(p, 2, "%}") == 0) {
          std::string body = source_.substr(body_begin, tag - body_begin);
          if (strip_inside_start) {
            size_t first = 0;
            while (first < body.size() && is_space(body[first])) ++first;
            body.erase(0, first);
          }
          if (strip_before) {
            while (!body.empty() && is_space(body.back())) body.pop_back();
          } else if (options_.lstrip_blocks && !keep_before) {
            size_t line_begin = body.rfind('\n');
            line_begin = line_begin == std::string::npos ? 0 : line_begin + 1;
            if (std::all_of(body.begin() + line_begin, body.end(), is_space) && line_begin > 0) body.erase(line_begin);
          }
          emit_text(body, body_begin);
          *strip_next_text = sign == '-';
          return sign == '-' ? p + 2 : after_block_end(p + 2, sign == '+');
        }
      }
      search = tag + 2;
    }
  }

  size_t lex_tag(char kind, size_t pos, size_t start, bool* strip_next_text) {
    bool block = kind == '%';
    tokens_.push_back({block ? Token::Type::kBlockBegin : Token::Type::kVariableBegin, "", line_at(start)});
    const char* close = block ? "%}" : "}}";
    int depth = 0;  // open brackets: `}}` inside `{'a': {'b': 1}}` does not end the tag
    while (true) {
      while (pos < source_.size() && is_space(source_[pos])) ++pos;
      if (pos >= source_.size())
        throw TemplateError(
            block ? "unexpected end of template, expected '%}'" : "unexpected end of template, expected '}}'",
            line_at(start));
      if (depth == 0) {
        char sign = source_[pos];
        bool signed_close = (sign == '-' || (sign == '+' && block)) && source_.compare(pos + 1, 2, close) == 0;
        if (signed_close || source_.compare(pos, 2, close) == 0) {
          tokens_.push_back({block ? Token::Type::kBlockEnd : Token::Type::kVariableEnd, "", line_at(pos)});
          size_t end = pos + 2 + signed_close;
          *strip_next_text = signed_close && sign == '-';
          if (*strip_next_text) return end;
          return block ? after_block_end(end, signed_close && sign == '+') : end;
        }
      }
      pos = lex_expression_token(pos, &depth);
    }
  }

  size_t lex_expression_token(size_t pos, int* depth) {
    int line = line_at(pos);
    char c = source_[pos];
    if (is_name_start(c)) {
      size_t end = pos;
      while (end < source_.size() && is_name_char(source_[end])) ++end;
      tokens_.push_back({Token::Type::kName, source_.substr(pos, end - pos), line});
      return end;
    }
    if (is_digit(c)) return lex_number(pos, line);
    if (c == '\'' || c == '"') {
      size_t end = pos + 1;
      while (end < source_.size() && source_[end] != c) end += source_[end] == '\\' ? 2 : 1;
      if (end >= source_.size()) throw TemplateError("unterminated string literal", line);
      tokens_.push_back({Token::Type::kString,
                         decode_string_literal(std::string_view(source_).substr(pos + 1, end - pos - 1)), line});
      return end + 1;
    }
    static const char* kTwoCharOperators[] = {"**", "//", "==", "!=", "<=", ">="};
    for (const char* op : kTwoCharOperators) {
      if (source_.compare(pos, 2, op) == 0) {
        tokens_.push_back({Token::Type::kOperator, op, line});
        return pos + 2;
      }
    }
    if (std::strchr("+-*/%~<>=()[]{}.,:|!", c)) {
      if (c == '(' || c == '[' || c == '{') ++*depth;
      if ((c == ')' || c == ']' || c == '}') && *depth > 0) --*depth;
      tokens_.push_back({Token::Type::kOperator, std::string(1, c), line});
      return pos + 1;
    }
    throw TemplateError(std::string("unexpected character '") + c + "'", line);
  }

  size_t lex_number(size_t pos, int line) {
    auto digits = [&](size_t p) {
      while (p < source_.size() &&
             (is_digit(source_[p]) || (source_[p] == '_' && p + 1 < source_.size() && is_digit(source_[p + 1])))) {
        ++p;
      }
      return p;
    };
    size_t end = digits(pos);
    bool is_float = false;
    if (end + 1 < source_.size() && source_[end] == '.' && is_digit(source_[end + 1])) {
      end = digits(end + 1);
      is_float = true;
    }
    if (end < source_.size() && (source_[end] == 'e' || source_[end] == 'E')) {
      size_t p = end + 1;
      if (p < source_.size() && (source_[p] == '+' || source_[p] == '-')) ++p;
      if (p < source_.size() && is_digit(source_[p])) {
        end = digits(p);
        is_float = true;
      }
    }
    std::string spelling = source_.substr(pos, end - pos);
    spelling.erase(std::remove(spelling.begin(), spelling.end(), '_'), spelling.end());
    tokens_.push_back({is_float ? Token::Type::kFloat : Token::Type::kInteger, spelling, line});
    return end;
  }

  std::string source_;
  LexerOptions options_;
  std::vector<Token> tokens_;
  size_t line_offset_ = 0;
  int line_ = 1;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source, const LexerOptions& options) {
  return Lexer(source, options).run();
}

}  // namespace tessera::tokenizer::jinja
