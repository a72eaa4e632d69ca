// oobleck-sim: composition root; the command lives in sim_command.cpp.
#include "apps/program_main.hpp"
#include "apps/sim_command.hpp"

int main(int argc, char** argv) { return oobleck::apps::run_program(argc, argv, oobleck::apps::run_sim_command); }
