#pragma once
// Pipeline templates (paper §4.1) and their exact generator.

#include <cstdint>
#include <optional>
#include <vector>

#include "planning/cost_model.hpp"
#include "planning/makespan.hpp"

namespace oobleck::planning {

/// One stage: layers [first_layer, end_layer) on `gpus` GPUs of the pipeline's node at position
/// `node` (0-based within the pipeline: not a node id, which a template does not know), taking `ms`
/// per microbatch forward + backward (`forward_ms` + `backward_ms`).
struct stage_spec {
  int node = 0;
  int gpus = 0;
  layer_index first_layer;
  layer_index end_layer;
  double ms = 0;
  double forward_ms = 0;
  double backward_ms = 0;
};

/// How n nodes run the whole model: stages in order, contiguous layers, each inside one node.
struct pipeline_template {
  int nodes = 0;
  std::vector<stage_spec> stages;
  double iteration_ms = 0;  ///< the paper's T with Nb = 4S: what templates are ranked by, not a prediction
  pipeline_time time;       ///< predicted time: predicted_time() of the stages (set by the generator)
  /// Whether iteration_ms is proven minimal. False only when the generator's work limit stopped
  /// the search for this node count early (generator_options::work_limit_cells): then no layout
  /// of these nodes has a T below lower_bound_ms, and the gap is iteration_ms - lower_bound_ms.
  bool exact = true;
  double lower_bound_ms = 0;  ///< a proven lower bound on the minimal T (== iteration_ms when exact)

  std::vector<double> stage_ms() const;
  double time_ms(int num_microbatches) const { return time.at(num_microbatches); }
  /// Layers [u, v) held by the pipeline's node at `position` (union of its stages; [0, 0) if none).
  std::pair<layer_index, layer_index> node_layers(int position) const;
};

/// The predicted time of a pipeline of these stages (their forward_ms and backward_ms set): the
/// 1F1B makespan (ARCHITECTURE.md §4) with every op charged for receiving its input from another node,
/// when the profile carries a link: a forward waits for the activation of the stage before it
/// when that stage is on another node, a backward for the gradient of the stage after it, each
/// a message of the boundary layer's output bytes (costs.link().message_ms). The receiving op is
/// charged because on the host data plane receiving costs the receiver's core, and a stage that
/// waits for its input waits at least that long. Stages on one node hand off in memory (free).
/// With a free link (all profiles before link costs) this is the makespan of the compute.
pipeline_time predicted_time(const layer_costs& costs, const std::vector<stage_spec>& stages);

/// Counters of the last generate() call, for benchmarks and tests of the pruning.
struct generator_stats {
  int candidate_caps = 0;   ///< distinct stage latencies that could be a bottleneck
  int caps_evaluated = 0;   ///< full DP runs over a bottleneck value
  int feasibility_runs = 0; ///< DP runs for feasibility and the bisection of the smallest cap
  std::uint64_t dp_cells = 0;       ///< DP cells computed (one per first layer, GPU and stage count)
  std::uint64_t memory_bytes = 0;   ///< what the call allocated for planning (the estimate it checked)
  int inexact_templates = 0;        ///< templates whose search the work limit stopped (exact false)
};

/// Default planning memory limit: 1 GiB. The DP's tables grow as rows x (L + 1) (rows: the (GPUs,
/// stages) pairs of up to n_max nodes); a profile and node range whose tables would exceed the
/// limit is refused before anything is allocated.
inline constexpr std::uint64_t kDefaultPlanningMemoryBytes = 1ull << 30;
struct generator_options {
  /// Bytes the planning tables may take (0: no limit). Larger inputs are refused at once with
  /// planning_error saying how much they need.
  std::uint64_t memory_limit_bytes = kDefaultPlanningMemoryBytes;
  /// DP cells the search may compute (0, the default: no limit, every template exact). Past it,
  /// only node counts without any template yet are searched (up to their first answer), and every
  /// template whose optimum is not proven is returned with exact = false and its lower bound.
  std::uint64_t work_limit_cells = 0;
};

/// The bytes generate(lo, hi) would allocate for planning (tables, candidate bottleneck values,
/// per node count bounds), computed without allocating.
std::uint64_t planning_memory_bytes(const layer_costs& costs, int hi);

/// Exact template generation (ARCHITECTURE.md §4): for each node count, the memory-feasible layout of
/// minimal T(4S). Not the paper's divide-and-conquer memo, which keeps one result per sub-problem
/// although T depends on the bottleneck stage and its suffix.
///
/// Method: T = sum_{k<k*} w + (3S + k* + 1) w* + 2 sum_{k>k*} w is additive once the bottleneck
/// value c = w* is fixed. For each candidate c (a stage latency), a backward DP over (first layer,
/// GPUs remaining, stages remaining) with three phases (after / at / before the bottleneck, stages
/// after it strictly below c, before it at most c) gives the exact minimum; the 4S*c term is charged
/// at the front. Counting GPUs from the back makes one DP serve every node count. Candidates are
/// visited in increasing c and pruned with T >= 2 W(n, S) + (3S - 1) c, W the least work of a
/// layout (in blocks of 16 candidates: the least work with every stage <= the block's largest
/// value, which also drops pairs infeasible there); each n starts from an answer (the min-max
/// layout of its most promising S), so the bound prunes from the first candidate. A DP run
/// computes only the (GPUs, stages) rows and first layers that the (n, S) pairs still open can
/// reach; transitions are sliding-window minima because both the cap and the memory limit bound
/// v monotonically in u. ARCHITECTURE.md §4 "Planning at frontier scale" has the complexity and
/// the memory bound.
class template_generator {
 public:
  explicit template_generator(const layer_costs& costs) : costs_(costs) {}
  template_generator(const layer_costs& costs, generator_options options) : costs_(costs), options_(options) {}

  /// Minimal-T template for n nodes; nullopt when no layout fits in memory.
  std::optional<pipeline_template> generate(int nodes);

  /// Templates for every node count in [lo, hi] from shared DP runs; result[i] is for lo + i.
  std::vector<std::optional<pipeline_template>> generate(int lo, int hi);

  /// feasible[n] for n in [0, hi]: some layout of n nodes fits in memory.
  std::vector<bool> feasible_node_counts(int hi);

  const generator_options& options() const { return options_; }

  const generator_stats& stats() const { return stats_; }

 private:
  /// Throws planning_error when `bytes` exceed the memory limit.
  void check_memory(std::uint64_t bytes, int hi);

  const layer_costs& costs_;
  generator_options options_;
  generator_stats stats_;
};

}  // namespace oobleck::planning
