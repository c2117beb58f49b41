#include "distributed/wire.h"

#include <cstring>

#include "core/error.h"

namespace tessera::dist {

namespace {

uint32_t load_u32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

void store_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

}  // namespace

const char* message_type_name(MessageType t) {
  switch (t) {
    case MessageType::kChallenge:
      return "challenge";
    case MessageType::kAuthResponse:
      return "auth-response";
    case MessageType::kAuthOk:
      return "auth-ok";
    case MessageType::kJoin:
      return "join";
    case MessageType::kWelcome:
      return "welcome";
    case MessageType::kReject:
      return "reject";
    case MessageType::kHeartbeat:
      return "heartbeat";
    case MessageType::kStatusQuery:
      return "status-query";
    case MessageType::kStatusReply:
      return "status-reply";
    case MessageType::kRankFailed:
      return "rank-failed";
    case MessageType::kStoreSet:
      return "store-set";
    case MessageType::kStoreGet:
      return "store-get";
    case MessageType::kStoreValue:
      return "store-value";
    case MessageType::kJobSubmit:
      return "job-submit";
    case MessageType::kJobStart:
      return "job-start";
    case MessageType::kJobAccepted:
      return "job-accepted";
    case MessageType::kStoreOk:
      return "store-ok";
    case MessageType::kRankHello:
      return "rank-hello";
    case MessageType::kLivenessQuery:
      return "liveness-query";
    case MessageType::kLivenessReply:
      return "liveness-reply";
    case MessageType::kLeave:
      return "leave";
  }
  return "unknown";
}

std::vector<uint8_t> encode_frame(MessageType type, std::span<const uint8_t> payload) {
  TESSERA_CHECK(payload.size() <= kMaxFrame, "{} frame of {} bytes exceeds the {}-byte limit", message_type_name(type),
                payload.size(), kMaxFrame);
  std::vector<uint8_t> out(kFrameHeaderBytes + payload.size());
  store_u32(out.data(), kWireMagic);
  out[4] = kWireVersion;
  out[5] = static_cast<uint8_t>(type);
  out[6] = out[7] = 0;
  store_u32(out.data() + 8, static_cast<uint32_t>(payload.size()));
  if (!payload.empty()) std::memcpy(out.data() + kFrameHeaderBytes, payload.data(), payload.size());
  return out;
}

FrameHeader decode_frame_header(std::span<const uint8_t> h, uint32_t max_payload) {
  if (h.size() < kFrameHeaderBytes) fail(ErrorKind::kCorrupt, "frame header truncated ({} bytes)", h.size());
  uint32_t magic = load_u32(h.data());
  if (magic != kWireMagic)
    fail(ErrorKind::kCorrupt, "bad frame magic 0x{:08x} (not a tessera control-channel peer?)", magic);
  if (h[4] != kWireVersion)
    fail(ErrorKind::kCorrupt, "wire version {} but this build speaks {}; run the same tessera version on every node",
         h[4], kWireVersion);
  if (h[5] == 0 || h[5] > kMaxMessageType) fail(ErrorKind::kCorrupt, "unknown message type {}", h[5]);
  if (h[6] != 0 || h[7] != 0) fail(ErrorKind::kCorrupt, "reserved frame bits set");
  uint32_t length = load_u32(h.data() + 8);
  if (length > max_payload)
    fail(ErrorKind::kCorrupt, "{} frame of {} bytes exceeds the {}-byte limit",
         message_type_name(static_cast<MessageType>(h[5])), length, max_payload);
  return {static_cast<MessageType>(h[5]), length};
}

std::optional<Frame> decode_frame(std::span<const uint8_t> bytes, uint32_t max_payload, size_t* consumed) {
  *consumed = 0;
  if (bytes.size() < kFrameHeaderBytes) return std::nullopt;
  FrameHeader h = decode_frame_header(bytes.first(kFrameHeaderBytes), max_payload);
  if (bytes.size() - kFrameHeaderBytes < h.length) return std::nullopt;
  Frame f{h.type,
          std::vector<uint8_t>(bytes.begin() + kFrameHeaderBytes, bytes.begin() + kFrameHeaderBytes + h.length)};
  *consumed = kFrameHeaderBytes + h.length;
  return f;
}

void send_frame(const Socket& s, MessageType type, std::span<const uint8_t> payload, Deadline deadline) {
  std::vector<uint8_t> frame = encode_frame(type, payload);
  write_all(s, frame.data(), frame.size(), deadline);
}

std::optional<Frame> recv_frame(const Socket& s, uint32_t max_payload, Deadline deadline) {
  uint8_t header[kFrameHeaderBytes];
  if (!read_exact(s, header, sizeof header, deadline)) return std::nullopt;
  FrameHeader h = decode_frame_header(header, max_payload);
  Frame f{h.type, std::vector<uint8_t>(h.length)};
  if (h.length > 0 && !read_exact(s, f.payload.data(), h.length, deadline))
    fail(ErrorKind::kNetwork, "{} closed the connection in the middle of a frame", peer_address(s));
  return f;
}

void WireWriter::u16(uint16_t v) {
  out_.push_back(static_cast<uint8_t>(v));
  out_.push_back(static_cast<uint8_t>(v >> 8));
}
void WireWriter::u32(uint32_t v) {
  for (int i = 0; i < 4; ++i) out_.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void WireWriter::u64(uint64_t v) {
  for (int i = 0; i < 8; ++i) out_.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void WireWriter::f32(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  u32(bits);
}
void WireWriter::i32s(std::span<const int32_t> v) {
  u32(static_cast<uint32_t>(v.size()));
  const size_t at = out_.size();
  out_.resize(at + 4 * v.size());
  for (size_t i = 0; i < v.size(); ++i) store_u32(out_.data() + at + 4 * i, static_cast<uint32_t>(v[i]));
}
void WireWriter::str(const std::string& s) {
  u32(static_cast<uint32_t>(s.size()));
  raw(s.data(), s.size());
}
void WireWriter::bytes(std::span<const uint8_t> b) {
  u32(static_cast<uint32_t>(b.size()));
  raw(b.data(), b.size());
}
void WireWriter::raw(const void* data, size_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  out_.insert(out_.end(), p, p + n);
}

void WireReader::need(size_t n) const {
  if (n > remaining())
    fail(ErrorKind::kCorrupt, "{} truncated: needs {} more bytes at offset {}, has {}", what_, n, pos_, remaining());
}
uint8_t WireReader::u8() {
  need(1);
  return in_[pos_++];
}
uint16_t WireReader::u16() {
  need(2);
  uint16_t v = static_cast<uint16_t>(in_[pos_] | in_[pos_ + 1] << 8);
  pos_ += 2;
  return v;
}
uint32_t WireReader::u32() {
  need(4);
  uint32_t v = load_u32(in_.data() + pos_);
  pos_ += 4;
  return v;
}
uint64_t WireReader::u64() {
  uint64_t lo = u32();
  uint64_t hi = u32();
  return lo | hi << 32;
}
float WireReader::f32() {
  const uint32_t bits = u32();
  float v;
  std::memcpy(&v, &bits, 4);
  return v;
}
std::vector<int32_t> WireReader::i32s(const char* field, uint32_t max_count) {
  const uint32_t n = u32();
  if (n > max_count || n > remaining() / 4)
    fail(ErrorKind::kCorrupt, "{}: {} claims {} entries, {} bytes remain (limit {})", what_, field, n, remaining(),
         max_count);
  std::vector<int32_t> v(n);
  const uint8_t* p = in_.data() + pos_;
  for (uint32_t i = 0; i < n; ++i) v[i] = static_cast<int32_t>(load_u32(p + 4 * static_cast<size_t>(i)));
  pos_ += 4 * static_cast<size_t>(n);
  return v;
}
std::string WireReader::str(size_t max_len) {
  uint32_t n = u32();
  if (n > max_len) fail(ErrorKind::kCorrupt, "{}: string of {} bytes exceeds {}", what_, n, max_len);
  need(n);
  std::string s(reinterpret_cast<const char*>(in_.data() + pos_), n);
  pos_ += n;
  return s;
}
std::vector<uint8_t> WireReader::bytes(size_t max_len) {
  uint32_t n = u32();
  if (n > max_len) fail(ErrorKind::kCorrupt, "{}: field of {} bytes exceeds {}", what_, n, max_len);
  need(n);
  std::vector<uint8_t> b(in_.begin() + pos_, in_.begin() + pos_ + n);
  pos_ += n;
  return b;
}
void WireReader::raw(void* data, size_t n) {
  need(n);
  std::memcpy(data, in_.data() + pos_, n);
  pos_ += n;
}
uint32_t WireReader::count(size_t min_item_bytes, uint32_t max_count) {
  uint32_t n = u32();
  if (n > max_count || (min_item_bytes > 0 && n > remaining() / min_item_bytes))
    fail(ErrorKind::kCorrupt, "{}: {} items cannot fit in the {} bytes left", what_, n, remaining());
  return n;
}
void WireReader::expect_end() const {
  if (remaining() != 0) fail(ErrorKind::kCorrupt, "{} has {} unexpected trailing bytes", what_, remaining());
}

}  // namespace tessera::dist
