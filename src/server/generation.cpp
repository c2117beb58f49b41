#include "server/generation.h"

#include <span>

#include "tokenizer/tokenizer.h"

namespace tessera::server::api {

ChatDelta Gen::parsed_delta(size_t ci, const StreamDelta& d, bool has_text) {
  if (parsers.empty()) {
    ChatDelta cd;
    if (has_text) cd.content = d.text;
    return cd;
  }
  ChatOutputParser& parser = *parsers[ci];
  ChatDelta cd = has_text ? parser.push(d.text) : ChatDelta{};
  if (d.finished) {
    ChatDelta tail = parser.finish();
    cd.reasoning += tail.reasoning;
    cd.content += tail.content;
    cd.tool_calls.insert(cd.tool_calls.end(), tail.tool_calls.begin(), tail.tool_calls.end());
  }
  if (parser.tools_called()) tools_called[ci] = true;
  return cd;
}

ChatParseResult Gen::parsed_output(size_t ci) const {
  if (!parsers.empty()) return parsers[ci]->parse(choices[ci].text);
  ChatParseResult r;
  r.content = choices[ci].text;
  return r;
}

ojson Gen::usage() const {
  int prompt = 0, completion = 0;
  for (int p : prompt_tokens) prompt += p;
  for (const auto& c : choices) completion += static_cast<int>(c.token_ids.size());
  ojson u{{"prompt_tokens", prompt}, {"total_tokens", prompt + completion}, {"completion_tokens", completion}};
  u["prompt_tokens_details"] = {{"cached_tokens", cached_tokens}};
  return u;
}

std::string TokenText::token_string(int32_t id) const {
  int32_t ids[1] = {id};
  return tok_.decode(std::span<const int32_t>(ids, 1), false);
}

ojson TokenText::token_bytes(int32_t id) const {
  std::string b;
  if (tok_.decodes_by_byte_concatenation())
    tok_.append_token_bytes(id, false, b);
  else
    b = token_string(id);
  ojson arr = ojson::array();
  for (unsigned char c : b) arr.push_back(static_cast<int>(c));
  return arr;
}

ojson TokenText::chat_logprobs(const std::vector<TokenLogprob>& lps, int top) const {
  ojson content = ojson::array();
  for (const auto& lp : lps) {
    ojson tops = ojson::array();
    for (size_t i = 0; i < lp.top.size() && static_cast<int>(i) < top; ++i)
      tops.push_back({{"token", token_string(lp.top[i].first)},
                      {"logprob", finite_logprob(lp.top[i].second)},
                      {"bytes", token_bytes(lp.top[i].first)}});
    content.push_back({{"token", token_string(lp.token)},
                       {"logprob", finite_logprob(lp.logprob)},
                       {"bytes", token_bytes(lp.token)},
                       {"top_logprobs", tops}});
  }
  return ojson{{"content", content}};
}

namespace {
// The four parallel arrays of completions' logprobs, filled token by token.
struct CompletionLogprobs {
  ojson tokens = ojson::array(), token_lps = ojson::array(), tops = ojson::array(), offsets = ojson::array();
  size_t offset = 0;

  void add(const std::string& token, ojson logprob, ojson top) {
    tokens.push_back(token);
    token_lps.push_back(std::move(logprob));
    tops.push_back(std::move(top));
    offsets.push_back(offset);
    offset += token.size();
  }
  void add(const TokenText& text, const std::vector<TokenLogprob>& lps, int top) {
    for (const auto& lp : lps) {
      ojson t = ojson::object();
      for (size_t i = 0; i < lp.top.size() && static_cast<int>(i) < top; ++i)
        t[text.token_string(lp.top[i].first)] = finite_logprob(lp.top[i].second);
      add(text.token_string(lp.token), finite_logprob(lp.logprob), std::move(t));
    }
  }
  ojson json() const {
    return ojson{{"tokens", tokens}, {"token_logprobs", token_lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
  }
};
}  // namespace

ojson TokenText::completion_logprobs(const std::vector<TokenLogprob>& lps, int top, size_t text_offset) const {
  CompletionLogprobs out;
  out.offset = text_offset;
  out.add(*this, lps, top);
  return out.json();
}

ojson TokenText::echo_logprobs(const std::vector<int32_t>& prompt, const std::vector<TokenLogprob>& prompt_lps,
                               const std::vector<TokenLogprob>& lps, int top) const {
  CompletionLogprobs out;
  if (!prompt.empty()) out.add(token_string(prompt[0]), nullptr, nullptr);
  out.add(*this, prompt_lps, top);
  out.add(*this, lps, top);
  return out.json();
}

ojson TokenText::prompt_logprobs(const std::vector<TokenLogprob>& prompt_lps, int top) const {
  ojson out = ojson::array();
  out.push_back(nullptr);
  for (const auto& lp : prompt_lps) {
    ojson entry = ojson::object();
    entry[std::to_string(lp.token)] = {
        {"logprob", finite_logprob(lp.logprob)}, {"rank", lp.rank}, {"decoded_token", token_string(lp.token)}};
    for (size_t i = 0; i < lp.top.size() && static_cast<int>(i) < top; ++i) {
      const std::string key = std::to_string(lp.top[i].first);
      if (entry.contains(key)) continue;
      entry[key] = {{"logprob", finite_logprob(lp.top[i].second)},
                    {"rank", static_cast<int>(i) + 1},
                    {"decoded_token", token_string(lp.top[i].first)}};
    }
    out.push_back(std::move(entry));
  }
  return out;
}

}  // namespace tessera::server::api
