#include "apps/checkpoint_model.hpp"

#include <cstdio>
#include <sstream>

namespace oobleck::apps {

std::string checkpoint_model_toml(const runtime::gpt_config& m) {
  char dropout[40];
  std::snprintf(dropout, sizeof dropout, "%.17g", m.dropout);
  std::ostringstream s;
  s << "# The model of this checkpoint's job, for oobleck-export and oobleck-eval (the layer files hold\n"
    << "# its hash: a model that differs is refused when its layers are read).\n"
    << "[model]\n"
    << "architecture = \"" << runtime::architecture_name(m.architecture) << "\"\n"
    << "vocab = " << m.vocab << "\n"
    << "d_model = " << m.d_model << "\n"
    << "heads = " << m.heads << "\n"
    << "blocks = " << m.blocks << "\n"
    << "seq_len = " << m.seq_len << "\n"
    << "dropout = " << dropout << "\n"
    << "seed = " << m.seed << "\n";
  if (m.architecture == runtime::model_architecture::gpt2)
    s << "tie_embeddings = " << (m.tie_embeddings ? "true" : "false") << "\n";
  // A byte-level default corpus would refuse a vocabulary below 256; a token file would not. The
  // data section only has to let the model through.
  if (m.vocab < 256) s << "[data]\ntrain = \"unused.bin\"\n";
  return s.str();
}

}  // namespace oobleck::apps
