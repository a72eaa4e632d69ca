#include "support/subprocess.hpp"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "runtime/child_process.hpp"

namespace oobleck::testing {

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

process_result run_process(const std::string& path, const std::vector<std::string>& args) {
  // Files, not pipes: a program that fills one stream while we wait on the other cannot block.
  const std::string stem = "/tmp/oobleck-subprocess-" + std::to_string(::getpid());
  const std::string out_path = stem + ".out", err_path = stem + ".err";
  runtime::child_process child(path, args,
                               {.out = runtime::child_output::file(out_path), .err = runtime::child_output::file(err_path)});
  const int status = child.wait();
  process_result r;
  if (!child.signalled()) r.exit_status = status;
  r.out = slurp(out_path);
  r.err = slurp(err_path);
  std::remove(out_path.c_str());
  std::remove(err_path.c_str());
  return r;
}

}  // namespace oobleck::testing
