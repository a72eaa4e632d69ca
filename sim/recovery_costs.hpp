#pragma once
// The constants that price a failure: Oobleck's recovery (detection, planning, layer copies),
// checkpoint-restart (Varuna, Bamboo's fatal failures, Oobleck below (f+1) n0 nodes) and Bamboo's
// redundant computation. The defaults below model the paper's cluster, each next to its source. A
// JSON file overrides any of them: bench/recovery writes one (bench/results/recovery.json) with
// the local cluster's measured detection, planning and copy rate (loopback, 2 cores); it measures
// no checkpoint, restart, Varuna or Bamboo figure, so those keep their defaults.

#include <string>

namespace oobleck::sim {

struct recovery_costs {
  // --- Oobleck (paper §5; ARCHITECTURE.md §5) ---
  /// From a node's loss to the coordinator's knowing it. A crash closes TCP at once (13-30 ms
  /// measured by bench/recovery on the loaded local cluster); a hung node needs the heartbeat
  /// timeout (cluster.connection_timeout_ms, 10 s by default). 1 s: a crash on a busy cluster
  /// with margin, or a hang with a 1 s timeout.
  double detection_ms = 1000;
  /// Re-planning plus the new epoch's communicators: the reconfiguration decision takes < 0.1 ms
  /// (bench/RESULTS.md) but NCCL communicators over 30 GPUs take seconds; 2 s is the low end of
  /// the 2-10 s the paper's simulator charged per reconfiguration.
  double planning_ms = 2000;
  /// Per-node link bandwidth for the copy plan (bytes/s): half of the paper's 200 Gb/s
  /// InfiniBand. Copies run in parallel: a reconfiguration waits for the busiest link.
  double copy_bytes_per_s = 12.5e9;

  // --- checkpoint-restart ---
  /// Writing a checkpoint: fixed + training state / storage bandwidth. Fitted to the Oobleck
  /// artifact's Varuna checkpoint times (simulations/varuna_simulator.py: BERT-large 15.8 s,
  /// GPT-3 2.7B 50 s, 6.7B 120 s) with 16 bytes of state per parameter: 10 s + bytes / 1 GB/s
  /// gives 15.9 s, 54.5 s and 119.8 s for sim/model_zoo's models.
  double checkpoint_fixed_ms = 10000;
  double storage_bytes_per_s = 1e9;
  /// A restart: framework re-initialisation and rendezvous, then loading the state. The artifact
  /// charges 60-70 s for the small models and 465 s / 581 s for GPT-3 2.7B / 6.7B (its
  /// local_rendezvous_timeout minus the checkpoint time): 60 s + bytes / 0.2 GB/s gives 89 s,
  /// 282 s and 609 s (the 2.7B restart is the one the fit misses).
  double restart_fixed_ms = 60000;
  double load_bytes_per_s = 0.2e9;

  // --- Varuna (paper §6.1) ---
  /// "we periodically perform synchronous checkpointing for every 10 iterations".
  int varuna_checkpoint_every_steps = 10;

  // --- Bamboo (Thorpe et al., NSDI'23; paper §2.2) ---
  /// Fraction of the successor stage's forward each node recomputes in every step (1: all of it;
  /// the Oobleck paper measures > 50% overhead from redundant computation, §6.4.2).
  double bamboo_redundancy_factor = 1.0;
  /// A failure Bamboo absorbs (the predecessor takes the stage over): the Bamboo artifact's
  /// local rendezvous, 1 s (project/simulator of uclasystem/bamboo).
  double bamboo_takeover_ms = 1000;

  // --- checkpoint-restart as large runs do it (issue 27; sim/checkpoint_restart_policy.hpp) ---
  /// Asynchronous checkpoints: training blocks only while each GPU copies its share of the state
  /// to host memory (state / (nodes x GPUs) / this), and the write to storage runs in the
  /// background at storage_bytes_per_s. 25 GB/s: about half of PCIe Gen5 x16's 64 GB/s, what a
  /// pinned device-to-host copy sustains on an H100 host.
  double snapshot_bytes_per_s = 25e9;
  /// Seconds between checkpoints; 0: Young-Daly's optimum sqrt(2 x snapshot x MTTF) (Young 1974,
  /// Daly 2006) for the job's MTTF, and never shorter than one background write.
  double checkpoint_interval_s = 0;

  // --- replica groups as TorchFT does them (issue 27; sim/replica_group_policy.hpp) ---
  /// Groups kept warm beyond those training (started, state not current); 0: a lost group's
  /// place is empty, and the global batch shrinks, until its replacement has started.
  int spare_groups = 0;

  std::string source = "defaults (no recovery-costs file)";
};

/// The constants for a job of thousands of 8-GPU H100 nodes (bench/sim_scale, oobleck-sim
/// --model dense-400b), each next to its source in recovery_costs.cpp. Oobleck's detection and
/// decision are what bench/recovery measures on the local cluster (bench/results/recovery.json)
/// where they do not depend on scale, and documented bandwidths where they do.
recovery_costs frontier_recovery_costs();

/// Reads a JSON object whose keys are the fields above (any subset; "source" a string, and
/// "measured" anything, for the benchmark's own notes). Unknown keys, wrong types, negative or
/// zero bandwidths are messages::input_error naming the file and key.
/// Keys the file does not give keep their value in `base`.
recovery_costs read_recovery_costs(const std::string& path, const recovery_costs& base = {});

/// Parses the same from text (`name` in messages).
recovery_costs parse_recovery_costs(const std::string& text, const std::string& name, const recovery_costs& base = {});

}  // namespace oobleck::sim
