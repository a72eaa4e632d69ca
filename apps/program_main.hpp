#pragma once
// The root of every program: whatever a command throws becomes one "error: ..." line on stderr and
// an exit status, so no program ends in std::terminate.
//
//   0  success (and --help)
//   2  bad input: a flag, a job file, a profile, a job the planner cannot satisfy
//      (CLI::ParseError, messages::input_error, planning::planning_error, std::invalid_argument)
//   1  something the program needs was not there (apps::unavailable: a coordinator that no address
//      answered), said as it is; or an internal failure: any other exception, LibTorch's (out of
//      memory) included, whose line starts "error: internal: "

#include <functional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

namespace oobleck::apps {

/// Something outside the program that it needs did not answer or is not there: no coordinator at
/// any address given within the time allowed. Not bad input (the address may be right and the
/// coordinator not up yet) and not a fault of the program: exit status 1, without "internal:".
class unavailable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A command: its arguments without the program name, stdout and stderr; returns the exit status.
using command = std::function<int(const std::vector<std::string>& args, std::ostream& out, std::ostream& err)>;

/// Runs body and returns its status, or the status above for what it throws (after writing the
/// error line to err). Only the first line of an exception's what() is shown: LibTorch appends a
/// backtrace.
int exit_status_of(std::ostream& err, const std::function<int()>& body) noexcept;

/// The environment variable through which a program asks the programs it starts to end with it:
/// oobleck-local sets it to its pid, so that its coordinator and workers do not outlive it even when
/// it is killed (kill -9, the OOM killer) and cannot stop them itself.
inline constexpr const char* exit_with_parent_variable = "OOBLECK_EXIT_WITH_PARENT";

/// When exit_with_parent_variable holds the pid of this process's parent: this process is killed
/// (SIGKILL) when that parent's thread which started it ends, and at once if the parent has already
/// gone. The variable is removed from this process's environment. run_program calls it first.
/// Returns whether it was asked (and this process still runs).
bool exit_with_parent_if_asked();

/// The whole of main(): runs the command on argv with std::cout and std::cerr. A write to stdout
/// that fails (a full disk, a closed pipe) is an internal failure, not a silent success.
int run_program(int argc, char** argv, const command& body) noexcept;

}  // namespace oobleck::apps
