#include "runtime/transport/buffer_pool.hpp"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <new>

namespace oobleck::runtime {

namespace {

// Below this, malloc serves from its arenas without page-fault storms; pooling would only add
// contention.
constexpr std::size_t pooled_from = std::size_t{256} << 10;
// Capacities are whole huge pages: the kernel can back them with 2 MiB pages (512 times fewer
// faults), and sizes that differ slightly (all-reduce chunks differ by an element) share buffers.
constexpr std::size_t huge_page = std::size_t{2} << 20;

}  // namespace

std::shared_ptr<buffer_pool> buffer_pool::create(std::size_t keep_bytes) {
  return std::shared_ptr<buffer_pool>(new buffer_pool(keep_bytes));
}

buffer_pool::~buffer_pool() {
  for (auto& [capacity, buffer] : free_) std::free(buffer);
}

payload buffer_pool::allocate(std::size_t size) {
  if (size < pooled_from)
    return payload{std::make_shared_for_overwrite<std::byte[]>(size == 0 ? 1 : size), size};
  const std::size_t capacity = (size + huge_page - 1) / huge_page * huge_page;
  std::byte* buffer = nullptr;
  std::size_t got = capacity;
  {
    std::lock_guard lock(mu_);
    // Reuse a buffer at most twice the size needed, so small messages do not pin big buffers.
    auto it = free_.lower_bound(capacity);
    if (it != free_.end() && it->first <= 2 * capacity) {
      got = it->first;
      buffer = it->second;
      free_bytes_ -= got;
      free_.erase(it);
    }
  }
  if (!buffer) {
    buffer = static_cast<std::byte*>(std::aligned_alloc(huge_page, capacity));
    if (!buffer) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
    ::madvise(buffer, capacity, MADV_HUGEPAGE);  // advice only; failure is harmless
#endif
  }
  auto self = shared_from_this();
  return payload{
      std::shared_ptr<std::byte[]>(buffer, [self, got](std::byte* b) { self->give_back(b, got); }),
      size};
}

payload buffer_pool::copy_of(std::span<const std::byte> bytes) {
  payload p = allocate(bytes.size());
  if (!bytes.empty()) std::memcpy(p.data.get(), bytes.data(), bytes.size());
  return p;
}

void buffer_pool::give_back(std::byte* buffer, std::size_t capacity) {
  {
    std::lock_guard lock(mu_);
    if (free_bytes_ + capacity <= keep_bytes_) {
      free_.emplace(capacity, buffer);
      free_bytes_ += capacity;
      return;
    }
  }
  std::free(buffer);
}

}  // namespace oobleck::runtime
