#include "actors/stage_copies.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "runtime/host_communicator.hpp"
#include "runtime/transport/host_transport.hpp"

namespace oobleck::actors {

using namespace oobleck::messages;

namespace {

/// Tags of the copy plan's messages: far above the executor's (which count microbatches).
int copy_tag(int layer, int part) { return (1 << 24) + layer * 4 + part; }

/// Bytes as a tensor that owns them: the transport keeps it until they are written.
torch::Tensor owning_tensor(std::vector<std::byte> bytes) {
  auto* owned = new std::vector<std::byte>(std::move(bytes));
  return torch::from_blob(
      owned->data(), {static_cast<std::int64_t>(owned->size())}, [owned](void*) { delete owned; }, torch::kUInt8);
}

/// The message a receiving rank sends each of its sources once it can take their layers.
constexpr int copy_ready_tag = (1 << 24) - 1;

}  // namespace

std::int64_t micros_since(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - since).count();
}

std::vector<runtime::layer_store::incoming> prepare_incoming(const runtime::layer_store& store,
                                                             const epoch_assignment& a) {
  std::vector<runtime::layer_store::incoming> out;
  for (const auto& c : a.copies)
    if (c.target == a.rank) out.push_back(store.prepare_incoming(c.layer));
  return out;
}

void run_copies(runtime::layer_store& store, runtime::host_transport& transport, runtime::host_communicator& comm,
                const epoch_assignment& a, std::vector<runtime::layer_store::incoming> incoming, form_timing& t) {
  using time_point = std::chrono::steady_clock::time_point;
  std::vector<torch::Tensor> headers;
  std::vector<runtime::host_communicator::tensor_recv> receives, rest;  // receives: each source's first header first
  std::vector<int> sources;
  std::size_t next = 0;
  for (const auto& c : a.copies) {
    if (c.target != a.rank) continue;
    if (a.stages.empty()) throw std::logic_error("the copy plan sends layer " + std::to_string(c.layer) + " to rank " +
                                                 std::to_string(a.rank) + ", which runs no stage");
    if (next >= incoming.size() || incoming[next].layer() != c.layer)
      throw std::logic_error("run_copies: the incoming layers do not follow the copy plan");
    headers.push_back(torch::empty({static_cast<std::int64_t>(runtime::layer_store::copy_header_bytes())}, torch::kUInt8));
    const bool is_first = std::find(sources.begin(), sources.end(), c.source) == sources.end();
    if (is_first) sources.push_back(c.source);
    (is_first ? receives : rest).push_back({headers.back(), c.source, copy_tag(c.layer, 0)});
    int part = 1;
    for (const auto& buffer : incoming[next].buffers()) rest.push_back({buffer, c.source, copy_tag(c.layer, part++)});
    ++next;
  }
  if (next != incoming.size()) throw std::logic_error("run_copies: more incoming layers than the copy plan sends");
  receives.insert(receives.end(), rest.begin(), rest.end());

  std::map<int, std::vector<int>> to_target;  // target rank -> the layers it gets from this rank, plan order
  for (const auto& c : a.copies) {
    if (c.source != a.rank) continue;
    if (!store.holds(c.layer))
      throw std::logic_error("the copy plan sends layer " + std::to_string(c.layer) + " from rank " +
                             std::to_string(a.rank) + ", which does not hold it");
    to_target[c.target].push_back(c.layer);
  }

  // Every part runs on a thread of its own; the first failure ends the epoch's data plane, so
  // that the others fail at once instead of waiting for a peer that will never send.
  std::mutex mu;
  std::exception_ptr failed;  // under mu
  auto guarded = [&](auto body) {
    try {
      body();
    } catch (...) {
      {
        std::lock_guard lock(mu);
        if (!failed) failed = std::current_exception();
      }
      transport.abort("a layer copy of rank " + std::to_string(a.rank) + " failed");
    }
  };
  std::vector<std::int64_t> sent(to_target.size(), 0), send_us(to_target.size(), 0);
  std::optional<time_point> ready_at;
  {
    std::vector<std::jthread> threads;
    if (!receives.empty())
      threads.emplace_back([&] {
        guarded([&] {
          for (int source : sources) transport.wait_connected(source);
          ready_at = std::chrono::steady_clock::now();
          const auto ready = torch::zeros({1}, torch::kUInt8);
          for (int source : sources) comm.send(ready, source, copy_ready_tag);
          // Each source's first header is waited for first: when the last of them has arrived,
          // every source has started, and the wait until then is the senders' skew.
          comm.recv_all(receives, [&](std::size_t i) {
            if (i + 1 == sources.size()) t.copy_wait_us = micros_since(*ready_at);
          });
        });
      });
    std::size_t i = 0;
    for (const auto& [target_rank, target_layers] : to_target) {
      threads.emplace_back([&, i, target = target_rank, &layers = target_layers] {
        guarded([&] {
          transport.wait_connected(target);
          auto ready = torch::empty({1}, torch::kUInt8);
          comm.recv(ready, target, copy_ready_tag);
          const auto go = std::chrono::steady_clock::now();
          for (int layer : layers) {
            auto source = store.copy_of(layer);
            const auto header = owning_tensor(std::move(source.header));
            comm.send(header, target, copy_tag(layer, 0));
            sent[i] += header.numel();
            for (std::size_t k = 0; k < source.buffers.size(); ++k) {
              comm.send(source.buffers[k], target, copy_tag(layer, 1 + static_cast<int>(k)));
              sent[i] += static_cast<std::int64_t>(source.buffers[k].nbytes());
            }
          }
          send_us[i] = micros_since(go);
        });
      });
      ++i;
    }
  }
  if (failed) std::rethrow_exception(failed);
  for (auto bytes : sent) t.bytes_sent += bytes;
  for (const auto& r : receives) t.bytes_received += static_cast<std::int64_t>(r.t.nbytes());
  for (std::size_t k = 0; k < incoming.size(); ++k)
    store.adopt(std::move(incoming[k]), {static_cast<const std::byte*>(headers[k].data_ptr()),
                                            static_cast<std::size_t>(headers[k].numel())});
  // Every byte of a copy travels within its receiver's span (its source waits for the ready),
  // so the slowest node's span covers them all.
  if (ready_at) t.copies_us = micros_since(*ready_at);
  for (auto us : send_us) t.copies_us = std::max(t.copies_us, us);
}

}  // namespace oobleck::actors
