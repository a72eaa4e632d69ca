#pragma once
// LibTorch's own AdamW set up like runtime::adamw_options, for the references that the project's
// optimizer is compared with: a reference that reused runtime::adamw_step could not catch a
// defect in it.

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "runtime/optimizer.hpp"

namespace oobleck::testing {

/// torch::optim::AdamW over `params` with o's betas and eps, amsgrad off. Weight decay applies
/// to matrices only (as in runtime::adamw_step): two parameter groups, the second without it.
inline std::unique_ptr<torch::optim::AdamW> torch_adamw(const std::vector<torch::Tensor>& params,
                                                        const runtime::adamw_options& o) {
  std::vector<torch::Tensor> decayed, plain;
  for (const auto& p : params) (p.dim() >= 2 ? decayed : plain).push_back(p);
  auto options = [&](double weight_decay) {
    return std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(runtime::learning_rate(o.lr, 1))
                                                            .betas({o.beta1, o.beta2})
                                                            .eps(o.eps)
                                                            .weight_decay(weight_decay)
                                                            .amsgrad(false));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!decayed.empty()) groups.emplace_back(decayed, options(o.weight_decay));
  if (!plain.empty()) groups.emplace_back(plain, options(0.0));
  return std::make_unique<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(runtime::learning_rate(o.lr, 1)));
}

/// The learning rate of every group, from the schedule, before the step-th update (1-based).
inline void set_learning_rate(torch::optim::AdamW& optimizer, const runtime::lr_schedule& schedule,
                              std::int64_t step) {
  for (auto& group : optimizer.param_groups())
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(runtime::learning_rate(schedule, static_cast<std::uint64_t>(step)));
}

/// LibTorch's state of `p` in `optimizer` (exp_avg, exp_avg_sq, step).
inline const torch::optim::AdamWParamState& torch_adamw_state(torch::optim::AdamW& optimizer,
                                                              const torch::Tensor& p) {
  return static_cast<const torch::optim::AdamWParamState&>(
      *optimizer.state().at(c10::guts::to_string(p.unsafeGetTensorImpl())));
}

}  // namespace oobleck::testing
