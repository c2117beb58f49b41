#include "bench/sse_parser.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace tessera::bench {
namespace {

std::vector<SseEvent> parse_in_pieces(const std::string& stream, const std::vector<size_t>& cuts) {
  std::vector<SseEvent> events;
  SseParser parser([&](const SseEvent& e) { events.push_back(e); });
  size_t start = 0;
  for (size_t cut : cuts) {
    parser.feed(std::string_view(stream).substr(start, cut - start));
    start = cut;
  }
  parser.feed(std::string_view(stream).substr(start));
  parser.finish();
  return events;
}

const std::string kStream =
    ": keep-alive comment\r\n"
    "data: {\"choices\":[{\"delta\":{\"content\":\"h\xc3\xa9llo\"}}]}\r\n\r\n"
    "event: message\n"
    "data: first line\n"
    "data: second line\n\n"
    "id: 7\r"
    "data:no-space\r\r"
    "data: [DONE]\n\n";

void expect_expected_events(const std::vector<SseEvent>& events) {
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].data, "{\"choices\":[{\"delta\":{\"content\":\"h\xc3\xa9llo\"}}]}");
  EXPECT_EQ(events[1].event, "message");
  EXPECT_EQ(events[1].data, "first line\nsecond line");
  EXPECT_EQ(events[2].data, "no-space");
  EXPECT_EQ(events[3].data, "[DONE]");
}

TEST(SseParser, WholeStream) { expect_expected_events(parse_in_pieces(kStream, {})); }

TEST(SseParser, EverySingleCutPosition) {
  for (size_t cut = 0; cut <= kStream.size(); ++cut) {
    SCOPED_TRACE(cut);
    expect_expected_events(parse_in_pieces(kStream, {cut}));
  }
}

TEST(SseParser, EveryPairOfCutPositions) {
  for (size_t a = 0; a <= kStream.size(); a += 3)
    for (size_t b = a; b <= kStream.size(); ++b) expect_expected_events(parse_in_pieces(kStream, {a, b}));
}

TEST(SseParser, ByteByByteAndRandomChunks) {
  std::vector<size_t> every_byte;
  for (size_t i = 1; i < kStream.size(); ++i) every_byte.push_back(i);
  expect_expected_events(parse_in_pieces(kStream, every_byte));
  std::mt19937 rng(1);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<size_t> cuts;
    for (size_t at = 0;;) {
      at += std::uniform_int_distribution<size_t>(1, 9)(rng);
      if (at >= kStream.size()) break;
      cuts.push_back(at);
    }
    expect_expected_events(parse_in_pieces(kStream, cuts));
  }
}

TEST(SseParser, UnterminatedLastEventIsDispatchedAtFinish) {
  auto events = parse_in_pieces("data: a\n\ndata: tail", {});
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[1].data, "tail");
}

TEST(SseParser, BlankLinesWithoutDataEmitNothing) {
  auto events = parse_in_pieces("\n\n: ping\n\nevent: x\n\n", {});
  EXPECT_TRUE(events.empty());
}

}  // namespace
}  // namespace tessera::bench
