#pragma once
// oobleck-profile: measure the model's layers and write the planning profile.

#include <ostream>
#include <string>
#include <vector>

namespace oobleck::apps {

/// Never throws. Returns the exit status of program_main.hpp: 0, 2 on bad input (checked before
/// LibTorch runs), 1 on an internal failure such as LibTorch running out of memory; one
/// "error: ..." line on err. Progress and the per-layer table go to err; with --json the profile
/// goes to out.
int run_profile_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace oobleck::apps
