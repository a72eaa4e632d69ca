#include "runtime/optimizer.hpp"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <cmath>
#include <set>
#include <stdexcept>
#include <string>

namespace oobleck::runtime {

layer_optimizer_state initial_state(const std::vector<torch::Tensor>& params) {
  layer_optimizer_state s;
  for (const auto& p : params) {
    s.exp_avg.push_back(torch::zeros_like(p));
    s.exp_avg_sq.push_back(torch::zeros_like(p));
  }
  return s;
}

void adamw_step(const std::vector<torch::Tensor>& params, layer_optimizer_state& state, const adamw_options& o) {
  torch::NoGradGuard no_grad;
  ++state.step;
  const double lr = learning_rate(o.lr, static_cast<std::uint64_t>(state.step));
  const double bias1 = 1 - std::pow(o.beta1, static_cast<double>(state.step));
  const double bias2 = 1 - std::pow(o.beta2, static_cast<double>(state.step));
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    if (!p.grad().defined()) continue;
    const auto& g = p.grad();
    if (o.weight_decay > 0 && p.dim() >= 2) p.mul_(1 - lr * o.weight_decay);
    state.exp_avg[i].mul_(o.beta1).add_(g, 1 - o.beta1);
    state.exp_avg_sq[i].mul_(o.beta2).addcmul_(g, g, 1 - o.beta2);
    const auto denom = (state.exp_avg_sq[i] / bias2).sqrt_().add_(o.eps);
    p.addcdiv_(state.exp_avg[i], denom, -lr / bias1);
  }
}

element_ranges matrix_ranges(const std::vector<torch::Tensor>& params) {
  element_ranges out;
  std::int64_t offset = 0;
  for (const auto& p : params) {
    const auto end = offset + p.numel();
    if (p.dim() >= 2) {
      if (!out.empty() && out.back().second == offset) out.back().second = end;
      else out.emplace_back(offset, end);
    }
    offset = end;
  }
  return out;
}

namespace {

/// The constants of one AdamW update, in the precision of the buffers.
struct adamw_constants {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, inverse_bias2, eps, step_size;
};

/// One AdamW update of elements [0, n), in one pass over the four buffers: what flat_adamw_step's
/// tensor operations compute, element by element in the same order (decay, first moment, second
/// moment, then the parameter), without their passes over memory and their temporary. `decay` is
/// 1 - lr x weight decay on matrices, 1 elsewhere (x 1 changes no value). Four elements at a time
/// with SSE where the compiler has it (written out: with errno semantics, which the programs keep,
/// GCC does not vectorise sqrt), the rest one by one. Every operation is one IEEE single-precision
/// operation in both, so they agree exactly, and every replica computes the same bits.
void adamw_elements(float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v,
                    std::int64_t n, float decay, const adamw_constants& c) {
  std::int64_t i = 0;
#if defined(__SSE2__)
  const __m128 beta1 = _mm_set1_ps(c.beta1), one_minus_beta1 = _mm_set1_ps(c.one_minus_beta1);
  const __m128 beta2 = _mm_set1_ps(c.beta2), one_minus_beta2 = _mm_set1_ps(c.one_minus_beta2);
  const __m128 inverse_bias2 = _mm_set1_ps(c.inverse_bias2), eps = _mm_set1_ps(c.eps);
  const __m128 step_size = _mm_set1_ps(c.step_size), decay4 = _mm_set1_ps(decay);
  for (; i + 4 <= n; i += 4) {
    const __m128 gi = _mm_loadu_ps(g + i);
    const __m128 mi = _mm_add_ps(_mm_mul_ps(_mm_loadu_ps(m + i), beta1), _mm_mul_ps(one_minus_beta1, gi));
    const __m128 vi =
        _mm_add_ps(_mm_mul_ps(_mm_loadu_ps(v + i), beta2), _mm_mul_ps(one_minus_beta2, _mm_mul_ps(gi, gi)));
    _mm_storeu_ps(m + i, mi);
    _mm_storeu_ps(v + i, vi);
    const __m128 denom = _mm_add_ps(_mm_sqrt_ps(_mm_mul_ps(vi, inverse_bias2)), eps);
    _mm_storeu_ps(p + i,
                  _mm_add_ps(_mm_mul_ps(_mm_loadu_ps(p + i), decay4), _mm_mul_ps(step_size, _mm_div_ps(mi, denom))));
  }
#endif
  for (; i < n; ++i) {
    const float gi = g[i];
    const float mi = m[i] * c.beta1 + c.one_minus_beta1 * gi;
    const float vi = v[i] * c.beta2 + c.one_minus_beta2 * (gi * gi);
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi * c.inverse_bias2) + c.eps;
    p[i] = p[i] * decay + c.step_size * (mi / denom);
  }
}

}  // namespace

void flat_adamw_step(const flat_adamw_buffers& b, const element_ranges& decayed, std::int64_t& step,
                     const adamw_options& o) {
  const auto n = b.parameters.numel();
  for (const auto* t : {&b.parameters, &b.gradients, &b.exp_avg, &b.exp_avg_sq})
    if (!t->defined() || t->dim() != 1 || t->numel() != n || !t->is_contiguous())
      throw std::invalid_argument("flat_adamw_step: parameters, gradients and moments must be contiguous 1-D "
                                  "buffers of " + std::to_string(n) + " elements");
  std::int64_t after = 0;  // nothing is touched before every range is known to be good
  for (const auto& [begin, end] : decayed) {
    if (begin < after || end < begin || end > n)
      throw std::invalid_argument("flat_adamw_step: the decayed ranges must be sorted, disjoint and within the " +
                                  std::to_string(n) + " elements");
    after = end;
  }
  torch::NoGradGuard no_grad;
  ++step;
  const double lr = learning_rate(o.lr, static_cast<std::uint64_t>(step));
  const double bias1 = 1 - std::pow(o.beta1, static_cast<double>(step));
  const double bias2 = 1 - std::pow(o.beta2, static_cast<double>(step));
  const bool on_cpu = b.parameters.is_cpu() && b.gradients.is_cpu() && b.exp_avg.is_cpu() && b.exp_avg_sq.is_cpu();
  const bool all_float = b.parameters.scalar_type() == torch::kFloat32 &&
                         b.gradients.scalar_type() == torch::kFloat32 && b.exp_avg.scalar_type() == torch::kFloat32 &&
                         b.exp_avg_sq.scalar_type() == torch::kFloat32;
  const std::set<const void*> distinct{b.parameters.data_ptr(), b.gradients.data_ptr(), b.exp_avg.data_ptr(),
                                       b.exp_avg_sq.data_ptr()};
  if (on_cpu && all_float && distinct.size() == 4) {
    // One pass (bench/RESULTS.md, "AdamW in one pass"): ~3x fewer bytes moved than the operations below.
    const adamw_constants c{static_cast<float>(o.beta1),    static_cast<float>(1 - o.beta1),
                            static_cast<float>(o.beta2),    static_cast<float>(1 - o.beta2),
                            static_cast<float>(1 / bias2),  static_cast<float>(o.eps),
                            static_cast<float>(-lr / bias1)};
    const float decay = o.weight_decay > 0 ? static_cast<float>(1 - lr * o.weight_decay) : 1.0f;
    float* p = b.parameters.data_ptr<float>();
    const float* g = b.gradients.data_ptr<float>();
    float* m = b.exp_avg.data_ptr<float>();
    float* v = b.exp_avg_sq.data_ptr<float>();
    std::int64_t at = 0;
    for (const auto& [begin, end] : decayed) {
      adamw_elements(p + at, g + at, m + at, v + at, begin - at, 1.0f, c);
      adamw_elements(p + begin, g + begin, m + begin, v + begin, end - begin, decay, c);
      at = end;
    }
    adamw_elements(p + at, g + at, m + at, v + at, n - at, 1.0f, c);
    return;
  }
  if (o.weight_decay > 0)
    for (const auto& [begin, end] : decayed) b.parameters.slice(0, begin, end).mul_(1 - lr * o.weight_decay);
  const auto& g = b.gradients;
  b.exp_avg.mul_(o.beta1).add_(g, 1 - o.beta1);
  b.exp_avg_sq.mul_(o.beta2).addcmul_(g, g, 1 - o.beta2);
  // One temporary for the layer (the per-tensor step made one per tensor).
  const auto denom = (b.exp_avg_sq / bias2).sqrt_().add_(o.eps);
  b.parameters.addcdiv_(b.exp_avg, denom, -lr / bias1);
}

}  // namespace oobleck::runtime
