// oobleck-plan: composition root; the command lives in plan_command.cpp.
#include <iostream>

#include "apps/plan_command.hpp"

int main(int argc, char** argv) {
  return oobleck::apps::run_plan_command(std::vector<std::string>(argv + 1, argv + argc), std::cout, std::cerr);
}
