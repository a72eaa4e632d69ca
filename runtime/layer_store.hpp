#pragma once
// A node's layers (ARCHITECTURE.md §5, Layer store): per layer its module, gradients and optimizer state,
// each kept in one flat buffer, so that all-reduce, copy and checkpoint are one operation per
// layer. Stage executors are views over a range of the store; a new epoch builds new views over
// the same store and keeps the layers the node still holds.

#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/gpt_config.hpp"
#include "runtime/gpt_model.hpp"
#include "runtime/optimizer.hpp"

namespace oobleck::runtime {

/// Bytes that are not a layer of this store's model: wrong layer, other model, torn or corrupt.
class layer_install_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Not synchronised: ensure, drop and install while no view runs. Views of one epoch may run on
/// threads of their own, since no two of them share a layer.
class layer_store {
  struct slot {
    std::shared_ptr<model_layer> module;
    std::vector<torch::Tensor> parameters;
    torch::Tensor flat_parameters, flat_gradients, flat_exp_avg, flat_exp_avg_sq;
    layer_optimizer_state optimizer;
    element_ranges matrices;        ///< where weight decay applies in the flat buffers
    bool gradients_stale = false;   ///< flat_gradients holds a finished step's: zero before use
  };

 public:
  explicit layer_store(gpt_config model, torch::Device device = torch::kCPU);
  layer_store(const layer_store&) = delete;
  layer_store& operator=(const layer_store&) = delete;

  const gpt_config& model() const { return model_; }
  torch::Device device() const { return device_; }

  /// Builds layer l from its seed unless held: identical on every node (job start only; later a
  /// layer arrives by install_layer).
  void ensure(int layer);
  /// ensure() for each layer in [first, end).
  void ensure(int first, int end);
  /// Frees layer l (nothing happens when it is not held).
  void drop(int layer);
  bool holds(int layer) const { return slots_.count(layer) != 0; }
  /// Held layers in increasing order.
  std::vector<int> layers_held() const;

  /// Layer l's full state (parameters, AdamW moments, step count) behind a header naming the layer
  /// and the model; gradients are not state. Throws std::out_of_range when l is not held.
  std::vector<std::byte> serialize_layer(int layer) const;
  /// Replaces (or adds) layer l with the state in `bytes`, dropping any gradients. Bytes of
  /// another layer or model, or torn or corrupt bytes, throw layer_install_error and change nothing.
  void install_layer(int layer, std::span<const std::byte> bytes);

  /// A layer's full state for a copy over a communicator without serialising it: a header
  /// (layer, model, step count, sizes; checksummed) and the store's own flat buffers (parameters,
  /// first moments, second moments). Send them as they are; they must not change until the sends
  /// complete (nothing updates a layer while an epoch forms).
  struct copy_source {
    std::vector<std::byte> header;
    std::vector<torch::Tensor> buffers;
  };
  copy_source copy_of(int layer) const;
  /// Bytes of a copy_source header.
  static std::size_t copy_header_bytes();
  /// Receives layer l from a copy_source: checks the header as install_layer checks bytes, then
  /// `fill` receives each buffer in turn into a tensor of the right size and type, and the layer
  /// is installed (replacing any held one) with no further copy. A wrong header, or a `fill`
  /// that throws, changes nothing.
  void receive_layer(int layer, std::span<const std::byte> header, const std::function<void(torch::Tensor&)>& fill);

  /// receive_layer in two halves, so that several layers can be received at once from different
  /// threads: prepare_incoming allocates layer l's buffers (values unspecified: the copy
  /// overwrites every one) and makes their pages resident, so that the copy is not slowed by
  /// page faults, without touching the store, so it may run on any thread, beside other calls
  /// of it (and ahead of the copy, e.g. while the epoch's mesh connects); the caller fills
  /// buffers() (parameters, first moments, second moments) with the copy's buffers; adopt()
  /// then checks the header as receive_layer does and installs the layer (replacing any held
  /// one), on the store's own thread. A wrong header throws layer_install_error and changes
  /// nothing.
  class incoming {
   public:
    int layer() const { return layer_; }
    std::vector<torch::Tensor> buffers() const;

   private:
    friend class layer_store;
    int layer_ = -1;
    std::unique_ptr<slot> slot_;
  };
  incoming prepare_incoming(int layer) const;
  void adopt(incoming in, std::span<const std::byte> header);

  model_layer& module(int layer);
  /// The module's parameters: views of flat_parameters(layer), in registration order.
  std::vector<torch::Tensor> parameters(int layer) const;
  /// Every parameter of layer l, concatenated.
  const torch::Tensor& flat_parameters(int layer) const;
  /// Layer l's gradient buffer, and the parameters' .grad() are its views: backward accumulates
  /// into it, and one all-reduce sums it. Zeros on the first call after clear_gradients() (or
  /// when the layer has no buffer yet); later calls return it as it is.
  torch::Tensor& gradients(int layer);
  /// Ends layer l's gradients (a step committed or discarded): the buffer stays allocated, with
  /// the parameters' .grad() its views, and is zeroed in place when gradients(l) is next called,
  /// so a step neither frees nor re-allocates it. drop(l) frees it with the layer; an install
  /// clears it.
  void clear_gradients(int layer);
  /// One AdamW update of layer l from its gradient buffer, over its flat buffers (weight decay
  /// on its matrices only); increments its step count.
  void optimizer_step(int layer, const adamw_options& o);
  /// Moments are views of one flat buffer each.
  layer_optimizer_state& optimizer_state(int layer);
  /// FNV-1a over the 8-byte words of layer l's parameters: equal digests = bitwise equal replicas.
  std::uint64_t parameter_digest(int layer) const;

 private:
  std::unique_ptr<slot> build(int layer, layer_init how = layer_init::seeded) const;
  slot& at(int layer);
  const slot& at(int layer) const;

  gpt_config model_;
  std::string model_hash_;
  torch::Device device_;
  std::map<int, std::unique_ptr<slot>> slots_;
};

/// A digest of the raw bytes of tensors: equal digests = bitwise equal tensors (up to a ~2^-64
/// collision). CPU tensors: FNV-1a over their bytes, 8-byte words at a time (then the tail bytes).
/// Tensors on a GPU: word_sum_digest, computed there (one small result crosses to the host, not the
/// parameters). The two kinds differ, and digests are only compared among the replicas of one job,
/// whose nodes are all of its cluster.device.
std::uint64_t tensor_digest(const std::vector<torch::Tensor>& tensors);

/// The device-side digest of tensor_digest, on any device: the tensor's bytes as 32-bit words w_i
/// (a tensor of a size not a multiple of 4 bytes is refused), Σ w_i · c_i mod 2^64 with c_i an odd
/// mix of the word's position i; integer sums in any order give the same bits, so a GPU's parallel
/// reduction is exact. Changing one word, or swapping two unequal words, changes it (an odd c_i is
/// invertible mod 2^64). Computed in chunks of `chunk_words` words (the result does not depend on
/// it) so that its temporaries stay bounded. Chained from `h`.
std::uint64_t word_sum_digest(std::uint64_t h, const torch::Tensor& t, std::int64_t chunk_words = 1 << 24);

}  // namespace oobleck::runtime
