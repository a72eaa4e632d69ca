#include "apps/program_main.hpp"

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <CLI/Error.hpp>

#include <cstdlib>
#include <exception>
#include <iostream>
#include <stdexcept>

#include "messages/input_error.hpp"
#include "planning/profile.hpp"

namespace oobleck::apps {

namespace {

std::string first_line(const char* what) {
  std::string s = what ? what : "";
  if (const auto nl = s.find('\n'); nl != std::string::npos) s.resize(nl);
  return s.empty() ? "(no message)" : s;
}

int report(std::ostream& err, int status, const std::string& prefix, const char* what) noexcept {
  try {
    err << "error: " << prefix << first_line(what) << "\n" << std::flush;
  } catch (...) {
    // Nowhere left to say it; the status still tells.
  }
  return status;
}

}  // namespace

bool exit_with_parent_if_asked() {
  const char* v = std::getenv(exit_with_parent_variable);
  if (!v) return false;
  char* end = nullptr;
  const long parent = std::strtol(v, &end, 10);
  ::unsetenv(exit_with_parent_variable);  // for this process only, not for what it starts
  if (end == v || *end != '\0' || parent <= 1) return false;
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  // The parent may have died before the line above: this process has been handed to another one.
  if (::getppid() != static_cast<pid_t>(parent)) ::raise(SIGKILL);
  return true;
}

int exit_status_of(std::ostream& err, const std::function<int()>& body) noexcept {
  try {
    return body();
  } catch (const CLI::ParseError& e) {
    return report(err, 2, "", e.what());
  } catch (const messages::input_error& e) {
    return report(err, 2, "", e.what());
  } catch (const planning::planning_error& e) {
    return report(err, 2, "", e.what());
  } catch (const std::invalid_argument& e) {
    return report(err, 2, "", e.what());
  } catch (const unavailable& e) {
    return report(err, 1, "", e.what());
  } catch (const std::exception& e) {
    return report(err, 1, "internal: ", e.what());
  } catch (...) {
    return report(err, 1, "internal: ", "an exception of unknown type");
  }
}

int run_program(int argc, char** argv, const command& body) noexcept {
  exit_with_parent_if_asked();
  return exit_status_of(std::cerr, [&] {
    const int status = body(std::vector<std::string>(argv + 1, argv + argc), std::cout, std::cerr);
    if (!std::cout.flush()) throw std::runtime_error("cannot write to standard output");
    return status;
  });
}

}  // namespace oobleck::apps
