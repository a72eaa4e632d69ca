#include "actors/stage_checkpoint.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <exception>
#include <filesystem>

#include "runtime/checkpoint.hpp"
#include "runtime/layer_store.hpp"

namespace oobleck::actors {

namespace {

/// A test hook (tests/actors/checkpoint_e2e_test.cpp): with OOBLECK_TEST_DIE_WRITING_CHECKPOINT set
/// to a path, the first writer of any process to create that file (O_EXCL) writes half of its
/// layer's temporary file and SIGKILLs its own process: a writer that dies mid-write, once.
void die_writing_if_asked(const messages::write_checkpoint& order, planning::layer_index layer,
                          const std::vector<std::byte>& bytes) {
  const char* marker = std::getenv("OOBLECK_TEST_DIE_WRITING_CHECKPOINT");
  if (!marker || !*marker) return;
  const int m = ::open(marker, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (m < 0) return;  // another writer died already
  const std::string who = order.writer + " layer " + std::to_string(layer.value) + "\n";
  (void)!::write(m, who.data(), who.size());
  ::close(m);
  const auto temp = std::filesystem::path(order.dir) / runtime::layer_temp_file_name(layer.value, order.writer);
  const int f = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f >= 0) {
    (void)!::write(f, bytes.data(), bytes.size() / 2);
    ::fsync(f);
  }
  ::kill(::getpid(), SIGKILL);
}

}  // namespace

messages::checkpoint_written write_checkpoint_layers(const runtime::layer_store& store,
                                                     const messages::write_checkpoint& order) {
  messages::checkpoint_written out;
  out.request = order.request;
  try {
    for (planning::layer_index layer : order.layers) {
      if (!store.holds(layer.value)) {
        out.missing.push_back(layer);
        continue;
      }
      const auto bytes = store.serialize_layer(layer.value);
      die_writing_if_asked(order, layer, bytes);
      const auto f = runtime::write_layer_file(order.dir, layer.value, bytes, order.writer);
      out.files.push_back({layer, f.bytes, f.sha256});
    }
  } catch (const std::exception& e) {
    // The layers after the failing one are neither written nor missing: the coordinator asks
    // another holder of each.
    out.error = e.what();
  }
  return out;
}

void install_from_checkpoint(runtime::layer_store& store, const std::string& dir, planning::layer_index first,
                             planning::layer_index end) {
  const auto manifest = runtime::read_manifest(dir);
  if (manifest.num_layers != store.model().num_layers())
    throw runtime::checkpoint_error(dir + ": " + std::to_string(manifest.num_layers) + " layers, the job's model has " +
                                    std::to_string(store.model().num_layers()));
  std::vector<std::pair<int, std::vector<std::byte>>> files;
  for (int l = first.value; l < end.value; ++l) files.emplace_back(l, runtime::read_layer_file(dir, runtime::file_of(manifest, l)));
  // The store checks each layer's header (layer, model) before it changes that layer. The
  // coordinator validated the job hash (which covers the model), so a refusal here is a bug or a
  // file changed under us: the stage fails to form, trains nothing, and a later assignment of a
  // first epoch installs every layer of its range again.
  for (auto& [l, bytes] : files) {
    try {
      store.install_layer(l, bytes);
    } catch (const runtime::layer_install_error& e) {
      throw runtime::layer_install_error(dir + "/" + runtime::layer_file_name(l) + ": " + e.what());
    }
  }
}

namespace {
std::vector<float> values(const std::vector<torch::Tensor>& parts) {
  std::vector<float> out;
  for (const auto& t : parts) {
    const auto c = t.detach().to(torch::kCPU, torch::kFloat).contiguous().flatten();
    out.insert(out.end(), c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
  }
  return out;
}
}  // namespace

layer_state_values decode_layer_state(const runtime::gpt_config& model, planning::layer_index layer,
                                      std::span<const std::byte> bytes) {
  runtime::layer_store store(model);
  store.install_layer(layer.value, bytes);
  layer_state_values v;
  v.parameters = values({store.flat_parameters(layer.value)});
  const auto& opt = store.optimizer_state(layer.value);
  v.exp_avg = values(opt.exp_avg);
  v.exp_avg_sq = values(opt.exp_avg_sq);
  v.step = opt.step;
  return v;
}

}  // namespace oobleck::actors
