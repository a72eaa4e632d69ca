// The NCCL communicator on a GPU (label `cuda`; built with OOBLECK_WITH_CUDA=ON, run by
// scripts/gpu/test.sh on a machine with a GPU). Where CUDA headers exist but no GPU build is
// configured, CI compiles this file without linking or running it, so it cannot rot.
//
// NCCL refuses two ranks of one communicator on one GPU ("Duplicate GPU detected"), so the cases
// of several ranks need as many GPUs and say SKIPPED otherwise; the cases of one rank, abort
// included, run on any single GPU.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <thread>
#include <vector>

#include "runtime/nccl_communicator.hpp"

using oobleck::runtime::comm_error;
using oobleck::runtime::nccl_communicator;

namespace {

/// The visible GPUs, counted in a child process: CUDA initialised in this process before a fork
/// would not work in the forked ranks (each test case runs in a process of its own under CTest).
int gpus() {
  const pid_t pid = fork();
  if (pid == 0) _exit(torch::cuda::is_available() ? std::min<int>(static_cast<int>(torch::cuda::device_count()), 100) : 0);
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return 0;
  return WEXITSTATUS(status);
}

torch::TensorOptions on(int device) {
  return torch::TensorOptions().dtype(torch::kFloat32).device(torch::kCUDA, static_cast<c10::DeviceIndex>(device));
}

/// Runs `body(rank, comm)` in `world` forked processes, rank r on GPU r, all joined to one
/// communicator; true when every process exited 0. The parent touches no CUDA before forking.
bool in_processes(int world, const std::function<void(int, nccl_communicator&)>& body) {
  std::vector<std::array<int, 2>> pipes(static_cast<std::size_t>(world));
  for (auto& p : pipes)
    if (pipe(p.data()) != 0) return false;
  std::vector<pid_t> children;
  for (int r = 0; r < world; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      int code = 0;
      try {
        std::vector<std::uint8_t> id(NCCL_UNIQUE_ID_BYTES);
        if (r == 0) {
          id = nccl_communicator::new_unique_id();
          for (int peer = 1; peer < world; ++peer)
            if (write(pipes[static_cast<std::size_t>(peer)][1], id.data(), id.size()) != static_cast<ssize_t>(id.size()))
              _exit(2);
        } else if (read(pipes[static_cast<std::size_t>(r)][0], id.data(), id.size()) != static_cast<ssize_t>(id.size())) {
          _exit(2);
        }
        nccl_communicator comm(r, world, id, r);
        comm.wait_ready();
        body(r, comm);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
        code = 1;
      }
      _exit(code);
    }
    children.push_back(pid);
  }
  bool ok = true;
  for (pid_t pid : children) {
    int status = 0;
    waitpid(pid, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  return ok;
}

void expect(bool condition, const char* what) {
  if (!condition) throw std::runtime_error(what);
}

}  // namespace

TEST_CASE("nccl: one rank joins, all-reduces and broadcasts over the world" * doctest::timeout(120)) {
  if (gpus() < 1) {
    MESSAGE("SKIPPED: no GPU visible");
    return;
  }
  nccl_communicator comm(0, 1, nccl_communicator::new_unique_id(), 0);
  comm.wait_ready();
  auto t = torch::arange(1 << 20, on(0));
  const auto before = t.clone();
  comm.all_reduce_sum(t, {0}, 0);
  CHECK(torch::equal(t, before));
  comm.broadcast(t, 0, {0}, 1);
  CHECK(torch::equal(t, before));
  comm.prepare_groups({{0}});  // a group of one rank needs no communicator
  CHECK_THROWS_AS(comm.send(t, 0, 0), std::invalid_argument);  // no link prepared
  CHECK_THROWS_AS(comm.all_reduce_sum(t, {0, 1}, 2), std::invalid_argument);  // rank outside the world
}

TEST_CASE("nccl: abort releases a communicator whose peers never join, and a new one works after" *
          doctest::timeout(120)) {
  if (gpus() < 1) {
    MESSAGE("SKIPPED: no GPU visible");
    return;
  }
  // A world of 2 of which only rank 0 exists: joining stays pending until abort.
  nccl_communicator pending(0, 2, nccl_communicator::new_unique_id(), 0);
  const auto start = std::chrono::steady_clock::now();
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    pending.abort();
  });
  CHECK_THROWS_AS(pending.wait_ready(), comm_error);
  aborter.join();
  const auto took = std::chrono::steady_clock::now() - start;
  CHECK(took < std::chrono::seconds(10));
  CHECK(pending.aborted());
  auto t = torch::ones({16}, on(0));
  CHECK_THROWS_AS(pending.all_reduce_sum(t, {0, 1}, 0), comm_error);

  // Re-creation after an abort: the next epoch's communicator.
  nccl_communicator next(0, 1, nccl_communicator::new_unique_id(), 0);
  next.all_reduce_sum(t, {0}, 0);
  CHECK(torch::equal(t, torch::ones({16}, on(0))));
}

TEST_CASE("nccl: the device guard leaves the calling thread's device as it was" * doctest::timeout(120)) {
  if (gpus() < 2) {
    MESSAGE("SKIPPED: needs 2 GPUs (" << gpus() << " visible)");
    return;
  }
  nccl_communicator comm(0, 1, nccl_communicator::new_unique_id(), 1);
  std::thread other([&] {
    // A thread that never chose a device (device 0), as the reducer and copy threads were.
    auto t = torch::ones({1024}, on(1));
    comm.all_reduce_sum(t, {0}, 0);
    int now = -1;
    cudaGetDevice(&now);
    CHECK(now == 0);
  });
  other.join();
}

TEST_CASE("nccl: two processes exchange large messages both ways at once (one link per direction)" *
          doctest::timeout(300)) {
  if (gpus() < 2) {
    MESSAGE("SKIPPED: needs 2 GPUs, NCCL refuses two ranks on one (" << gpus() << " visible)");
    return;
  }
  // Both ranks send first, then receive, 64 MiB each: far beyond NCCL's eager buffers. On one
  // communicator each send waits for a receive queued behind the other's send: a deadlock.
  CHECK(in_processes(2, [](int rank, nccl_communicator& comm) {
    comm.prepare_links({{0, 1}, {1, 0}});
    comm.prepare_groups({{0, 1}});
    const int peer = 1 - rank;
    const std::int64_t n = 16 << 20;
    for (int round = 0; round < 4; ++round) {
      auto out = torch::full({n}, static_cast<float>(rank * 10 + round), on(rank));
      auto in = torch::empty({n}, on(rank));
      comm.send(out, peer, round);
      comm.recv(in, peer, round);
      expect(torch::all(in == static_cast<float>(peer * 10 + round)).item<bool>(), "received the peer's values");
    }
    auto sum = torch::full({1000}, static_cast<float>(rank + 1), on(rank));
    comm.all_reduce_sum(sum, {1, 0}, 7);
    expect(torch::all(sum == 3.0F).item<bool>(), "all-reduce sums both ranks");
    auto b = torch::full({1000}, static_cast<float>(rank), on(rank));
    comm.broadcast(b, 1, {1, 0}, 8);  // the root is world rank 1, listed first
    expect(torch::all(b == 1.0F).item<bool>(), "broadcast from world rank 1");
  }));
}

TEST_CASE("nccl: groups prepared in two calls stay in step across ranks" * doctest::timeout(300)) {
  if (gpus() < 3) {
    MESSAGE("SKIPPED: needs 3 GPUs (" << gpus() << " visible)");
    return;
  }
  CHECK(in_processes(3, [](int rank, nccl_communicator& comm) {
    comm.prepare_groups({{0, 1}});
    comm.prepare_groups({{0, 1}, {1, 2}});  // rank 2 was no member of the first: same rounds all the same
    auto t = torch::ones({256}, on(rank));
    if (rank != 2) comm.all_reduce_sum(t, {0, 1}, 0);
    if (rank != 0) comm.all_reduce_sum(t, {1, 2}, 1);
    const float want = rank == 0 ? 2.0F : rank == 1 ? 4.0F : 3.0F;
    expect(torch::all(t == want).item<bool>(), "both groups summed");
  }));
}

TEST_CASE("nccl: a peer killed during a pending receive fails it within a bounded time" * doctest::timeout(300)) {
  if (gpus() < 2) {
    MESSAGE("SKIPPED: needs 2 GPUs (" << gpus() << " visible)");
    return;
  }
  CHECK(in_processes(2, [](int rank, nccl_communicator& comm) {
    comm.prepare_links({{1, 0}});
    if (rank == 1) _exit(0);  // gone without sending
    auto in = torch::empty({1 << 20}, on(0));
    std::thread watchdog([&] {
      // The control plane's part: a lost peer aborts the epoch's communicators.
      std::this_thread::sleep_for(std::chrono::seconds(2));
      comm.abort();
    });
    bool failed = false;
    try {
      comm.recv(in, 1, 0);
    } catch (const comm_error&) {
      failed = true;
    }
    watchdog.join();
    expect(failed, "the receive failed");
  }));
}
