#include "bench/bench_flags.hpp"

#include <exception>
#include <iostream>
#include <utility>

#include "apps/flags.hpp"
#include "messages/input_error.hpp"

namespace oobleck::bench {

bool flag::given() const { return option_->count() > 0; }

flag& flag::type_name(const std::string& name) {
  option_->type_name(name);
  return *this;
}

flag_set::flag_set(const std::string& description, const std::string& name)
    : app_(std::make_unique<CLI::App>(description, name)) {}

flag_set::~flag_set() = default;

flag flag_set::add_switch(const std::string& name, bool& target, const std::string& help) {
  return flag(app_->add_flag(name, target, help));
}

flag flag_set::add_integer(const std::string& name, std::int64_t min, std::int64_t max,
                           std::function<void(std::int64_t)> set, const std::string& help) {
  return flag(apps::add_integer(*app_, name, min, max, std::move(set), help));
}

flag flag_set::add_number(const std::string& name, double& target, double min, const std::string& help) {
  return flag(apps::add_number(*app_, name, target, min, help));
}

flag flag_set::add_text(const std::string& name, std::string& target, const std::string& help) {
  return flag(apps::add_text(*app_, name, target, help));
}

flag flag_set::add_internal_words(const std::string& name, std::vector<std::string>& target, int count,
                                  const std::string& help) {
  auto take = [name, count, &target](const std::vector<std::string>& words) {
    if (static_cast<int>(words.size()) != count)
      throw messages::input_error(name + " takes " + std::to_string(count) + " words, got " +
                                  std::to_string(words.size()));
    target = words;
  };
  return flag(app_->add_option_function<std::vector<std::string>>(name, std::move(take), help)
                  ->expected(1, count)
                  ->group(""));
}

std::optional<int> flag_set::parse(int argc, char** argv) {
  try {
    if (!apps::parse_flags(*app_, std::vector<std::string>(argv + 1, argv + argc), std::cout)) return 0;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
  return std::nullopt;
}

}  // namespace oobleck::bench
