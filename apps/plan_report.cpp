#include "apps/plan_report.hpp"

#include <iomanip>
#include <sstream>

namespace oobleck::apps {

using value = nlohmann::ordered_json;

namespace {

value object() { return value::object(); }
value array() { return value::array(); }

value ids(const std::vector<planning::node_id>& xs) {
  value out = array();
  for (auto x : xs) out.push_back(x.value);
  return out;
}

double samples_per_s(int global_batch, double step_ms) { return step_ms > 0 ? global_batch * 1000.0 / step_ms : 0; }

std::string node_list(const std::vector<planning::node_id>& nodes) {
  std::ostringstream os;
  for (std::size_t i = 0; i < nodes.size(); ++i) os << (i ? "," : "") << nodes[i].value;
  return os.str();
}

// "6..16" for runs, "6, 9, 12" otherwise.
std::string ranges(const std::vector<int>& xs) {
  std::ostringstream os;
  for (std::size_t i = 0; i < xs.size();) {
    std::size_t j = i;
    while (j + 1 < xs.size() && xs[j + 1] == xs[j] + 1) ++j;
    os << (i ? ", " : "") << xs[i];
    if (j > i) os << (j == i + 1 ? ", " : "..") << xs[j];
    i = j + 1;
  }
  return xs.empty() ? "none" : os.str();
}

void print_pipelines(std::ostream& out, const std::vector<planning::pipeline_instance>& ps) {
  for (std::size_t i = 0; i < ps.size(); ++i)
    out << "    pipeline " << i << ": template " << ps[i].template_nodes << " nodes [" << node_list(ps[i].nodes)
        << "], " << ps[i].microbatches << " microbatches, " << ps[i].time_ms << " ms\n";
}

}  // namespace

std::string json_line(const value& v) { return v.dump(-1, ' ', false, value::error_handler_t::replace); }

value template_to_json(const planning::pipeline_template& t) {
  value stages = array();
  for (const auto& s : t.stages) {
    value stage = object();
    stage["node"] = s.node;
    stage["gpus"] = s.gpus;
    stage["layers"] = {s.first_layer.value, s.end_layer.value};
    stage["ms"] = s.ms;
    stages.push_back(std::move(stage));
  }
  const int four_s = 4 * static_cast<int>(t.stages.size());
  value o = object();
  o["nodes"] = t.nodes;
  o["iteration_ms"] = t.iteration_ms;
  o["exact"] = t.exact;
  o["lower_bound_ms"] = t.lower_bound_ms;
  o["makespan_4s_ms"] = t.time_ms(four_s);
  o["stages"] = std::move(stages);
  return o;
}

value pipelines_to_json(const std::vector<planning::pipeline_instance>& ps) {
  value out = array();
  for (const auto& p : ps) {
    value o = object();
    o["nodes"] = ids(p.nodes);
    o["template_nodes"] = p.template_nodes;
    o["microbatches"] = p.microbatches;
    o["time_ms"] = p.time_ms;
    out.push_back(std::move(o));
  }
  return out;
}

value plan_to_json(const planning::job_plan& plan, const std::vector<plan_event>& events, int global_batch) {
  value templates = array();
  for (const auto& t : plan.templates.templates) templates.push_back(template_to_json(t));
  value evs = array();
  for (const auto& e : events) {
    const auto& r = e.result;
    value o = object();
    o["lost"] = ids(e.lost);
    o["joined"] = ids(e.joined);
    o["action"] = to_string(r.action);
    if (r.action == planning::reconfiguration_action::checkpoint_and_stop) {
      o["reason"] = r.reason;
      o["pipelines"] = array();
      o["step_ms"] = nullptr;
      o["copies"] = array();
    } else {
      value rules = array();
      for (auto rule : r.rules) rules.push_back(to_string(rule));
      value copies = array();
      for (const auto& c : r.copies) {
        value copy = object();
        copy["layer"] = c.layer.value;
        copy["from_node"] = c.from_node.value;
        copy["to_node"] = c.to_node.value;
        copy["bytes"] = c.bytes;
        copies.push_back(std::move(copy));
      }
      o["rules"] = std::move(rules);
      o["pipelines"] = pipelines_to_json(r.pipelines);
      o["idle_nodes"] = ids(r.idle_nodes);
      o["step_ms"] = r.step_ms;
      o["samples_per_s"] = samples_per_s(global_batch, r.step_ms);
      o["copies"] = std::move(copies);
    }
    evs.push_back(std::move(o));
  }
  value instantiation = object();
  instantiation["pipelines"] = pipelines_to_json(plan.pipelines);
  instantiation["idle_nodes"] = ids(plan.idle_nodes);
  instantiation["step_ms"] = plan.step_ms;
  instantiation["samples_per_s"] = samples_per_s(global_batch, plan.step_ms);
  value out = object();
  out["n0"] = plan.spec.n0;
  out["n_max"] = plan.spec.n_max;
  out["covered_node_counts"] = value(plan.spec.covered_node_counts);
  out["templates"] = std::move(templates);
  out["instantiation"] = std::move(instantiation);
  out["events"] = std::move(evs);
  return out;
}

void print_template(std::ostream& out, const planning::pipeline_template& t) {
  const int four_s = 4 * static_cast<int>(t.stages.size());
  out << "  " << t.nodes << (t.nodes == 1 ? " node" : " nodes") << ": " << t.stages.size()
      << " stages, ranked by T(4S) = " << t.iteration_ms << " ms (1F1B makespan " << t.time_ms(four_s)
      << " ms), bottleneck " << planning::bottleneck_stage(t.stage_ms()) << "\n";
  if (!t.exact)
    out << "      not proven minimal (the planning work limit stopped its search): no layout has T(4S) below "
        << t.lower_bound_ms << " ms\n";
  for (std::size_t k = 0; k < t.stages.size(); ++k) {
    const auto& s = t.stages[k];
    out << "      stage " << k << ": node " << s.node << ", " << s.gpus << " GPU" << (s.gpus > 1 ? "s" : " ")
        << ", layers [" << s.first_layer.value << ", " << s.end_layer.value << "), " << s.ms << " ms\n";
  }
}

void print_plan(std::ostream& out, const planning::profile& prof, const planning::job_config& job,
                const planning::job_plan& plan, const std::vector<plan_event>& events) {
  out << std::setprecision(6);
  out << "model " << prof.model << ": " << prof.num_layers() << " layers, " << prof.gpus_per_node
      << " GPUs per node, microbatch " << prof.microbatch_size << "\n";
  if (prof.link == planning::link_profile{})
    out << "link between nodes: free (the profile has no link costs)\n";
  else
    out << "link between nodes: " << prof.link.latency_ms << " ms per message, "
        << prof.link.bytes_per_ms / 1e6 << " GB/s\n";
  out << "job: " << job.nodes << " nodes, f = " << job.fault_tolerance << ", global batch " << job.global_batch
      << " = " << plan.num_microbatches << " microbatches\n";
  out << "node specification: n0 = " << plan.spec.n0 << ", n_max = " << plan.spec.n_max
      << "; node counts covered by >= " << job.fault_tolerance + 1 << " pipelines: "
      << ranges(plan.spec.covered_node_counts) << "\n";
  out << "templates (" << plan.templates.templates.size() << "):\n";
  for (const auto& t : plan.templates.templates) print_template(out, t);
  out << "instantiation: " << plan.pipelines.size() << " pipelines, step " << plan.step_ms << " ms, "
      << samples_per_s(job.global_batch, plan.step_ms) << " samples/s predicted\n";
  print_pipelines(out, plan.pipelines);
  if (!plan.idle_nodes.empty()) out << "    idle nodes: " << node_list(plan.idle_nodes) << "\n";
  for (std::size_t i = 0; i < events.size(); ++i) {
    const auto& e = events[i];
    out << "event " << i + 1 << ":";
    if (!e.lost.empty()) out << " lost [" << node_list(e.lost) << "]";
    if (!e.joined.empty()) out << " joined [" << node_list(e.joined) << "]";
    if (e.result.action == planning::reconfiguration_action::checkpoint_and_stop) {
      out << " -> checkpoint and stop: " << e.result.reason << "\n";
      continue;
    }
    std::int64_t bytes = 0;
    for (const auto& c : e.result.copies) bytes += c.bytes;
    out << " -> continue (" << e.result.reason << "), " << e.result.pipelines.size() << " pipelines, step "
        << e.result.step_ms << " ms, " << samples_per_s(job.global_batch, e.result.step_ms) << " samples/s, "
        << e.result.copies.size() << " layer copies (" << bytes << " bytes)\n";
    print_pipelines(out, e.result.pipelines);
    if (!e.result.idle_nodes.empty()) out << "    idle nodes: " << node_list(e.result.idle_nodes) << "\n";
  }
}

}  // namespace oobleck::apps
