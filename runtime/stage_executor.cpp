#include "runtime/stage_executor.hpp"

#include <optional>

#include "planning/schedule.hpp"

namespace oobleck::runtime {

namespace {
/// The tag of the gradient all-reduce (communicator.hpp: collectives of other tags are independent).
constexpr int gradient_tag = 0;
}  // namespace

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

stage_executor::stage_executor(layer_store& store, stage_position position, communicator& comm,
                               executor_options options)
    : store_(store), position_(position), comm_(comm), options_(options) {
  const int L = store.model().num_layers();
  if (position.first_layer < 0 || position.end_layer > L || position.first_layer >= position.end_layer)
    throw std::invalid_argument("stage layers [" + std::to_string(position.first_layer) + ", " +
                                std::to_string(position.end_layer) + ") are not inside the model's " +
                                std::to_string(L) + " layers");
  for (int l = position.first_layer; l < position.end_layer; ++l)
    if (!store.holds(l))
      throw std::invalid_argument("stage layers [" + std::to_string(position.first_layer) + ", " +
                                  std::to_string(position.end_layer) + ") need layer " + std::to_string(l) +
                                  ", which the node's store does not hold");
}

int stage_executor::checked(int layer) const {
  if (layer < position_.first_layer || layer >= position_.end_layer)
    throw std::out_of_range("layer " + std::to_string(layer) + " is outside this stage's layers [" +
                            std::to_string(position_.first_layer) + ", " + std::to_string(position_.end_layer) + ")");
  return layer;
}

torch::Tensor stage_executor::forward_layers(const torch::Tensor& x, std::int64_t step, std::int64_t microbatch) {
  const auto& model = store_.model();
  torch::Tensor h = x;
  for (int l = position_.first_layer; l < position_.end_layer; ++l) {
    if (model.dropout > 0) {
      auto gen = dropout_generator(model, step, microbatch, l);
      h = store_.module(l).forward(h, &gen);
    } else {
      h = store_.module(l).forward(h, nullptr);
    }
  }
  return h;
}

double stage_executor::run_step(std::int64_t step, std::int64_t first_microbatch, int num_microbatches,
                                const torch::Tensor& inputs, const torch::Tensor& targets) {
  const auto& model = store_.model();
  const auto device = store_.device();
  const bool first = position_.stage == 0;
  const bool last = position_.stage == position_.num_stages - 1;
  const bool recompute = options_.activation_checkpointing;
  const int b = options_.microbatch_size;
  const auto activation = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  auto rows = [&](const torch::Tensor& t, int microbatch) {
    return t.slice(0, microbatch * b, (microbatch + 1) * b).to(device);
  };
  // Backward accumulates straight into each layer's flat gradient buffer.
  for (int l = position_.first_layer; l < position_.end_layer; ++l) store_.gradients(l);
  // Forward of one microbatch; under checkpointing autograd records nothing until backward redoes it.
  auto forward = [&](in_flight& mb, int microbatch, bool record) {
    std::optional<torch::NoGradGuard> no_grad;
    if (!record) no_grad.emplace();
    auto out = forward_layers(mb.input, step, first_microbatch + microbatch);
    return last ? lm_loss(out, rows(targets, microbatch)) : out;
  };
  std::vector<in_flight> mbs(num_microbatches);
  double loss_sum = 0;
  for (const auto& op : planning::one_f_one_b(position_.stage, position_.num_stages, num_microbatches)) {
    auto& mb = mbs[op.microbatch];
    const int tag = tag_of(op.kind, op.microbatch);
    switch (op.kind) {
      case op_kind::recv_activation:
        mb.input = torch::empty({b, model.seq_len, model.d_model}, activation);
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
        mb.gradient = torch::empty({b, model.seq_len, model.d_model}, activation);
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
    comm_.all_reduce_sum(store_.gradients(l), group, gradient_tag);
  }
}

void stage_executor::commit() {
  for (int l = position_.first_layer; l < position_.end_layer; ++l)
    adamw_step(store_.parameters(l), store_.optimizer_state(l), options_.optimizer);
  discard();
}

void stage_executor::discard() {
  for (int l = position_.first_layer; l < position_.end_layer; ++l) store_.drop_gradients(l);
}

std::vector<torch::Tensor> stage_executor::parameters(int layer) const { return store_.parameters(checked(layer)); }

layer_optimizer_state& stage_executor::optimizer_state(int layer) { return store_.optimizer_state(checked(layer)); }

std::uint64_t stage_executor::parameter_digest(int layer) const { return store_.parameter_digest(checked(layer)); }

}  // namespace oobleck::runtime
