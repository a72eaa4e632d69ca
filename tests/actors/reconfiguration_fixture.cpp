#include "actors/reconfiguration_fixture.hpp"

#include <doctest/doctest.h>

#include <algorithm>

#include "planning/synthetic_profile.hpp"
#include "support/coordinator_probe.hpp"

using namespace oobleck::actors;
using namespace oobleck::messages;

namespace oobleck::testing {
namespace {

const std::string token(64, 'k');

stage_actor::behavior_type fake_stage(stage_actor::pointer self, fake_stage_record* rec) {
  return {
      [self, rec](epoch_assignment& a) -> caf::result<form_timing> {
        rec->trace.push_back("assign " + std::to_string(a.epoch));
        rec->assignments[a.epoch] = a;
        rec->current_epoch = a.epoch;
        if (rec->hold_form.count(a.epoch)) return self->make_response_promise<form_timing>();
        // Copies that take longer on higher ranks: the record keeps the slowest node's.
        return form_timing{1000, 100 + 1000 * std::max(0, a.rank), 500, 0, a.copies.empty() ? 0 : 1'000'000,
                           200 + std::max(0, a.rank), 50 + 10 * std::max(0, a.rank)};
      },
      [self, rec](stage_step& s) -> caf::result<stage_done> {
        rec->trace.push_back("step " + std::to_string(s.epoch) + " " + std::to_string(s.step));
        rec->steps.push_back(s);
        const auto& st = rec->assignments.at(s.epoch).stages.at(0);
        if (rec->hold_step == std::pair{s.epoch, s.step}) return self->make_response_promise<stage_done>();
        stage_done d{s.epoch, s.step, st.pipeline, st.stage, 0, {}};
        if (st.stage + 1 == st.num_stages) d.loss_sum = 2.0 * s.microbatches;
        return d;
      },
      [self, rec](commit_step& c) -> caf::result<step_committed> {
        rec->trace.push_back("commit " + std::to_string(c.epoch) + " " + std::to_string(c.step));
        rec->commits.push_back(c);
        if (rec->hold_commit == std::pair{c.epoch, c.step}) return self->make_response_promise<step_committed>();
        step_committed out{c.epoch, c.step, -1, {}};
        const auto& a = rec->assignments.at(c.epoch);
        if (a.stages.empty()) return out;
        const auto& st = a.stages.at(0);
        for (int l = st.first_layer; l < st.end_layer; ++l) out.digests.push_back({l, 1000u + static_cast<unsigned>(c.step)});
        return out;
      },
      [self, rec](write_checkpoint& w) -> caf::result<checkpoint_written> {
        rec->trace.push_back("write " + std::to_string(w.step));
        rec->writes.push_back(w);
        if (rec->hold_write) return self->make_response_promise<checkpoint_written>();
        checkpoint_written out{w.request, -1, {}, {}, {}};
        for (auto l : w.layers) {
          if (rec->not_held.count(l))
            out.missing.push_back(l);
          else
            out.files.push_back({l, 100u + static_cast<std::uint64_t>(l), "sha-" + std::to_string(l)});
        }
        return out;
      },
  };
}

}  // namespace

bool fake_stage_record::traced(const std::string& what) const {
  return std::find(trace.begin(), trace.end(), what) != trace.end();
}
std::size_t fake_stage_record::position(const std::string& what) const {
  return static_cast<std::size_t>(std::find(trace.begin(), trace.end(), what) - trace.begin());
}
std::size_t fake_stage_record::commits_of(std::uint64_t step) const {
  return static_cast<std::size_t>(std::count_if(commits.begin(), commits.end(), [&](const commit_step& c) { return c.step == step; }));
}
std::size_t fake_stage_record::runs_of(std::uint64_t step, std::optional<std::uint64_t> epoch) const {
  return static_cast<std::size_t>(std::count_if(steps.begin(), steps.end(), [&](const stage_step& s) {
    return s.step == step && (!epoch || s.epoch == *epoch);
  }));
}

fixture::config::config() {
  add_protocol_types(*this);
  set("scheduler.policy", caf::atom("testing"));
}

fixture::fixture(std::uint64_t steps, std::uint64_t checkpoint_every, bool checkpoints) {
  planning::synthetic_gpt g;
  g.layers = 6;
  g.hidden = 32;
  g.heads = 2;
  g.sequence = 16;
  g.vocab = 256;
  g.microbatch = 2;
  g.gpus_per_node = 1;
  g.device_tflops = 0.02;
  g.device_memory_bytes = 800'000;
  profile = planning::synthetic_gpt_profile(g);
  job.nodes = nodes;
  job.fault_tolerance = 1;
  job.global_batch = 16;
  job.microbatch = 2;
  plan = planning::plan_job(profile, job);

  coordinator_deps d;
  d.policy = {token, "hash", protocol_version};
  d.expected_nodes = nodes;
  d.log = [this](const std::string& l) { log.push_back(l); };
  d.profile = profile;
  d.job = job;
  d.steps = steps;
  d.on_step = [this](const step_record& r) { records.push_back(r); };
  d.on_reconfigured = [this](const reconfiguration_record& r) { recoveries.push_back(r); };
  if (checkpoints || checkpoint_every > 0) {
    d.checkpoint.root = "/ckpt";
    d.checkpoint.every = checkpoint_every;
    d.checkpoint.begin = [](std::uint64_t step) { return "/ckpt/.tmp-" + std::to_string(step); };
    d.checkpoint.finish = [this](const std::string&, std::uint64_t step, const std::vector<checkpoint_layer_file>& files) {
      finished.emplace_back(step, files);
      return "/ckpt/step-" + std::to_string(step);
    };
    d.checkpoint.discard = [this](const std::string& temp) { discarded.push_back(temp); };
    d.checkpoint.on_stop = [this](const checkpoint_stop_record& r) { stops.push_back(r); };
  }
  coord = sys.spawn(coordinator, std::move(d));
  sched.run();
}

fixture::~fixture() {
  caf::anon_send_exit(coord, caf::exit_reason::user_shutdown);
  for (auto& m : all_monitors) caf::anon_send_exit(m, caf::exit_reason::user_shutdown);
  for (auto& [id, s] : stage_actors) caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
  sched.run();
}

void fixture::start(const setup_map& setup) {
  for (int i = 0; i < nodes; ++i) add_worker(i, setup);
  sched.run();
  REQUIRE(monitors.size() == static_cast<std::size_t>(nodes));
  for (auto& [id, rec] : stages) REQUIRE(rec->node == id);
}

void fixture::add_worker(int i, const setup_map& setup) {
  monitor_deps d;
  d.coordinator = coord;
  d.token = token;
  d.name = "w" + std::to_string(i);
  d.data = {"127.0.0.1", static_cast<std::uint16_t>(5000 + i)};
  d.make_stage = [this, setup](const admission& a) {
    auto& rec = stages[a.node];
    rec = std::make_unique<fake_stage_record>();
    rec->node = a.node;
    if (auto it = setup.find(a.node); it != setup.end()) it->second(*rec);
    auto* r = rec.get();
    spawned_stage s;
    s.actor = sys.spawn(fake_stage, r);
    stage_actors[a.node] = s.actor;
    s.abort = [r](std::uint64_t epoch, const std::string&) { r->trace.push_back("abort " + std::to_string(epoch)); };
    return s;
  };
  d.admitted = [this, i](const admission& a) { monitors[a.node] = all_monitors.at(static_cast<std::size_t>(i)); };
  all_monitors.push_back(sys.spawn(monitor, std::move(d)));
}

void fixture::kill(std::int64_t node) {
  caf::anon_send_exit(monitors.at(node), caf::exit_reason::kill);
  caf::anon_send_exit(stage_actors.at(node), caf::exit_reason::kill);
}

void fixture::kill_during_commit(std::int64_t node, std::pair<std::uint64_t, std::uint64_t> commit, setup_map setup) {
  setup[node] = [commit](fake_stage_record& r) { r.hold_commit = commit; };
  start(setup);
  REQUIRE(status().state == "committing");
  kill(node);
  sched.run();
}

job_status fixture::status() { return request_status(self, sched, coord, token); }

bool fixture::logged(const std::string& text) const { return log_contains(log, text); }

std::size_t fixture::log_position(const std::string& text) const {
  for (std::size_t i = 0; i < log.size(); ++i)
    if (log[i].find(text) != std::string::npos) return i;
  return log.size();
}

planning::reconfiguration fixture::lose(const planning::cluster_state& from, std::vector<int> lost,
                                        std::vector<int> joined) const {
  const planning::layer_costs costs(profile, planning::job_memory(profile, job));
  const planning::reconfiguration_context ctx{plan.templates, costs, job.fault_tolerance,
                                              job.global_batch / job.microbatch, job.microbatch};
  return planning::reconfigure(ctx, from, lost, joined);
}
std::set<std::tuple<int, int, int>> fixture::copies_of(std::uint64_t epoch) const {
  std::map<int, int> node_of_rank;
  const epoch_assignment* any = nullptr;
  for (const auto& [id, rec] : stages) {
    auto it = rec->assignments.find(epoch);
    if (it == rec->assignments.end()) continue;
    any = &it->second;
    if (it->second.rank >= 0) node_of_rank[it->second.rank] = static_cast<int>(id);
  }
  std::set<std::tuple<int, int, int>> out;
  if (!any) return out;
  for (const auto& c : any->copies) out.insert({c.layer, node_of_rank.at(c.source), node_of_rank.at(c.target)});
  return out;
}

std::set<std::tuple<int, int, int>> fixture::copies_of(const planning::reconfiguration& r) {
  std::set<std::tuple<int, int, int>> out;
  for (const auto& c : r.copies) out.insert({c.layer, c.from_node, c.to_node});
  return out;
}

void fixture::check_pipelines(std::size_t first, const planning::cluster_state& expected) const {
  for (std::size_t k = first; k < records.size(); ++k) {
    CAPTURE(k);
    REQUIRE(records[k].pipelines.size() == expected.pipelines.size());
    for (std::size_t i = 0; i < expected.pipelines.size(); ++i) {
      const auto& [nodes, microbatches] = records[k].pipelines[i];
      CHECK(std::vector<int>(nodes.begin(), nodes.end()) == expected.pipelines[i].nodes);
      CHECK(microbatches == expected.pipelines[i].microbatches);
    }
  }
}

void fixture::check_steps(std::uint64_t steps) const {
  REQUIRE(records.size() == steps);
  for (std::size_t k = 0; k < steps; ++k) {
    CAPTURE(k);
    CHECK(records[k].step == k);
    CHECK(records[k].samples == job.global_batch);
    std::int32_t microbatches = 0;
    for (const auto& p : records[k].pipelines) microbatches += p.second;
    CHECK(microbatches * job.microbatch == job.global_batch);
    CHECK(records[k].layer_digests.size() == 6u);
    for (const auto& [layer, digests] : records[k].layer_digests) {
      CHECK(digests.size() == records[k].pipelines.size());
      for (auto d : digests) CHECK(d == 1000u + k);
    }
  }
}

int copy_source_to_lose(const fixture& f, int first) {
  const auto start = f.initial();
  auto pipeline_of = [&](int node) {
    for (std::size_t i = 0; i < start.pipelines.size(); ++i)
      for (int n : start.pipelines[i].nodes)
        if (n == node) return static_cast<int>(i);
    return -1;
  };
  std::optional<int> same_pipeline;
  for (const auto& c : f.lose(start, {first}).copies) {
    if (f.lose(start, {first, c.from_node}).action != planning::reconfiguration_action::continue_training) continue;
    if (pipeline_of(c.from_node) != pipeline_of(first)) return c.from_node;
    if (!same_pipeline) same_pipeline = c.from_node;
  }
  REQUIRE(same_pipeline);
  return *same_pipeline;
}

}  // namespace oobleck::testing
