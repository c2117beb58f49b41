#include "tokenizer/normalizer.h"

#include <unicode/bytestream.h>
#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/stringpiece.h>
#include <unicode/unistr.h>

#include <nlohmann/json.hpp>
#include <vector>

#include "core/error.h"

namespace tessera::tokenizer {
namespace {

bool is_ascii(const std::string& s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

// NFC, NFD, NFKC, NFKD. ASCII text is invariant under all four, which skips ICU for most input.
class UnicodeFormNormalizer : public Normalizer {
 public:
  explicit UnicodeFormNormalizer(const std::string& form) {
    UErrorCode status = U_ZERO_ERROR;
    if (form == "NFC") {
      icu_ = icu::Normalizer2::getNFCInstance(status);
    } else if (form == "NFD") {
      icu_ = icu::Normalizer2::getNFDInstance(status);
    } else if (form == "NFKC") {
      icu_ = icu::Normalizer2::getNFKCInstance(status);
    } else {
      icu_ = icu::Normalizer2::getNFKDInstance(status);
    }
    if (U_FAILURE(status)) fail(ErrorKind::kInternal, "ICU has no {} normalizer: {}", form, u_errorName(status));
  }

  void normalize(std::string& text) const override {
    if (is_ascii(text)) return;
    UErrorCode status = U_ZERO_ERROR;
    if (icu_->isNormalizedUTF8(text, status) && U_SUCCESS(status)) return;
    status = U_ZERO_ERROR;
    std::string out;
    icu::StringByteSink<std::string> sink(&out, static_cast<int32_t>(text.size()));
    icu_->normalizeUTF8(0, text, sink, nullptr, status);
    if (U_FAILURE(status)) fail(ErrorKind::kInternal, "ICU normalization failed: {}", u_errorName(status));
    text = std::move(out);
  }

 private:
  const icu::Normalizer2* icu_ = nullptr;
};

class LowercaseNormalizer : public Normalizer {
 public:
  void normalize(std::string& text) const override {
    icu::UnicodeString u = icu::UnicodeString::fromUTF8(text);
    u.toLower(icu::Locale::getRoot());
    text.clear();
    u.toUTF8String(text);
  }
};

// Replace with a literal string pattern (a Regex pattern is refused at load).
class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(std::string from, std::string to) : from_(std::move(from)), to_(std::move(to)) {}
  void normalize(std::string& text) const override {
    if (from_.empty()) return;
    std::string out;
    size_t pos = 0;
    for (size_t hit; (hit = text.find(from_, pos)) != std::string::npos; pos = hit + from_.size()) {
      out.append(text, pos, hit - pos).append(to_);
    }
    out.append(text, pos, std::string::npos);
    text = std::move(out);
  }

 private:
  std::string from_, to_;
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& text) const override {
    if (!text.empty()) text.insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps) : steps_(std::move(steps)) {}
  void normalize(std::string& text) const override {
    for (const auto& step : steps_) step->normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& config) {
  if (config.is_null()) return nullptr;
  const std::string type = config.value("type", "");
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    return std::make_unique<UnicodeFormNormalizer>(type);
  }
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "Prepend") return std::make_unique<PrependNormalizer>(config.at("prepend").get<std::string>());
  if (type == "Replace") {
    const auto& pattern = config.at("pattern");
    if (!pattern.contains("String")) {
      fail(ErrorKind::kUnsupported, "tokenizer.json: Replace normalizer with a regex pattern is not supported yet");
    }
    return std::make_unique<ReplaceNormalizer>(pattern.at("String").get<std::string>(),
                                               config.at("content").get<std::string>());
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (const auto& step : config.at("normalizers")) {
      if (auto normalizer = make_normalizer(step)) steps.push_back(std::move(normalizer));
    }
    if (steps.empty()) return nullptr;  // DeepSeek-V3 ships an empty Sequence
    return std::make_unique<SequenceNormalizer>(std::move(steps));
  }
  fail(ErrorKind::kUnsupported, "tokenizer.json: normalizer type '{}' is not supported", type);
}

}  // namespace tessera::tokenizer
