#include "runtime/layer_store.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <bit>
#include <cstring>
#include <string_view>
#include <type_traits>

#include "runtime/hf_gpt2_weights.hpp"

namespace oobleck::runtime {

namespace {

static_assert(std::endian::native == std::endian::little, "layer bytes are little-endian");

/// The header of a serialised layer; three float32 buffers of `elements` each follow: parameters,
/// first moments, second moments.
struct layer_header {
  char magic[8];
  std::uint32_t version;
  std::int32_t layer;
  char model_hash[16];  ///< gpt_config::hash(): same shapes and initialisation
  std::int64_t step;    ///< AdamW updates applied so far
  std::int64_t tensors;
  std::int64_t elements;
  std::uint64_t payload_bytes;
  std::uint64_t checksum;  ///< over the header (this field zero) and the payload
};
static_assert(std::is_trivially_copyable_v<layer_header> && sizeof(layer_header) == 72);

constexpr std::string_view kMagic = "OOBLAYER";
constexpr std::uint32_t kVersion = 1;
constexpr int kBuffers = 3;

/// FNV-1a over 8-byte words (then the tail bytes): a corruption check fast enough for the bytes
/// of a large layer, not a cryptographic one.
std::uint64_t checksum(std::uint64_t h, const std::byte* data, std::size_t n) {
  constexpr std::uint64_t prime = 1099511628211ULL;
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t word;
    std::memcpy(&word, data + i, 8);
    h = (h ^ word) * prime;
  }
  for (; i < n; ++i) h = (h ^ static_cast<std::uint64_t>(data[i])) * prime;
  return h;
}

std::uint64_t checksum_of(layer_header header, const std::byte* payload, std::size_t n) {
  header.checksum = 0;
  const auto h = checksum(1469598103934665603ULL, reinterpret_cast<const std::byte*>(&header), sizeof header);
  return checksum(h, payload, n);
}

std::string hash_text(const char (&hash)[16]) {
  std::string out(hash, 16);
  for (auto& c : out)
    if (c < 0x20 || c > 0x7e) c = '?';
  return out;
}

[[noreturn]] void refuse(int layer, const std::string& why) {
  throw layer_install_error("cannot install layer " + std::to_string(layer) + ": " + why);
}

/// The header of layer `layer` held in `s` (every field but the checksum, which covers what
/// travels with it): one for serialize_layer and copy_of.
template <class slot>
layer_header header_of(int layer, const slot& s, const std::string& model_hash) {
  layer_header h{};
  std::memcpy(h.magic, kMagic.data(), sizeof h.magic);
  h.version = kVersion;
  h.layer = layer;
  std::memcpy(h.model_hash, model_hash.data(), sizeof h.model_hash);
  h.step = s.optimizer.step;
  h.tensors = static_cast<std::int64_t>(s.parameters.size());
  h.elements = s.flat_parameters.numel();
  h.payload_bytes = static_cast<std::uint64_t>(kBuffers * h.elements) * sizeof(float);
  return h;
}

/// The header of a copy of `layer`, checked (magic, version, checksum, layer, model, step)
/// before anything changes.
layer_header checked_copy_header(int layer, std::span<const std::byte> header, const std::string& model_hash) {
  layer_header h;
  if (header.size() != sizeof h)
    refuse(layer, "a copy header of " + std::to_string(header.size()) + " bytes, not " + std::to_string(sizeof h));
  std::memcpy(&h, header.data(), sizeof h);
  if (std::string_view(h.magic, sizeof h.magic) != kMagic) refuse(layer, "the header is not a layer's");
  if (h.version != kVersion)
    refuse(layer, "format version " + std::to_string(h.version) + "; this build reads " + std::to_string(kVersion));
  if (checksum_of(h, nullptr, 0) != h.checksum) refuse(layer, "corrupt copy header: checksum mismatch");
  if (h.layer != layer) refuse(layer, "the header announces layer " + std::to_string(h.layer));
  if (std::string_view(h.model_hash, sizeof h.model_hash) != model_hash)
    refuse(layer, "the header is of model " + hash_text(h.model_hash) + ", this store's model is " + model_hash);
  if (h.step < 0) refuse(layer, "negative step count " + std::to_string(h.step));
  return h;
}

/// Makes every page of a fresh CPU buffer resident and writable now. A large buffer is fresh
/// anonymous memory, which the kernel otherwise faults in one 4 KiB page at a time (~0.8 ms per
/// 9.5 MB) when the copy's bytes are first written into it, i.e. on the transport's I/O thread
/// during the transfer. MADV_POPULATE_WRITE (Linux 5.14) does it in one call; elsewhere a write
/// per page. The values stay unspecified (the copy overwrites them).
void prefault(const torch::Tensor& t) {
  if (!t.device().is_cpu() || t.nbytes() == 0) return;
  auto* begin = static_cast<std::byte*>(t.data_ptr());
  auto* end = begin + t.nbytes();
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
#ifdef MADV_POPULATE_WRITE
  const auto first = (reinterpret_cast<std::uintptr_t>(begin) + page - 1) / page * page;
  const auto last = reinterpret_cast<std::uintptr_t>(end) / page * page;
  if (last > first && ::madvise(reinterpret_cast<void*>(first), last - first, MADV_POPULATE_WRITE) == 0) {
    // The partial pages at either end share their page with other allocations: touch them.
    *static_cast<volatile std::byte*>(begin) = std::byte{0};
    *static_cast<volatile std::byte*>(end - 1) = std::byte{0};
    return;
  }
#endif
  for (std::byte* p = begin; p < end; p += page) *static_cast<volatile std::byte*>(p) = std::byte{0};
  *static_cast<volatile std::byte*>(end - 1) = std::byte{0};
}

}  // namespace

layer_store::layer_store(gpt_config model, torch::Device device)
    : model_(std::move(model)), model_hash_(model_.hash()), device_(device) {
  validate(model_);
  if (model_hash_.size() != sizeof layer_header{}.model_hash)
    throw std::logic_error("gpt_config::hash() is not 16 characters: " + model_hash_);
}

std::unique_ptr<layer_store::slot> layer_store::build(int layer, layer_init how) const {
  auto s = std::make_unique<slot>();
  // Initialised on the CPU from the layer's own generator (identical on every node), then moved
  // into flat buffers on the device; the parameters become views of them. An uninitialised
  // layer (a copy will overwrite it) draws and copies nothing.
  const bool seeded = how == layer_init::seeded;
  s->module = build_layers(model_, layer, layer + 1, torch::kCPU, how).front();
  auto params = s->module->parameters();
  std::int64_t n = 0;
  for (const auto& p : params) {
    if (p.scalar_type() != torch::kFloat32)
      throw std::logic_error("layer store: parameters must be float32 (layer " + std::to_string(layer) + ")");
    n += p.numel();
  }
  const auto options = torch::TensorOptions().dtype(torch::kFloat32).device(device_);
  s->flat_parameters = torch::empty({n}, options);
  s->flat_exp_avg = seeded ? torch::zeros({n}, options) : torch::empty({n}, options);
  s->flat_exp_avg_sq = seeded ? torch::zeros({n}, options) : torch::empty({n}, options);
  torch::NoGradGuard no_grad;
  std::int64_t offset = 0;
  for (auto& p : params) {
    auto view = [&](const torch::Tensor& flat) { return flat.slice(0, offset, offset + p.numel()).view(p.sizes()); };
    auto data = view(s->flat_parameters);
    if (seeded) data.copy_(p);
    p.set_data(data);
    s->optimizer.exp_avg.push_back(view(s->flat_exp_avg));
    s->optimizer.exp_avg_sq.push_back(view(s->flat_exp_avg_sq));
    offset += p.numel();
  }
  s->matrices = matrix_ranges(params);
  s->parameters = std::move(params);
  // [model] init: the seed's values give way to the user's weights (Hugging Face GPT-2 form);
  // the optimizer state stays fresh.
  if (seeded && !model_.init.empty()) load_hf_layer(model_.init, model_, layer, s->parameters);
  return s;
}

void layer_store::ensure(int layer) {
  if (layer < 0 || layer >= model_.num_layers())
    throw std::invalid_argument("layer " + std::to_string(layer) + " is not one of the model's " +
                                std::to_string(model_.num_layers()) + " layers");
  if (!holds(layer)) slots_.emplace(layer, build(layer));
}

void layer_store::ensure(int first, int end) {
  for (int l = first; l < end; ++l) ensure(l);
}

void layer_store::drop(int layer) { slots_.erase(layer); }

std::vector<int> layer_store::layers_held() const {
  std::vector<int> out;
  for (const auto& [l, s] : slots_) out.push_back(l);
  return out;
}

layer_store::slot& layer_store::at(int layer) {
  return const_cast<slot&>(static_cast<const layer_store*>(this)->at(layer));
}

const layer_store::slot& layer_store::at(int layer) const {
  const auto it = slots_.find(layer);
  if (it == slots_.end()) throw std::out_of_range("layer " + std::to_string(layer) + " is not held by this store");
  return *it->second;
}

std::vector<std::byte> layer_store::serialize_layer(int layer) const {
  const auto& s = at(layer);
  // The optimizer updates moments in place; a moment that is no longer a view of its flat buffer
  // would be silently missing from the bytes.
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < s.parameters.size(); ++i) {
    const auto expected = [&](const torch::Tensor& flat) { return static_cast<const float*>(flat.data_ptr()) + offset; };
    if (s.parameters[i].data_ptr() != expected(s.flat_parameters) ||
        s.optimizer.exp_avg.at(i).data_ptr() != expected(s.flat_exp_avg) ||
        s.optimizer.exp_avg_sq.at(i).data_ptr() != expected(s.flat_exp_avg_sq))
      throw std::logic_error("layer store: tensor " + std::to_string(i) + " of layer " + std::to_string(layer) +
                             " is no longer a view of its flat buffer");
    offset += s.parameters[i].numel();
  }
  layer_header h = header_of(layer, s, model_hash_);
  std::vector<std::byte> bytes(sizeof h + h.payload_bytes);
  std::byte* payload = bytes.data() + sizeof h;
  std::size_t at = 0;
  for (const auto* flat : {&s.flat_parameters, &s.flat_exp_avg, &s.flat_exp_avg_sq}) {
    const auto cpu = flat->detach().to(torch::kCPU).contiguous();
    std::memcpy(payload + at, cpu.data_ptr(), cpu.nbytes());
    at += cpu.nbytes();
  }
  h.checksum = checksum_of(h, payload, h.payload_bytes);
  std::memcpy(bytes.data(), &h, sizeof h);
  return bytes;
}

std::size_t layer_store::copy_header_bytes() { return sizeof(layer_header); }

layer_store::copy_source layer_store::copy_of(int layer) const {
  const auto& s = at(layer);
  layer_header h = header_of(layer, s, model_hash_);
  h.checksum = checksum_of(h, nullptr, 0);  // the header alone: the buffers travel on their own
  copy_source out;
  out.header.resize(sizeof h);
  std::memcpy(out.header.data(), &h, sizeof h);
  out.buffers = {s.flat_parameters, s.flat_exp_avg, s.flat_exp_avg_sq};
  return out;
}

void layer_store::receive_layer(int layer, std::span<const std::byte> header,
                                const std::function<void(torch::Tensor&)>& fill) {
  if (layer < 0 || layer >= model_.num_layers())
    throw std::invalid_argument("layer " + std::to_string(layer) + " is not one of the model's " +
                                std::to_string(model_.num_layers()) + " layers");
  checked_copy_header(layer, header, model_hash_);  // before anything is received
  auto in = prepare_incoming(layer);
  for (auto flat : in.buffers()) {
    fill(flat);
    if (flat.numel() != in.slot_->flat_parameters.numel() || flat.scalar_type() != torch::kFloat32)
      throw std::logic_error("receive_layer: a buffer of layer " + std::to_string(layer) + " changed its shape");
  }
  adopt(std::move(in), header);
}

std::vector<torch::Tensor> layer_store::incoming::buffers() const {
  if (!slot_) throw std::logic_error("an incoming layer that was adopted or never prepared has no buffers");
  return {slot_->flat_parameters, slot_->flat_exp_avg, slot_->flat_exp_avg_sq};
}

layer_store::incoming layer_store::prepare_incoming(int layer) const {
  if (layer < 0 || layer >= model_.num_layers())
    throw std::invalid_argument("layer " + std::to_string(layer) + " is not one of the model's " +
                                std::to_string(model_.num_layers()) + " layers");
  incoming in;
  in.layer_ = layer;
  in.slot_ = build(layer, layer_init::uninitialised);
  for (const auto& flat : in.buffers()) prefault(flat);
  return in;
}

void layer_store::adopt(incoming in, std::span<const std::byte> header) {
  if (!in.slot_) throw std::logic_error("adopt: an incoming layer that was adopted or never prepared");
  const int layer = in.layer_;
  const auto h = checked_copy_header(layer, header, model_hash_);
  auto& fresh = *in.slot_;
  if (h.tensors != static_cast<std::int64_t>(fresh.parameters.size()) || h.elements != fresh.flat_parameters.numel() ||
      h.payload_bytes != static_cast<std::uint64_t>(kBuffers * h.elements) * sizeof(float))
    refuse(layer, "the header announces " + std::to_string(h.tensors) + " tensors of " + std::to_string(h.elements) +
                      " elements, the layer has " + std::to_string(fresh.parameters.size()) + " of " +
                      std::to_string(fresh.flat_parameters.numel()));
  fresh.optimizer.step = h.step;
  slots_.insert_or_assign(layer, std::move(in.slot_));
}

void layer_store::install_layer(int layer, std::span<const std::byte> bytes) {
  if (layer < 0 || layer >= model_.num_layers())
    throw std::invalid_argument("layer " + std::to_string(layer) + " is not one of the model's " +
                                std::to_string(model_.num_layers()) + " layers");
  // Every check comes before the first change.
  layer_header h;
  if (bytes.size() < sizeof h)
    refuse(layer, std::to_string(bytes.size()) + " bytes are shorter than the " + std::to_string(sizeof h) +
                      "-byte header");
  std::memcpy(&h, bytes.data(), sizeof h);
  if (std::string_view(h.magic, sizeof h.magic) != kMagic) refuse(layer, "the bytes are not a serialised layer");
  if (h.version != kVersion)
    refuse(layer, "format version " + std::to_string(h.version) + "; this build reads " + std::to_string(kVersion));
  if (h.layer != layer) refuse(layer, "the bytes hold layer " + std::to_string(h.layer));
  if (std::string_view(h.model_hash, sizeof h.model_hash) != model_hash_)
    refuse(layer, "the bytes are of model " + hash_text(h.model_hash) + ", this store's model is " + model_hash_);
  // Compared by division: a corrupt element count must not overflow a product.
  const std::uint64_t follow = bytes.size() - sizeof h;
  constexpr std::uint64_t per_element = kBuffers * sizeof(float);
  if (h.elements < 0 || h.payload_bytes != follow || follow % per_element != 0 ||
      static_cast<std::uint64_t>(h.elements) != follow / per_element)
    refuse(layer, "torn bytes: the header announces " + std::to_string(h.elements) + " elements per buffer (" +
                      std::to_string(h.payload_bytes) + " payload bytes), " + std::to_string(bytes.size() - sizeof h) +
                      " follow");
  const std::byte* payload = bytes.data() + sizeof h;
  if (checksum_of(h, payload, h.payload_bytes) != h.checksum) refuse(layer, "corrupt bytes: checksum mismatch");
  if (h.step < 0) refuse(layer, "negative step count " + std::to_string(h.step));

  std::unique_ptr<slot> fresh;
  if (!holds(layer)) fresh = build(layer, layer_init::uninitialised);  // every value is overwritten below
  slot& s = fresh ? *fresh : at(layer);
  if (h.tensors != static_cast<std::int64_t>(s.parameters.size()) || h.elements != s.flat_parameters.numel())
    refuse(layer, "the bytes hold " + std::to_string(h.tensors) + " tensors of " + std::to_string(h.elements) +
                      " elements, the layer has " + std::to_string(s.parameters.size()) + " of " +
                      std::to_string(s.flat_parameters.numel()));

  torch::NoGradGuard no_grad;
  std::size_t at = 0;
  for (auto* flat : {&s.flat_parameters, &s.flat_exp_avg, &s.flat_exp_avg_sq}) {
    // from_blob does not copy; copy_ does, so the bytes may go once this returns.
    const auto source = torch::from_blob(const_cast<std::byte*>(payload + at), {h.elements}, torch::kFloat32);
    flat->copy_(source);
    at += static_cast<std::size_t>(h.elements) * sizeof(float);
  }
  s.optimizer.step = h.step;
  if (fresh) slots_.emplace(layer, std::move(fresh));
  else clear_gradients(layer);
}

model_layer& layer_store::module(int layer) { return *at(layer).module; }

std::vector<torch::Tensor> layer_store::parameters(int layer) const { return at(layer).parameters; }

const torch::Tensor& layer_store::flat_parameters(int layer) const { return at(layer).flat_parameters; }

torch::Tensor& layer_store::gradients(int layer) {
  auto& s = at(layer);
  if (!s.flat_gradients.defined()) {
    s.flat_gradients = torch::zeros_like(s.flat_parameters);
    std::int64_t offset = 0;
    for (auto& p : s.parameters) {
      p.mutable_grad() = s.flat_gradients.slice(0, offset, offset + p.numel()).view(p.sizes());
      offset += p.numel();
    }
  } else if (s.gradients_stale) {
    s.flat_gradients.zero_();
  }
  s.gradients_stale = false;
  // Autograd accumulates into a defined .grad() in place; anything that replaced one would leave
  // the flat buffer (and so the all-reduce) without that parameter's gradient.
  std::int64_t offset = 0;
  for (const auto& p : s.parameters) {
    if (!p.grad().defined() || p.grad().data_ptr() != static_cast<float*>(s.flat_gradients.data_ptr()) + offset)
      throw std::logic_error("layer store: a gradient of layer " + std::to_string(layer) +
                             " is no longer a view of its flat buffer");
    offset += p.numel();
  }
  return s.flat_gradients;
}

void layer_store::clear_gradients(int layer) { at(layer).gradients_stale = true; }

void layer_store::optimizer_step(int layer, const adamw_options& o) {
  auto& grads = gradients(layer);
  auto& s = at(layer);
  flat_adamw_step({s.flat_parameters, grads, s.flat_exp_avg, s.flat_exp_avg_sq}, s.matrices, s.optimizer.step, o);
}

layer_optimizer_state& layer_store::optimizer_state(int layer) { return at(layer).optimizer; }

std::uint64_t layer_store::parameter_digest(int layer) const {
  // The parameters are consecutive pieces of the flat buffer: the same bytes in the same order.
  return tensor_digest({flat_parameters(layer)});
}

std::uint64_t word_sum_digest(std::uint64_t h, const torch::Tensor& t, std::int64_t chunk_words) {
  if (chunk_words < 1) throw std::invalid_argument("word_sum_digest: chunk_words must be >= 1");
  const auto flat = t.detach().contiguous().view({-1});
  if (flat.nbytes() % 4 != 0)
    throw std::invalid_argument("word_sum_digest: " + std::to_string(flat.nbytes()) + " bytes are not whole 32-bit words");
  const auto words = flat.view(torch::kUInt8).view(torch::kInt32);
  const auto n = words.numel();
  const auto on = torch::TensorOptions().dtype(torch::kInt64).device(words.device());
  // Signed 64-bit products and sums wrap (two's complement) on the CPU and on CUDA alike.
  auto sum = torch::zeros({}, on);
  for (std::int64_t first = 0; first < n; first += chunk_words) {
    const auto count = std::min(chunk_words, n - first);
    auto c = torch::arange(first, first + count, on).mul_(static_cast<std::int64_t>(0x9E3779B97F4A7C15ULL));
    c.bitwise_xor_(c.bitwise_right_shift(29)).mul_(static_cast<std::int64_t>(0xBF58476D1CE4E5B9ULL)).bitwise_or_(1);
    sum.add_(words.slice(0, first, first + count).to(torch::kInt64).mul_(c).sum());
  }
  const std::uint64_t s = static_cast<std::uint64_t>(sum.item<std::int64_t>());
  const std::uint64_t parts[2] = {s, static_cast<std::uint64_t>(n)};
  return checksum(h, reinterpret_cast<const std::byte*>(parts), sizeof parts);
}

std::uint64_t tensor_digest(const std::vector<torch::Tensor>& tensors) {
  // Word-wise (checksum() above): a byte at a time cost ~5 ms per step for a 5 MB model, in
  // every commit of every holder (bench/RESULTS.md, "Failure-free throughput").
  std::uint64_t h = 1469598103934665603ULL;
  for (const auto& t : tensors) {
    if (!t.device().is_cpu()) {  // on the GPU: no copy of the parameters to the host
      h = word_sum_digest(h, t);
      continue;
    }
    const auto c = t.detach().to(torch::kCPU).contiguous();
    h = checksum(h, static_cast<const std::byte*>(c.data_ptr()), static_cast<std::size_t>(c.nbytes()));
  }
  return h;
}

}  // namespace oobleck::runtime
