#pragma once
// The stage's part of a new epoch's layer copies (DESIGN §5): preparing the layers a node will
// receive, and running its part of the copy plan over the epoch's data plane. Private to the
// stage library (the layer store's header brings LibTorch).

#include <chrono>
#include <cstdint>
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

/// The buffers of the layers this rank receives in `a`'s copy plan, allocated and pre-faulted
/// (layer_store::prepare_incoming), in plan order.
std::vector<runtime::layer_store::incoming> prepare_incoming(const runtime::layer_store& store,
                                                             const messages::epoch_assignment& a);

/// Runs this rank's part of the copy plan while the epoch's mesh connects (on another thread):
/// each layer's full state (parameters, AdamW moments, step count): a checksummed header, then
/// the store's three flat buffers as they are, received straight into the new layer's buffers
/// (no serialisation, no intermediate copy, no initialisation drawn only to be overwritten).
/// Links are used as they come up, not once the whole mesh is. A receiving rank waits for the
/// links to all its sources, posts every receive at once into `incoming` (the received layers'
/// buffers, prepared in plan order) and tells each source it is ready; so the links from
/// different sources run together and each message is read from its socket straight into its
/// buffer whatever the order the messages arrive in, and the layers are installed when all
/// have arrived. A source sends a target's layers once the target is ready (one thread per
/// target). The transport checks every message's length; the replicas' digests are compared
/// after every commit. Copy time: a receiver's from its ready to its layers installed (no byte
/// of its copies travels before: a source still joining the mesh by then is mesh time, not copy
/// time), or a source's from a target's ready to its sends posted, whichever is longer.
void run_copies(runtime::layer_store& store, runtime::host_transport& transport, runtime::host_communicator& comm,
                const messages::epoch_assignment& a, std::vector<runtime::layer_store::incoming> incoming,
                messages::form_timing& t);

}  // namespace oobleck::actors
