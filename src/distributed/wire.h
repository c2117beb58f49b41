// The control channel's binary format. A frame is a 12-byte header followed by a payload:
//
//   offset 0  u32  magic   0x41525354 ("TSRA" in memory order)
//   offset 4  u8   version (kWireVersion)
//   offset 5  u8   message type (MessageType)
//   offset 6  u16  reserved, must be 0
//   offset 8  u32  payload length in bytes (<= the receiver's limit)
//
// All integers are little-endian. Payload fields are written by WireWriter and read by
// WireReader, which checks every length against the bytes that remain, so a lying or
// truncated frame is refused with Error(kCorrupt) and never over-reads or over-allocates.
// Nothing on the wire is a pointer, an offset into memory, or code.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "distributed/socket.h"

namespace tessera::dist {

inline constexpr uint32_t kWireMagic = 0x41525354;
inline constexpr uint8_t kWireVersion = 1;
inline constexpr size_t kFrameHeaderBytes = 12;
// Before a peer has authenticated it may send only small frames (no memory to exhaust).
inline constexpr uint32_t kMaxUnauthenticatedFrame = 4 * 1024;
// After authentication: large enough for a cluster table or a job, small enough to allocate.
inline constexpr uint32_t kMaxFrame = 64 * 1024 * 1024;

enum class MessageType : uint8_t {
  kChallenge = 1,     // server -> client: nonce
  kAuthResponse = 2,  // client -> server: client nonce, HMAC
  kAuthOk = 3,        // server -> client: HMAC proving the server knows the token too
  kJoin = 4,          // node -> head: node rank, fingerprint
  kWelcome = 5,       // head -> node: the cluster table, once every node joined
  kReject = 6,        // either way: a reason, then the connection closes
  kHeartbeat = 7,     // node -> head, echoed back
  kStatusQuery = 8,   // anyone authenticated -> head
  kStatusReply = 9,   // head -> asker
  // 10 was the step plan over the control channel; step plans travel on the world group now.
  kRankFailed = 11,     // head -> nodes: a node/rank is gone
  kStoreSet = 12,       // rank -> head: key, value
  kStoreGet = 13,       // rank -> head: key
  kStoreValue = 14,     // head -> rank: found flag, value
  kStoreOk = 15,        // head -> rank: set done
  kRankHello = 16,      // rank -> head: this store connection belongs to world rank R
  kLivenessQuery = 17,  // rank -> head: which of these ranks lost their control connection?
  kLivenessReply = 18,  // head -> rank: the dead ones
  kLeave = 19,          // node -> head: orderly shutdown, not a failure
  kJobSubmit = 20,      // peer -> head of a persistent cluster: run a job on these nodes
  kJobStart = 21,       // head of a persistent cluster -> node: run this job
  kJobAccepted = 22,    // head -> submitter: every node got its job-start
};
inline constexpr uint8_t kMaxMessageType = 22;
const char* message_type_name(MessageType t);

struct FrameHeader {
  MessageType type;
  uint32_t length;
};

struct Frame {
  MessageType type;
  std::vector<uint8_t> payload;
};

std::vector<uint8_t> encode_frame(MessageType type, std::span<const uint8_t> payload);
// Validates magic, version, reserved bits, type and length (<= max_payload); throws Error(kCorrupt).
FrameHeader decode_frame_header(std::span<const uint8_t> header, uint32_t max_payload);
// Decodes one whole frame from the front of `bytes`; nullopt if more bytes are needed.
// Sets *consumed to the frame's size. Throws Error(kCorrupt) on an invalid frame.
std::optional<Frame> decode_frame(std::span<const uint8_t> bytes, uint32_t max_payload, size_t* consumed);

void send_frame(const Socket& s, MessageType type, std::span<const uint8_t> payload, Deadline deadline);
// nullopt on a clean end-of-stream between frames.
std::optional<Frame> recv_frame(const Socket& s, uint32_t max_payload, Deadline deadline);

// Appends little-endian fields.
class WireWriter {
 public:
  void u8(uint8_t v) { out_.push_back(v); }
  void u16(uint16_t v);
  void u32(uint32_t v);
  void u64(uint64_t v);
  void i32(int32_t v) { u32(static_cast<uint32_t>(v)); }
  void i64(int64_t v) { u64(static_cast<uint64_t>(v)); }
  void f32(float v);
  void i32s(std::span<const int32_t> v);   // u32 count + the values
  void str(const std::string& s);          // u32 length + bytes
  void bytes(std::span<const uint8_t> b);  // u32 length + bytes
  void raw(const void* data, size_t n);    // no length prefix
  const std::vector<uint8_t>& data() const { return out_; }
  std::vector<uint8_t> take() { return std::move(out_); }

 private:
  std::vector<uint8_t> out_;
};

// Reads fields back; every read checks the remaining length first.
class WireReader {
 public:
  explicit WireReader(std::span<const uint8_t> in, const char* what = "message") : in_(in), what_(what) {}
  uint8_t u8();
  uint16_t u16();
  uint32_t u32();
  uint64_t u64();
  int32_t i32() { return static_cast<int32_t>(u32()); }
  int64_t i64() { return static_cast<int64_t>(u64()); }
  float f32();
  // What WireWriter::i32s wrote; `field` names the array in the error when the count is over
  // `max_count` or more than the bytes left.
  std::vector<int32_t> i32s(const char* field, uint32_t max_count);
  std::string str(size_t max_len = 1 << 20);
  std::vector<uint8_t> bytes(size_t max_len = kMaxFrame);
  void raw(void* data, size_t n);
  // A count of items each at least `min_item_bytes` long: refused if the rest cannot hold them.
  uint32_t count(size_t min_item_bytes, uint32_t max_count = 1 << 20);
  size_t remaining() const { return in_.size() - pos_; }
  // Refuses trailing bytes: a frame must be exactly what its type says.
  void expect_end() const;

 private:
  void need(size_t n) const;
  std::span<const uint8_t> in_;
  size_t pos_ = 0;
  const char* what_;
};

}  // namespace tessera::dist
