#include "runtime/stage_executor.hpp"

#include <optional>

#include "planning/schedule.hpp"

namespace oobleck::runtime {

namespace {

using planning::op_kind;

/// One message stream per direction and microbatch; the transport keeps each (peer, tag) in order.
int tag_of(op_kind kind, int microbatch) {
  const bool gradient = kind == op_kind::send_gradient || kind == op_kind::recv_gradient;
  return microbatch * 2 + (gradient ? 1 : 0);
}

struct in_flight {
  torch::Tensor input;     // activation received (a leaf requiring grad) or token ids
  torch::Tensor output;    // activation to send, or the scaled loss on the last stage
  torch::Tensor gradient;  // gradient of `output` received from downstream
};

}  // namespace

stage_executor::stage_executor(const gpt_config& model, stage_position position, communicator& comm,
                               executor_options options)
    : model_(model), position_(position), comm_(comm), options_(options) {
  layers_ = build_layers(model, position.first_layer, position.end_layer, options.device);
  for (const auto& layer : layers_) states_.push_back(initial_state(layer->parameters()));
}

torch::Tensor stage_executor::forward_layers(const torch::Tensor& x) {
  torch::Tensor h = x;
  for (const auto& layer : layers_) h = layer->forward(h);
  return h;
}

double stage_executor::run_step(int num_microbatches, const torch::Tensor& inputs, const torch::Tensor& targets) {
  const bool first = position_.stage == 0;
  const bool last = position_.stage == position_.num_stages - 1;
  const bool recompute = options_.activation_checkpointing;
  const int b = options_.microbatch_size;
  const auto activation = torch::TensorOptions().dtype(torch::kFloat32).device(options_.device);
  auto rows = [&](const torch::Tensor& t, int microbatch) {
    return t.slice(0, microbatch * b, (microbatch + 1) * b).to(options_.device);
  };
  // Forward of one microbatch; under checkpointing autograd records nothing until backward redoes it.
  auto forward = [&](in_flight& mb, int microbatch, bool record) {
    std::optional<torch::NoGradGuard> no_grad;
    if (!record) no_grad.emplace();
    auto out = forward_layers(mb.input);
    return last ? lm_loss(out, rows(targets, microbatch)) : out;
  };
  std::vector<in_flight> mbs(num_microbatches);
  double loss_sum = 0;
  for (const auto& op : planning::one_f_one_b(position_.stage, position_.num_stages, num_microbatches)) {
    auto& mb = mbs[op.microbatch];
    const int tag = tag_of(op.kind, op.microbatch);
    switch (op.kind) {
      case op_kind::recv_activation:
        mb.input = torch::empty({b, model_.seq_len, model_.d_model}, activation);
        comm_.recv(mb.input, position_.prev_rank, tag);
        mb.input.requires_grad_(true);
        break;
      case op_kind::forward:
        if (first) mb.input = rows(inputs, op.microbatch);
        mb.output = forward(mb, op.microbatch, !recompute);
        if (last) {
          loss_sum += mb.output.item<double>();
          mb.output = mb.output / options_.global_microbatches;
        }
        break;
      case op_kind::send_activation:
        comm_.send(mb.output.detach().contiguous(), position_.next_rank, tag);
        if (recompute) mb.output = torch::Tensor();
        break;
      case op_kind::recv_gradient:
        mb.gradient = torch::empty({b, model_.seq_len, model_.d_model}, activation);
        comm_.recv(mb.gradient, position_.next_rank, tag);
        break;
      case op_kind::backward: {
        auto out = recompute ? forward(mb, op.microbatch, true) : mb.output;
        if (last) (recompute ? out / options_.global_microbatches : out).backward();
        else out.backward(mb.gradient);
        mb.output = mb.gradient = torch::Tensor();
        break;
      }
      case op_kind::send_gradient:
        comm_.send(mb.input.grad().contiguous(), position_.prev_rank, tag);
        mb.input = torch::Tensor();
        break;
    }
  }
  return loss_sum;
}

void stage_executor::reduce_gradients(const std::vector<std::vector<int>>& layer_groups) {
  torch::NoGradGuard no_grad;
  for (int l = position_.first_layer; l < position_.end_layer; ++l) {
    const auto& group = layer_groups.at(l);
    if (group.size() < 2) continue;
    auto params = parameters(l);
    std::vector<torch::Tensor> grads;
    for (auto& p : params) grads.push_back(p.grad().defined() ? p.grad().reshape({-1}) : torch::zeros({p.numel()}, p.options()));
    auto flat = torch::cat(grads);
    comm_.all_reduce_sum(flat, group);
    std::int64_t offset = 0;
    for (auto& p : params) {
      const auto n = p.numel();
      p.mutable_grad() = flat.slice(0, offset, offset + n).view_as(p).clone();
      offset += n;
    }
  }
}

void stage_executor::commit() {
  for (std::size_t i = 0; i < layers_.size(); ++i) adamw_step(layers_[i]->parameters(), states_[i], options_.optimizer);
  discard();
}

void stage_executor::discard() {
  for (const auto& layer : layers_)
    for (auto& p : layer->parameters()) p.mutable_grad() = torch::Tensor();
}

std::vector<torch::Tensor> stage_executor::parameters(int layer) const {
  return layers_.at(layer - position_.first_layer)->parameters();
}

layer_optimizer_state& stage_executor::optimizer_state(int layer) { return states_.at(layer - position_.first_layer); }

std::uint64_t stage_executor::parameter_digest(int layer) const { return tensor_digest(parameters(layer)); }

std::uint64_t tensor_digest(const std::vector<torch::Tensor>& tensors) {
  std::uint64_t h = 1469598103934665603ULL;
  for (const auto& t : tensors) {
    const auto c = t.detach().to(torch::kCPU).contiguous();
    const auto* bytes = static_cast<const unsigned char*>(c.data_ptr());
    for (std::int64_t i = 0; i < c.numel() * static_cast<std::int64_t>(c.element_size()); ++i) {
      h ^= bytes[i];
      h *= 1099511628211ULL;
    }
  }
  return h;
}

}  // namespace oobleck::runtime
