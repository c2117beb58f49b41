#include "tokenizer/decoder.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/utf8.h"

namespace tessera::tokenizer {
namespace {

// Maps each token out of the byte alphabet (a token with other characters keeps its own UTF-8
// bytes), joins the bytes and replaces ill-formed UTF-8 with U+FFFD, into one string.
class ByteLevelDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::get();
    std::string bytes;
    for (const std::string& token : tokens) {
      if (auto raw = alphabet.to_bytes(token)) {
        bytes.append(*raw);
      } else {
        bytes.append(token);
      }
    }
    tokens.assign(1, utf8_lossy(bytes));
  }
  bool is_byte_concatenation() const override { return true; }
};

class FuseDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string joined;
    for (const std::string& token : tokens) joined.append(token);
    tokens.assign(1, std::move(joined));
  }
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(std::string from, std::string to) : from_(std::move(from)), to_(std::move(to)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    if (from_.empty()) return;
    for (std::string& token : tokens) {
      std::string out;
      size_t pos = 0;
      for (size_t hit; (hit = token.find(from_, pos)) != std::string::npos; pos = hit + from_.size()) {
        out.append(token, pos, hit - pos).append(to_);
      }
      out.append(token, pos, std::string::npos);
      token = std::move(out);
    }
  }

 private:
  std::string from_, to_;
};

// Strips up to `start` leading and `stop` trailing copies of one character from each token.
class StripDecoder : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    if (content_.empty()) return;
    for (std::string& token : tokens) {
      size_t begin = 0;
      for (size_t i = 0; i < start_ && token.compare(begin, content_.size(), content_) == 0; ++i)
        begin += content_.size();
      size_t end = token.size();
      for (size_t i = 0; i < stop_ && end >= begin + content_.size() &&
                         token.compare(end - content_.size(), content_.size(), content_) == 0;
           ++i) {
        end -= content_.size();
      }
      token = token.substr(begin, end - begin);
    }
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

// Runs of <0xXX> tokens become the bytes they name (lossy UTF-8, or one U+FFFD per byte when
// the run is not valid UTF-8, as HF does).
class ByteFallbackDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string pending;
    size_t pending_count = 0;
    auto flush = [&] {
      if (pending_count == 0) return;
      if (is_valid_utf8(pending)) {
        out.push_back(pending);
      } else {
        for (size_t i = 0; i < pending_count; ++i) out.emplace_back(kReplacementCharacter);
      }
      pending.clear();
      pending_count = 0;
    };
    for (std::string& token : tokens) {
      int byte = parse_byte_token(token);
      if (byte >= 0) {
        pending.push_back(static_cast<char>(byte));
        ++pending_count;
      } else {
        flush();
        out.push_back(std::move(token));
      }
    }
    flush();
    tokens = std::move(out);
  }

 private:
  static int parse_byte_token(const std::string& token) {
    if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return -1;
    auto hex = [](char c) {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      return -1;
    };
    int high = hex(token[3]), low = hex(token[4]);
    return high < 0 || low < 0 ? -1 : high * 16 + low;
  }
};

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps) : steps_(std::move(steps)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& step : steps_) step->decode_chain(tokens);
  }
  bool is_byte_concatenation() const override { return steps_.size() == 1 && steps_.front()->is_byte_concatenation(); }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

}  // namespace

std::unique_ptr<Decoder> make_decoder(const nlohmann::json& config) {
  if (config.is_null()) return nullptr;
  const std::string type = config.value("type", "");
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Strip") {
    return std::make_unique<StripDecoder>(config.at("content").get<std::string>(), config.value("start", 0),
                                          config.value("stop", 0));
  }
  if (type == "Replace") {
    const auto& pattern = config.at("pattern");
    if (!pattern.contains("String")) {
      fail(ErrorKind::kUnsupported, "tokenizer.json: Replace decoder with a regex pattern is not supported yet");
    }
    return std::make_unique<ReplaceDecoder>(pattern.at("String").get<std::string>(),
                                            config.at("content").get<std::string>());
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> steps;
    for (const auto& step : config.at("decoders")) {
      if (auto decoder = make_decoder(step)) steps.push_back(std::move(decoder));
    }
    return std::make_unique<SequenceDecoder>(std::move(steps));
  }
  fail(ErrorKind::kUnsupported, "tokenizer.json: decoder type '{}' is not supported", type);
}

}  // namespace tessera::tokenizer
