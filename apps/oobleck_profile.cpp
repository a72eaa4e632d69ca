// oobleck-profile: composition root; the command lives in profile_command.cpp.
#include "apps/profile_command.hpp"
#include "apps/program_main.hpp"

int main(int argc, char** argv) { return oobleck::apps::run_program(argc, argv, oobleck::apps::run_profile_command); }
