#pragma once
// The error every decoder of outside bytes throws (profile JSON and Cap'n Proto, job files, and
// later checkpoint manifests and network payloads): the input is malformed, has an unknown or
// duplicate key, a value of the wrong type or out of its documented range. `what()` is one line for
// the user, naming the file or key path. Programs exit with status 2 on it (bad input), as on
// planning::planning_error (a well-formed job the planner cannot satisfy).

#include <stdexcept>

namespace oobleck::messages {

class input_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace oobleck::messages
