#include "runtime/layer_copies.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "runtime/communicator.hpp"
#include "runtime/host_communicator.hpp"
#include "runtime/transport/host_transport.hpp"

namespace oobleck::runtime {

using time_point = std::chrono::steady_clock::time_point;

namespace {

/// Tags of the copy plan's messages: far above the executor's (which count microbatches).
int copy_tag(int layer, int part) { return (1 << 24) + layer * 4 + part; }

/// The message a receiving rank sends each of its sources once it can take their layers.
constexpr int copy_ready_tag = (1 << 24) - 1;

/// Bytes as a tensor that owns them: the transport keeps it until they are written.
torch::Tensor owning_tensor(std::vector<std::byte> bytes) {
  auto* owned = new std::vector<std::byte>(std::move(bytes));
  return torch::from_blob(
      owned->data(), {static_cast<std::int64_t>(owned->size())}, [owned](void*) { delete owned; }, torch::kUInt8);
}

std::int64_t micros(time_point from, time_point to) {
  return std::chrono::duration_cast<std::chrono::microseconds>(to - from).count();
}

/// What a rank receives: every message of its incoming layers, per source in the order the
/// source sends them (plan order; one link delivers them in that order).
struct receive_plan {
  std::vector<torch::Tensor> headers;  ///< one per incoming layer, in plan order
  std::vector<int> sources;            ///< in the order of their first layer in the plan
  std::vector<std::vector<host_communicator::tensor_recv>> from;  ///< per source
};

/// Checks that this rank may receive what the plan sends it, into `incoming` in plan order
/// (std::logic_error otherwise).
void check_receives(const std::vector<copy_entry>& plan, std::int32_t rank, bool runs_stages,
                    const std::vector<layer_store::incoming>& incoming) {
  std::size_t next = 0;
  for (const auto& c : plan) {
    if (c.target != rank) continue;
    if (!runs_stages)
      throw std::logic_error("the copy plan sends layer " + std::to_string(c.layer) + " to rank " +
                             std::to_string(rank) + ", which runs no stage");
    if (next >= incoming.size() || incoming[next].layer() != c.layer)
      throw std::logic_error("layer_copies::run: the incoming layers do not follow the copy plan");
    ++next;
  }
  if (next != incoming.size()) throw std::logic_error("layer_copies::run: more incoming layers than the copy plan sends");
}

receive_plan plan_receives(const std::vector<copy_entry>& plan, std::int32_t rank, bool runs_stages,
                           const std::vector<layer_store::incoming>& incoming) {
  check_receives(plan, rank, runs_stages, incoming);
  receive_plan p;
  std::size_t next = 0;
  for (const auto& c : plan) {
    if (c.target != rank) continue;
    p.headers.push_back(
        torch::empty({static_cast<std::int64_t>(layer_store::copy_header_bytes())}, torch::kUInt8));
    auto s = std::find(p.sources.begin(), p.sources.end(), c.source);
    if (s == p.sources.end()) {
      p.sources.push_back(c.source);
      p.from.emplace_back();
      s = p.sources.end() - 1;
    }
    auto& items = p.from[static_cast<std::size_t>(s - p.sources.begin())];
    items.push_back({p.headers.back(), c.source, copy_tag(c.layer, 0)});
    int part = 1;
    for (const auto& buffer : incoming[next].buffers()) items.push_back({buffer, c.source, copy_tag(c.layer, part++)});
    ++next;
  }
  return p;
}

/// Installs the received layers, each with its header (host bytes), in plan order.
void install(layer_store& store, std::vector<layer_store::incoming>& incoming, const std::vector<torch::Tensor>& headers) {
  for (std::size_t k = 0; k < incoming.size(); ++k)
    store.adopt(std::move(incoming[k]), {static_cast<const std::byte*>(headers[k].data_ptr()),
                                         static_cast<std::size_t>(headers[k].numel())});
}

/// What a rank sends: target rank -> the layers it gets from this rank, in plan order.
std::map<int, std::vector<int>> plan_sends(const layer_store& store, const std::vector<copy_entry>& plan,
                                          std::int32_t rank) {
  std::map<int, std::vector<int>> to_target;
  for (const auto& c : plan) {
    if (c.source != rank) continue;
    if (!store.holds(c.layer))
      throw std::logic_error("the copy plan sends layer " + std::to_string(c.layer) + " from rank " +
                             std::to_string(rank) + ", which does not hold it");
    to_target[c.target].push_back(c.layer);
  }
  return to_target;
}

/// A source's link, in this rank's clock: this rank's ready sent, the source's first and last
/// messages arrived.
struct source_span {
  std::optional<time_point> ready, first, last;
};

}  // namespace

std::int64_t micros_since(time_point since) { return micros(since, std::chrono::steady_clock::now()); }

std::int64_t covered_micros(std::vector<std::pair<time_point, time_point>> spans) {
  std::sort(spans.begin(), spans.end());
  std::int64_t total = 0;
  std::optional<std::pair<time_point, time_point>> run;  // the union's current piece
  for (const auto& [from, to] : spans) {
    if (to <= from) continue;
    if (run && from <= run->second) {
      run->second = std::max(run->second, to);
      continue;
    }
    if (run) total += micros(run->first, run->second);
    run = {from, to};
  }
  if (run) total += micros(run->first, run->second);
  return total;
}

layer_copies::layer_copies(layer_store& store, std::int32_t rank, bool runs_stages, std::vector<copy_entry> plan)
    : store_(store), rank_(rank), runs_stages_(runs_stages), plan_(std::move(plan)) {
  for (const auto& c : plan_)
    if (c.target == rank_) incoming_.push_back(store_.prepare_incoming(c.layer));
}

std::int64_t layer_copies::bytes() const {
  std::int64_t total = 0;
  const auto header = static_cast<std::int64_t>(layer_store::copy_header_bytes());
  for (const auto& in : incoming_) {
    total += header;
    for (const auto& b : in.buffers()) total += static_cast<std::int64_t>(b.nbytes());
  }
  for (const auto& c : plan_)
    if (c.source == rank_ && store_.holds(c.layer))  // run() refuses the plan otherwise
      total += header + 3 * static_cast<std::int64_t>(store_.flat_parameters(c.layer).nbytes());
  return total;
}

std::chrono::milliseconds layer_copies::time_limit(std::chrono::milliseconds connect_timeout) const {
  const double seconds = static_cast<double>(bytes()) / copy_floor_bytes_per_second;
  return connect_timeout + std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000.0) + 1);
}

std::uint64_t largest_frame_bytes(const gpt_config& model, std::int64_t microbatch) {
  // Parameters per layer (runtime/gpt_model.cpp): the embeddings, a block (gpt2's, with its q/k/v
  // bias: 3d more than oobleck-gpt's), the head (a tied one holds the embedding's matrix instead).
  const auto d = static_cast<std::uint64_t>(model.d_model);
  const auto vocab = static_cast<std::uint64_t>(model.vocab);
  const auto seq = static_cast<std::uint64_t>(model.seq_len);
  const std::uint64_t layer_floats = std::max({(vocab + seq) * d, 12 * d * d + 13 * d, vocab * d + 2 * d});
  const std::uint64_t activation_floats = static_cast<std::uint64_t>(std::max<std::int64_t>(microbatch, 1)) * seq * d;
  const std::uint64_t segment_bytes = std::uint64_t{1} << 20;  // the all-reduce's (transport_collectives.cpp)
  const std::uint64_t largest =
      std::max({layer_floats * sizeof(float), activation_floats * sizeof(float), segment_bytes,
                static_cast<std::uint64_t>(layer_store::copy_header_bytes())});
  return 2 * largest;
}

copy_timing layer_copies::run(host_transport& transport, host_communicator& comm) {
  return run(transport, comm, time_limit(std::chrono::seconds(30)));
}

copy_timing layer_copies::run(communicator& comm) {
  const auto started = std::chrono::steady_clock::now();
  std::vector<layer_store::incoming> incoming = std::move(incoming_);
  check_receives(plan_, rank_, runs_stages_, incoming);
  const std::map<int, std::vector<int>> to_target = plan_sends(store_, plan_, rank_);
  copy_timing t;
  std::vector<torch::Tensor> headers;  // received, in plan order, on the host
  time_point receiving = started;
  std::optional<time_point> first;
  try {
    for (const auto& [target, layers] : to_target)
      for (int layer : layers) {
        auto source = store_.copy_of(layer);
        const auto header = owning_tensor(std::move(source.header)).to(source.buffers.front().device());
        comm.send(header, target, copy_tag(layer, 0));
        t.bytes_sent += header.numel();
        for (std::size_t k = 0; k < source.buffers.size(); ++k) {
          comm.send(source.buffers[k], target, copy_tag(layer, 1 + static_cast<int>(k)));
          t.bytes_sent += static_cast<std::int64_t>(source.buffers[k].nbytes());
        }
      }
    receiving = std::chrono::steady_clock::now();
    std::size_t next = 0;
    for (const auto& c : plan_) {
      if (c.target != rank_) continue;
      auto buffers = incoming[next++].buffers();
      auto header = torch::empty({static_cast<std::int64_t>(layer_store::copy_header_bytes())},
                                 torch::TensorOptions().dtype(torch::kUInt8).device(buffers.front().device()));
      comm.recv(header, c.source, copy_tag(c.layer, 0));
      if (!first) first = std::chrono::steady_clock::now();
      t.bytes_received += header.numel();
      for (std::size_t k = 0; k < buffers.size(); ++k) {
        comm.recv(buffers[k], c.source, copy_tag(c.layer, 1 + static_cast<int>(k)));
        t.bytes_received += static_cast<std::int64_t>(buffers[k].nbytes());
      }
      headers.push_back(header.cpu());
    }
  } catch (...) {
    comm.abort();  // the epoch's data plane is done for: its peers' waits on this rank fail too
    throw;
  }
  install(store_, incoming, headers);
  t.copies_us = micros_since(started);
  t.copy_wait_us = first ? micros(receiving, *first) : 0;
  return t;
}

copy_timing layer_copies::run(host_transport& transport, host_communicator& comm, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  layer_store& store = store_;
  std::vector<layer_store::incoming> incoming = std::move(incoming_);
  const receive_plan in = plan_receives(plan_, rank_, runs_stages_, incoming);
  const std::map<int, std::vector<int>> to_target = plan_sends(store, plan_, rank_);
  copy_timing t;

  // A thread per source and one per target, so that each link runs as soon as it is up,
  // whatever the rest of the mesh does. A source's thread posts every receive of its layers,
  // then tells it this rank is ready; a target's thread sends the target its layers once the
  // target is ready, and, when the target is also a source of this rank, only after this rank's
  // own ready went out on that link: two ranks copying both ways never find their ready queued
  // behind each other's layers.
  std::mutex mu;
  std::condition_variable cv;
  std::exception_ptr failed;
  std::vector<source_span> from_source(in.sources.size());
  std::vector<std::pair<time_point, time_point>> sends(to_target.size());  // target's ready -> sends posted
  std::vector<bool> ready_sent(in.sources.size(), false);  // or the source's thread has ended
  std::vector<std::size_t> arrived(in.sources.size(), 0);  // messages received, per source
  std::vector<bool> sends_done(to_target.size(), false);
  std::size_t finished = 0;  // threads that have ended
  // The first failure ends the epoch's data plane, so that the other threads fail at once
  // instead of waiting for a peer that will never send.
  auto guarded = [&](auto body) {
    try {
      body();
    } catch (...) {
      {
        std::lock_guard lock(mu);
        if (!failed) failed = std::current_exception();
      }
      transport.abort("a layer copy of rank " + std::to_string(rank_) + " failed");
    }
  };
  auto mark_finished = [&] {
    {
      std::lock_guard lock(mu);
      ++finished;
    }
    cv.notify_all();
  };
  auto mark_ready_sent = [&](std::size_t s) {
    {
      std::lock_guard lock(mu);
      ready_sent[s] = true;
    }
    cv.notify_all();
  };
  std::vector<std::int64_t> sent(to_target.size(), 0);
  {
    const auto ready = torch::zeros({1}, torch::kUInt8);
    std::vector<std::jthread> threads;  // joined before `ready` goes
    for (std::size_t s = 0; s < in.sources.size(); ++s)
      threads.emplace_back([&, s] {
        const int source = in.sources[s];
        guarded([&] {
          comm.recv_all(
              in.from[s],
              [&](std::size_t i) {
                const auto now = std::chrono::steady_clock::now();
                std::lock_guard lock(mu);
                arrived[s] = i + 1;
                if (i == 0) from_source[s].first = now;
                if (i + 1 == in.from[s].size()) from_source[s].last = now;
              },
              [&] {  // every receive of this source is posted
                transport.wait_connected(source);
                {
                  std::lock_guard lock(mu);  // taken before the ready: no byte of the link travels earlier
                  from_source[s].ready = std::chrono::steady_clock::now();
                }
                comm.send(ready, source, copy_ready_tag);
                mark_ready_sent(s);
              });
        });
        mark_ready_sent(s);  // also when it failed: the targets' threads then fail on the aborted transport
        mark_finished();
      });
    std::size_t i = 0;
    for (const auto& [target_rank, target_layers] : to_target) {
      threads.emplace_back([&, i, target = target_rank, &layers = target_layers] {
        guarded([&] {
          transport.wait_connected(target);
          if (const auto s = std::find(in.sources.begin(), in.sources.end(), target); s != in.sources.end()) {
            std::unique_lock lock(mu);
            cv.wait(lock, [&] { return ready_sent[static_cast<std::size_t>(s - in.sources.begin())]; });
          }
          auto go_ahead = torch::empty({1}, torch::kUInt8);
          comm.recv(go_ahead, target, copy_ready_tag);
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
          std::lock_guard lock(mu);
          sends[i] = {go, std::chrono::steady_clock::now()};
          sends_done[i] = true;
        });
        mark_finished();
      });
      ++i;
    }
    // The deadline: a peer that neither sends nor fails (frozen, or never there) would otherwise
    // hold the epoch's forming for good. Its expiry fails the copies like a lost peer.
    std::unique_lock lock(mu);
    if (!cv.wait_until(lock, deadline, [&] { return finished == threads.size(); })) {
      std::ostringstream why;
      int late = -1;
      why << "layer copies of rank " << rank_ << " missed their deadline of " << limit.count() << " ms:";
      for (std::size_t k = 0; k < in.sources.size(); ++k)
        if (arrived[k] < in.from[k].size()) {
          if (late < 0) late = in.sources[k];
          why << " rank " << in.sources[k] << " sent " << arrived[k] << " of its " << in.from[k].size()
              << " messages;";
        }
      std::size_t k = 0;
      for (const auto& [target_rank, target_layers] : to_target) {
        if (!sends_done[k++]) {
          if (late < 0) late = target_rank;
          why << " rank " << target_rank << " has not taken its " << target_layers.size() << " layer(s);";
        }
      }
      why << " presumed lost";
      if (!failed) failed = std::make_exception_ptr(transport_error(transport_failure::peer_lost, late, why.str()));
      lock.unlock();
      transport.abort(why.str());  // every thread's wait fails now; they end before the scope does
    }
  }
  if (failed) std::rethrow_exception(failed);
  for (auto bytes : sent) t.bytes_sent += bytes;
  for (const auto& items : in.from)
    for (const auto& r : items) t.bytes_received += static_cast<std::int64_t>(r.t.nbytes());
  install(store, incoming, in.headers);
  const auto installed = std::chrono::steady_clock::now();

  // Every byte of a copy travels within its link's span (a source waits for its target's
  // ready), so the time during which some link of this rank was copying covers them all; the
  // layers are installed after the last byte has arrived. Time before a link came up is the
  // mesh's, not the copies'.
  std::vector<std::pair<time_point, time_point>> spans = std::move(sends);
  std::optional<time_point> last_arrival;
  for (const auto& l : from_source) {
    spans.emplace_back(*l.ready, *l.last);
    last_arrival = std::max(last_arrival.value_or(*l.last), *l.last);
    t.copy_wait_us = std::max(t.copy_wait_us, micros(*l.ready, *l.first));
  }
  t.copies_us = covered_micros(std::move(spans)) + (last_arrival ? micros(*last_arrival, installed) : 0);
  return t;
}

}  // namespace oobleck::runtime
