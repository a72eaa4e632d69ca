#pragma once
// oobleck-plan: plan a job from a profile and replay failure / join events through the policy.

#include <ostream>
#include <string>
#include <vector>

namespace oobleck::apps {

/// Runs oobleck-plan with args (without the program name); never throws. Returns the exit status of
/// program_main.hpp: 0, 2 on bad input, 1 on an internal failure (one "error: ..." line on err).
/// Output and --help go to out.
int run_plan_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace oobleck::apps
