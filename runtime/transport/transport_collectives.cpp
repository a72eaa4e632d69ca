// Collectives built on the framed point-to-point path: ring all-reduce and broadcast.

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>

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

/// Segment size of the ring all-reduce: small enough that reducing one segment overlaps the
/// transfer of the next and the received partial sums stay in cache, large enough that the
/// per-message hand-offs between threads stay cheap. 512 KiB - 4 MiB measured alike on loopback
/// (2-4 processes, 16-64 MiB); 256 KiB was 15-35% slower.
constexpr std::size_t segment_floats = (std::size_t{1} << 20) / sizeof(float);

/// acc[k] = partial[k] + acc[k]: the partial sum of the members before this one, plus ours.
void add_into(float* __restrict acc, const std::byte* __restrict partial, std::size_t count) {
  for (std::size_t k = 0; k < count; ++k) {
    float v;  // memcpy: the body is raw bytes, not float objects
    std::memcpy(&v, partial + k * sizeof(float), sizeof(float));
    acc[k] = v + acc[k];
  }
}

/// Which of a collective's zero-copy sends the I/O thread has let go of: each send's keep-alive
/// marks its slot when released (written, or dropped with its link).
class send_tracker {
 public:
  /// A keep-alive for the next send; `index` receives its slot.
  static std::shared_ptr<const void> track(const std::shared_ptr<send_tracker>& self,
                                           std::size_t& index) {
    {
      std::lock_guard lock(self->mu_);
      index = self->done_.size();
      self->done_.push_back(0);
    }
    return std::shared_ptr<const void>(self.get(), [self, index](const void*) {
      {
        std::lock_guard lock(self->mu_);
        self->done_[index] = 1;
        ++self->released_;
      }
      self->cv_.notify_all();
    });
  }
  void wait(std::size_t index) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return done_[index] != 0; });
  }
  void wait_all() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return released_ == done_.size(); });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<char> done_;
  std::size_t released_ = 0;
};

/// Waits for every tracked send on the way out, normal or not: the caller's buffer must not be
/// read by the I/O thread once the collective has returned or thrown. Bounded: a written
/// send releases at once, and a peer that does not read (frozen) is abort()'s business, which
/// drops the send.
struct wait_for_sends {
  send_tracker& tracker;
  ~wait_for_sends() { tracker.wait_all(); }
};

}  // namespace

void host_transport::all_reduce_sum(std::span<const int> group, std::span<float> data,
                                    std::uint32_t tag) {
  state& s = *state_;
  const std::string op =
      "all_reduce_sum over " + describe_group(group) + " (tag " + std::to_string(tag) + ")";
  const std::size_t pos = position_in(op, group, s.config.rank, s.world);
  {
    auto lk = s.lock();
    s.throw_if_failed(lk, op, group);
  }
  const std::size_t n = group.size();
  if (n == 1) return;
  // Members on one machine sum through shared memory (transport_shm.hpp): the same bits.
  if (auto ch = s.shm_channel_for(op, group, pos, tag, data.size()); ch->usable) {
    s.shm_all_reduce(op, group, pos, data, tag, *ch);
    ++s.shm_all_reduces;
    return;
  }
  ++s.ring_all_reduces;
  const int next = group[(pos + 1) % n];
  const int prev = group[(pos + n - 1) % n];
  const std::uint64_t key = frame_key(channel::all_reduce, tag);

  // Chunk c is data[size*c/n, size*(c+1)/n); a chunk travels as segments of at most
  // segment_floats (at least one message per chunk and step, even when it is empty).
  const std::size_t seg = segment_floats;
  auto chunk_begin = [&](std::size_t c) { return data.size() * c / n; };
  auto segments = [&](std::size_t c) {
    const std::size_t len = chunk_begin(c + 1) - chunk_begin(c);
    return len == 0 ? std::size_t{1} : (len + seg - 1) / seg;
  };
  auto segment = [&](std::size_t c, std::size_t j) {
    const std::size_t begin = std::min(chunk_begin(c) + j * seg, chunk_begin(c + 1));
    const std::size_t end = std::min(begin + seg, chunk_begin(c + 1));
    return data.subspan(begin, end - begin);
  };

  // Sends go straight from `data`. The tracker knows which have been written; before this call
  // returns or throws, all of them have (or their link is gone), so `data` is the caller's again.
  const auto tracker = std::make_shared<send_tracker>();
  const wait_for_sends guard{*tracker};
  std::vector<std::vector<std::size_t>> sent(n);  // tracker index per segment sent, per chunk
  auto send_segment = [&](std::size_t c, std::size_t j) {
    std::size_t index = 0;
    auto keep = send_tracker::track(tracker, index);
    sent[c].push_back(index);
    s.post_frame(op, next, key, std::as_bytes(segment(c, j)), std::move(keep));
  };
  // Receives watch the whole group: when any member dies, the ring cannot finish, and the
  // members upstream of the hole would otherwise wait forever on a neighbour that gave up.
  auto receive_partial = [&](std::size_t c, std::size_t j) {
    recv_request req;
    req.take = true;
    s.wait_recv(op, prev, key, req, group);
    const std::size_t expected = segment(c, j).size_bytes();
    if (req.taken.size != expected)
      throw transport_error(transport_failure::mismatch, prev,
                            op + ": peer " + std::to_string(prev) + " sent a segment of " +
                                std::to_string(req.taken.size) + " bytes, expected " +
                                std::to_string(expected) +
                                " (different data sizes or call sequences)");
    return std::move(req.taken);
  };

  // Reduce-scatter: at step t, send chunk pos-t and fold the incoming partial sum of chunk
  // pos-t-1 into ours. Chunk c is thus summed once, in ring order starting at position c, and
  // this rank ends up owning the complete chunk pos+1. Pipelined: each segment is sent on as
  // soon as it is reduced (it is what step t+1 sends; after the last step, the complete chunk
  // that the all-gather starts with), so the next rank reduces it while this one reduces the
  // segment after it. The order of messages on the wire is the unsegmented algorithm's.
  for (std::size_t j = 0; j < segments(pos); ++j) send_segment(pos, j);
  for (std::size_t step = 0; step + 1 < n; ++step) {
    const std::size_t recv_c = (pos + 2 * n - step - 1) % n;
    for (std::size_t j = 0; j < segments(recv_c); ++j) {
      const payload in = receive_partial(recv_c, j);
      const std::span<float> acc = segment(recv_c, j);
      add_into(acc.data(), in.data.get(), acc.size());
      send_segment(recv_c, j);
    }
  }
  // All-gather: pass the complete chunks round the ring unchanged, so every member copies the
  // very bytes its owner computed. They are read straight into `data` and forwarded from there.
  // Receives are posted a few segments ahead, so that a segment arriving while this thread
  // forwards the one before it still lands in place instead of in an intermediate buffer. A
  // region is posted only once the send of the partial sum that was there has been written.
  struct item {
    std::size_t c, j;
    bool forward;
  };
  std::vector<item> items;
  for (std::size_t step = 0; step + 1 < n; ++step) {
    const std::size_t recv_c = (pos + n - step) % n;
    for (std::size_t j = 0; j < segments(recv_c); ++j) items.push_back({recv_c, j, step + 2 < n});
  }
  std::deque<recv_request> reqs;  // stable addresses: the mailbox points at them
  std::size_t waited = 0;
  // On the way out, normal or not, nothing may stay queued or be read into `data`.
  struct cancel_receives {
    state& s;
    int peer;
    std::uint64_t key;
    std::deque<recv_request>& reqs;
    const std::size_t& waited;
    ~cancel_receives() {
      for (std::size_t i = waited; i < reqs.size(); ++i) s.cancel_recv(peer, key, reqs[i]);
    }
  };
  const cancel_receives cancel{s, prev, key, reqs, waited};
  constexpr std::size_t lookahead = 8;
  for (std::size_t i = 0; i < items.size(); ++i) {
    while (reqs.size() < items.size() && reqs.size() < i + lookahead) {
      const item& next_item = items[reqs.size()];
      tracker->wait(sent[next_item.c][next_item.j]);
      recv_request& req = reqs.emplace_back();
      req.out = std::as_writable_bytes(segment(next_item.c, next_item.j));
      req.direct = true;
      s.post_recv(op, prev, key, req, group);
    }
    s.wait_posted(op, prev, key, reqs[i], group);
    waited = i + 1;
    if (items[i].forward) send_segment(items[i].c, items[i].j);
  }
}

host_transport::all_reduce_paths host_transport::all_reduce_counts() const {
  return {.ring = state_->ring_all_reduces.load(), .shared_memory = state_->shm_all_reduces.load()};
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
      auto lk = s.lock();
      s.throw_if_failed(lk, op, group);
    }
    // Flat: the root sends one shared copy to each member. Broadcasts here carry parameters of
    // a few layers to a few ranks; a pipelined tree is not worth it at that scale.
    const payload body = s.pool->copy_of(data);
    for (int member : group)
      if (member != root) s.post_payload(op, member, key, body);
    return;
  }
  recv_request req;
  req.out = data;
  req.direct = true;
  s.wait_recv(op, root, key, req, {});
}

}  // namespace oobleck::runtime
