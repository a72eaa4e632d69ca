// oobleck-worker: composition root; the command lives in worker_command.cpp.
#include "apps/cluster_commands.hpp"
#include "apps/program_main.hpp"
#include "runtime/fork_server.hpp"

namespace {

int run(int argc, char** argv) { return oobleck::apps::run_program(argc, argv, oobleck::apps::run_worker_command); }

}  // namespace

int main(int argc, char** argv) {
  // Started by oobleck-local as its fork server (runtime/fork_server.hpp): the workers are copies of
  // this process, which has loaded LibTorch once; each runs run() on its own arguments.
  if (const auto socket = oobleck::runtime::fork_server_socket())
    return oobleck::runtime::serve_forks(*socket, run, oobleck::apps::exit_with_parent_if_asked(), argc, argv);
  return run(argc, argv);
}
