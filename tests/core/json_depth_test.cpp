#include "core/json_depth.h"

#include <gtest/gtest.h>

#include <string>

namespace tessera {
namespace {

TEST(JsonDepth, CountsArraysAndObjects) {
  EXPECT_EQ(json_nesting_depth("3"), 0);
  EXPECT_EQ(json_nesting_depth("[]"), 1);
  EXPECT_EQ(json_nesting_depth(R"({"a": [1, {"b": []}], "c": {}})"), 4);
}

TEST(JsonDepth, IgnoresBracketsInsideStrings) {
  EXPECT_EQ(json_nesting_depth(R"({"a": "[[[[{{{{", "b": "\"[[["})"), 1);
  EXPECT_EQ(json_nesting_depth(R"(["\\", [1]])"), 2);  // an escaped backslash ends before the quote
}

TEST(JsonDepth, StopsPastTheLimit) {
  const std::string deep = std::string(50000, '[') + std::string(50000, ']');
  EXPECT_EQ(json_nesting_depth(deep), kMaxJsonDepth + 1);
  EXPECT_EQ(json_nesting_depth(deep, 10), 11);
  const std::string ok = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  EXPECT_EQ(json_nesting_depth(ok), kMaxJsonDepth);
}

TEST(JsonDepth, UnbalancedClosersDoNotHideDepth) {
  // A stray closer must not let later openers go uncounted.
  EXPECT_EQ(json_nesting_depth("]]]]" + std::string(200, '[')), kMaxJsonDepth + 1);
}

}  // namespace
}  // namespace tessera
