#pragma once
// The all-reduce between ranks of one machine through shared memory. Private to the transport's
// .cpp files.
//
// Why: on one machine the TCP ring moves every byte through the kernel twice (a copy into the
// socket, a copy out) and runs loopback's protocol work for each, on the same cores that compute.
// Through shared memory a member copies its data into a segment of its own once, the owner of
// each chunk sums it from every member's segment, and every member copies the sums out: no
// kernel, no protocol. The control stays on the TCP links: a tiny frame per member and phase is
// the barrier, so a lost peer or an abort() fails the collective exactly as it fails the ring.
//
// Which pairs: the members of a group agree once per (group, tag) and epoch, with one round of
// frames (setup): each offers a segment it created, named with a random cookie written into it,
// and its host identity (boot id, network namespace, user). The channel is used only if every
// member offered one, every identity is the same and every member could map every other's
// segment and read its cookie; otherwise the group keeps the ring. Ranks in different network
// namespaces of one machine (the multi-host tests) keep TCP, as separate machines would.
// A segment's name is unlinked as soon as every member has mapped it (or given up), so a crash
// leaves nothing in /dev/shm except within that one round; such a leftover (its process gone, a
// minute old) is removed by the next process of the user that creates a segment.
//
// The sums are the ring's, bit for bit: chunk c of the data (the ring's chunks) is summed by
// the member at group position c, starting with its own values and adding the others' in ring
// order, so a job's numbers do not depend on which path its all-reduce took.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace oobleck::runtime {

/// This process's machine as far as shared memory goes: boot id, network namespace and user.
/// Empty if any of them cannot be read (then shared memory is not offered).
std::string shm_host_identity();

/// Removes the names of segments that a process of this user created and did not live to unlink
/// (killed within its setup round): /dev/shm/oobleck-PID-..., PID gone, untouched for a minute
/// (a process in another PID namespace that shares /dev/shm could look gone from here; its names
/// live for one round of frames). Returns how many it removed. The first segment a process
/// creates runs it.
std::size_t shm_remove_stale_segments();

/// A mapped shared-memory segment: a header page holding a random cookie, then two slots of
/// `slot_floats` floats each (the pieces of consecutive all-reduce steps alternate between them,
/// so a member may fill one while the others still read the other).
class shm_segment {
 public:
  shm_segment() = default;
  /// Creates, sizes (reserving the memory: a full /dev/shm fails here, not with SIGBUS later)
  /// and maps a fresh segment. Throws std::runtime_error with the cause.
  static shm_segment create(std::size_t slot_floats);
  /// Maps a segment another member created, read-only; false (and `why`) if it cannot be opened,
  /// is smaller than expected or its cookie differs.
  bool open(const std::string& name, const std::string& cookie, std::size_t slot_floats, std::string& why);
  ~shm_segment();
  shm_segment(shm_segment&& other) noexcept;
  shm_segment& operator=(shm_segment&& other) noexcept;
  shm_segment(const shm_segment&) = delete;
  shm_segment& operator=(const shm_segment&) = delete;

  /// Removes the name (the mapping stays). Idempotent; only the creator unlinks.
  void unlink();
  [[nodiscard]] const std::string& name() const { return name_; }
  [[nodiscard]] const std::string& cookie() const { return cookie_; }
  [[nodiscard]] float* slot(std::size_t parity) const;

 private:
  void release() noexcept;
  std::string name_, cookie_;
  std::byte* base_ = nullptr;
  std::size_t bytes_ = 0;
  std::size_t slot_floats_ = 0;
  bool owner_linked_ = false;  ///< created by this process and its name not unlinked yet
};

/// One (group, tag)'s shared-memory path, as agreed at setup.
struct shm_channel {
  bool usable = false;
  std::size_t slot_floats = 0;       ///< the largest piece one step moves
  shm_segment own;                   ///< this member's segment (written)
  std::vector<shm_segment> members;  ///< by group position; this member's entry is empty
  std::uint64_t steps = 0;           ///< pieces reduced so far: the slot parity
};

}  // namespace oobleck::runtime
