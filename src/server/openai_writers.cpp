// OpenAI chat completions and completions: chunks with choices[].delta / choices[].text, then
// [DONE]; or one chat.completion / text_completion object.
#include <functional>

#include "server/protocol_writers.h"

namespace tessera::server::api {

namespace {

// What chat and completions share: the chunk frame, the error chunk, usage, [DONE].
class OpenAIWriter : public ProtocolWriter {
 public:
  explicit OpenAIWriter(const TokenText& text) : text_(text) {}

  std::string stream_delta(Gen& g, size_t ci, const StreamDelta& d, const std::vector<TokenLogprob>& lps) override {
    const bool has_text = !d.text.empty() && d.finish_reason != FinishReason::kError;
    if (!has_text && lps.empty() && !d.finished) return {};
    Choice& c = g.choices[ci];
    if (d.finished && d.finish_reason == FinishReason::kError)
      return sse(openai_error(500, "generation failed: " + c.error));
    ojson choice{{"index", ci}};
    if (!fill_choice(g, ci, d, lps, has_text, choice)) return {};
    choice["finish_reason"] = d.finished ? ojson(c.finish_reason) : ojson(nullptr);
    if (d.finished) choice["stop_reason"] = c.stop_reason;
    ojson j = chunk_head(g);
    j["choices"] = ojson::array({choice});
    if (g.include_usage && g.continuous_usage) j["usage"] = g.usage();
    return sse(j);
  }

  std::string end_stream(Gen& g) override {
    std::string out;
    if (g.include_usage) {
      ojson j = chunk_head(g);
      j["choices"] = ojson::array();
      j["usage"] = g.usage();
      out += sse(j);
    }
    return out + "data: [DONE]\n\n";
  }

 protected:
  virtual const char* chunk_object() const = 0;
  // The delta (chat) or text (completions) and logprobs of one chunk's choice; false: send no chunk.
  virtual bool fill_choice(Gen& g, size_t ci, const StreamDelta& d, const std::vector<TokenLogprob>& lps, bool has_text,
                           ojson& choice) = 0;

  ojson chunk_head(const Gen& g) const {
    return ojson{{"id", g.id}, {"object", chunk_object()}, {"created", g.created}, {"model", g.model}};
  }
  // One chunk per choice before any output: {"index", key: value(index), "logprobs": null, "finish_reason": null}.
  std::string first_chunks(const Gen& g, const char* key, const std::function<ojson(size_t)>& value) const {
    std::string out;
    for (size_t c = 0; c < g.choices.size(); ++c) {
      ojson j = chunk_head(g);
      j["choices"] =
          ojson::array({ojson{{"index", c}, {key, value(c)}, {"logprobs", nullptr}, {"finish_reason", nullptr}}});
      out += sse(j);
    }
    return out;
  }
  ojson body(const Gen& g, const char* object, ojson choices) const {
    return {{"id", g.id},       {"object", object},   {"created", g.created},
            {"model", g.model}, {"choices", choices}, {"usage", g.usage()}};
  }

  const TokenText& text_;
};

class ChatWriter final : public OpenAIWriter {
 public:
  using OpenAIWriter::OpenAIWriter;
  const char* id_prefix() const override { return "chatcmpl-"; }

  std::string begin_stream(Gen& g) override {
    return first_chunks(g, "delta", [](size_t) { return ojson{{"role", "assistant"}, {"content", ""}}; });
  }

  ojson response(Gen& g) override {
    ojson choices = ojson::array();
    for (size_t i = 0; i < g.choices.size(); ++i) {
      const Choice& c = g.choices[i];
      ChatParseResult r = g.parsed_output(i);
      ojson message{{"role", "assistant"},
                    {"content", r.content.empty() && r.tools_called() ? ojson(nullptr) : ojson(r.content)}};
      if (!g.parsers.empty()) message["reasoning_content"] = r.reasoning.empty() ? ojson(nullptr) : ojson(r.reasoning);
      message["tool_calls"] = tool_calls_json(r.tool_calls);
      std::string finish = c.finish_reason;
      if (r.tools_called() && finish == "stop") finish = "tool_calls";
      choices.push_back({{"index", i},
                         {"message", message},
                         {"logprobs", g.logprobs >= 0 ? text_.chat_logprobs(c.logprobs, g.logprobs) : ojson(nullptr)},
                         {"finish_reason", finish},
                         {"stop_reason", c.stop_reason}});
    }
    ojson b = body(g, "chat.completion", choices);
    if (g.prompt_logprobs >= 0 && !g.choices.empty())
      b["prompt_logprobs"] = text_.prompt_logprobs(g.choices[0].prompt_logprobs, g.prompt_logprobs);
    return b;
  }

 private:
  const char* chunk_object() const override { return "chat.completion.chunk"; }

  bool fill_choice(Gen& g, size_t ci, const StreamDelta& d, const std::vector<TokenLogprob>& lps, bool has_text,
                   ojson& choice) override {
    ChatDelta cd = g.parsed_delta(ci, d, has_text);
    if (cd.empty() && lps.empty() && !d.finished) return false;
    ojson delta = ojson::object();
    if (!cd.reasoning.empty()) delta["reasoning_content"] = cd.reasoning;
    if (!cd.content.empty()) delta["content"] = cd.content;
    if (!cd.tool_calls.empty()) delta["tool_calls"] = tool_call_deltas_json(cd.tool_calls);
    choice["delta"] = delta;
    choice["logprobs"] = g.logprobs >= 0 && !lps.empty() ? text_.chat_logprobs(lps, g.logprobs) : ojson(nullptr);
    Choice& c = g.choices[ci];
    if (d.finished && !g.tools_called.empty() && g.tools_called[ci] && c.finish_reason == "stop")
      c.finish_reason = "tool_calls";
    return true;
  }
};

class CompletionWriter final : public OpenAIWriter {
 public:
  using OpenAIWriter::OpenAIWriter;
  const char* id_prefix() const override { return "cmpl-"; }

  // With echo, each choice's prompt first (with logprobs: in the choice's first chunk, which brings the
  // prompt's logprobs).
  std::string begin_stream(Gen& g) override {
    if (!g.echo || g.logprobs >= 0) return {};
    return first_chunks(g, "text", [&g](size_t c) { return ojson(g.prompt_texts[c / static_cast<size_t>(g.n)]); });
  }

  ojson response(Gen& g) override {
    ojson choices = ojson::array();
    for (size_t i = 0; i < g.choices.size(); ++i) {
      const Choice& c = g.choices[i];
      const size_t p = i / static_cast<size_t>(g.n);
      std::string prefix = g.echo ? g.prompt_texts[p] : std::string();
      ojson logprobs = nullptr;
      if (g.logprobs >= 0)
        logprobs = g.echo ? text_.echo_logprobs(g.prompt_ids[p], c.prompt_logprobs, c.logprobs, g.logprobs)
                          : text_.completion_logprobs(c.logprobs, g.logprobs, 0);
      ojson choice{{"index", i},
                   {"text", prefix + c.text},
                   {"logprobs", logprobs},
                   {"finish_reason", c.finish_reason},
                   {"stop_reason", c.stop_reason}};
      if (g.prompt_logprobs >= 0)
        choice["prompt_logprobs"] = text_.prompt_logprobs(c.prompt_logprobs, g.prompt_logprobs);
      choices.push_back(std::move(choice));
    }
    return body(g, "text_completion", choices);
  }

 private:
  // A chunk's choice: the new text, and its logprobs at their offset in the choice's text.
  bool fill_choice(Gen& g, size_t ci, const StreamDelta& d, const std::vector<TokenLogprob>& lps, bool has_text,
                   ojson& choice) override {
    Choice& c = g.choices[ci];
    const size_t p = ci / static_cast<size_t>(g.n);
    const std::string text = has_text ? d.text : "";
    if (g.echo && g.logprobs >= 0 && !c.echoed) {  // the prompt, its logprobs, then this delta's
      c.echoed = true;
      choice["text"] = g.prompt_texts[p] + text;
      choice["logprobs"] = text_.echo_logprobs(g.prompt_ids[p], c.prompt_logprobs, lps, g.logprobs);
      return true;
    }
    choice["text"] = text;
    size_t offset = (g.echo ? g.prompt_texts[p].size() : 0) + c.text.size() - text.size();
    choice["logprobs"] =
        g.logprobs >= 0 && !lps.empty() ? text_.completion_logprobs(lps, g.logprobs, offset) : ojson(nullptr);
    return true;
  }

  const char* chunk_object() const override { return "text_completion"; }
};

}  // namespace

std::unique_ptr<ProtocolWriter> chat_writer(const TokenText& text) { return std::make_unique<ChatWriter>(text); }

std::unique_ptr<ProtocolWriter> completion_writer(const TokenText& text) {
  return std::make_unique<CompletionWriter>(text);
}

}  // namespace tessera::server::api
