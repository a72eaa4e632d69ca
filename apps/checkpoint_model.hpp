#pragma once
// The model of a checkpoint's job, kept beside its manifest, so that a checkpoint alone is enough
// for oobleck-export and oobleck-eval. No LibTorch, no CAF.

#include <string>

#include "runtime/gpt_config.hpp"

namespace oobleck::apps {

/// The file beside a checkpoint's manifest that holds its job's [model] (checkpoint_model_toml).
inline constexpr const char* checkpoint_model_file = "model.toml";

/// A job file of `model` alone ([model] without init, every field that shapes or seeds the layers,
/// numbers exact): what oobleck-export and oobleck-eval read from a checkpoint.
std::string checkpoint_model_toml(const runtime::gpt_config& model);

}  // namespace oobleck::apps
