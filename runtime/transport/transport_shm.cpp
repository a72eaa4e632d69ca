// The all-reduce through shared memory between members on one machine (transport_shm.hpp).

#include "runtime/transport/transport_shm.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "runtime/transport/transport_state.hpp"

namespace oobleck::runtime {

namespace {

constexpr std::size_t header_bytes = 4096;  // the cookie, then the slots start page-aligned

std::string hex(std::span<const std::byte> bytes) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  for (std::byte b : bytes) {
    out += digits[static_cast<unsigned>(b) >> 4];
    out += digits[static_cast<unsigned>(b) & 15];
  }
  return out;
}

std::size_t segment_bytes(std::size_t slot_floats) { return header_bytes + 2 * slot_floats * sizeof(float); }

std::string errno_text(int e) { return std::strerror(e); }

}  // namespace

std::size_t shm_remove_stale_segments() {
  std::size_t removed = 0;
  std::error_code ec;
  const auto now = std::filesystem::file_time_type::clock::now();
  // A sweep that cannot read /dev/shm (or a name that vanishes under it) just ends: it is tidying.
  try {
    for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("oobleck-", 0) != 0) continue;
      const auto dash = name.find('-', 8);
      if (dash == std::string::npos) continue;
      const pid_t pid = static_cast<pid_t>(std::strtol(name.substr(8, dash - 8).c_str(), nullptr, 10));
      struct stat st {};
      if (pid <= 0 || ::stat(e.path().c_str(), &st) != 0 || st.st_uid != ::getuid()) continue;
      if (::kill(pid, 0) == 0 || errno != ESRCH) continue;
      std::error_code age_ec;
      const auto modified = std::filesystem::last_write_time(e.path(), age_ec);
      if (age_ec || now - modified < std::chrono::minutes(1)) continue;
      if (::shm_unlink(("/" + name).c_str()) == 0) ++removed;
    }
  } catch (const std::filesystem::filesystem_error&) {
  }
  return removed;
}

std::string shm_host_identity() {
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  if (!(boot >> boot_id) || boot_id.empty()) return {};
  struct stat net {};
  if (::stat("/proc/self/ns/net", &net) != 0) return {};
  return boot_id + "/net:" + std::to_string(net.st_dev) + ":" + std::to_string(net.st_ino) +
         "/uid:" + std::to_string(::getuid());
}

shm_segment shm_segment::create(std::size_t slot_floats) {
  static std::once_flag swept;
  std::call_once(swept, [] { shm_remove_stale_segments(); });
  shm_segment s;
  const auto cookie = fresh_challenge();
  s.cookie_ = hex(cookie);
  s.name_ = "/oobleck-" + std::to_string(::getpid()) + "-" + s.cookie_.substr(0, 16);
  s.slot_floats_ = slot_floats;
  s.bytes_ = segment_bytes(slot_floats);
  const int fd = ::shm_open(s.name_.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) throw std::runtime_error("shm_open " + s.name_ + ": " + errno_text(errno));
  s.owner_linked_ = true;
  struct closer {
    int fd;
    ~closer() { ::close(fd); }
  } close_fd{fd};
  if (::ftruncate(fd, static_cast<off_t>(s.bytes_)) != 0)
    throw std::runtime_error("sizing " + s.name_ + ": " + errno_text(errno));
  // Reserve the pages now: on a full tmpfs a write into a sparse page would be SIGBUS.
  if (const int e = ::posix_fallocate(fd, 0, static_cast<off_t>(s.bytes_)); e != 0)
    throw std::runtime_error("reserving " + std::to_string(s.bytes_) + " bytes for " + s.name_ + ": " + errno_text(e));
  void* at = ::mmap(nullptr, s.bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (at == MAP_FAILED) throw std::runtime_error("mapping " + s.name_ + ": " + errno_text(errno));
  s.base_ = static_cast<std::byte*>(at);
  std::memcpy(s.base_, s.cookie_.data(), s.cookie_.size());
  return s;
}

bool shm_segment::open(const std::string& name, const std::string& cookie, std::size_t slot_floats, std::string& why) {
  release();
  const int fd = ::shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) {
    why = "cannot open " + name + ": " + errno_text(errno);
    return false;
  }
  struct closer {
    int fd;
    ~closer() { ::close(fd); }
  } close_fd{fd};
  const std::size_t bytes = segment_bytes(slot_floats);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) < bytes) {
    why = name + " is smaller than " + std::to_string(bytes) + " bytes";
    return false;
  }
  void* at = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  if (at == MAP_FAILED) {
    why = "cannot map " + name + ": " + errno_text(errno);
    return false;
  }
  base_ = static_cast<std::byte*>(at);
  bytes_ = bytes;
  slot_floats_ = slot_floats;
  name_ = name;
  if (cookie.size() > header_bytes || std::memcmp(base_, cookie.data(), cookie.size()) != 0) {
    why = name + " holds another cookie (not the offering member's segment)";
    release();
    return false;
  }
  cookie_ = cookie;
  return true;
}

shm_segment::~shm_segment() { release(); }

shm_segment::shm_segment(shm_segment&& other) noexcept
    : name_(std::move(other.name_)),
      cookie_(std::move(other.cookie_)),
      base_(std::exchange(other.base_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      slot_floats_(std::exchange(other.slot_floats_, 0)),
      owner_linked_(std::exchange(other.owner_linked_, false)) {}

shm_segment& shm_segment::operator=(shm_segment&& other) noexcept {
  if (this != &other) {
    release();
    name_ = std::move(other.name_);
    cookie_ = std::move(other.cookie_);
    base_ = std::exchange(other.base_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    slot_floats_ = std::exchange(other.slot_floats_, 0);
    owner_linked_ = std::exchange(other.owner_linked_, false);
  }
  return *this;
}

void shm_segment::unlink() {
  if (owner_linked_) ::shm_unlink(name_.c_str());
  owner_linked_ = false;
}

float* shm_segment::slot(std::size_t parity) const {
  return reinterpret_cast<float*>(base_ + header_bytes) + (parity & 1) * slot_floats_;
}

void shm_segment::release() noexcept {
  unlink();
  if (base_ != nullptr) ::munmap(base_, bytes_);
  base_ = nullptr;
  bytes_ = 0;
}

// ---------------------------------------------------------------------------------------------
// The protocol. Every frame of it travels on channel::shared_memory with the collective's tag,
// from each member to each other member, so a member waits for the others exactly as the ring
// does: its receives watch the whole group and fail when any member is lost or on abort().

namespace {

std::uint64_t shm_key(std::uint32_t tag) { return frame_key(channel::shared_memory, tag); }

std::string text_of(const payload& p) { return {reinterpret_cast<const char*>(p.data.get()), p.size}; }

std::span<const std::byte> bytes_of(const std::string& s) { return std::as_bytes(std::span(s.data(), s.size())); }

[[noreturn]] void size_mismatch(const std::string& op, int member, std::uint64_t theirs, std::size_t ours) {
  throw transport_error(transport_failure::mismatch, member,
                        op + ": peer " + std::to_string(member) + " reduces " + std::to_string(theirs) +
                            " floats, expected " + std::to_string(ours) + " (different data sizes or call sequences)");
}

/// memcpy of `count` floats; nothing for none (the data of an empty all-reduce has no address).
void copy_floats(float* dst, const float* src, std::size_t count) {
  if (count != 0) std::memcpy(dst, src, count * sizeof(float));
}

/// dst[k] = dst[k] + src[k]: the running sum of the members so far, plus the next member's values.
void add_into(float* __restrict dst, const float* __restrict src, std::size_t count) {
  for (std::size_t k = 0; k < count; ++k) dst[k] = dst[k] + src[k];
}

}  // namespace

void host_transport::state::shm_send_to_others(const std::string& op, std::span<const int> group, std::uint32_t tag,
                                               std::span<const std::byte> body) {
  for (int member : group)
    if (member != config.rank) post_copy(op, member, shm_key(tag), body);
}

payload host_transport::state::shm_receive(const std::string& op, std::span<const int> group, int member,
                                           std::uint32_t tag) {
  recv_request req;
  req.take = true;
  wait_recv(op, member, shm_key(tag), req, group);
  return std::move(req.taken);
}

std::shared_ptr<shm_channel> host_transport::state::shm_channel_for(const std::string& op, std::span<const int> group,
                                                                    std::size_t pos, std::uint32_t tag,
                                                                    std::size_t count) {
  const std::size_t cap = std::max<std::size_t>(1, config.shared_memory_piece_bytes / sizeof(float));
  const std::size_t wanted = std::max<std::size_t>(1, std::min(count, cap));
  auto key = std::make_pair(std::vector<int>(group.begin(), group.end()), tag);
  {
    std::lock_guard lock(shm_mu);
    auto it = shm_channels.find(key);
    // Set up again only to grow (every member sees the same sizes, so all decide alike).
    if (it != shm_channels.end() && (!it->second->usable || it->second->slot_floats >= wanted)) return it->second;
  }
  auto ch = std::make_shared<shm_channel>();
  ch->slot_floats = wanted;
  const std::size_t n = group.size();
  ch->members.resize(n);

  // Offer: "ok", the count, the slot size, the segment's name and cookie, and this machine's
  // identity; or "no", the count and why not.
  std::string offer;
  const std::string identity = shm_host_identity();
  std::string why_not = !config.shared_memory ? "shared memory is off (transport_config::shared_memory)"
                        : identity.empty()    ? "this machine's identity cannot be read"
                                              : "";
  if (why_not.empty()) try {
      ch->own = shm_segment::create(wanted);
    } catch (const std::exception& e) {
      why_not = e.what();
    }
  if (why_not.empty())
    offer = "ok\n" + std::to_string(count) + "\n" + std::to_string(wanted) + "\n" + ch->own.name() + "\n" +
            ch->own.cookie() + "\n" + identity;
  else
    offer = "no\n" + std::to_string(count) + "\n" + why_not;
  shm_send_to_others(op, group, tag, bytes_of(offer));

  bool mapped_all = why_not.empty();
  for (std::size_t q = 0; q < n; ++q) {
    if (q == pos) continue;
    std::istringstream in(text_of(shm_receive(op, group, group[q], tag)));
    std::string verdict, name, cookie, theirs;
    std::uint64_t their_count = 0;
    std::size_t their_slot = 0;
    in >> verdict >> their_count;
    if (their_count != count) size_mismatch(op, group[q], their_count, count);
    if (verdict != "ok") {
      mapped_all = false;
      continue;
    }
    in >> their_slot >> name >> cookie >> theirs;
    std::string why;
    if (!mapped_all || theirs != identity || their_slot != wanted ||
        !ch->members[q].open(name, cookie, their_slot, why))
      mapped_all = false;
  }
  // Everyone's verdict: the channel is used only if every member mapped every segment.
  const std::string mine = mapped_all ? "1" : "0";
  shm_send_to_others(op, group, tag, bytes_of(mine));
  bool everyone = mapped_all;
  for (std::size_t q = 0; q < n; ++q)
    if (q != pos && text_of(shm_receive(op, group, group[q], tag)) != "1") everyone = false;
  ch->own.unlink();  // every member has mapped it or given up
  ch->usable = everyone;
  if (!everyone) {
    ch->members.clear();
    ch->own = {};
  }
  std::lock_guard lock(shm_mu);
  shm_channels[std::move(key)] = ch;
  return ch;
}

void host_transport::state::shm_all_reduce(const std::string& op, std::span<const int> group, std::size_t pos,
                                           std::span<float> data, std::uint32_t tag, shm_channel& ch) {
  const std::size_t n = group.size();
  const std::size_t total = data.size();
  // The ring's chunks: chunk c is data[total*c/n, total*(c+1)/n), summed from position c on.
  auto chunk_begin = [&](std::size_t c) { return total * c / n; };
  const std::size_t pieces = total == 0 ? 1 : (total + ch.slot_floats - 1) / ch.slot_floats;
  std::array<std::byte, 8> count_frame{};
  put_u64(count_frame.data(), total);
  for (std::size_t piece = 0; piece < pieces; ++piece) {
    const std::size_t a = piece * ch.slot_floats, b = std::min(total, a + ch.slot_floats);
    const std::size_t parity = ch.steps++;
    float* own = ch.own.slot(parity);
    // Chunk c's part of this piece, as [begin, end) of the data.
    auto part = [&](std::size_t c) {
      const std::size_t begin = std::clamp(chunk_begin(c), a, b), end = std::clamp(chunk_begin(c + 1), a, b);
      return std::make_pair(begin, end);
    };
    // 1. What the others sum goes into this member's slot.
    for (std::size_t c = 0; c < n; ++c) {
      if (c == pos) continue;
      const auto [begin, end] = part(c);
      copy_floats(own + (begin - a), data.data() + begin, end - begin);
    }
    // 2. Everyone's slot is filled (and everyone has finished reading the slot of two pieces ago).
    shm_send_to_others(op, group, tag, count_frame);
    for (std::size_t q = 0; q < n; ++q) {
      if (q == pos) continue;
      const payload in = shm_receive(op, group, group[q], tag);
      const std::uint64_t theirs = in.size == 8 ? get_u64(in.data.get()) : ~std::uint64_t{0};
      if (theirs != total) size_mismatch(op, group[q], theirs, total);
    }
    // 3. This member's chunk: its own values, plus each other member's in ring order.
    const auto [mine_begin, mine_end] = part(pos);
    for (std::size_t j = 1; j < n; ++j) {
      const std::size_t q = (pos + j) % n;
      add_into(data.data() + mine_begin, ch.members[q].slot(parity) + (mine_begin - a), mine_end - mine_begin);
    }
    copy_floats(own + (mine_begin - a), data.data() + mine_begin, mine_end - mine_begin);
    // 4. Every chunk is summed.
    shm_send_to_others(op, group, tag, {});
    for (std::size_t q = 0; q < n; ++q)
      if (q != pos && shm_receive(op, group, group[q], tag).size != 0)
        throw transport_error(transport_failure::mismatch, group[q],
                              op + ": peer " + std::to_string(group[q]) + " is at another step of the all-reduce");
    // 5. The others' sums, copied out of their slots.
    for (std::size_t q = 0; q < n; ++q) {
      if (q == pos) continue;
      const auto [begin, end] = part(q);
      copy_floats(data.data() + begin, ch.members[q].slot(parity) + (begin - a), end - begin);
    }
  }
}

}  // namespace oobleck::runtime
