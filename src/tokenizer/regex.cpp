#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"

namespace tessera::tokenizer {
namespace {

// Oniguruma's \s in Unicode mode is the White_Space property. PCRE2 10.42's \s under UCP is
// \p{Z}, \h and \v, which adds U+180E (no longer White_Space since Unicode 6.3); spell it out.
constexpr std::string_view kWhiteSpaceRanges =
    "\\x{9}-\\x{d}\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}";

// Per-thread match data (one ovector pair is all find_all needs) and a JIT stack large enough
// for long whitespace runs.
struct ThreadMatchState {
  pcre2_match_data* match_data = pcre2_match_data_create(1, nullptr);
  pcre2_jit_stack* jit_stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
  pcre2_match_context* context = [this] {
    pcre2_match_context* c = pcre2_match_context_create(nullptr);
    pcre2_jit_stack_assign(c, nullptr, jit_stack);
    return c;
  }();
  ~ThreadMatchState() {
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_data_free(match_data);
  }
};

ThreadMatchState& thread_match_state() {
  thread_local ThreadMatchState state;
  return state;
}

}  // namespace

struct Regex::Compiled {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Compiled() { pcre2_code_free(code); }
};

std::string Regex::translate_from_oniguruma(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 64);
  int class_depth = 0;  // inside [...] (POSIX-style nesting is not used by tokenizer patterns)
  for (size_t i = 0; i < pattern.size(); ++i) {
    char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      char next = pattern[i + 1];
      if (next == 's') {
        if (class_depth > 0) {
          out.append(kWhiteSpaceRanges);
        } else {
          out.append("[").append(kWhiteSpaceRanges).append("]");
        }
        ++i;
        continue;
      }
      if (next == 'S' && class_depth == 0) {
        out.append("[^").append(kWhiteSpaceRanges).append("]");
        ++i;
        continue;
      }
      out.push_back(c);
      out.push_back(next);
      ++i;
      continue;
    }
    if (c == '[') {
      ++class_depth;
      out.push_back(c);
      // A ']' right after '[' or '[^' is a literal member, not the end of the class.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out.push_back(pattern[++i]);
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out.push_back(pattern[++i]);
      continue;
    }
    if (c == ']' && class_depth > 0) --class_depth;
    out.push_back(c);
  }
  return out;
}

std::string Regex::escape(std::string_view literal) {
  std::string out;
  for (char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}-/#&~ \t\n\r").find(c) != std::string_view::npos) {
      if (c == '\t') {
        out.append("\\t");
      } else if (c == '\n') {
        out.append("\\n");
      } else if (c == '\r') {
        out.append("\\r");
      } else {
        out.push_back('\\');
        out.push_back(c);
      }
    } else {
      out.push_back(c);
    }
  }
  return out;
}

Regex::Regex(std::string_view pattern) : compiled_(std::make_unique<Compiled>()) {
  std::string translated = translate_from_oniguruma(pattern);
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  compiled_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                                  PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &error_code, &error_offset, nullptr);
  if (!compiled_->code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    fail(ErrorKind::kInvalidArgument, "tokenizer regex does not compile at offset {}: {} (pattern: {})",
         static_cast<size_t>(error_offset), reinterpret_cast<const char*>(message), pattern);
  }
  compiled_->jit = pcre2_jit_compile(compiled_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() = default;

void Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& matches) const {
  matches.clear();
  ThreadMatchState& state = thread_match_state();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t offset = 0;
  uint32_t options = 0;
  while (offset <= text.size()) {
    // The JIT fast path takes no match-time PCRE2_ANCHORED; the rare retry after an empty match
    // goes through the interpreter.
    int rc =
        compiled_->jit && options == 0
            ? pcre2_jit_match(compiled_->code, subject, text.size(), offset, options, state.match_data, state.context)
            : pcre2_match(compiled_->code, subject, text.size(), offset, options | PCRE2_NO_UTF_CHECK, state.match_data,
                          state.context);
    if (rc == PCRE2_ERROR_NOMATCH) {
      if (options == 0) break;
      // No non-empty match at an empty match's position: step one character and go on.
      options = 0;
      if (offset >= text.size()) break;
      ++offset;
      while (offset < text.size() && (static_cast<uint8_t>(text[offset]) & 0xC0) == 0x80) ++offset;
      continue;
    }
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      fail(ErrorKind::kInternal, "tokenizer regex match failed: {}", reinterpret_cast<const char*>(message));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.match_data);
    size_t begin = ovector[0];
    size_t end = ovector[1];
    matches.emplace_back(begin, end);
    offset = end;
    options = begin == end ? (PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED) : 0;
  }
}

}  // namespace tessera::tokenizer
