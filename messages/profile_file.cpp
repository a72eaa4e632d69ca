#include "messages/profile_file.hpp"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/array.h>
#include <kj/exception.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "messages/profile.capnp.h"
#include "planning/profile_json.hpp"

namespace oobleck::messages {

namespace {

using planning::planning_error;

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw planning_error("cannot read profile " + path + ": " + std::strerror(errno));
  std::ostringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

planning::profile from_capnp(const std::string& bytes) {
  if (bytes.size() % sizeof(capnp::word) != 0) throw planning_error("size is not a whole number of 8-byte words");
  kj::Array<capnp::word> words = kj::heapArray<capnp::word>(bytes.size() / sizeof(capnp::word));
  std::memcpy(words.begin(), bytes.data(), bytes.size());
  capnp::FlatArrayMessageReader reader(words);
  auto root = reader.getRoot<schema::Profile>();
  planning::profile p;
  p.model = root.getModel().cStr();
  p.config_hash = root.getConfigHash().cStr();
  p.device_kind = root.getDeviceKind().cStr();
  p.microbatch_size = static_cast<int>(root.getMicrobatchSize());
  p.gpus_per_node = static_cast<int>(root.getGpusPerNode());
  p.device_memory_bytes = static_cast<std::int64_t>(root.getDeviceMemoryBytes());
  for (auto layer : root.getLayers()) {
    planning::layer_profile l;
    l.name = layer.getName().cStr();
    for (double t : layer.getForwardMs()) l.forward_ms.push_back(t);
    for (double t : layer.getBackwardMs()) l.backward_ms.push_back(t);
    l.param_bytes = static_cast<std::int64_t>(layer.getParamBytes());
    l.activation_bytes = static_cast<std::int64_t>(layer.getActivationBytes());
    p.layers.push_back(std::move(l));
  }
  return p;
}

}  // namespace

planning::profile read_profile_file(const std::string& path) {
  const std::string bytes = read_all(path);
  const auto first = bytes.find_first_not_of(" \t\r\n");
  try {
    if (first != std::string::npos && bytes[first] == '{') return planning::profile_from_json(bytes);
    planning::profile p;
    try {
      p = from_capnp(bytes);
    } catch (const kj::Exception& e) {
      throw planning_error(std::string("not a Cap'n Proto profile (") + e.getDescription().cStr() + ")");
    }
    planning::validate(p);
    return p;
  } catch (const planning_error& e) {
    throw planning_error(path + ": " + e.what());
  }
}

void write_profile_capnp(const planning::profile& p, const std::string& path) {
  capnp::MallocMessageBuilder message;
  auto root = message.initRoot<schema::Profile>();
  root.setModel(p.model);
  root.setConfigHash(p.config_hash);
  root.setDeviceKind(p.device_kind);
  root.setMicrobatchSize(static_cast<std::uint32_t>(p.microbatch_size));
  root.setGpusPerNode(static_cast<std::uint32_t>(p.gpus_per_node));
  root.setDeviceMemoryBytes(static_cast<std::uint64_t>(p.device_memory_bytes));
  auto layers = root.initLayers(static_cast<unsigned>(p.layers.size()));
  for (unsigned i = 0; i < p.layers.size(); ++i) {
    const auto& l = p.layers[i];
    auto out = layers[i];
    out.setName(l.name);
    auto fwd = out.initForwardMs(static_cast<unsigned>(l.forward_ms.size()));
    for (unsigned k = 0; k < l.forward_ms.size(); ++k) fwd.set(k, l.forward_ms[k]);
    auto bwd = out.initBackwardMs(static_cast<unsigned>(l.backward_ms.size()));
    for (unsigned k = 0; k < l.backward_ms.size(); ++k) bwd.set(k, l.backward_ms[k]);
    out.setParamBytes(static_cast<std::uint64_t>(l.param_bytes));
    out.setActivationBytes(static_cast<std::uint64_t>(l.activation_bytes));
  }
  const auto words = capnp::messageToFlatArray(message);
  const auto bytes = words.asBytes();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.begin()), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw planning_error("cannot write profile " + path);
}

void write_profile_json(const planning::profile& p, const std::string& path) {
  std::ofstream out(path, std::ios::trunc);
  out << planning::json::dump(planning::profile_to_json(p), 2) << "\n";
  if (!out) throw planning_error("cannot write profile " + path);
}

}  // namespace oobleck::messages
