// oobleck-profile: composition root; the command lives in profile_command.cpp.
#include <iostream>

#include "apps/profile_command.hpp"

int main(int argc, char** argv) {
  return oobleck::apps::run_profile_command(std::vector<std::string>(argv + 1, argv + argc), std::cout, std::cerr);
}
