// Pre-tokenizers of tokenizer.json ("pre_tokenizer"): cut normalized text into the pieces that
// BPE encodes one at a time. Pieces are views into the text or into `storage` (for pieces a
// pre-tokenizer rewrote, such as ByteLevel's prefix space).
#pragma once
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace tessera::tokenizer {

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void split(std::vector<std::string_view>& pieces, std::deque<std::string>& storage) const = 0;
  // True for ByteLevel: the model then works on raw bytes shown in the GPT-2 byte alphabet.
  virtual bool is_byte_level() const { return false; }
};

// nullptr for a JSON null (the whole text is one piece). Throws tessera::Error for an
// unsupported type or a regex that does not compile.
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& config);

}  // namespace tessera::tokenizer
