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

ojson TokenText::completion_logprobs(const std::vector<TokenLogprob>& lps, int top, size_t text_offset) const {
  ojson tokens = ojson::array(), token_lps = ojson::array(), tops = ojson::array(), offsets = ojson::array();
  for (const auto& lp : lps) {
    std::string s = token_string(lp.token);
    tokens.push_back(s);
    token_lps.push_back(finite_logprob(lp.logprob));
    ojson t = ojson::object();
    for (size_t i = 0; i < lp.top.size() && static_cast<int>(i) < top; ++i)
      t[token_string(lp.top[i].first)] = finite_logprob(lp.top[i].second);
    tops.push_back(t);
    offsets.push_back(text_offset);
    text_offset += s.size();
  }
  return ojson{{"tokens", tokens}, {"token_logprobs", token_lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

}  // namespace tessera::server::api
