#pragma once
// The stage's part of a new epoch's layer copies (DESIGN §5): preparing the layers a node will
// receive, and running its part of the copy plan over the epoch's data plane. Private to the
// stage library (the layer store's header brings LibTorch).

#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

#include "messages/epoch_messages.hpp"
#include "runtime/layer_store.hpp"

namespace oobleck::runtime {
class host_transport;
class host_communicator;
}  // namespace oobleck::runtime

namespace oobleck::actors {

/// Microseconds from `since` to now (the unit of form_timing).
std::int64_t micros_since(std::chrono::steady_clock::time_point since);

/// Microseconds covered by the union of the spans [from, to) (empty or reversed spans count
/// nothing): the time during which at least one of them was under way.
std::int64_t covered_micros(
    std::vector<std::pair<std::chrono::steady_clock::time_point, std::chrono::steady_clock::time_point>> spans);

/// The buffers of the layers this rank receives in `a`'s copy plan, allocated and pre-faulted
/// (layer_store::prepare_incoming), in plan order.
std::vector<runtime::layer_store::incoming> prepare_incoming(const runtime::layer_store& store,
                                                             const messages::epoch_assignment& a);

/// Runs this rank's part of the copy plan while the epoch's mesh connects (on another thread):
/// each layer's full state (parameters, AdamW moments, step count): a checksummed header, then
/// the store's three flat buffers as they are, received straight into the new layer's buffers
/// (no serialisation, no intermediate copy, no initialisation drawn only to be overwritten).
/// A receiving rank first posts every receive at once into `incoming` (the received layers'
/// buffers, prepared in plan order), so each message is read from its socket straight into its
/// buffer whatever the order in which the messages arrive. Then each link is used as soon as it
/// is up, whatever the rest of the mesh does: the rank tells a source on it that it is ready,
/// before sending any layer of its own on that link, and sends a target its layers once the
/// target is ready; the links to different peers run together, one thread each. The layers are
/// installed when all have arrived. The transport checks every message's length; the replicas'
/// digests are compared after every commit.
/// Copy time (form_timing::copies_us): the time during which some link of this rank was copying
/// (from a ready to the source's last message arrived, or to this rank's sends to that target
/// posted), plus installing. No byte of a copy travels outside its link's span, and time spent
/// waiting for a link to come up is the mesh's, not the copies'.
void run_copies(runtime::layer_store& store, runtime::host_transport& transport, runtime::host_communicator& comm,
                const messages::epoch_assignment& a, std::vector<runtime::layer_store::incoming> incoming,
                messages::form_timing& t);

}  // namespace oobleck::actors
