// The coordinator's phase machine: the drawing in coordinator_phase.hpp, the table the code checks
// every transition against, and the variant's alternatives must be one and the same machine.

#include "actors/coordinator_phase.hpp"

#include <doctest/doctest.h>

#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <utility>

using namespace oobleck::actors;

namespace {

using edge = std::pair<std::string, std::string>;

/// The edges drawn between "BEGIN PHASES" and "END PHASES" in the header ("//   from -> to  why").
std::set<edge> drawn_edges() {
  std::ifstream in(std::string(OOBLECK_SOURCE_DIR) + "/actors/coordinator_phase.hpp");
  REQUIRE(in);
  std::set<edge> out;
  bool inside = false;
  const std::regex line_re(R"(^//\s+([a-z_]+)\s+->\s+([a-z_]+)\s)");
  for (std::string line; std::getline(in, line);) {
    if (line.find("BEGIN PHASES") != std::string::npos) inside = true;
    else if (line.find("END PHASES") != std::string::npos) inside = false;
    else if (std::smatch m; inside && std::regex_search(line, m, line_re)) out.insert({m[1], m[2]});
  }
  return out;
}

}  // namespace

TEST_CASE("coordinator phases: the drawing, the transition table and the variant agree") {
  const auto drawn = drawn_edges();
  REQUIRE(drawn.size() >= 10);
  std::set<edge> table;
  for (const auto& t : transitions) table.insert({std::string(t.from), std::string(t.to)});
  CHECK(drawn == table);

  std::set<std::string> alternatives;
  for (auto n : phase_names()) alternatives.insert(std::string(n));
  CHECK(alternatives.size() == std::variant_size_v<job_phase>);
  std::set<std::string> mentioned;
  for (const auto& [from, to] : drawn) {
    if (from != "any") mentioned.insert(from);
    mentioned.insert(to);
  }
  CHECK(mentioned == alternatives);  // no phase without an edge, no edge to a phase that does not exist

  CHECK(phase_name(job_phase{}) == "registering");
  CHECK(phase_name(job_phase{phase::committing{}}) == "committing");
}

TEST_CASE("coordinator phases: allowed edges, `any`, and the ones that are not") {
  CHECK(transition_allowed("training", "committing"));
  CHECK(transition_allowed("committing", "training"));
  CHECK(transition_allowed("registering", "stopped"));   // any -> stopped
  CHECK(transition_allowed("checkpointing", "stopped"));
  CHECK_FALSE(transition_allowed("registering", "training"));  // never without forming first
  CHECK_FALSE(transition_allowed("forming", "committing"));    // nothing to commit before a step ran
  CHECK_FALSE(transition_allowed("stopped", "training"));      // stopped is the end
  CHECK_FALSE(transition_allowed("ready", "forming"));         // a job without steps never trains
}
