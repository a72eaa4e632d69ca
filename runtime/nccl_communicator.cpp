#include "runtime/nccl_communicator.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "runtime/cuda_stream.hpp"
#include "runtime/nccl_id.hpp"
#include "runtime/nccl_plan.hpp"

namespace oobleck::runtime {

namespace {

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw comm_error(std::string(what) + ": " + cudaGetErrorString(e));
}

ncclDataType_t nccl_type(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kFloat32: return ncclFloat32;
    case torch::kFloat16: return ncclFloat16;
    case torch::kBFloat16: return ncclBfloat16;
    case torch::kInt64: return ncclInt64;
    case torch::kInt32: return ncclInt32;
    case torch::kUInt8: return ncclUint8;
    default: throw std::invalid_argument("NCCL communicator: unsupported dtype");
  }
}

void check_device_tensor(const torch::Tensor& t, int device) {
  if (!t.is_cuda() || !t.is_contiguous())
    throw std::invalid_argument("NCCL communicator: tensors must be contiguous on a GPU");
  if (t.get_device() != device)
    throw std::invalid_argument("NCCL communicator: a tensor on cuda:" + std::to_string(t.get_device()) +
                                " given to the communicator of cuda:" + std::to_string(device));
}

ncclConfig_t non_blocking() {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  c.blocking = 0;
  return c;
}

/// Makes `device` current on this thread for the guard's life, then restores the previous one.
class device_guard {
 public:
  explicit device_guard(int device) {
    cuda_check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) cuda_check(cudaSetDevice(device), "cudaSetDevice");
  }
  ~device_guard() {
    int now = previous_;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
  }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;

 private:
  int previous_ = 0;
};

/// `stream` waits (on the device) for the work queued so far on LibTorch's current stream.
void after_current(cudaStream_t stream, int device) {
  const cudaStream_t current = current_cuda_stream(device);
  if (current == stream) return;
  cudaEvent_t ready;
  cuda_check(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate");
  const cudaError_t recorded = cudaEventRecord(ready, current);
  const cudaError_t waited = recorded == cudaSuccess ? cudaStreamWaitEvent(stream, ready, 0) : recorded;
  cudaEventDestroy(ready);  // released once the wait it is part of has passed
  cuda_check(waited, "cudaStreamWaitEvent");
}

}  // namespace

std::vector<std::uint8_t> nccl_communicator::new_unique_id() {
  try {
    return new_nccl_unique_id();
  } catch (const std::runtime_error& e) {
    throw comm_error(e.what());
  }
}

nccl_communicator::nccl_communicator(int rank, int world, const std::vector<std::uint8_t>& unique_id, int device)
    : rank_(rank), world_(world), device_(device) {
  if (unique_id.size() != NCCL_UNIQUE_ID_BYTES) throw std::invalid_argument("NCCL unique id has the wrong size");
  if (world < 1 || rank < 0 || rank >= world) throw std::invalid_argument("NCCL communicator: rank outside the world");
  device_guard guard(device_);
  cuda_check(cudaStreamCreateWithFlags(&world_channel_.stream, cudaStreamNonBlocking), "cudaStreamCreate");
  for (int r = 0; r < world_; ++r) world_channel_.members.push_back(r);
  ncclUniqueId id;
  std::memcpy(id.internal, unique_id.data(), NCCL_UNIQUE_ID_BYTES);
  auto config = non_blocking();
  // Returns at once (non-blocking): the communicator is ready once every rank joined, which the
  // first operation (or wait_ready) waits for, abortably. The call sets world_channel_.comm even
  // while it is in progress; only then may it be polled.
  init_result_ = ncclCommInitRankConfig(&world_channel_.comm, world_, id, rank_, &config);
  if (init_result_ != ncclSuccess && init_result_ != ncclInProgress) {
    if (world_channel_.comm) ncclCommAbort(world_channel_.comm);
    cudaStreamDestroy(world_channel_.stream);
    throw comm_error(std::string("ncclCommInitRankConfig: ") + ncclGetErrorString(init_result_));
  }
}

void nccl_communicator::ready_locked() {
  if (ready_) return;
  issued(init_result_, world_channel_.comm, "ncclCommInitRankConfig");
  ready_ = true;
}

void nccl_communicator::wait_ready() {
  device_guard guard(device_);
  std::lock_guard lock(mutex_);
  if (aborted_) throw comm_error(comm_failure::aborted, -1, "ncclCommInitRankConfig: aborted");
  ready_locked();
}

nccl_communicator::~nccl_communicator() {
  abort();
  device_guard guard(device_);
  for (auto& s : sends_) cudaEventDestroy(s.done);
  auto destroy = [](channel& ch) {
    if (ch.stream) cudaStreamDestroy(ch.stream);
    ch.stream = nullptr;
  };
  destroy(world_channel_);
  for (auto& [key, ch] : groups_) destroy(ch);
  for (auto& [key, ch] : links_) destroy(ch);
}

void nccl_communicator::issued(ncclResult_t r, ncclComm_t comm, const char* what) {
  // Called with mutex_ held: abort() cannot free `comm` meanwhile; it sets the flag first.
  while (r == ncclInProgress) {
    if (aborted_) throw comm_error(comm_failure::aborted, -1, std::string(what) + ": aborted");
    std::this_thread::yield();
    if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) break;
  }
  if (r != ncclSuccess) throw comm_error(std::string(what) + ": " + ncclGetErrorString(r));
}

void nccl_communicator::wait(channel& ch, const char* what) {
  while (true) {
    const cudaError_t q = cudaStreamQuery(ch.stream);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) cuda_check(q, what);
    ncclResult_t async = ncclSuccess;
    {
      // Under the lock: abort() frees the communicator under it, and sets the flag before.
      std::lock_guard lock(mutex_);
      if (aborted_) throw comm_error(comm_failure::aborted, -1, std::string(what) + ": aborted");
      ncclCommGetAsyncError(ch.comm, &async);
    }
    if (async != ncclSuccess && async != ncclInProgress)
      throw comm_error(std::string(what) + ": " + ncclGetErrorString(async));
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

template <class Call>
void nccl_communicator::issue(channel& ch, const char* what, Call&& call) {
  std::lock_guard lock(mutex_);
  if (aborted_) throw comm_error(comm_failure::aborted, -1, std::string(what) + ": aborted");
  ready_locked();
  after_current(ch.stream, device_);
  issued(call(), ch.comm, what);
}

void nccl_communicator::make_rounds(const std::vector<nccl_plan::split_round>& rounds, bool links) {
  for (const auto& round : rounds) {
    const auto args = nccl_plan::args_of(round, rank_);
    auto config = non_blocking();
    ncclComm_t sub = nullptr;
    std::lock_guard lock(mutex_);
    if (aborted_) throw comm_error(comm_failure::aborted, -1, "ncclCommSplit: aborted");
    ready_locked();
    const ncclResult_t r =
        ncclCommSplit(world_channel_.comm, args.member() ? args.color : NCCL_SPLIT_NOCOLOR, args.key, &sub, &config);
    // A non-blocking split is finished when the new communicator says so (the parent's state
    // says nothing about it); a rank in no communicator of the round gets none to poll.
    issued(r, sub ? sub : world_channel_.comm, "ncclCommSplit");
    if (!args.member()) continue;
    channel ch;
    ch.comm = sub;
    ch.members = round.comms[static_cast<std::size_t>(args.color)];
    const cudaError_t made = cudaStreamCreateWithFlags(&ch.stream, cudaStreamNonBlocking);
    if (made != cudaSuccess) {
      ncclCommAbort(sub);
      cuda_check(made, "cudaStreamCreate");
    }
    if (links)
      links_[{ch.members[0], ch.members[1]}] = std::move(ch);
    else
      groups_[ch.members] = std::move(ch);
  }
}

void nccl_communicator::prepare_groups(const std::vector<std::vector<int>>& groups) {
  device_guard guard(device_);
  const auto rounds = nccl_plan::plan_groups(groups, groups_made_, world_);
  for (const auto& r : rounds) groups_made_.insert(groups_made_.end(), r.comms.begin(), r.comms.end());
  make_rounds(rounds, false);
}

void nccl_communicator::prepare_links(const std::vector<std::pair<int, int>>& links) {
  device_guard guard(device_);
  const auto rounds = nccl_plan::plan_links(links, links_made_, world_);
  for (const auto& r : rounds)
    for (const auto& c : r.comms) links_made_.emplace_back(c[0], c[1]);
  make_rounds(rounds, true);
}

nccl_communicator::channel& nccl_communicator::group_channel(const std::vector<int>& canonical) {
  if (nccl_plan::is_world(canonical, world_)) return world_channel_;
  auto it = groups_.find(canonical);
  if (it == groups_.end()) throw std::invalid_argument("NCCL communicator: group was not prepared for this epoch");
  return it->second;
}

nccl_communicator::channel& nccl_communicator::link_channel(int from, int to) {
  auto it = links_.find({from, to});
  if (it == links_.end())
    throw std::invalid_argument("NCCL communicator: no link from rank " + std::to_string(from) + " to rank " +
                                std::to_string(to) + " was prepared for this epoch");
  return it->second;
}

void nccl_communicator::reap_sends() {
  sends_.erase(std::remove_if(sends_.begin(), sends_.end(),
                              [](pending_send& s) {
                                if (cudaEventQuery(s.done) != cudaSuccess) return false;
                                cudaEventDestroy(s.done);
                                return true;
                              }),
               sends_.end());
}

void nccl_communicator::send(const torch::Tensor& t, int peer, int) {
  check_device_tensor(t, device_);
  device_guard guard(device_);
  channel& ch = link_channel(rank_, peer);
  issue(ch, "ncclSend", [&] { return ncclSend(t.data_ptr(), t.numel(), nccl_type(t), 1, ch.comm, ch.stream); });
  std::lock_guard lock(mutex_);
  reap_sends();
  pending_send s{t, nullptr};
  cuda_check(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming), "cudaEventCreate");
  cuda_check(cudaEventRecord(s.done, ch.stream), "cudaEventRecord");
  sends_.push_back(std::move(s));
}

void nccl_communicator::recv(torch::Tensor& t, int peer, int) {
  check_device_tensor(t, device_);
  device_guard guard(device_);
  channel& ch = link_channel(peer, rank_);
  issue(ch, "ncclRecv", [&] { return ncclRecv(t.data_ptr(), t.numel(), nccl_type(t), 0, ch.comm, ch.stream); });
  wait(ch, "recv");
}

void nccl_communicator::all_reduce_sum(torch::Tensor& t, const std::vector<int>& group, int /*tag: see header*/) {
  check_device_tensor(t, device_);
  device_guard guard(device_);
  const auto canonical = nccl_plan::canonical_group(group, world_);
  if (canonical.size() < 2 && !nccl_plan::is_world(canonical, world_)) return;  // one rank's sum: itself
  channel& ch = group_channel(canonical);
  issue(ch, "ncclAllReduce", [&] {
    return ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t), ncclSum, ch.comm, ch.stream);
  });
  wait(ch, "all-reduce");
}

void nccl_communicator::broadcast(torch::Tensor& t, int root, const std::vector<int>& group, int /*tag*/) {
  check_device_tensor(t, device_);
  device_guard guard(device_);
  const auto canonical = nccl_plan::canonical_group(group, world_);
  const int root_rank = nccl_plan::rank_in(canonical, root);  // in the communicator, not the world
  if (canonical.size() < 2 && !nccl_plan::is_world(canonical, world_)) return;
  channel& ch = group_channel(canonical);
  issue(ch, "ncclBroadcast", [&] {
    return ncclBroadcast(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t), root_rank, ch.comm, ch.stream);
  });
  wait(ch, "broadcast");
}

void nccl_communicator::abort() {
  if (aborted_.exchange(true)) return;
  // ncclCommAbort frees each communicator and makes its pending operations fail; every other
  // reader of a communicator holds the lock and checks the flag first.
  std::lock_guard lock(mutex_);
  int previous = 0;
  const bool switched = cudaGetDevice(&previous) == cudaSuccess && previous != device_ && cudaSetDevice(device_) == cudaSuccess;
  for (auto& [key, ch] : links_)
    if (ch.comm) ncclCommAbort(std::exchange(ch.comm, nullptr));
  for (auto& [key, ch] : groups_)
    if (ch.comm) ncclCommAbort(std::exchange(ch.comm, nullptr));
  if (world_channel_.comm) ncclCommAbort(std::exchange(world_channel_.comm, nullptr));
  if (switched) cudaSetDevice(previous);
}

}  // namespace oobleck::runtime
