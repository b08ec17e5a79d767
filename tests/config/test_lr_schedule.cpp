#include <catch2/catch.hpp>

#include <cmath>

#include "config/train_config.hpp"

using namespace mt;
using Catch::Detail::Approx;

TEST_CASE("warmup rises linearly from 0 as in Hugging Face", "[lr]") {
  for (LrSchedule s : {LrSchedule::constant, LrSchedule::linear, LrSchedule::cosine}) {
    CHECK(learning_rate_at(s, 1.0, 10, 100, 0.0, 0) == 0.0);
    CHECK(learning_rate_at(s, 1.0, 10, 100, 0.0, 5) == Approx(0.5));
    CHECK(learning_rate_at(s, 1.0, 10, 100, 0.0, 10) == Approx(1.0));
  }
}

TEST_CASE("constant stays at the peak after warmup", "[lr]") {
  CHECK(learning_rate_at(LrSchedule::constant, 3e-4, 0, 100, 0.0, 0) == 3e-4);
  CHECK(learning_rate_at(LrSchedule::constant, 3e-4, 5, 100, 0.0, 99) == 3e-4);
}

TEST_CASE("linear decays to zero (or the floor) at max_steps", "[lr]") {
  CHECK(learning_rate_at(LrSchedule::linear, 1.0, 10, 110, 0.0, 60) == Approx(0.5));
  CHECK(learning_rate_at(LrSchedule::linear, 1.0, 10, 110, 0.0, 110) == Approx(0.0));
  CHECK(learning_rate_at(LrSchedule::linear, 1.0, 10, 110, 0.1, 110) == Approx(0.1));
  CHECK(learning_rate_at(LrSchedule::linear, 1.0, 10, 110, 0.0, 500) == Approx(0.0));  // clamped past the end
}

TEST_CASE("cosine follows half a cosine from the peak to the floor", "[lr]") {
  CHECK(learning_rate_at(LrSchedule::cosine, 1.0, 0, 100, 0.0, 0) == Approx(1.0));
  CHECK(learning_rate_at(LrSchedule::cosine, 1.0, 0, 100, 0.0, 50) == Approx(0.5));
  CHECK(learning_rate_at(LrSchedule::cosine, 1.0, 0, 100, 0.0, 25) == Approx(0.5 * (1 + std::cos(M_PI / 4))));
  CHECK(learning_rate_at(LrSchedule::cosine, 1.0, 0, 100, 0.0, 100) == Approx(0.0).margin(1e-12));
  CHECK(learning_rate_at(LrSchedule::cosine, 2.0, 20, 120, 0.1, 70) == Approx(2.0 * (0.1 + 0.9 * 0.5)));
  CHECK(learning_rate_at(LrSchedule::cosine, 2.0, 20, 120, 0.1, 120) == Approx(0.2));
}

TEST_CASE("the schedule never increases after warmup", "[lr]") {
  for (LrSchedule s : {LrSchedule::linear, LrSchedule::cosine}) {
    double previous = 1e9;
    for (std::int64_t step = 10; step <= 200; ++step) {
      const double lr = learning_rate_at(s, 1e-3, 10, 200, 0.05, step);
      REQUIRE(lr <= previous);
      REQUIRE(lr >= 0.05e-3 * (1 - 1e-12));
      previous = lr;
    }
  }
}

TEST_CASE("TrainConfig applies its schedule and AdamW keys", "[lr]") {
  TrainConfig c;
  c.train.learning_rate = 1e-3;
  c.train.warmup_steps = 10;
  c.train.max_steps = 110;
  c.train.lr_scheduler_type = "linear";
  c.train.weight_decay = 0.1;
  c.train.adam_beta2 = 0.95;
  CHECK(c.learning_rate_at(60) == Approx(5e-4));
  const AdamWHyper h = c.adamw_at(5);
  CHECK(h.lr == Approx(5e-4f));
  CHECK(h.weight_decay == Approx(0.1f));
  CHECK(h.beta2 == Approx(0.95f));
  CHECK(h.beta1 == Approx(0.9f));
  CHECK(h.eps == Approx(1e-8f));
}
