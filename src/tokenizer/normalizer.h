// Normalizers of tokenizer.json ("normalizer"): Unicode forms through ICU, and the few string
// rewrites HF defines. Applied to the text between added tokens, before pre-tokenization.
#pragma once
#include <memory>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace tessera::tokenizer {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& text) const = 0;
};

// nullptr for a JSON null (no normalizer). Throws tessera::Error for an unknown type.
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& config);

}  // namespace tessera::tokenizer
