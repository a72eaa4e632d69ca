// oobleck-plan: composition root; the command lives in plan_command.cpp.
#include "apps/plan_command.hpp"
#include "apps/program_main.hpp"

int main(int argc, char** argv) { return oobleck::apps::run_program(argc, argv, oobleck::apps::run_plan_command); }
