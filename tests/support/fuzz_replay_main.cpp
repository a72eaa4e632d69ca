// Replays a libFuzzer target's inputs without libFuzzer: the test build (GCC) links each harness of
// fuzz/ with this main and runs it on the target's seed corpus (cmake/fuzz_replay.cmake), so the
// harnesses compile with every change and every seed (findings included: they are regression
// inputs) still ends decoded or refused. Fuzzing itself is scripts/fuzz.sh (clang, libFuzzer).
//
//   fuzz_replay_NAME PATH...   every regular file of each PATH (a file, or a folder, not recursed)
//
// A harness that finds a problem aborts, as under libFuzzer: the test fails with the input named
// on stderr. Exit status 0 when every input passed, 2 on bad arguments (a missing path, no input).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s PATH... (files, or folders of inputs)\n", argv[0]);
    return 2;
  }
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    const fs::path p = argv[i];
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      for (const auto& e : fs::directory_iterator(p))
        if (e.is_regular_file()) inputs.push_back(e.path());
    } else if (fs::is_regular_file(p, ec)) {
      inputs.push_back(p);
    } else {
      std::fprintf(stderr, "error: %s is neither a file nor a folder\n", p.c_str());
      return 2;
    }
  }
  if (inputs.empty()) {
    std::fprintf(stderr, "error: no input in the given paths\n");
    return 2;
  }
  std::sort(inputs.begin(), inputs.end());
  for (const auto& p : inputs) {
    std::ifstream in(p, std::ios::binary);
    const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    if (!in.good() && !in.eof()) {
      std::fprintf(stderr, "error: cannot read %s\n", p.c_str());
      return 2;
    }
    std::fprintf(stderr, "%s (%zu bytes)\n", p.c_str(), bytes.size());
    // A copy of exactly the input's size, as libFuzzer hands it: a harness that reads past the
    // end reads past an allocation (which AddressSanitizer, in the fuzz build, reports).
    std::vector<std::uint8_t> data(bytes.begin(), bytes.end());
    LLVMFuzzerTestOneInput(data.data(), data.size());
  }
  std::printf("%zu input(s) replayed\n", inputs.size());
  return 0;
}
