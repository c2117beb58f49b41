#include "core/env.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace tessera {
namespace {

constexpr const char* kVar = "TESSERA_ENV_SWITCH_TEST";

TEST(EnvSwitch, UnsetKeepsTheDefault) {
  unsetenv(kVar);
  EXPECT_TRUE(env_switch(kVar, true));
  EXPECT_FALSE(env_switch(kVar, false));
}

TEST(EnvSwitch, OnlyTheOtherValueFlipsIt) {
  setenv(kVar, "0", 1);
  EXPECT_FALSE(env_switch(kVar, true));
  EXPECT_FALSE(env_switch(kVar, false));
  setenv(kVar, "1", 1);
  EXPECT_TRUE(env_switch(kVar, true));
  EXPECT_TRUE(env_switch(kVar, false));
  for (const char* other : {"", "yes", "no", "00", "true"}) {
    setenv(kVar, other, 1);
    EXPECT_TRUE(env_switch(kVar, true)) << '"' << other << '"';
    EXPECT_FALSE(env_switch(kVar, false)) << '"' << other << '"';
  }
  unsetenv(kVar);
}

}  // namespace
}  // namespace tessera
