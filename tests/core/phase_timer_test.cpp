#include "core/phase_timer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <thread>

namespace tessera {
namespace {

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

// A pass of one phase that lasts `ms`.
void one_phase_pass(PhaseTimer& t, int ms, const char* name) {
  t.start();
  sleep_ms(ms);
  t.mark(0, name);
  t.pass_done();
}

TEST(PhaseTimer, AveragesEachPhaseOverThePassesAfterTheWarmUp) {
  PhaseTimer t("test loop", /*on=*/true, /*skip=*/2);
  for (int pass = 0; pass < 6; ++pass) {
    const bool warm_up = pass < 2;
    t.start();
    sleep_ms(warm_up ? 60 : 2);
    t.mark(0, "first");
    sleep_ms(warm_up ? 60 : 4);
    t.mark(1, "second");
    t.pass_done();
    sleep_ms(3);  // between passes
  }
  // Sleeps last at least as long as asked; the warm-up's 60 ms sleeps must not be counted
  // (with them, the means would be over 30 ms).
  EXPECT_GE(t.mean_us(0), 2000.0);
  EXPECT_LT(t.mean_us(0), 25000.0);
  EXPECT_GE(t.mean_us(1), 4000.0);
  EXPECT_LT(t.mean_us(1), 25000.0);
  EXPECT_GE(t.between_us(), 3000.0);
  EXPECT_LT(t.between_us(), 25000.0);
  EXPECT_EQ(t.mean_us(7), 0.0);  // no such phase
  const std::string s = t.summary();
  EXPECT_NE(s.find("test loop: 4 passes after 2 of warm-up"), std::string::npos) << s;
  EXPECT_NE(s.find("first "), std::string::npos) << s;
  EXPECT_NE(s.find("second "), std::string::npos) << s;
  // Each warm-up pass's own time is listed (two of them, each at least 120 ms).
  const size_t w = s.find("the warm-up passes took ");
  ASSERT_NE(w, std::string::npos) << s;
  double a = 0, b = 0;
  ASSERT_EQ(std::sscanf(s.c_str() + w, "the warm-up passes took %lf %lf ms", &a, &b), 2) << s;
  EXPECT_GE(a, 120.0);
  EXPECT_GE(b, 120.0);
}

TEST(PhaseTimer, APassNeverDoneIsNotCounted) {
  PhaseTimer t("test loop", /*on=*/true, /*skip=*/0);
  for (int pass = 0; pass < 3; ++pass) {
    one_phase_pass(t, 2, "first");
    t.start();  // an empty step: started, one phase timed, then left without pass_done()
    sleep_ms(60);
    t.mark(0, "first");
  }
  // Counted, the 60 ms would put the mean of phase 0 over 30 ms.
  EXPECT_GE(t.mean_us(0), 2000.0);
  EXPECT_LT(t.mean_us(0), 25000.0);
  // The two gaps between done passes hold one abandoned pass each, counted once.
  EXPECT_GE(t.between_us(), 60000.0);
  EXPECT_LT(t.between_us(), 100000.0);
  EXPECT_NE(t.summary().find("3 passes after 0 of warm-up"), std::string::npos) << t.summary();
}

TEST(PhaseTimer, OffMeasuresNothing) {
  PhaseTimer t("off", /*on=*/false, /*skip=*/0);
  for (int pass = 0; pass < 3; ++pass) one_phase_pass(t, 1, "phase");
  EXPECT_FALSE(t.on());
  EXPECT_EQ(t.mean_us(0), 0.0);
  EXPECT_EQ(t.between_us(), 0.0);
}

}  // namespace
}  // namespace tessera
