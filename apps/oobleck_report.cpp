// oobleck-report: composition root; the command lives in report_command.cpp.
#include "apps/program_main.hpp"
#include "apps/report_command.hpp"

int main(int argc, char** argv) { return oobleck::apps::run_program(argc, argv, oobleck::apps::run_report_command); }
