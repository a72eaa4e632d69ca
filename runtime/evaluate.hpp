#pragma once
// Held-out evaluation (issue 24, item 4): the mean loss over the first W windows of a dataset,
// window i = inputs tokens[i*T, (i+1)*T), targets shifted by one (T = seq_len), i.e. sample i of a
// runtime::token_dataset. One process, every layer in one store, no dropout. What oobleck-eval
// prints and what the pipelines' evaluation must equal.

#include <cstdint>

#include "runtime/dataset.hpp"
#include "runtime/layer_store.hpp"

namespace oobleck::runtime {

/// Mean over windows 0..windows-1 of each window's mean token cross-entropy, in eval mode (the
/// layers' training flags are restored after), `batch` windows per forward. Every layer of the
/// model must be held. Throws std::invalid_argument when windows < 1, batch < 1, or the dataset
/// holds fewer than `windows` windows.
double evaluate(layer_store& store, const token_dataset& data, std::int64_t windows, std::int64_t batch = 8);

}  // namespace oobleck::runtime
