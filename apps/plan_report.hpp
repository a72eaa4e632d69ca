#pragma once
// How oobleck-plan shows a plan: the JSON object of the planner issue, and a readable report.

#include <nlohmann/json.hpp>
#include <ostream>
#include <vector>

#include "planning/planner.hpp"
#include "planning/reconfiguration.hpp"

namespace oobleck::apps {

/// One --fail / --join event and what the policy decided.
struct plan_event {
  std::vector<planning::node_id> lost;
  std::vector<planning::node_id> joined;
  planning::reconfiguration result;
};

// Keys keep the documented order (README, `--json`).
nlohmann::ordered_json template_to_json(const planning::pipeline_template& t);
nlohmann::ordered_json pipelines_to_json(const std::vector<planning::pipeline_instance>& ps);
nlohmann::ordered_json plan_to_json(const planning::job_plan& plan, const std::vector<plan_event>& events,
                                    int global_batch);

/// One line of JSON, as `--json` prints it.
std::string json_line(const nlohmann::ordered_json& v);

void print_template(std::ostream& out, const planning::pipeline_template& t);
void print_plan(std::ostream& out, const planning::profile& prof, const planning::job_config& job,
                const planning::job_plan& plan, const std::vector<plan_event>& events);

}  // namespace oobleck::apps
