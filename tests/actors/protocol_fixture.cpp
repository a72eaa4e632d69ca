#include "actors/protocol_fixture.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>

#include "actors/admission.hpp"
#include "messages/profile_json.hpp"
#include "planning/synthetic_profile.hpp"

using namespace oobleck::actors;
using namespace oobleck::messages;
using oobleck::planning::layer_index;
using oobleck::planning::node_id;

namespace oobleck::testing {
namespace {

stage_actor::behavior_type fake_stage(stage_actor::pointer self, fake_stage_record* rec) {
  // Slot j > 0 runs stage j of its node's assignment, which slot 0 received.
  auto node = [rec]() -> fake_stage_record& { return rec->first ? *rec->first : *rec; };
  return {
      [self, rec](epoch_assignment& a) -> caf::result<form_timing> {
        rec->trace.push_back("assign " + std::to_string(a.epoch));
        rec->assignments[a.epoch] = a;
        if (rec->hold_form.count(a.epoch)) return self->make_response_promise<form_timing>();
        // Copies that take longer on higher ranks: the record keeps the slowest node's.
        const int r = std::max(0, a.rank.value);
        return form_timing{1000, 100 + 1000 * r, 500, 0, a.copies.empty() ? 0 : 1'000'000, 200 + r, 50 + 10 * r};
      },
      [self, rec, node](stage_step& s) -> caf::result<stage_done> {
        rec->trace.push_back("step " + std::to_string(s.epoch) + " " + std::to_string(s.step));
        rec->steps.push_back(s);
        const auto& st = node().assignments.at(s.epoch).stages.at(static_cast<std::size_t>(rec->slot));
        if (rec->hold_step == std::pair{s.epoch, s.step} || rec->hold_steps.count({s.epoch, s.step}))
          return self->make_response_promise<stage_done>();
        if (s.commit_first) {
          // The previous step's commit rode with these orders: a real stage applies it first, so a
          // node stuck applying that commit (hold_commit) is stuck here too.
          if (node().hold_commit == std::pair{s.commit.epoch, s.commit.step}) return self->make_response_promise<stage_done>();
          if (static_cast<std::int64_t>(s.commit.step) > node().last_applied_step) {
            ++node().applied;
            node().last_applied_step = static_cast<std::int64_t>(s.commit.step);
          }
        }
        stage_done d{s.epoch, s.step, st.pipeline, st.stage, 0, {}};
        if (s.eval) {
          // Every validation window's loss is 3: a round's mean is 3 whatever the split.
          if (st.stage + 1 == st.num_stages) d.loss_sum = 3.0 * s.microbatches;
          if (rec->fail_evals > 0) {
            --rec->fail_evals;
            d.error = "injected evaluation failure";
          }
          return d;
        }
        if (st.stage + 1 == st.num_stages) d.loss_sum = 2.0 * s.microbatches;
        // Squared gradient norms that differ by stage: a pipeline's total depends on its depth.
        d.grad_sq = 1.0 + st.stage;
        // Every forward takes 1 ms and every backward 2: the pipeline's ideal is its 1F1B makespan.
        d.forward_ms.assign(static_cast<std::size_t>(s.microbatches), 1.0);
        d.backward_ms.assign(static_cast<std::size_t>(s.microbatches), 2.0);
        if (rec->fail_step == s.step) d.error = "injected stage failure";
        else node().last_done_step = std::max(node().last_done_step, static_cast<std::int64_t>(s.step));
        return d;
      },
      [self, rec](commit_step& c) -> caf::result<step_committed> {
        rec->trace.push_back("commit " + std::to_string(c.epoch) + " " + std::to_string(c.step));
        rec->commits.push_back(c);
        if (rec->hold_commit == std::pair{c.epoch, c.step}) return self->make_response_promise<step_committed>();
        if (static_cast<std::int64_t>(c.step) > rec->last_applied_step) {
          ++rec->applied;
          rec->last_applied_step = static_cast<std::int64_t>(c.step);
        }
        step_committed out{c.epoch, c.step, node_id{-1}, {}};
        // Slot 0 commits every stage of its node.
        for (const auto& st : rec->assignments.at(c.epoch).stages)
          for (int l = st.first_layer.value; l < st.end_layer.value && c.digests; ++l) {
            out.digests.push_back({layer_index{l}, 1000u + static_cast<unsigned>(c.step)});
            if (l == 0 || l == static_cast<int>(rec->assignments.at(c.epoch).layer_groups.size()) - 1)
              out.tied_digests.push_back({layer_index{l}, rec->bad_tied_digest && l != 0 ? 8u : 7u});
          }
        return out;
      },
      [self, rec](write_checkpoint& w) -> caf::result<checkpoint_written> {
        rec->trace.push_back("write " + std::to_string(w.step));
        rec->writes.push_back(w);
        if (rec->hold_write) return self->make_response_promise<checkpoint_written>();
        checkpoint_written out{w.request, node_id{-1}, {}, {}, rec->write_error};
        if (!rec->write_error.empty()) return out;
        for (auto l : w.layers) {
          if (rec->not_held.count(l.value))
            out.missing.push_back(l);
          else
            out.files.push_back({l, 100u + static_cast<std::uint64_t>(l.value), "sha-" + std::to_string(l.value)});
        }
        return out;
      },
      // What a worker kept for a replacement coordinator: its stages' layers, one update per applied
      // commit, with the digest its commit answered (1000 + the step), and unapplied gradients.
      [rec](memory_atom) -> node_memory {
        node_memory m;
        m.views_epoch = rec->assignment().epoch;
        for (const auto& s : rec->assignment().stages)
          for (int l = s.first_layer.value; l < s.end_layer.value; ++l)
            m.layers.push_back({layer_index{l}, static_cast<std::uint64_t>(1000 + rec->last_applied_step), rec->applied});
        if (rec->last_done_step > rec->last_applied_step) m.gradients_step = rec->last_done_step;
        return m;
      },
  };
}

}  // namespace

const std::string fixture::token(64, 'k');

const epoch_assignment& fake_stage_record::assignment() const {
  static const epoch_assignment none;
  const auto& a = first ? first->assignments : assignments;
  return a.empty() ? none : a.rbegin()->second;
}
std::vector<std::uint64_t> fake_stage_record::epochs() const {
  std::vector<std::uint64_t> out;
  for (const auto& [epoch, a] : assignments) out.push_back(epoch);
  return out;
}
std::vector<std::uint64_t> fake_stage_record::aborted() const {
  std::vector<std::uint64_t> out;
  for (const auto& t : trace)
    if (t.rfind("abort ", 0) == 0) out.push_back(std::stoull(t.substr(6)));
  return out;
}
bool fake_stage_record::traced(const std::string& what) const {
  return std::find(trace.begin(), trace.end(), what) != trace.end();
}
std::size_t fake_stage_record::position(const std::string& what) const {
  return static_cast<std::size_t>(std::find(trace.begin(), trace.end(), what) - trace.begin());
}
std::size_t fake_stage_record::commits_of(std::uint64_t step) const {
  return static_cast<std::size_t>(
      std::count_if(commits.begin(), commits.end(), [&](const commit_step& c) { return c.step == step; }));
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

fixture::options fixture::roomy(int nodes, std::uint64_t steps, int slots) {
  options o;
  o.nodes = nodes;
  o.steps = steps;
  o.slots = slots;
  o.device_memory_bytes = 1LL << 30;
  o.device_tflops = 100;
  o.global_batch = 8;
  return o;
}

fixture::fixture(options o) : opts(o) {
  // The log sink prefixes every line as the programs do (OOBLECK_LOG_PREFIX, set for every test by
  // tests/CMakeLists.txt): a test that learnt what happened from the wording would break.
  if (const char* p = std::getenv("OOBLECK_LOG_PREFIX")) prefix_ = p;
  planning::synthetic_gpt g;
  g.layers = 6;
  g.hidden = 32;
  g.heads = 2;
  g.sequence = 16;
  g.vocab = 256;
  g.microbatch = 2;
  g.gpus_per_node = o.slots;
  if (o.slots > 1) g.tensor_parallel_overhead = 4.0;  // one stage per slot beats one wide stage
  g.device_tflops = o.device_tflops;
  g.device_memory_bytes = o.device_memory_bytes;
  profile = planning::synthetic_gpt_profile(g);
  job.nodes = o.nodes;
  job.fault_tolerance = 1;
  job.global_batch = o.global_batch;
  job.microbatch = 2;
  if (o.steps > 0) plan = planning::plan_job(profile, job);

  coordinator_deps d;
  d.policy = {token, "hash", protocol_version, o.slots};
  d.policy.one_gpu_per_worker = o.one_gpu_per_worker;
  d.job_toml = "[model]\n";
  d.expected_nodes = o.nodes;
  d.log = [this](const std::string& l) { log.push_back(prefix_ + "[coordinator] " + l); };
  d.on_event = [this](const job_event& e) { events.push_back(e); };
  // A phase entered along an edge the coordinator's machine does not draw fails every protocol test.
  d.on_bug = [](const std::string& what) { FAIL_CHECK("coordinator bug: " << what); };
  d.profile = profile;
  d.job = job;
  d.steps = o.steps;
  d.on_step = [this](const step_record& r) { records.push_back(r); };
  d.on_reconfigured = [this](const reconfiguration_record& r) { recoveries.push_back(r); };
  d.clip_norm = o.clip_norm;
  d.eval_every = o.eval_every;
  d.eval_windows = o.eval_windows;
  d.on_eval = [this](const eval_record& r) { evals.push_back(r); };
  d.wait_below_minimum = o.wait_below_minimum;
  d.wait_for_nodes_ms = o.wait_for_nodes_ms;
  d.faults.digest_every = o.digest_every;
  d.run_ahead = o.run_ahead;
  d.new_nccl_id = o.new_nccl_id;
  measured = profile;
  if (o.profile_at_start) {
    d.profile_at_start = true;
    d.accept_profile = [](const std::string& text) { return messages::profile_from_json(text); };
    d.on_profiled = [this](const planning::profile& p) { profiled.push_back(p); };
  }
  d.on_waiting = [this](const waiting_record& r) { waits.push_back(r); };
  d.on_resumed = [this](const resumed_record& r) { resumes.push_back(r); };
  d.on_restored = [this](const restore_record& r) { restores.push_back(r); };
  if (o.checkpoints || o.checkpoint_every > 0) {
    d.checkpoint.root = "/ckpt";
    d.checkpoint.every = o.checkpoint_every;
    d.checkpoint.begin = [](std::uint64_t step) { return "/ckpt/.tmp-" + std::to_string(step); };
    d.checkpoint.finish = [this](const std::string&, std::uint64_t step, const std::vector<checkpoint_layer_file>& files) {
      finished.emplace_back(step, files);
      return "/ckpt/step-" + std::to_string(step);
    };
    d.checkpoint.discard = [this](const std::string& temp) { discarded.push_back(temp); };
    d.checkpoint.on_stop = [this](const checkpoint_stop_record& r) { stops.push_back(r); };
  }
  deps_ = d;
  coord = spawn_coordinator(sys, std::move(d));
  sched.run();
}

void fixture::replace_coordinator() {
  self->send_exit(coord, caf::exit_reason::kill);
  // Spawned before anything runs: the workers that lose the first look for this one.
  auto d = deps_;
  d.term = ++deps_.term;
  coord = spawn_coordinator(sys, std::move(d));
  sched.run();
}

fixture::~fixture() {
  self->send_exit(coord, caf::exit_reason::user_shutdown);  // the coordinator takes exits from its own process only
  for (auto& w : workers) caf::anon_send_exit(w->handle, caf::exit_reason::user_shutdown);
  for (auto& [id, slots] : stage_actors)
    for (auto& s : slots) caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
  sched.run();
}

void fixture::start(const setup_map& setup) {
  for (int i = 0; i < opts.nodes; ++i) add_worker(i, setup);
  sched.run();
  REQUIRE(monitors.size() == static_cast<std::size_t>(opts.nodes));
  for (auto& [id, rec] : stages) REQUIRE(rec->node == id);
}

void fixture::add_worker(int i, const setup_map& setup) {
  add_worker({.name = "w" + std::to_string(i),
              .setup = [setup](fake_stage_record& r) {
                if (auto it = setup.find(r.node); it != setup.end()) it->second(r);
              },
              .slots = opts.slots});
}

fixture::worker& fixture::add_worker(worker_options o) {
  auto* w = workers.emplace_back(std::make_unique<worker>()).get();
  w->name = o.name;
  monitor_deps d;
  d.coordinator = o.first_coordinator.value_or(coord);
  if (o.finds_coordinator) d.find_coordinator = [this]() -> std::optional<coordinator_actor> { return coord; };
  d.grace_s = o.grace_s;
  if (o.drop_link) d.drop_coordinator_link = o.drop_link;
  d.token = o.token.value_or(token);
  d.name = o.name;
  d.slots = o.slots;
  d.device_index = o.device_index;
  d.job_hash = o.job_hash;
  d.data = {o.data_host, static_cast<std::uint16_t>(5000 + workers.size() - 1)};
  d.log = [this, w](const std::string& l) {
    w->log.push_back(prefix_ + "[" + w->name + "] " + l);
    log.push_back(w->log.back());
  };
  d.admitted = [this, w](const admission& a) {
    w->node = a.node.value;
    w->trace.push_back("admitted " + std::to_string(a.node.value));
    monitors[a.node.value] = w->handle;
  };
  d.profile_job = [this, w, fails = o.profile_fails](const admission&) -> std::string {
    profiled_by.push_back(w->name);
    if (fails) throw std::runtime_error("out of memory (testing)");
    return messages::profile_json_text(measured, 0);
  };
  d.fault = [w](const inject_fault& f) {
    w->faults.push_back(f);
    w->trace.push_back("fault " + to_string(f.kind) + " at " + std::to_string(f.at_step));
  };
  if (o.stages)
    d.make_stage = [this, setup = o.setup, slots = o.slots](const admission& a) {
      auto& rec = stages[a.node.value];
      rec = std::make_unique<fake_stage_record>();
      rec->node = a.node.value;
      for (int j = 1; j < slots; ++j) {
        auto& runner = *rec->runners.emplace_back(std::make_unique<fake_stage_record>());
        runner.node = a.node.value;
        runner.slot = j;
        runner.first = rec.get();
      }
      if (setup) {
        setup(*rec);
        for (auto& r : rec->runners) setup(*r);
      }
      auto* first = rec.get();
      spawned_stage s;
      s.actor = sys.spawn(fake_stage, first);
      auto& actors = stage_actors[a.node.value];
      actors = {s.actor};
      for (auto& r : rec->runners) {
        s.runners.push_back(sys.spawn(fake_stage, r.get()));
        actors.push_back(caf::actor_cast<stage_actor>(s.runners.back()));
      }
      s.abort = [first](std::uint64_t epoch, const std::string&) { first->trace.push_back("abort " + std::to_string(epoch)); };
      s.activity = [first] {
        stall_report r;
        r.epoch = first->assignments.empty() ? 0 : first->assignments.rbegin()->first;
        r.formed = !first->forming_blocked && !first->hold_form.count(r.epoch);
        r.forming_blocked = first->forming_blocked;
        r.computing_ms = first->computing_ms;
        return r;
      };
      return s;
    };
  w->handle = sys.spawn(monitor, std::move(d));
  return *w;
}

void fixture::kill(std::int64_t node) {
  caf::anon_send_exit(monitors.at(node), caf::exit_reason::kill);
  for (auto& s : stage_actors.at(node)) caf::anon_send_exit(s, caf::exit_reason::kill);
}

void fixture::kill_during_commit(std::int64_t node, std::pair<std::uint64_t, std::uint64_t> commit, setup_map setup) {
  setup[node] = [commit](fake_stage_record& r) { r.hold_commit = commit; };
  start(setup);
  REQUIRE(status().state == "committing");
  kill(node);
  sched.run();
}

control_proof fixture::operator_proof() {
  std::string nonce;
  REQUIRE(ask(nonce, nonce_request{protocol_version}) == "ok");
  return {nonce, control_proof_of(token, nonce)};
}

job_status fixture::status() {
  job_status out;
  REQUIRE(ask(out, status_atom_v, operator_proof()) == "ok");
  return out;
}

bool fixture::alive(const monitor_actor& m) {
  bool down = false;
  self->monitor(m);
  sched.run();
  self->receive([&](caf::down_msg&) { down = true; }, caf::after(std::chrono::seconds(0)) >> [] {});
  self->demonitor(m.address());
  return !down;
}

const job_event& fixture::stop() const {
  INFO(describe(events));
  REQUIRE(count(events, {.kind = event_kind::stopped}) == 1);
  return stop_of(events);
}

bool fixture::told(const std::string& text) const {
  return std::any_of(log.begin(), log.end(), [&](const std::string& l) { return l.find(text) != std::string::npos; });
}

planning::reconfiguration fixture::lose(const planning::cluster_state& from, std::vector<int> lost,
                                        std::vector<int> joined) const {
  const planning::layer_costs costs(profile, planning::job_memory(profile, job));
  const planning::reconfiguration_context ctx{plan.templates, costs, job.fault_tolerance,
                                              job.global_batch / job.microbatch, job.microbatch};
  return planning::reconfigure(ctx, from, planning::node_ids(lost), planning::node_ids(joined));
}

std::set<std::tuple<int, int, int>> fixture::copies_of(std::uint64_t epoch) const {
  std::map<int, int> node_of_rank;
  const epoch_assignment* any = nullptr;
  for (const auto& [id, rec] : stages) {
    auto it = rec->assignments.find(epoch);
    if (it == rec->assignments.end()) continue;
    any = &it->second;
    if (it->second.rank != planning::no_rank) node_of_rank[it->second.rank.value] = static_cast<int>(id);
  }
  std::set<std::tuple<int, int, int>> out;
  if (!any) return out;
  for (const auto& c : any->copies)
    out.insert({c.layer.value, node_of_rank.at(c.source.value), node_of_rank.at(c.target.value)});
  return out;
}

std::set<std::tuple<int, int, int>> fixture::copies_of(const planning::reconfiguration& r) {
  std::set<std::tuple<int, int, int>> out;
  for (const auto& c : r.copies)
    out.insert({c.layer.value, static_cast<int>(c.from_node.value), static_cast<int>(c.to_node.value)});
  return out;
}

void fixture::check_pipelines(std::size_t first, const planning::cluster_state& expected) const {
  for (std::size_t k = first; k < records.size(); ++k) {
    CAPTURE(k);
    REQUIRE(records[k].pipelines.size() == expected.pipelines.size());
    for (std::size_t i = 0; i < expected.pipelines.size(); ++i) {
      const auto& [nodes, stage_layers, microbatches] = records[k].pipelines[i];
      CHECK(nodes == expected.pipelines[i].nodes);
      CHECK(microbatches == expected.pipelines[i].microbatches);
      // Every stage's layer bounds: from layer 0 to the end, in order.
      REQUIRE(stage_layers.size() == nodes.size() + 1);
      CHECK(stage_layers.front() == 0);
      CHECK(std::is_sorted(stage_layers.begin(), stage_layers.end()));
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
    for (const auto& p : records[k].pipelines) microbatches += p.microbatches;
    CHECK(microbatches * job.microbatch == job.global_batch);
    CHECK(records[k].layer_digests.size() == 6u);
    for (const auto& [layer, digests] : records[k].layer_digests) {
      CHECK(digests.size() == records[k].pipelines.size());
      for (auto d : digests) CHECK(d == 1000u + k);
    }
  }
  // Every committed step was published too, once, in order, and the job finished.
  const auto committed = all_of(events, {.kind = event_kind::step_committed});
  REQUIRE(committed.size() == steps);
  for (std::size_t k = 0; k < steps; ++k) CHECK(committed[k].step == k);
}

event_match reconfigured(std::vector<std::int64_t> lost, std::vector<std::int64_t> joined, std::optional<std::string> rules) {
  return {.kind = event_kind::epoch_forming, .detail = std::move(rules), .lost = std::move(lost), .joined = std::move(joined)};
}

int copy_source_to_lose(const fixture& f, int first) {
  const auto start = f.initial();
  auto pipeline_of = [&](int node) {
    for (std::size_t i = 0; i < start.pipelines.size(); ++i)
      for (planning::node_id n : start.pipelines[i].nodes)
        if (n == planning::node_id{node}) return static_cast<int>(i);
    return -1;
  };
  std::optional<int> same_pipeline;
  for (const auto& c : f.lose(start, {first}).copies) {
    const int from = static_cast<int>(c.from_node.value);
    if (f.lose(start, {first, from}).action != planning::reconfiguration_action::continue_training) continue;
    if (pipeline_of(from) != pipeline_of(first)) return from;
    if (!same_pipeline) same_pipeline = from;
  }
  REQUIRE(same_pipeline);
  return *same_pipeline;
}

}  // namespace oobleck::testing
