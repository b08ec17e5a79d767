#include "kernels/adamw.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

namespace mt {

AdamWStep make_adamw_step(const AdamWHyper& h, std::int64_t step, float grad_scale) {
  auto require = [](bool ok, const char* what) {
    if (!ok) throw std::invalid_argument(std::string("AdamW: ") + what);
  };
  require(step >= 1, "step must be >= 1 (the first update is step 1)");
  require(std::isfinite(h.lr) && h.lr >= 0.0f, "learning rate must be finite and >= 0");
  require(h.beta1 >= 0.0f && h.beta1 < 1.0f, "beta1 must be in [0, 1)");
  require(h.beta2 >= 0.0f && h.beta2 < 1.0f, "beta2 must be in [0, 1)");
  require(h.eps > 0.0f, "eps must be > 0");
  require(std::isfinite(h.weight_decay) && h.weight_decay >= 0.0f, "weight decay must be finite and >= 0");
  require(std::isfinite(grad_scale), "gradient scale must be finite");
  // Bias corrections in double, as PyTorch computes them in Python floats.
  const double bias1 = 1.0 - std::pow(static_cast<double>(h.beta1), static_cast<double>(step));
  const double bias2 = 1.0 - std::pow(static_cast<double>(h.beta2), static_cast<double>(step));
  AdamWStep s{};
  s.beta1 = h.beta1;
  s.beta2 = h.beta2;
  s.one_minus_beta1 = 1.0f - h.beta1;
  s.one_minus_beta2 = 1.0f - h.beta2;
  s.eps = h.eps;
  s.decay_factor = static_cast<float>(1.0 - static_cast<double>(h.lr) * h.weight_decay);
  s.step_size = static_cast<float>(h.lr / bias1);
  s.inv_sqrt_bias2 = static_cast<float>(1.0 / std::sqrt(bias2));
  s.grad_scale = grad_scale;
  return s;
}

}  // namespace mt
