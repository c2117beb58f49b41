// libFuzzer target for everything the control channel decodes from a peer: the frame
// header and every message payload. Any crash, over-read (ASan) or undefined behaviour
// (UBSan) is a finding; a refused input (Error) is the expected outcome.
//   cmake -B build-fuzz -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_C_COMPILER=clang-14 -DTESSERA_FUZZ=ON
//   scripts/fuzz.sh 60
#include <cstddef>
#include <cstdint>
#include <span>

#include "core/error.h"
#include "distributed/messages.h"
#include "distributed/wire.h"

using namespace tessera::dist;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const uint8_t> in(data, size);
  // 1. As a stream of frames, with both the unauthenticated and the full limit.
  for (uint32_t limit : {kMaxUnauthenticatedFrame, kMaxFrame}) {
    std::span<const uint8_t> rest = in;
    for (int frames = 0; frames < 64 && !rest.empty(); ++frames) {
      size_t consumed = 0;
      try {
        std::optional<Frame> f = decode_frame(rest, limit, &consumed);
        if (!f) break;
        try {
          decode_any(f->type, f->payload);
        } catch (const tessera::Error&) {
        }
      } catch (const tessera::Error&) {
        break;
      }
      rest = rest.subspan(consumed);
    }
  }
  // 2. As a bare payload of the type named by the first byte (reaches the decoders directly).
  if (size >= 1) {
    auto type = static_cast<MessageType>(1 + data[0] % kMaxMessageType);
    try {
      decode_any(type, in.subspan(1));
    } catch (const tessera::Error&) {
    }
  }
  return 0;
}
