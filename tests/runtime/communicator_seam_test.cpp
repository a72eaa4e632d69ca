// The communicator seam (runtime/communicator.hpp), on each CPU implementation: collectives of
// different tags are independent (issued in different orders on different members, they still
// match by tag), and a failure says its kind and the peer it is attributed to.

#include <torch/torch.h>

#include <doctest/doctest.h>

#include <thread>

#include "runtime/device_spec.hpp"
#include "runtime/host_communicator.hpp"
#include "runtime/nccl_id.hpp"
#include "runtime/nccl_plane.hpp"
#include "runtime/transport_test_support.hpp"
#include "support/fake_communicator.hpp"

using namespace oobleck;
using runtime::comm_error;
using runtime::comm_failure;

namespace {

/// Rank 0 runs the tag-1 all-reduce, then the tag-2 one; rank 1 starts tag 2 first (on a thread)
/// and tag 1 only once `ready_for_tag1()` says rank 0 is waiting in tag 1. Tensors of the two
/// tags differ in size and value: matching by issue order alone would pair them wrongly.
template <class Comm, class Ready>
void opposite_orders(Comm& c0, Comm& c1, Ready ready_for_tag1) {
  const std::vector<int> group{0, 1};
  auto a0 = torch::full({5}, 1.0f), b0 = torch::full({3}, 10.0f);
  auto a1 = torch::full({5}, 2.0f), b1 = torch::full({3}, 20.0f);
  std::thread rank0([&] {
    c0.all_reduce_sum(a0, group, 1);
    c0.all_reduce_sum(b0, group, 2);
  });
  std::thread rank1_tag2([&] { c1.all_reduce_sum(b1, group, 2); });
  ready_for_tag1();
  c1.all_reduce_sum(a1, group, 1);
  rank0.join();
  rank1_tag2.join();
  CHECK(torch::equal(a0, torch::full({5}, 3.0f)));
  CHECK(torch::equal(a1, torch::full({5}, 3.0f)));
  CHECK(torch::equal(b0, torch::full({3}, 30.0f)));
  CHECK(torch::equal(b1, torch::full({3}, 30.0f)));
}

}  // namespace

TEST_CASE("communicator seam, fake: collectives of different tags are independent") {
  testing::fake_hub hub(2);
  // Both rank 0 (in tag 1) and rank 1's first thread (in tag 2) wait before tag 1 is issued.
  opposite_orders(hub.at(0), hub.at(1), [&] { REQUIRE(hub.wait_until_parked(2, std::chrono::seconds(10))); });
}

TEST_CASE("communicator seam, host transport: collectives of different tags are independent") {
  auto ts = runtime::transport_testing::make_transports(2, 1);
  const auto eps = runtime::transport_testing::endpoints_of(ts);
  std::thread connect1([&] { ts[1]->connect(eps); });
  ts[0]->connect(eps);
  connect1.join();
  runtime::host_communicator c0(*ts[0]), c1(*ts[1]);
  // No park signal here: rank 1 issues tag 1 after tag 2 has started; a transport that paired
  // collectives by issue order would mix the two whatever the timing.
  opposite_orders(c0, c1, [] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); });
}

TEST_CASE("communicator seam, fake: a crashed peer is peer_lost naming it, an abort is aborted") {
  testing::fake_hub hub(3);
  hub.crash(2);
  auto t = torch::ones({4});
  try {
    hub.at(0).all_reduce_sum(t, {0, 2}, 0);
    FAIL("no error");
  } catch (const comm_error& e) {
    CHECK(e.kind() == comm_failure::peer_lost);
    CHECK(e.peer() == 2);
  }
  hub.at(1).abort();
  try {
    hub.at(1).all_reduce_sum(t, {0, 1}, 0);
    FAIL("no error");
  } catch (const comm_error& e) {
    CHECK(e.kind() == comm_failure::aborted);
    CHECK(e.peer() == -1);
  }
}

TEST_CASE("communicator seam, host transport: a lost peer is peer_lost naming it, an abort is aborted") {
  auto ts = runtime::transport_testing::make_transports(3, 1);
  const auto eps = runtime::transport_testing::endpoints_of(ts);
  std::thread c1([&] { ts[1]->connect(eps); }), c2([&] { ts[2]->connect(eps); });
  ts[0]->connect(eps);
  c1.join();
  c2.join();
  runtime::host_communicator comm0(*ts[0]), comm1(*ts[1]);
  ts[2].reset();  // rank 2 leaves: to its peers, a crash
  auto t = torch::ones({4});
  try {
    comm0.all_reduce_sum(t, {0, 2}, 0);
    FAIL("no error");
  } catch (const comm_error& e) {
    CHECK(e.kind() == comm_failure::peer_lost);
    CHECK(e.peer() == 2);
  }
  ts[1]->abort("test");
  try {
    comm1.all_reduce_sum(t, {0, 1}, 0);
    FAIL("no error");
  } catch (const comm_error& e) {
    CHECK(e.kind() == comm_failure::aborted);
  }
}

TEST_CASE("the NCCL data plane in a build without CUDA: the coordinator's id and a stage's communicator refuse, saying why") {
  if (runtime::built_with_cuda()) return;  // the cuda-labelled tests run it for real
  auto why = [](auto&& call) {
    try {
      call();
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(why([] { runtime::new_nccl_unique_id(); }).find("an NCCL data plane needs NCCL: this build has no CUDA support") == 0);
  CHECK(why([] { runtime::start_nccl_epoch(0, 2, std::vector<std::uint8_t>(128), 0); })
            .find("the epoch's data plane is NCCL, but this worker cannot run it: this build has no CUDA support") == 0);
  testing::fake_hub hub(1);
  CHECK(why([&] { runtime::prepare_nccl_epoch(hub.at(0), {}, {}); }).find("this build has no CUDA support") !=
        std::string::npos);
}
