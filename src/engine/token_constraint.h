// The engine's seam for constrained decoding (structured output, allowed token ids): a per-sequence object
// that says which tokens may come next and advances with each token the sequence takes. The engine knows
// nothing of grammars or JSON Schema; the server builds a factory from the request's fields (grammar/).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace tessera {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Bit t of `mask` (word t / 32, bit t % 32) set = token t may come next; every word is written
  // (mask.size() = ceil(vocab / 32) of the model's vocabulary). Stop tokens: set exactly where the
  // constraint allows the sequence to end.
  virtual void fill_mask(std::span<uint32_t> mask) = 0;
  // Advances past `token`. False when the constraint does not allow it (the state is unchanged).
  virtual bool accept(int32_t token) = 0;
  // Nothing but a stop token can follow (the engine may end the sequence as "stop" at its next token).
  virtual bool is_finished() const = 0;
  // Undoes the last n accepted tokens (the engine advances through a step's drafts to make each row's
  // mask, then steps back).
  virtual void rollback(int num_tokens) = 0;
};

// Makes one TokenConstraint per sequence of a request (n > 1 gives each its own state). Shared, immutable.
class TokenConstraintFactory {
 public:
  virtual ~TokenConstraintFactory() = default;
  virtual std::unique_ptr<TokenConstraint> make() const = 0;
  // What it constrains to, for logs ("json_schema", "regex", ...).
  virtual std::string describe() const = 0;
};

}  // namespace tessera
