#pragma once
// oobleck-plan: plan a job from a profile and replay failure / join events through the policy.

#include <ostream>
#include <string>
#include <vector>

namespace oobleck::apps {

/// Runs oobleck-plan with args (without the program name). Returns the exit code: 0 success,
/// 2 bad input (one "error: ..." line on err). Output goes to out.
int run_plan_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace oobleck::apps
