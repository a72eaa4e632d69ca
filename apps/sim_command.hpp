#pragma once
// oobleck-sim: throughput under a node availability trace, Oobleck against Varuna-like and
// Bamboo-like baselines.

#include <ostream>
#include <string>
#include <vector>

namespace oobleck::apps {

/// Runs oobleck-sim with args (without the program name); never throws. Exit status of
/// program_main.hpp: 0, 2 on bad input (flags, profile, trace, recovery-costs file, an impossible
/// job), 1 on an internal failure. The report (or --json) goes to out.
int run_sim_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace oobleck::apps
