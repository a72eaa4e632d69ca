#include "planning/schedule.hpp"

#include <algorithm>
#include <stdexcept>

namespace oobleck::planning {

std::vector<schedule_op> one_f_one_b(int stage, int num_stages, int num_microbatches) {
  if (num_stages < 1 || stage < 0 || stage >= num_stages || num_microbatches < 1)
    throw std::invalid_argument("one_f_one_b: need 0 <= stage < num_stages and num_microbatches >= 1");
  const bool first = stage == 0;
  const bool last = stage == num_stages - 1;
  std::vector<schedule_op> ops;
  auto forward = [&](int mb) {
    if (!first) ops.push_back({op_kind::recv_activation, mb});
    ops.push_back({op_kind::forward, mb});
    if (!last) ops.push_back({op_kind::send_activation, mb});
  };
  auto backward = [&](int mb) {
    if (!last) ops.push_back({op_kind::recv_gradient, mb});
    ops.push_back({op_kind::backward, mb});
    if (!first) ops.push_back({op_kind::send_gradient, mb});
  };
  const int warmup = std::min(num_stages - stage - 1, num_microbatches);
  int next_forward = 0, next_backward = 0;
  for (; next_forward < warmup; ++next_forward) forward(next_forward);
  for (; next_forward < num_microbatches; ++next_forward) {
    forward(next_forward);
    backward(next_backward++);
  }
  while (next_backward < num_microbatches) backward(next_backward++);
  return ops;
}

const char* to_string(op_kind k) {
  switch (k) {
    case op_kind::recv_activation: return "recv_activation";
    case op_kind::forward: return "forward";
    case op_kind::send_activation: return "send_activation";
    case op_kind::recv_gradient: return "recv_gradient";
    case op_kind::backward: return "backward";
    case op_kind::send_gradient: return "send_gradient";
  }
  return "?";
}

}  // namespace oobleck::planning
