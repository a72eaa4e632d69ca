// oobleck-local: composition root; the command lives in local_command.cpp.
#include "apps/cluster_commands.hpp"
#include "apps/program_main.hpp"

int main(int argc, char** argv) { return oobleck::apps::run_program(argc, argv, oobleck::apps::run_local_command); }
