#include "runtime/gpt_config.hpp"

#include <charconv>
#include <cstdio>
#include <stdexcept>

namespace oobleck::runtime {

std::string gpt_config::hash() const {
  // FNV-1a over a canonical text form: stable across runs, platforms and C locales. The dropout
  // is written by to_chars, which is printf's %.17g in the "C" locale whatever LC_NUMERIC says
  // (snprintf wrote "0,10000000000000001" under de_DE, and every profile looked stale).
  char p[32];
  const auto end = std::to_chars(p, p + sizeof p - 1, dropout, std::chars_format::general, 17).ptr;
  *end = '\0';
  char text[256];
  std::snprintf(text, sizeof text, "gpt/v1/vocab=%lld/d=%lld/heads=%lld/blocks=%lld/seq=%lld/dropout=%s/seed=%llu",
                static_cast<long long>(vocab), static_cast<long long>(d_model), static_cast<long long>(heads),
                static_cast<long long>(blocks), static_cast<long long>(seq_len), p,
                static_cast<unsigned long long>(seed));
  std::uint64_t h = 1469598103934665603ULL;
  for (const char* p = text; *p; ++p) {
    h ^= static_cast<unsigned char>(*p);
    h *= 1099511628211ULL;
  }
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(h));
  return out;
}

void validate(const gpt_config& c) {
  auto bad = [](const std::string& what) { throw std::invalid_argument("invalid model config: " + what); };
  if (c.vocab < 2) bad("vocab must be >= 2");
  if (c.d_model < 1 || c.heads < 1 || c.d_model % c.heads != 0) bad("d_model must be a positive multiple of heads");
  if (c.blocks < 1) bad("blocks must be >= 1");
  if (c.seq_len < 1) bad("seq_len must be >= 1");
  if (c.dropout < 0 || c.dropout >= 1) bad("dropout must be in [0, 1)");
}

}  // namespace oobleck::runtime
