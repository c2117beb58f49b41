// OpenAI Responses API output: the ResponseBuilder's items and events (responses_api.h) over the shared
// generation bookkeeping.
#include <algorithm>

#include "server/protocol_writers.h"
#include "tokenizer/tokenizer.h"

namespace tessera::server::api {

namespace {

class ResponsesWriter final : public ProtocolWriter {
 public:
  ResponsesWriter(const TokenText& text, ResponsesRequest request) : text_(text), request_(std::move(request)) {}

  const char* id_prefix() const override { return "resp_"; }
  bool clamps_max_tokens() const override { return true; }
  void attach(const Gen& g) override {
    builder_ = std::make_unique<ResponseBuilder>(g.id, g.model, g.created, request_);
  }

  std::string begin_stream(Gen&) override { return builder_->start(); }

  std::string stream_delta(Gen& g, size_t ci, const StreamDelta& d, const std::vector<TokenLogprob>&) override {
    const bool has_text = !d.text.empty() && d.finish_reason != FinishReason::kError;
    return builder_->push(g.parsed_delta(ci, d, has_text));
  }

  std::string end_stream(Gen& g) override {
    return builder_->finish(g.choices[0].finish_reason, usage(g), g.choices[0].error);
  }

  ojson response(Gen& g) override {
    builder_->add(g.parsed_output(0));
    return builder_->response(g.choices[0].finish_reason, usage(g));
  }

 private:
  ResponsesUsage usage(const Gen& g) const {
    ResponsesUsage u;
    u.input_tokens = g.prompt_tokens[0];
    u.cached_tokens = g.cached_tokens;
    u.output_tokens = static_cast<int>(g.choices[0].token_ids.size());
    const std::string& reasoning = builder_->reasoning_text();
    // The reasoning part's tokens, counted by encoding its text (the parsers work on text, not token ids).
    if (!reasoning.empty())
      u.reasoning_tokens =
          std::min(u.output_tokens, static_cast<int>(text_.tokenizer().encode(reasoning, false).size()));
    return u;
  }

  const TokenText& text_;
  ResponsesRequest request_;
  std::unique_ptr<ResponseBuilder> builder_;
};

}  // namespace

std::unique_ptr<ProtocolWriter> responses_writer(const TokenText& text, ResponsesRequest request) {
  return std::make_unique<ResponsesWriter>(text, std::move(request));
}

}  // namespace tessera::server::api
