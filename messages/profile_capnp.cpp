#include "messages/profile_capnp.hpp"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/array.h>
#include <kj/exception.h>

#include <cstring>
#include <string>

#include "messages/checked.hpp"
#include "messages/input_error.hpp"
#include "messages/profile.capnp.h"
#include "messages/profile_file.hpp"

namespace oobleck::messages {

namespace {

// A message cannot make the reader visit more words than the largest profile file holds (shared
// or repeated pointers would otherwise multiply the work), and a profile nests 4 levels deep
// (Profile, its layer list, a Layer, its time lists).
constexpr std::uint64_t traversal_limit_words = profile_limits::max_file_bytes / sizeof(capnp::word);
constexpr int nesting_limit = 8;

std::string text(capnp::Text::Reader t, const std::string& path) {
  if (t.size() > profile_limits::max_text_bytes)
    throw input_error(path + ": " + std::to_string(t.size()) + " bytes is above the limit of " +
                      std::to_string(profile_limits::max_text_bytes) + " bytes");
  return std::string(t.begin(), t.size());
}

std::vector<double> times(capnp::List<double>::Reader list, const std::string& path) {
  if (list.size() > static_cast<unsigned>(profile_limits::max_widths))
    throw input_error(path + ": " + std::to_string(list.size()) + " times is above the limit of " +
                      std::to_string(profile_limits::max_widths) + " stage widths (1.." +
                      std::to_string(profile_limits::max_gpus_per_node) + ")");
  std::vector<double> out;
  out.reserve(list.size());
  for (double t : list) out.push_back(t);
  return out;
}

// Every byte of the string (Text::Reader from a std::string would stop at a NUL).
capnp::Text::Reader text_of(const std::string& s) { return capnp::Text::Reader(s.data(), s.size()); }

planning::profile read_message(kj::ArrayPtr<const capnp::word> words) {
  capnp::ReaderOptions options;
  options.traversalLimitInWords = traversal_limit_words;
  options.nestingLimit = nesting_limit;
  capnp::FlatArrayMessageReader reader(words, options);
  if (reader.getEnd() != words.end())
    throw input_error("profile: " + std::to_string((words.end() - reader.getEnd()) * sizeof(capnp::word)) +
                      " bytes after the end of the Cap'n Proto message");
  const auto root = reader.getRoot<schema::Profile>();
  planning::profile p;
  p.model = text(root.getModel(), "profile.model");
  p.config_hash = text(root.getConfigHash(), "profile.config_hash");
  p.device_kind = text(root.getDeviceKind(), "profile.device_kind");
  p.microbatch_size = checked_cast<int>(root.getMicrobatchSize(), "profile.microbatch_size");
  p.gpus_per_node = checked_gpus_per_node(root.getGpusPerNode(), "profile.gpus_per_node");
  p.device_memory_bytes = checked_cast<std::int64_t>(root.getDeviceMemoryBytes(), "profile.device_memory_bytes");
  const auto layers = root.getLayers();
  check_layer_count(layers.size(), "profile.layers");
  for (unsigned i = 0; i < layers.size(); ++i) {
    const auto layer = layers[i];
    const std::string path = "profile.layers[" + std::to_string(i) + "]";
    planning::layer_profile l;
    l.name = text(layer.getName(), path + ".name");
    l.forward_ms = times(layer.getForwardMs(), path + ".forward_ms");
    l.backward_ms = times(layer.getBackwardMs(), path + ".backward_ms");
    l.param_bytes = checked_cast<std::int64_t>(layer.getParamBytes(), path + ".param_bytes");
    l.activation_bytes = checked_cast<std::int64_t>(layer.getActivationBytes(), path + ".activation_bytes");
    l.output_bytes = checked_cast<std::int64_t>(layer.getOutputBytes(), path + ".output_bytes");
    l.optimizer_ms = layer.getOptimizerMs();
    p.layers.push_back(std::move(l));
  }
  if (root.hasLink()) {
    const auto link = root.getLink();
    p.link.latency_ms = link.getLatencyMs();
    p.link.bytes_per_ms = link.getBytesPerMs();
  }
  return p;
}

}  // namespace

planning::profile profile_from_capnp(std::span<const std::byte> bytes) {
  if (bytes.size() > profile_limits::max_file_bytes)
    throw input_error("profile: " + std::to_string(bytes.size()) + " bytes is above the limit of " +
                      std::to_string(profile_limits::max_file_bytes) + " bytes for a profile");
  if (bytes.empty() || bytes.size() % sizeof(capnp::word) != 0)
    throw input_error("profile: not a Cap'n Proto message: " + std::to_string(bytes.size()) +
                      " bytes is not a whole, non-zero number of 8-byte words");
  // Copied: the reader needs word alignment, which bytes from a file buffer need not have.
  kj::Array<capnp::word> words = kj::heapArray<capnp::word>(bytes.size() / sizeof(capnp::word));
  std::memcpy(words.begin(), bytes.data(), bytes.size());
  planning::profile p;
  try {
    p = read_message(words);
  } catch (const kj::Exception& e) {
    throw input_error(std::string("profile: not a Cap'n Proto profile (") + e.getDescription().cStr() + ")");
  }
  validate_profile(p);
  return p;
}

std::vector<std::byte> profile_to_capnp(const planning::profile& p) {
  capnp::MallocMessageBuilder message;
  auto root = message.initRoot<schema::Profile>();
  root.setModel(text_of(p.model));
  root.setConfigHash(text_of(p.config_hash));
  root.setDeviceKind(text_of(p.device_kind));
  root.setMicrobatchSize(checked_cast<std::uint32_t>(p.microbatch_size, "profile.microbatch_size"));
  root.setGpusPerNode(checked_cast<std::uint32_t>(p.gpus_per_node, "profile.gpus_per_node"));
  root.setDeviceMemoryBytes(checked_cast<std::uint64_t>(p.device_memory_bytes, "profile.device_memory_bytes"));
  auto layers = root.initLayers(checked_cast<unsigned>(p.layers.size(), "profile.layers"));
  for (unsigned i = 0; i < p.layers.size(); ++i) {
    const auto& l = p.layers[i];
    const std::string path = "profile.layers[" + std::to_string(i) + "]";
    auto out = layers[i];
    out.setName(text_of(l.name));
    auto fwd = out.initForwardMs(checked_cast<unsigned>(l.forward_ms.size(), path + ".forward_ms"));
    for (unsigned k = 0; k < l.forward_ms.size(); ++k) fwd.set(k, l.forward_ms[k]);
    auto bwd = out.initBackwardMs(checked_cast<unsigned>(l.backward_ms.size(), path + ".backward_ms"));
    for (unsigned k = 0; k < l.backward_ms.size(); ++k) bwd.set(k, l.backward_ms[k]);
    out.setParamBytes(checked_cast<std::uint64_t>(l.param_bytes, path + ".param_bytes"));
    out.setActivationBytes(checked_cast<std::uint64_t>(l.activation_bytes, path + ".activation_bytes"));
    out.setOutputBytes(checked_cast<std::uint64_t>(l.output_bytes, path + ".output_bytes"));
    out.setOptimizerMs(l.optimizer_ms);
  }
  if (p.link != planning::link_profile{}) {
    auto link = root.initLink();
    link.setLatencyMs(p.link.latency_ms);
    link.setBytesPerMs(p.link.bytes_per_ms);
  }
  const auto words = capnp::messageToFlatArray(message);
  const auto bytes = words.asBytes();
  std::vector<std::byte> out(bytes.size());
  std::memcpy(out.data(), bytes.begin(), bytes.size());
  return out;
}

}  // namespace oobleck::messages
