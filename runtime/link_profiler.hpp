#pragma once
// What a message between two nodes costs on the host data plane, measured for the planning
// profile's link (planning::link_profile): latency per message and bandwidth.

#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

#include "planning/profile.hpp"

namespace oobleck::runtime {

struct link_measurement {
  planning::link_profile link;
  std::vector<double> round_trip_ms;  ///< small messages there and back, one per repeat
  std::vector<double> bulk_ms;        ///< bulk_bytes one way and a small reply, one per repeat
  std::int64_t small_bytes = 0;
  std::int64_t bulk_bytes = 0;
  /// With an op (below): per repeat, from the other side's send of a small message to the end of
  /// the op that this side ran as soon as the message arrived, its thread having blocked for it.
  std::vector<double> waited_ms;
  /// ... and the same op run right after itself, one per repeat.
  std::vector<double> op_ms;
  /// Half the median round trip: the latency of a message between two threads that wait for nothing
  /// else (what link.latency_ms is without an op).
  double idle_latency_ms = 0;
};

/// Two host transports of this process on 127.0.0.1, connected as ranks 0 and 1, rank 1 echoing
/// on its own thread (the I/O thread of each transport wakes the receiver, as between worker
/// processes): latency = half the median round trip of a `small_bytes` message; bandwidth =
/// bulk_bytes over (median time of bulk_bytes one way and a small reply back, less one round
/// trip). Loopback is what oobleck-local's nodes use; a real cluster's network is slower, and its
/// figures are given to oobleck-profile instead. Throws transport_error if the sockets fail.
///
/// With `op` (one of the model's ops, as a stage runs it), the latency is what a pipeline stage
/// sees instead: the other side holds each message back for `hold` (so this side's thread blocks
/// in its receive, as a stage waiting for its input does), and this side runs `op` as soon as the
/// message arrives; latency = median(from the send to the op's end) - median(the op run right
/// after itself), at least the idle latency. It thereby includes the op's cold start after a
/// blocking wait (caches, the core's wake-up: bench/op_after_wait), which timing the op back to
/// back does not see. `op` runs at most `repeats` times on each side of that difference and stops
/// after about `op_budget` (3 times at least). The transports' transport_config::spin_wait is
/// `hold`: the receiving thread waits awake through about all of the hold and is asleep, or just
/// falling asleep, when the message comes, so this is the latency of a stage that waited longer
/// than it waits awake. A stage whose input comes sooner sees less (bench/RESULTS.md, "A receive
/// that waits awake", "A waiting receive reads its link itself"); the prediction keeps this
/// figure, measured with the 300 us hold it had before stages waited awake for 1 ms.
link_measurement measure_loopback_link(int repeats, std::int64_t small_bytes = 64, std::int64_t bulk_bytes = 4 << 20,
                                       const std::function<void()>& op = {},
                                       std::chrono::microseconds hold = std::chrono::microseconds(300),
                                       std::chrono::milliseconds op_budget = std::chrono::milliseconds(1000));

/// `link` for device tensors, which the host data plane stages through host memory at
/// `staging_bytes_per_ms` (runtime::measure_device_staging): a message's bytes pay the wire and the
/// staging one after the other, 1 / (1 / wire + 1 / staging); a free wire (bytes_per_ms 0) leaves
/// the staging alone. The latency is unchanged. std::invalid_argument for a staging rate <= 0.
planning::link_profile with_staging(planning::link_profile link, double staging_bytes_per_ms);

}  // namespace oobleck::runtime
