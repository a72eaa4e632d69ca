#pragma once
// Runs a program to its end with its stdout and stderr captured, for tests of the programs as a
// user meets them: exit status, what each stream says.

#include <string>
#include <vector>

namespace oobleck::testing {

struct process_result {
  int exit_status = -1;  ///< -1 when the program did not exit normally (a signal, std::terminate)
  std::string out, err;
};

process_result run_process(const std::string& path, const std::vector<std::string>& args);

}  // namespace oobleck::testing
