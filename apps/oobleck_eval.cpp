// oobleck-eval: composition root; the command lives in weights_command.cpp.
#include "apps/program_main.hpp"
#include "apps/weights_command.hpp"

int main(int argc, char** argv) { return oobleck::apps::run_program(argc, argv, oobleck::apps::run_eval_command); }
