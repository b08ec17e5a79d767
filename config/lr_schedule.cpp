// Learning-rate schedules, with Hugging Face's formulas (transformers.optimization): a linear warmup
// from 0, then constant, linear decay or half-cosine decay reaching the floor at max_steps.
#include <algorithm>
#include <cmath>

#include "config/train_config.hpp"

namespace mt {

double learning_rate_at(LrSchedule schedule, double peak_lr, std::int64_t warmup_steps, std::int64_t max_steps,
                        double min_lr_ratio, std::int64_t step) {
  if (step < 0) step = 0;
  if (step < warmup_steps) return peak_lr * static_cast<double>(step) / static_cast<double>(warmup_steps);
  if (schedule == LrSchedule::constant) return peak_lr;
  const double decay_steps = static_cast<double>(std::max<std::int64_t>(1, max_steps - warmup_steps));
  const double progress = std::min(1.0, static_cast<double>(step - warmup_steps) / decay_steps);
  const double factor = schedule == LrSchedule::linear ? 1.0 - progress : 0.5 * (1.0 + std::cos(M_PI * progress));
  return peak_lr * (min_lr_ratio + (1.0 - min_lr_ratio) * factor);
}

double TrainConfig::learning_rate_at(std::int64_t step) const {
  return mt::learning_rate_at(lr_schedule(), train.learning_rate, train.warmup_steps, train.max_steps,
                              train.min_lr_ratio, step);
}

AdamWHyper TrainConfig::adamw_at(std::int64_t step) const {
  AdamWHyper h;
  h.lr = static_cast<float>(learning_rate_at(step));
  h.beta1 = static_cast<float>(train.adam_beta1);
  h.beta2 = static_cast<float>(train.adam_beta2);
  h.eps = static_cast<float>(train.adam_epsilon);
  h.weight_decay = static_cast<float>(train.weight_decay);
  return h;
}

}  // namespace mt
