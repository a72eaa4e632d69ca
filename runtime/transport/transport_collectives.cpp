// Collectives built on the framed point-to-point path: ring all-reduce and broadcast.

#include <algorithm>
#include <cstring>

#include "runtime/transport/transport_state.hpp"

namespace oobleck::runtime {

namespace {

/// This rank's position in `group`, after checking the group makes sense.
std::size_t position_in(const std::string& op, std::span<const int> group, int me, int world) {
  std::vector<int> sorted(group.begin(), group.end());
  std::sort(sorted.begin(), sorted.end());
  if (sorted.empty() || sorted.front() < 0 || sorted.back() >= world ||
      std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    throw std::invalid_argument(op + ": the group must be distinct ranks of 0.." +
                                std::to_string(world - 1));
  auto it = std::find(group.begin(), group.end(), me);
  if (it == group.end())
    throw std::invalid_argument(op + ": rank " + std::to_string(me) + " is not in the group");
  return static_cast<std::size_t>(it - group.begin());
}

}  // namespace

void host_transport::all_reduce_sum(std::span<const int> group, std::span<float> data,
                                    std::uint32_t tag) {
  state& s = *state_;
  const std::string op =
      "all_reduce_sum over " + describe_group(group) + " (tag " + std::to_string(tag) + ")";
  const std::size_t pos = position_in(op, group, s.config.rank, s.world);
  {
    std::unique_lock lock(s.mu);
    s.throw_if_failed(lock, op, group);
  }
  const std::size_t n = group.size();
  if (n == 1) return;
  const int next = group[(pos + 1) % n];
  const int prev = group[(pos + n - 1) % n];
  const std::uint64_t key = frame_key(channel::all_reduce, tag);

  auto chunk = [&](std::size_t c) {
    const std::size_t begin = data.size() * c / n;
    const std::size_t end = data.size() * (c + 1) / n;
    return data.subspan(begin, end - begin);
  };
  // Receives watch the whole group: when any member dies, the ring cannot finish, and the
  // members upstream of the hole would otherwise wait forever on a neighbour that gave up.
  auto receive = [&](std::size_t c) {
    recv_request req;
    req.take = true;
    s.wait_recv(op, prev, key, req, group);
    if (req.taken.size != chunk(c).size_bytes())
      throw transport_error(transport_failure::mismatch, prev,
                            op + ": peer " + std::to_string(prev) + " sent a chunk of " +
                                std::to_string(req.taken.size) + " bytes, expected " +
                                std::to_string(chunk(c).size_bytes()) +
                                " (different data sizes or call sequences)");
    return std::move(req.taken);
  };

  // Reduce-scatter: at step t, send chunk pos-t and fold the incoming partial sum of chunk
  // pos-t-1 into ours. Chunk c is thus summed once, in ring order starting at position c, and
  // this rank ends up owning the complete chunk pos+1.
  for (std::size_t step = 0; step + 1 < n; ++step) {
    const std::size_t send_c = (pos + n - step) % n;
    const std::size_t recv_c = (pos + 2 * n - step - 1) % n;
    s.post_send(op, next, key, s.pool->copy_of(std::as_bytes(chunk(send_c))));
    const payload in = receive(recv_c);
    const std::span<float> acc = chunk(recv_c);
    const std::byte* partial = in.data.get();
    for (std::size_t k = 0; k < acc.size(); ++k) {
      float v;  // memcpy: the body is raw bytes, not float objects
      std::memcpy(&v, partial + k * sizeof(float), sizeof(float));
      acc[k] = v + acc[k];
    }
  }
  // All-gather: pass the complete chunks round the ring unchanged, so every member copies the
  // very bytes its owner computed. What arrives is forwarded as is, without another copy.
  payload forward = s.pool->copy_of(std::as_bytes(chunk((pos + 1) % n)));
  for (std::size_t step = 0; step + 1 < n; ++step) {
    s.post_send(op, next, key, std::move(forward));
    const std::size_t recv_c = (pos + n - step) % n;
    forward = receive(recv_c);
    if (forward.size) std::memcpy(chunk(recv_c).data(), forward.data.get(), forward.size);
  }
}

void host_transport::broadcast(std::span<const int> group, int root, std::span<std::byte> data,
                               std::uint32_t tag) {
  state& s = *state_;
  const std::string op = "broadcast from " + std::to_string(root) + " over " +
                         describe_group(group) + " (tag " + std::to_string(tag) + ")";
  position_in(op, group, s.config.rank, s.world);
  if (std::find(group.begin(), group.end(), root) == group.end())
    throw std::invalid_argument(op + ": the root is not in the group");
  const std::uint64_t key = frame_key(channel::broadcast, tag);
  if (s.config.rank == root) {
    {
      // All or nothing: refuse before queueing anything if a member is already known lost.
      std::unique_lock lock(s.mu);
      s.throw_if_failed(lock, op, group);
    }
    // Flat: the root sends one shared copy to each member. Broadcasts here carry parameters of
    // a few layers to a few ranks; a pipelined tree is not worth it at that scale.
    const payload body = s.pool->copy_of(data);
    for (int member : group)
      if (member != root) s.post_send(op, member, key, body);
    return;
  }
  recv_request req;
  req.out = data;
  req.direct = true;
  s.wait_recv(op, root, key, req, {});
}

}  // namespace oobleck::runtime
