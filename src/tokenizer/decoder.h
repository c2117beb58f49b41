// Decoders of tokenizer.json ("decoder"): turn token strings back into text, as HF's decode_chain.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace tessera::tokenizer {

class Decoder {
 public:
  virtual ~Decoder() = default;
  // One step of the chain: tokens in, tokens out (HF's Decoder::decode_chain).
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
  // True when the text of a sequence is the lossy UTF-8 of the concatenated per-token bytes
  // (ByteLevel): then decoding can go token by token, which the streaming detokenizer relies on.
  virtual bool is_byte_concatenation() const { return false; }
};

// nullptr for a JSON null (tokens are then joined with spaces, as HF does).
std::unique_ptr<Decoder> make_decoder(const nlohmann::json& config);

}  // namespace tessera::tokenizer
