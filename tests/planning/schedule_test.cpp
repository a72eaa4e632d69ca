#include "planning/schedule.hpp"

#include <doctest/doctest.h>

#include <deque>
#include <map>

using namespace oobleck::planning;

TEST_CASE("1F1B ops: warm-up, every backward after its forward, bounded in-flight count") {
  for (int S = 1; S <= 6; ++S)
    for (int m = 1; m <= 12; ++m)
      for (int s = 0; s < S; ++s) {
        CAPTURE(S);
        CAPTURE(m);
        CAPTURE(s);
        const auto ops = one_f_one_b(s, S, m);
        std::vector<int> forward_at(m, -1), backward_at(m, -1);
        int in_flight = 0, max_in_flight = 0, leading_forwards = 0;
        bool seen_backward = false;
        for (int i = 0; i < static_cast<int>(ops.size()); ++i) {
          if (ops[i].kind == op_kind::forward) {
            CHECK(forward_at[ops[i].microbatch] == -1);
            forward_at[ops[i].microbatch] = i;
            ++in_flight;
            if (!seen_backward) ++leading_forwards;
          } else if (ops[i].kind == op_kind::backward) {
            CHECK(backward_at[ops[i].microbatch] == -1);
            CHECK(forward_at[ops[i].microbatch] >= 0);
            backward_at[ops[i].microbatch] = i;
            --in_flight;
            seen_backward = true;
          }
          CHECK(in_flight >= 0);
          max_in_flight = std::max(max_in_flight, in_flight);
        }
        CHECK(in_flight == 0);
        CHECK(max_in_flight <= std::min(S - s, m));
        // Warm-up is min(S - s - 1, m) forwards; the steady phase adds one more before a backward.
        CHECK(leading_forwards == std::min(S - s - 1, m) + (S - s - 1 < m ? 1 : 0));
        for (int mb = 0; mb < m; ++mb) {
          CHECK(forward_at[mb] >= 0);
          CHECK(backward_at[mb] > forward_at[mb]);
        }
      }
}

TEST_CASE("first and last stages do no transfers toward the outside") {
  for (const auto& op : one_f_one_b(0, 3, 4)) {
    CHECK(op.kind != op_kind::recv_activation);
    CHECK(op.kind != op_kind::send_gradient);
  }
  for (const auto& op : one_f_one_b(2, 3, 4)) {
    CHECK(op.kind != op_kind::send_activation);
    CHECK(op.kind != op_kind::recv_gradient);
  }
  CHECK(one_f_one_b(0, 1, 2) == std::vector<schedule_op>{{op_kind::forward, 0},
                                                          {op_kind::backward, 0},
                                                          {op_kind::forward, 1},
                                                          {op_kind::backward, 1}});
}

TEST_CASE("all stages run to completion over FIFO channels and receive in send order") {
  for (int S = 1; S <= 6; ++S)
    for (int m = 1; m <= 9; ++m) {
      CAPTURE(S);
      CAPTURE(m);
      std::vector<std::vector<schedule_op>> ops;
      for (int s = 0; s < S; ++s) ops.push_back(one_f_one_b(s, S, m));
      std::vector<std::size_t> pc(S, 0);
      std::map<std::pair<int, int>, std::deque<int>> activations, gradients;  // (from, to) -> microbatches
      bool progress = true;
      while (progress) {
        progress = false;
        for (int s = 0; s < S; ++s) {
          while (pc[s] < ops[s].size()) {
            const auto& op = ops[s][pc[s]];
            if (op.kind == op_kind::recv_activation || op.kind == op_kind::recv_gradient) {
              auto& q = op.kind == op_kind::recv_activation ? activations[{s - 1, s}] : gradients[{s + 1, s}];
              if (q.empty()) break;  // blocked until the peer sends
              CHECK(q.front() == op.microbatch);
              q.pop_front();
            } else if (op.kind == op_kind::send_activation) {
              activations[{s, s + 1}].push_back(op.microbatch);
            } else if (op.kind == op_kind::send_gradient) {
              gradients[{s, s - 1}].push_back(op.microbatch);
            }
            ++pc[s];
            progress = true;
          }
        }
      }
      for (int s = 0; s < S; ++s) CHECK(pc[s] == ops[s].size());
    }
}

TEST_CASE("bad schedule arguments are refused") {
  CHECK_THROWS(one_f_one_b(3, 3, 1));
  CHECK_THROWS(one_f_one_b(0, 2, 0));
}
