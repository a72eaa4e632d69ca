#include "apps/flags.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>

#include "messages/input_error.hpp"

namespace oobleck::apps {

using messages::input_error;

namespace {

CLI::Option* last_wins(CLI::Option* opt) { return opt->multi_option_policy(CLI::MultiOptionPolicy::TakeLast); }

/// Where std::from_chars starts reading `text`: past one leading '+' (accepted as the flags always
/// did; from_chars itself refuses it), but not in "+-4" or a lone "+". from_chars reads the same
/// under every C locale, unlike std::stod, which took the decimal point from LC_NUMERIC.
const char* number_start(const std::string& text) {
  const char* first = text.data();
  if (text.size() > 1 && text[0] == '+' && text[1] != '-') ++first;
  return first;
}

std::int64_t to_integer(const std::string& flag, const std::string& text, std::int64_t min, std::int64_t max) {
  std::int64_t x = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(number_start(text), end, x);
  if (ec == std::errc::result_out_of_range) {
    if (text.front() == '-') throw input_error(flag + " must be >= " + std::to_string(min) + ", got " + text);
    throw input_error(flag + " must be <= " + std::to_string(max) + ", got " + text);
  }
  if (ec != std::errc() || ptr != end) throw input_error(flag + " expects an integer, got '" + text + "'");
  if (x < min) throw input_error(flag + " must be >= " + std::to_string(min) + ", got " + text);
  if (x > max) throw input_error(flag + " must be <= " + std::to_string(max) + ", got " + text);
  return x;
}

}  // namespace

CLI::Option* add_integer(CLI::App& app, const std::string& name, std::int64_t min, std::int64_t max,
                         std::function<void(std::int64_t)> set, const std::string& help) {
  auto parse = [name, min, max, set = std::move(set)](const std::string& v) { set(to_integer(name, v, min, max)); };
  return last_wins(app.add_option_function<std::string>(name, std::move(parse), help))->type_name("INT");
}

CLI::Option* add_number(CLI::App& app, const std::string& name, double& target, double min, const std::string& help) {
  auto parse = [name, min, &target](const std::string& v) {
    double x = 0;
    const char* end = v.data() + v.size();
    const auto [ptr, ec] = std::from_chars(number_start(v), end, x);
    if (ec != std::errc() || ptr != end || !std::isfinite(x))
      throw input_error(name + " expects a finite number, got '" + v + "'");
    if (x < min) {
      // %g of the C locale whatever LC_NUMERIC says (snprintf would print 0,5 under de_DE).
      char bound[32];
      const auto printed = std::to_chars(bound, bound + sizeof bound, min, std::chars_format::general, 6);
      throw input_error(name + " must be >= " + std::string(bound, printed.ptr) + ", got " + v);
    }
    target = x;
  };
  return last_wins(app.add_option_function<std::string>(name, std::move(parse), help))->type_name("X");
}

CLI::Option* add_text(CLI::App& app, const std::string& name, std::string& target, const std::string& help) {
  return last_wins(app.add_option(name, target, help))->type_name("PATH");
}

std::pair<std::uint64_t, double> parse_step_seconds(const std::string& flag, const std::string& text) {
  const auto colon = text.find(':');
  try {
    if (colon == std::string::npos || colon == 0) throw std::invalid_argument("no STEP:");
    std::size_t used = 0;
    const long long step = std::stoll(text.substr(0, colon), &used);
    const double seconds = std::stod(text.substr(colon + 1));
    if (used != colon || step < 0 || !(seconds > 0)) throw std::invalid_argument("out of range");
    return {static_cast<std::uint64_t>(step), seconds};
  } catch (const std::exception&) {
    throw messages::input_error(flag + ": expected STEP:SECONDS (a step >= 0, seconds > 0), got '" + text + "'");
  }
}

std::vector<int> parse_id_list(const std::string& flag, const std::string& text) {
  std::vector<int> out;
  std::size_t start = 0;
  while (true) {
    const auto comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    int id = 0;
    const auto [ptr, ec] = std::from_chars(number_start(item), item.data() + item.size(), id);
    if (item.empty() || ec != std::errc() || ptr != item.data() + item.size() || id < 0)
      throw input_error(flag + " expects comma-separated node ids, got '" + text + "'");
    out.push_back(id);
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

bool parse_flags(CLI::App& app, const std::vector<std::string>& args, std::ostream& out) {
  // The help of the subcommand named before --help ("oobleck-ctl kill-node --help"), else the
  // program's: read before parsing, so that missing required flags do not hide it.
  CLI::App* shown = &app;
  std::string above;  // "oobleck-ctl [OPTIONS]": what comes before a subcommand in its usage line
  for (const auto& a : args) {
    if (a == "--help" || a == "-h") {
      out << shown->help(above);
      return false;
    }
    for (CLI::App* sub : shown->get_subcommands([](CLI::App*) { return true; }))
      if (sub->check_name(a)) {
        above = (above.empty() ? "" : above + " ") + shown->get_name() + " [OPTIONS]";
        shown = sub;
        break;
      }
  }
  if (app.get_require_subcommand_min() > 0 && shown == &app) {  // no subcommand named: say which there are
    std::string names;
    for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
      names += (names.empty() ? "" : ", ") + sub->get_name();
    throw input_error("a subcommand is required: " + names + " (see --help)");
  }
  app.allow_extras();  // so that the first unknown word is named below, in our words
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes them last first
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {  // -h inside a group of short flags
    out << app.help();
    return false;
  }
  if (!app.remaining().empty()) {
    std::string first = app.remaining().front();
    if (first.rfind("-", 0) == 0) throw input_error("unknown option " + first.substr(0, first.find('=')) + " (see --help)");
    throw input_error("unexpected argument '" + first + "' (see --help)");
  }
  return true;
}

runtime::device_spec parse_device_flag(const std::string& text) {
  runtime::device_spec device;
  try {
    device = runtime::parse_device_spec(text);
  } catch (const std::invalid_argument& e) {
    throw messages::input_error(std::string("--device: ") + e.what());
  }
  if (device.kind == "cuda" && !runtime::built_with_cuda())
    throw messages::input_error("--device " + text + ": " + runtime::no_cuda_build_reason());
  return device;
}

}  // namespace oobleck::apps
