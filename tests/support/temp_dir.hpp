#pragma once
// A fresh directory for one test's files, removed with everything in it when the test ends
// (however it ends: a failed REQUIRE throws through the destructor's scope).

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <system_error>

namespace oobleck::testing {

class temp_dir {
 public:
  /// Creates <system temp dir>/<prefix><pid>-<n>: distinct across processes and within one.
  explicit temp_dir(const std::string& prefix) {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            (prefix + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::create_directories(path_);
  }
  ~temp_dir() {
    std::error_code ignored;  // a destructor must not throw; a leftover directory is harmless
    std::filesystem::remove_all(path_, ignored);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;

  [[nodiscard]] const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace oobleck::testing
