#include "runtime/stage_executor.hpp"

#include <chrono>
#include <map>
#include <memory>
#include <optional>

#include "planning/schedule.hpp"

namespace oobleck::runtime {

namespace {

/// The tag of layer l's gradient all-reduce: one of its own per layer (communicator.hpp:
/// collectives of other tags are independent), so that two stages of one node, each reducing on
/// a thread of its own, can never interleave collectives of the same (group, tag) in an order
/// the layer's other holders do not share.
int gradient_tag(int layer) { return layer; }

using planning::op_kind;

/// Point-to-point tags stay below this (the copy plan's start there: actors/stage_forming.cpp).
constexpr std::int64_t p2p_tag_limit = std::int64_t{1} << 24;

/// The tied embedding's gradient between a pipeline's first and last stage, one tag per direction.
/// The 1F1B tags stay at or below 2 * microbatches * stages - 3 < p2p_tag_limit - 4 (run_step
/// refuses more microbatches), so these two are never a step's.
constexpr int tie_tag_from_first = static_cast<int>(p2p_tag_limit - 1);
constexpr int tie_tag_from_last = static_cast<int>(p2p_tag_limit - 2);

/// One message stream per link, direction and microbatch; the transport keeps each (peer, tag) in
/// order. The link (stage s to s + 1 is link s) is part of the tag because a node of several slots
/// runs consecutive stages of one pipeline: stages s and s + 1 then talk to the node's own rank,
/// and so do s + 1 and s + 2, in the same direction.
int tag_of(op_kind kind, int microbatch, int stage, int num_stages) {
  const bool gradient = kind == op_kind::send_gradient || kind == op_kind::recv_gradient;
  const bool downstream = kind == op_kind::send_activation || kind == op_kind::recv_gradient;
  const int link = downstream ? stage : stage - 1;
  return (microbatch * num_stages + link) * 2 + (gradient ? 1 : 0);
}

struct in_flight {
  torch::Tensor input;     // activation received (a leaf requiring grad) or token ids
  torch::Tensor output;    // activation to send, or the scaled loss on the last stage
  torch::Tensor gradient;  // gradient of `output` received from downstream
  std::vector<torch::Tensor> boundaries;  // per layer: its input leaf, its output (recorded forward)
};

using clock_type = std::chrono::steady_clock;

/// Adds the time from construction to destruction to `sink` (milliseconds).
class timed {
 public:
  explicit timed(double& sink) : sink_(sink), start_(clock_type::now()) {}
  ~timed() { sink_ += std::chrono::duration<double, std::milli>(clock_type::now() - start_).count(); }
  timed(const timed&) = delete;
  timed& operator=(const timed&) = delete;

 private:
  double& sink_;
  clock_type::time_point start_;
};

}  // namespace

stage_executor::stage_executor(layer_store& store, stage_position position, communicator& comm,
                               executor_options options)
    : store_(store), position_(position), comm_(comm), options_(options), reducer_(comm) {
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

torch::Tensor stage_executor::forward_layers(const torch::Tensor& x, std::int64_t step, std::int64_t microbatch,
                                            std::vector<torch::Tensor>* boundaries) {
  const auto& model = store_.model();
  torch::Tensor h = x;
  if (boundaries) boundaries->clear();
  for (int l = position_.first_layer; l < position_.end_layer; ++l) {
    if (boundaries) {
      // Cut the graph at every layer boundary: backward then runs layer by layer, and a layer's
      // gradient is known to be complete when its own backward returns.
      if (l > position_.first_layer) h = h.detach().requires_grad_(true);
      boundaries->push_back(h);
    }
    if (model.dropout > 0) {
      auto gen = dropout_generator(model, step, microbatch, l, store_.device());
      h = store_.module(l).forward(h, &gen);
    } else {
      h = store_.module(l).forward(h, nullptr);
    }
    if (boundaries) boundaries->push_back(h);
  }
  return h;
}

double stage_executor::run_step(std::int64_t step, std::int64_t first_microbatch, int num_microbatches,
                                const torch::Tensor& inputs, const torch::Tensor& targets,
                                const std::vector<std::vector<int>>& layer_groups) {
  const auto& model = store_.model();
  const auto device = store_.device();
  const bool first = position_.stage == 0;
  const bool last = position_.stage == position_.num_stages - 1;
  const bool recompute = options_.activation_checkpointing;
  const int b = options_.microbatch_size;
  const int first_layer = position_.first_layer;
  const int num_layers = position_.end_layer - position_.first_layer;
  const bool overlap = options_.overlap_gradient_reduce && !layer_groups.empty();
  const auto activation = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  auto rows = [&](const torch::Tensor& t, int microbatch) {
    return t.slice(0, microbatch * b, (microbatch + 1) * b).to(device);
  };
  timing_ = {};
  timing_.forward_op_ms.assign(static_cast<std::size_t>(std::max(num_microbatches, 0)), 0.0);
  timing_.backward_op_ms.assign(static_cast<std::size_t>(std::max(num_microbatches, 0)), 0.0);
  reduce_started_.assign(static_cast<std::size_t>(num_layers), false);
  // Backward accumulates straight into each layer's flat gradient buffer.
  for (int l = position_.first_layer; l < position_.end_layer; ++l) store_.gradients(l);
  if (static_cast<std::int64_t>(num_microbatches) * position_.num_stages * 2 >= p2p_tag_limit)
    throw std::invalid_argument("a pipeline of " + std::to_string(position_.num_stages) + " stages cannot run " +
                                std::to_string(num_microbatches) + " microbatches per step (message tags run out)");
  const auto ops = planning::one_f_one_b(position_.stage, position_.num_stages, num_microbatches);
  std::size_t last_backward = 0;
  for (std::size_t i = 0; i < ops.size(); ++i)
    if (ops[i].kind == op_kind::backward) last_backward = i;
  const int final_microbatch = ops.at(last_backward).microbatch;
  // Forward of one microbatch; under checkpointing autograd records nothing until backward redoes it.
  auto forward = [&](in_flight& mb, int microbatch, bool record) {
    const autocast_scope precision(model.precision, device);
    std::optional<torch::NoGradGuard> no_grad;
    if (!record) no_grad.emplace();
    // Only the microbatch of the final backward is cut at layer boundaries (per-layer backward
    // calls cost engine overhead); every mode does the same, so the sums do not depend on overlap.
    auto out = forward_layers(mb.input, step, first_microbatch + microbatch,
                              record && microbatch == final_microbatch ? &mb.boundaries : nullptr);
    return last ? lm_loss(out, rows(targets, microbatch)) : out;
  };
  // The final backward goes layer by layer from the top: a layer's gradient is final as soon as its
  // own backward returns, and its all-reduce can start at once.
  auto backward = [&](in_flight& mb, const torch::Tensor& top, bool final_backward) {
    if (!final_backward) {
      if (last) top.backward();
      else top.backward(mb.gradient);
      return;
    }
    for (int i = num_layers - 1; i >= 0; --i) {
      if (i == num_layers - 1) {
        if (last) top.backward();
        else top.backward(mb.gradient);
      } else {
        mb.boundaries[2 * i + 1].backward(mb.boundaries[2 * (i + 1)].grad());
      }
      const int l = first_layer + i;
      const auto& group = overlap ? layer_groups.at(l) : std::vector<int>{};
      if (group.size() >= 2) {
        reducer_.post(store_.gradients(l), group, gradient_tag(l));
        reduce_started_[static_cast<std::size_t>(i)] = true;
      }
    }
    mb.boundaries.clear();
  };
  std::vector<in_flight> mbs(num_microbatches);
  // Receives are posted ahead of their ops, so that a message that arrives before the schedule
  // reaches its receive lands in its final buffer (the transport reads it straight from the
  // socket) instead of a pooled one and a copy. At most `window` are posted at a time: the
  // stage's 1F1B warm-up depth plus one, which bounds the extra buffers as 1F1B bounds the
  // microbatches in flight.
  std::vector<std::size_t> recv_ops;
  for (std::size_t i = 0; i < ops.size(); ++i)
    if (ops[i].kind == op_kind::recv_activation || ops[i].kind == op_kind::recv_gradient) recv_ops.push_back(i);
  const std::size_t window = static_cast<std::size_t>(std::max(1, position_.num_stages - position_.stage));
  std::map<std::size_t, std::unique_ptr<runtime::pending_recv>> posted;  // by op index; withdrawn when left
  std::size_t next_post = 0;  // into recv_ops
  auto post_ahead = [&] {
    while (next_post < recv_ops.size() && posted.size() < window) {
      const std::size_t i = recv_ops[next_post++];
      const auto& op = ops[i];
      const int peer = op.kind == op_kind::recv_activation ? position_.prev_rank : position_.next_rank;
      posted[i] = comm_.post_recv_owned({b, model.seq_len, model.d_model}, activation, peer,
                                        tag_of(op.kind, op.microbatch, position_.stage, position_.num_stages));
    }
  };
  auto take_posted = [&](std::size_t i) {
    post_ahead();  // op i is the oldest receive not waited for: it is posted by now
    auto node = posted.extract(i);
    if (node.empty()) throw std::logic_error("stage executor: receive of op " + std::to_string(i) + " was not posted");
    return node.mapped()->wait();
  };
  // The unscaled losses summed on the stage, in double as item() sums did, and read once per step:
  // an item() per microbatch would wait for the device at every forward.
  torch::Tensor loss_sum;
  try {
    post_ahead();
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const auto& op = ops[i];
      auto& mb = mbs[op.microbatch];
      const int tag = tag_of(op.kind, op.microbatch, position_.stage, position_.num_stages);
      switch (op.kind) {
        case op_kind::recv_activation: {
          timed t(timing_.p2p_wait_ms);
          // Owned: posted ahead (read straight into it), or from a stage of this node, the
          // sender's tensor itself (no copy).
          mb.input = take_posted(i);
          mb.input.requires_grad_(true);
          break;
        }
        case op_kind::forward: {
          timed t(timing_.compute_ms), op_time(timing_.forward_op_ms[static_cast<std::size_t>(op.microbatch)]);
          if (first) mb.input = rows(inputs, op.microbatch);
          mb.output = forward(mb, op.microbatch, !recompute);
          if (last) {
            const auto loss = mb.output.detach().to(torch::kFloat64);
            loss_sum = loss_sum.defined() ? loss_sum.add_(loss) : loss;
            mb.output = mb.output / options_.global_microbatches;
          }
          break;
        }
        case op_kind::send_activation: {
          timed t(timing_.p2p_wait_ms);
          comm_.send(mb.output.detach().contiguous(), position_.next_rank, tag);
          if (recompute) {
            mb.output = torch::Tensor();
            mb.boundaries.clear();
          }
          break;
        }
        case op_kind::recv_gradient: {
          timed t(timing_.p2p_wait_ms);
          mb.gradient = take_posted(i);
          break;
        }
        case op_kind::backward: {
          timed t(timing_.compute_ms), op_time(timing_.backward_op_ms[static_cast<std::size_t>(op.microbatch)]);
          auto out = recompute ? forward(mb, op.microbatch, true) : mb.output;
          backward(mb, last && recompute ? out / options_.global_microbatches : out, i == last_backward);
          mb.output = mb.gradient = torch::Tensor();
          break;
        }
        case op_kind::send_gradient: {
          timed t(timing_.p2p_wait_ms);
          comm_.send(mb.input.grad().contiguous(), position_.prev_rank, tag);
          mb.input = torch::Tensor();
          break;
        }
      }
    }
  } catch (...) {
    // No all-reduce may outlive the step: the caller discards the buffers they write into.
    reducer_.cancel();
    throw;
  }
  return loss_sum.defined() ? loss_sum.item<double>() : 0.0;
}

void stage_executor::reduce_gradients(const std::vector<std::vector<int>>& layer_groups) {
  torch::NoGradGuard no_grad;
  timed t(timing_.allreduce_ms);
  reducer_.wait();
  const int num_layers = position_.end_layer - position_.first_layer;
  reduce_started_.resize(static_cast<std::size_t>(num_layers), false);
  for (int i = num_layers - 1; i >= 0; --i) {
    const int l = position_.first_layer + i;
    const auto& group = layer_groups.at(l);
    if (group.size() < 2 || reduce_started_[static_cast<std::size_t>(i)]) continue;
    comm_.all_reduce_sum(store_.gradients(l), group, gradient_tag(l));
  }
  reduce_started_.assign(reduce_started_.size(), false);
  tie_gradients();
}

void stage_executor::tie_gradients() {
  const auto& model = store_.model();
  if (!tied(model)) return;
  const int last_layer = model.num_layers() - 1;
  const bool has_first = position_.first_layer == 0;
  const bool has_last = position_.end_layer == model.num_layers();
  if (!has_first && !has_last) return;
  torch::NoGradGuard no_grad;
  // Parameter 0 of both layers is the tied matrix: the first piece of each flat gradient buffer.
  const auto elements = model.vocab * model.d_model;
  auto tied_gradient = [&](int layer) { return store_.gradients(layer).slice(0, 0, elements); };
  if (has_first && has_last) {
    auto embedding = tied_gradient(0);
    auto head = tied_gradient(last_layer);
    embedding.add_(head);
    head.copy_(embedding);
    return;
  }
  if (position_.first_rank < 0 || position_.last_rank < 0)
    throw std::logic_error("a stage of a tied-embedding model does not know its pipeline's first and last stage");
  timed t(timing_.allreduce_ms);
  // The first stage sends, then receives; the last receives, then sends: whatever the transport
  // buffers, neither waits on the other.
  if (has_first) {
    auto mine = tied_gradient(0);
    comm_.send(mine, position_.last_rank, tie_tag_from_first);
    auto theirs = torch::empty_like(mine);
    comm_.recv(theirs, position_.last_rank, tie_tag_from_last);
    mine.add_(theirs);
  } else {
    auto mine = tied_gradient(last_layer);
    auto theirs = torch::empty_like(mine);
    comm_.recv(theirs, position_.first_rank, tie_tag_from_first);
    comm_.send(mine, position_.first_rank, tie_tag_from_last);
    mine.add_(theirs);
  }
}

double stage_executor::gradient_sq_norm() {
  torch::NoGradGuard no_grad;
  const auto& model = store_.model();
  const int last_layer = model.num_layers() - 1;
  double sum = 0;
  for (int l = position_.first_layer; l < position_.end_layer; ++l) {
    auto g = store_.gradients(l);
    if (l == last_layer && tied(model)) g = g.slice(0, model.vocab * model.d_model);  // counted on layer 0
    // The norm kernel accumulates in double on the CPU without a double copy of the gradient (a
    // 124M-parameter model's would be 1 GB per step).
    const double norm = g.norm().item<double>();
    sum += norm * norm;
  }
  return sum;
}

void stage_executor::commit(double gradient_scale) {
  reducer_.wait();  // normally idle: reduce_gradients() waited
  {
    timed t(timing_.optimizer_ms);
    torch::NoGradGuard no_grad;
    for (int l = position_.first_layer; l < position_.end_layer; ++l) {
      if (gradient_scale != 1.0) store_.gradients(l).mul_(gradient_scale);
      store_.optimizer_step(l, options_.optimizer);
    }
  }
  for (int l = position_.first_layer; l < position_.end_layer; ++l) store_.clear_gradients(l);
}

double stage_executor::run_eval(int windows, const torch::Tensor& inputs, const torch::Tensor& targets) {
  torch::NoGradGuard no_grad;
  const auto& model = store_.model();
  const auto device = store_.device();
  const bool first = position_.stage == 0;
  const bool last = position_.stage == position_.num_stages - 1;
  const int b = options_.microbatch_size;
  const int chunks = (windows + b - 1) / b;
  if (static_cast<std::int64_t>(chunks) * position_.num_stages * 2 >= p2p_tag_limit)
    throw std::invalid_argument("a pipeline of " + std::to_string(position_.num_stages) + " stages cannot evaluate " +
                                std::to_string(windows) + " windows in one round (message tags run out)");
  const auto activation = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  // Evaluation mode for the range (no dropout); training mode again whatever happens.
  struct mode_guard {
    layer_store& store;
    int first, end;
    mode_guard(layer_store& s, int f, int e) : store(s), first(f), end(e) {
      for (int l = first; l < end; ++l) store.module(l).eval();
    }
    ~mode_guard() {
      for (int l = first; l < end; ++l) store.module(l).train();
    }
  } mode(store_, position_.first_layer, position_.end_layer);
  double sum = 0;
  for (int c = 0; c < chunks; ++c) {
    const int rows = std::min(b, windows - c * b);
    torch::Tensor h;
    if (first) {
      h = inputs.slice(0, c * b, c * b + rows).to(device);
    } else {
      h = torch::empty({rows, model.seq_len, model.d_model}, activation);
      comm_.recv(h, position_.prev_rank, tag_of(op_kind::recv_activation, c, position_.stage, position_.num_stages));
    }
    for (int l = position_.first_layer; l < position_.end_layer; ++l) h = store_.module(l).forward(h, nullptr);
    if (last) {
      const auto t = targets.slice(0, c * b, c * b + rows).to(device);
      auto per_token = torch::nn::functional::cross_entropy(
          h.reshape({-1, h.size(-1)}), t.reshape({-1}),
          torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
      sum += per_token.view({rows, -1}).mean(1).to(torch::kFloat64).sum().item<double>();
    } else {
      comm_.send(h.contiguous(), position_.next_rank,
                 tag_of(op_kind::send_activation, c, position_.stage, position_.num_stages));
    }
  }
  return sum;
}

void stage_executor::discard() {
  reducer_.cancel();
  for (int l = position_.first_layer; l < position_.end_layer; ++l) store_.clear_gradients(l);
}

std::vector<torch::Tensor> stage_executor::parameters(int layer) const { return store_.parameters(checked(layer)); }

layer_optimizer_state& stage_executor::optimizer_state(int layer) { return store_.optimizer_state(checked(layer)); }

std::uint64_t stage_executor::parameter_digest(int layer) const { return store_.parameter_digest(checked(layer)); }

}  // namespace oobleck::runtime
