#pragma once
// oobleck-export and oobleck-eval: a trained model out of a checkpoint in Hugging Face GPT-2 form,
// and its held-out loss (issue 24, item 6).

#include <ostream>
#include <string>
#include <vector>

namespace oobleck::apps {

/// oobleck-export --checkpoint DIR/step-N --out OUTDIR: writes OUTDIR/model.safetensors and
/// OUTDIR/config.json. Never throws; exit status as program_main.hpp (2: bad input, such as a
/// checkpoint of an oobleck-gpt model, which has no Hugging Face names).
int run_export_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

/// oobleck-eval (--checkpoint DIR/step-N | --model OUTDIR) --tokens FILE [--dtype uint16]
/// --windows W [--json]: the mean loss over the first W windows (runtime::evaluate). Never throws.
int run_eval_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace oobleck::apps
