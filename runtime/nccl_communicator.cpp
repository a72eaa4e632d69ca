#include "runtime/nccl_communicator.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

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
    default: throw std::invalid_argument("NCCL communicator: unsupported dtype");
  }
}

void check_device_tensor(const torch::Tensor& t) {
  if (!t.is_cuda() || !t.is_contiguous()) throw std::invalid_argument("NCCL communicator: tensors must be contiguous on a GPU");
}

ncclConfig_t non_blocking() {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  c.blocking = 0;
  return c;
}

}  // namespace

std::vector<std::uint8_t> nccl_communicator::new_unique_id() {
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) throw comm_error("ncclGetUniqueId failed");
  return {reinterpret_cast<std::uint8_t*>(id.internal), reinterpret_cast<std::uint8_t*>(id.internal) + NCCL_UNIQUE_ID_BYTES};
}

nccl_communicator::nccl_communicator(int rank, int world, const std::vector<std::uint8_t>& unique_id, int device)
    : rank_(rank), world_(world), device_(device) {
  if (unique_id.size() != NCCL_UNIQUE_ID_BYTES) throw std::invalid_argument("NCCL unique id has the wrong size");
  cuda_check(cudaSetDevice(device_), "cudaSetDevice");
  for (cudaStream_t* s : {&send_stream_, &recv_stream_, &collective_stream_})
    cuda_check(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking), "cudaStreamCreate");
  ncclUniqueId id;
  std::memcpy(id.internal, unique_id.data(), NCCL_UNIQUE_ID_BYTES);
  auto config = non_blocking();
  issued(ncclCommInitRankConfig(&world_comm_, world_, id, rank_, &config), world_comm_, "ncclCommInitRankConfig");
}

nccl_communicator::~nccl_communicator() {
  abort();
  for (auto& s : sends_) cudaEventDestroy(s.done);
  for (cudaStream_t s : {send_stream_, recv_stream_, collective_stream_})
    if (s) cudaStreamDestroy(s);
}

void nccl_communicator::issued(ncclResult_t r, ncclComm_t comm, const char* what) {
  while (r == ncclInProgress) {
    if (aborted_) throw comm_error(std::string(what) + ": aborted");
    std::this_thread::yield();
    if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) break;
  }
  if (r != ncclSuccess) throw comm_error(std::string(what) + ": " + ncclGetErrorString(r));
}

void nccl_communicator::wait(cudaStream_t stream, ncclComm_t comm, const char* what) {
  while (true) {
    const cudaError_t q = cudaStreamQuery(stream);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) cuda_check(q, what);
    if (aborted_) throw comm_error(std::string(what) + ": aborted");
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm, &async);
    if (async != ncclSuccess && async != ncclInProgress)
      throw comm_error(std::string(what) + ": " + ncclGetErrorString(async));
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void nccl_communicator::after_compute(cudaStream_t stream) {
  cudaEvent_t ready;
  cuda_check(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate");
  cuda_check(cudaEventRecord(ready, nullptr), "cudaEventRecord");  // LibTorch's default stream
  cuda_check(cudaStreamWaitEvent(stream, ready, 0), "cudaStreamWaitEvent");
  cudaEventDestroy(ready);
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
  check_device_tensor(t);
  std::lock_guard lock(mutex_);
  if (aborted_) throw comm_error("send: aborted");
  reap_sends();
  after_compute(send_stream_);
  issued(ncclSend(t.data_ptr(), t.numel(), nccl_type(t), peer, world_comm_, send_stream_), world_comm_, "ncclSend");
  pending_send s{t, nullptr};
  cuda_check(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming), "cudaEventCreate");
  cuda_check(cudaEventRecord(s.done, send_stream_), "cudaEventRecord");
  sends_.push_back(std::move(s));
}

void nccl_communicator::recv(torch::Tensor& t, int peer, int) {
  check_device_tensor(t);
  {
    std::lock_guard lock(mutex_);
    if (aborted_) throw comm_error("recv: aborted");
    after_compute(recv_stream_);
    issued(ncclRecv(t.data_ptr(), t.numel(), nccl_type(t), peer, world_comm_, recv_stream_), world_comm_, "ncclRecv");
  }
  wait(recv_stream_, world_comm_, "recv");
}

ncclComm_t nccl_communicator::group_comm(const std::vector<int>& group) {
  if (static_cast<int>(group.size()) == world_) return world_comm_;
  auto it = groups_.find(group);
  if (it == groups_.end()) throw std::invalid_argument("NCCL communicator: group was not prepared for this epoch");
  return it->second;
}

void nccl_communicator::prepare_groups(const std::vector<std::vector<int>>& groups) {
  std::lock_guard lock(mutex_);
  std::vector<std::vector<int>> distinct;
  for (const auto& g : groups)
    if (g.size() > 1 && static_cast<int>(g.size()) < world_ && !groups_.count(g) &&
        std::find(distinct.begin(), distinct.end(), g) == distinct.end())
      distinct.push_back(g);
  for (const auto& g : distinct) {
    const auto at = std::find(g.begin(), g.end(), rank_);
    const int color = at == g.end() ? NCCL_SPLIT_NOCOLOR : 0;
    const int key = at == g.end() ? 0 : static_cast<int>(at - g.begin());
    auto config = non_blocking();
    ncclComm_t sub = nullptr;
    issued(ncclCommSplit(world_comm_, color, key, &sub, &config), world_comm_, "ncclCommSplit");
    if (color != NCCL_SPLIT_NOCOLOR) groups_[g] = sub;
  }
}

void nccl_communicator::all_reduce_sum(torch::Tensor& t, const std::vector<int>& group, int /*tag: see communicator.hpp*/) {
  check_device_tensor(t);
  ncclComm_t comm;
  {
    std::lock_guard lock(mutex_);
    if (aborted_) throw comm_error("all-reduce: aborted");
    comm = group_comm(group);
    after_compute(collective_stream_);
    issued(ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t), ncclSum, comm, collective_stream_), comm,
           "ncclAllReduce");
  }
  wait(collective_stream_, comm, "all-reduce");
}

void nccl_communicator::broadcast(torch::Tensor& t, int root, const std::vector<int>& group, int /*tag*/) {
  check_device_tensor(t);
  ncclComm_t comm;
  {
    std::lock_guard lock(mutex_);
    if (aborted_) throw comm_error("broadcast: aborted");
    comm = group_comm(group);
    const auto at = std::find(group.begin(), group.end(), root);
    if (at == group.end()) throw std::invalid_argument("broadcast root is not in the group");
    after_compute(collective_stream_);
    issued(ncclBroadcast(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t), static_cast<int>(at - group.begin()), comm,
                         collective_stream_),
           comm, "ncclBroadcast");
  }
  wait(collective_stream_, comm, "broadcast");
}

void nccl_communicator::abort() {
  if (aborted_.exchange(true)) return;
  // ncclCommAbort frees the communicator and makes its pending operations fail; callers polling
  // in wait() see the flag first.
  std::lock_guard lock(mutex_);
  for (auto& [group, comm] : groups_) ncclCommAbort(comm);
  groups_.clear();
  if (world_comm_) ncclCommAbort(world_comm_);
  world_comm_ = nullptr;
}

}  // namespace oobleck::runtime
