#include "runtime/gpt_config.hpp"

#include <array>
#include <charconv>
#include <cstdio>
#include <stdexcept>

namespace oobleck::runtime {

namespace {

std::string fnv1a_hex(const char* text) {
  std::uint64_t h = 1469598103934665603ULL;
  for (const char* p = text; *p; ++p) {
    h ^= static_cast<unsigned char>(*p);
    h *= 1099511628211ULL;
  }
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(h));
  return out;
}

}  // namespace

std::string gpt_config::hash() const {
  // FNV-1a over a canonical text form: stable across runs, platforms and C locales. The dropout
  // is written by to_chars, which is printf's %.17g in the "C" locale whatever LC_NUMERIC says
  // (snprintf wrote "0,10000000000000001" under de_DE, and every profile looked stale).
  char p[32];
  const auto end = std::to_chars(p, p + sizeof p - 1, dropout, std::chars_format::general, 17).ptr;
  *end = '\0';
  char text[256];
  if (architecture == model_architecture::oobleck_gpt) {
    // The text of the only model there was before gpt2: profiles written then stay valid.
    std::snprintf(text, sizeof text, "gpt/v1/vocab=%lld/d=%lld/heads=%lld/blocks=%lld/seq=%lld/dropout=%s/seed=%llu",
                  static_cast<long long>(vocab), static_cast<long long>(d_model), static_cast<long long>(heads),
                  static_cast<long long>(blocks), static_cast<long long>(seq_len), p,
                  static_cast<unsigned long long>(seed));
  } else {
    std::snprintf(text, sizeof text,
                  "gpt2/v1/vocab=%lld/d=%lld/heads=%lld/blocks=%lld/seq=%lld/dropout=%s/seed=%llu/tie=%d",
                  static_cast<long long>(vocab), static_cast<long long>(d_model), static_cast<long long>(heads),
                  static_cast<long long>(blocks), static_cast<long long>(seq_len), p,
                  static_cast<unsigned long long>(seed), tie_embeddings ? 1 : 0);
  }
  return fnv1a_hex(text);
}

bool tied(const gpt_config& c) { return c.architecture == model_architecture::gpt2 && c.tie_embeddings; }

std::string precision_name(precision_kind p) {
  switch (p) {
    case precision_kind::fp32:
      return "fp32";
    case precision_kind::bf16:
      return "bf16";
  }
  throw std::invalid_argument("unknown precision " + std::to_string(static_cast<int>(p)));
}

precision_kind parse_precision(std::string_view name) {
  if (name == "fp32") return precision_kind::fp32;
  if (name == "bf16") return precision_kind::bf16;
  throw std::invalid_argument("precision must be \"fp32\" or \"bf16\", got \"" + std::string(name) + "\"");
}

std::string architecture_name(model_architecture a) {
  switch (a) {
    case model_architecture::oobleck_gpt:
      return "oobleck-gpt";
    case model_architecture::gpt2:
      return "gpt2";
  }
  throw std::invalid_argument("unknown model architecture " + std::to_string(static_cast<int>(a)));
}

void validate(const gpt_config& c) {
  auto bad = [](const std::string& what) { throw std::invalid_argument("invalid model config: " + what); };
  if (c.architecture != model_architecture::oobleck_gpt && c.architecture != model_architecture::gpt2)
    bad("architecture must be \"oobleck-gpt\" or \"gpt2\"");
  if (c.vocab < 2) bad("vocab must be >= 2");
  if (c.d_model < 1 || c.heads < 1 || c.d_model % c.heads != 0) bad("d_model must be a positive multiple of heads");
  if (c.blocks < 1) bad("blocks must be >= 1");
  if (c.seq_len < 1) bad("seq_len must be >= 1");
  if (c.dropout < 0 || c.dropout >= 1) bad("dropout must be in [0, 1)");
  if (c.tie_embeddings && c.architecture != model_architecture::gpt2)
    bad("tie_embeddings is only valid with architecture \"gpt2\" (architecture is \"" +
        architecture_name(c.architecture) + "\")");
}

namespace {

struct preset_sizes {
  std::string_view name;
  std::int64_t d_model, heads, blocks;
};

// Radford et al. 2019, Table 2, with the head counts of the released checkpoints.
constexpr std::array<preset_sizes, 4> presets{{
    {"gpt2", 768, 12, 12},
    {"gpt2-medium", 1024, 16, 24},
    {"gpt2-large", 1280, 20, 36},
    {"gpt2-xl", 1600, 25, 48},
}};

}  // namespace

gpt_config preset(std::string_view name) {
  for (const auto& p : presets) {
    if (p.name != name) continue;
    gpt_config c;
    c.architecture = model_architecture::gpt2;
    c.vocab = 50257;
    c.seq_len = 1024;
    c.d_model = p.d_model;
    c.heads = p.heads;
    c.blocks = p.blocks;
    c.dropout = 0.1;
    c.tie_embeddings = true;
    return c;
  }
  std::string known;
  for (const auto& p : presets) known += (known.empty() ? "" : ", ") + std::string(p.name);
  throw std::invalid_argument("unknown model preset \"" + std::string(name) + "\" (known: " + known + ")");
}

}  // namespace oobleck::runtime
