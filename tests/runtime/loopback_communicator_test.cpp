// The hand-off between two stages of one node (runtime/loopback_communicator.hpp): messages to
// the node's own rank are matched by tag in send order, fail on a size mismatch, and abort wakes
// a waiting receiver; messages to other ranks go through the wrapped communicator.
#include <torch/torch.h>

#include <doctest/doctest.h>

#include <chrono>
#include <future>
#include <thread>

#include "runtime/loopback_communicator.hpp"
#include "support/fake_communicator.hpp"

using namespace oobleck;

TEST_CASE("loopback: messages to this rank arrive per tag in send order, others go to the wrapped communicator") {
  testing::fake_hub hub(2);
  runtime::loopback_communicator node0(hub.at(0));
  CHECK(node0.rank() == 0);
  node0.send(torch::full({4}, 1.0f), 0, 7);
  node0.send(torch::full({4}, 2.0f), 0, 7);
  node0.send(torch::full({2, 2}, 3.0f), 0, 8);
  auto t = torch::empty({2, 2});
  node0.recv(t, 0, 8);  // another tag: independent of the two queued before it
  CHECK(torch::equal(t, torch::full({2, 2}, 3.0f)));
  auto u = torch::empty({4});
  node0.recv(u, 0, 7);
  CHECK(torch::equal(u, torch::full({4}, 1.0f)));
  node0.recv(u, 0, 7);
  CHECK(torch::equal(u, torch::full({4}, 2.0f)));
  CHECK(hub.operations(0) == 0);  // nothing of it went through the wrapped communicator

  node0.send(torch::full({3}, 5.0f), 1, 7);  // to another rank: through the hub
  auto v = torch::empty({3});
  hub.at(1).recv(v, 0, 7);
  CHECK(torch::equal(v, torch::full({3}, 5.0f)));
}

TEST_CASE("loopback: a size mismatch is an error, and abort wakes a receiver waiting for this rank") {
  testing::fake_hub hub(1);
  runtime::loopback_communicator node(hub.at(0));
  node.send(torch::zeros({5}), 0, 1);
  auto small = torch::empty({4});
  try {
    node.recv(small, 0, 1);
    FAIL("a 5-element message went into a 4-element tensor");
  } catch (const runtime::comm_error& e) {
    CHECK(e.kind() == runtime::comm_failure::mismatch);
  }
  auto waiting = std::async(std::launch::async, [&] {
    auto t = torch::empty({4});
    try {
      node.recv(t, 0, 2);
    } catch (const runtime::comm_error& e) {
      return e.kind();
    }
    return runtime::comm_failure::other;
  });
  CHECK(waiting.wait_for(std::chrono::milliseconds(50)) == std::future_status::timeout);  // nothing sent
  node.abort();
  REQUIRE(waiting.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CHECK(waiting.get() == runtime::comm_failure::aborted);
  CHECK_THROWS_AS(node.send(torch::zeros({1}), 0, 3), runtime::comm_error);
}

TEST_CASE("loopback: recv_owned hands a message to this rank over without a copy, and copies from other ranks") {
  testing::fake_hub hub(2);
  runtime::loopback_communicator node0(hub.at(0));
  const auto sent = torch::arange(12, torch::kFloat32);
  node0.send(sent, 0, 3);
  const auto got = node0.recv_owned({3, 4}, torch::kFloat32, 0, 3);
  CHECK(got.sizes() == at::IntArrayRef({3, 4}));
  CHECK(got.data_ptr() == sent.data_ptr());  // the sender's storage itself: no copy
  CHECK(torch::equal(got.reshape({12}), sent));
  CHECK(!got.requires_grad());
  // Its autograd is the receiver's own: a leaf, whatever graph the sent tensor came from.
  auto leaf = got.requires_grad_(true);
  CHECK(leaf.is_leaf());
  // A size or dtype that differs is a mismatch, as for recv.
  node0.send(torch::zeros({5}), 0, 4);
  CHECK_THROWS_AS(node0.recv_owned({4}, torch::kFloat32, 0, 4), runtime::comm_error);
  node0.send(torch::zeros({4}, torch::kFloat64), 0, 5);
  CHECK_THROWS_AS(node0.recv_owned({4}, torch::kFloat32, 0, 5), runtime::comm_error);
  // From another rank: through the wrapped communicator, into a fresh tensor.
  const auto remote = torch::full({2, 3}, 2.0f);
  hub.at(1).send(remote, 0, 9);
  const auto copied = node0.recv_owned({2, 3}, torch::kFloat32, 1, 9);
  CHECK(torch::equal(copied, torch::full({2, 3}, 2.0f)));
  CHECK(copied.data_ptr() != remote.data_ptr());
}
