#include "support/recovery_model.hpp"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <stdexcept>

#include "messages/profile_json.hpp"
#include "support/subprocess.hpp"

namespace oobleck::testing {

const std::string& default_job_text(const std::string& apps_dir) {
  static const std::string text = [&] {
    const auto r = run_process(apps_dir + "/oobleck-local", {"--print-default-job"});
    if (r.exit_status != 0) throw std::runtime_error("oobleck-local --print-default-job failed: " + r.err);
    return r.out;
  }();
  return text;
}

std::string job_with(const std::string& apps_dir, const job_keys& keys) {
  std::string text = default_job_text(apps_dir);
  for (const auto& [section, key, value] : keys) {
    auto header = text.find("[" + section + "]\n");
    if (header == std::string::npos) {  // a table the default job leaves at its defaults
      if (!text.empty() && text.back() != '\n') text += "\n";
      text += "\n[" + section + "]\n";
      header = text.size() - section.size() - 3;
    }
    const auto body = header + section.size() + 3;
    const auto next = text.find("\n[", body);
    const auto end = next == std::string::npos ? text.size() : next + 1;
    const auto at = text.find("\n" + key + " =", body - 1);
    if (at != std::string::npos && at < end) {
      const auto eol = text.find('\n', at + 1);
      text.replace(at + 1, eol - at - 1, key + " = " + value);
    } else {
      text.insert(body, key + " = " + value + "\n");
    }
  }
  return text;
}


job_case make_job(const std::string& apps_dir, int nodes, int f, std::int64_t memory, const job_keys& more) {
  job_case c;
  job_keys keys{
      {"cluster", "nodes", std::to_string(nodes)},
      {"cluster", "fault_tolerance", std::to_string(f)},
      {"cluster", "device_memory_bytes", std::to_string(memory)},
      {"faults", "digest_every", "1"},  // the replicas are compared after every step
      {"profile", "file", "\"profile.json\""}};
  keys.insert(keys.end(), more.begin(), more.end());
  c.text = job_with(apps_dir, keys);
  c.job = apps::parse_job(c.text, "job");
  c.nodes = nodes;
  c.profile_json = messages::profile_json_text(apps::modelled_profile(c.job));
  return c;
}

std::string write_job(const job_case& c, const std::filesystem::path& dir) {
  std::ofstream(dir / "profile.json") << c.profile_json;
  std::ofstream(dir / "job.toml") << c.text;
  return (dir / "job.toml").string();
}


bool continues(const planning::reconfiguration& r) {
  return r.action == planning::reconfiguration_action::continue_training;
}

int pipeline_of(const planning::cluster_state& s, int node) {
  for (std::size_t i = 0; i < s.pipelines.size(); ++i)
    for (planning::node_id n : s.pipelines[i].nodes)
      if (n == planning::node_id{node}) return static_cast<int>(i);
  return -1;
}

std::string describe(const planning::cluster_state& s) {
  std::string out;
  for (const auto& p : s.pipelines) {
    out += "[";
    for (std::size_t i = 0; i < p.nodes.size(); ++i) out += (i ? " " : "") + std::to_string(p.nodes[i].value);
    out += " x" + std::to_string(p.microbatches) + "] ";
  }
  return out;
}

std::string ids_list(const std::vector<int>& ids) {
  std::string s;
  for (int n : ids) s += (s.empty() ? "" : ",") + std::to_string(n);
  return s;
}

bool survivable(const planner_model& planner, int nodes, const std::map<int, std::vector<int>>& faults, int join_step,
                int join_count) {
  struct state {
    planning::cluster_state s;
    int admitted = 0;  ///< joined nodes nodes .. nodes + admitted - 1 are in
  };
  auto key = [](const state& x) {
    std::string k = describe(x.s) + "|";
    for (planning::node_id n : x.s.idle_nodes) k += std::to_string(n.value) + " ";
    return k + "|" + std::to_string(x.admitted);
  };
  auto joiners = [&](int from, int to) {
    std::vector<int> ids;
    for (int i = from; i < to; ++i) ids.push_back(nodes + i);
    return ids;
  };
  bool ok = true;
  // Adds `x` to `into` unless an equal state is there.
  auto add = [&](std::vector<state>& into, std::set<std::string>& seen, state x) {
    if (seen.insert(key(x)).second) into.push_back(std::move(x));
  };
  // Every state reachable by admitting joined nodes at step boundaries (no loss).
  auto admissions = [&](std::vector<state> states) {
    std::set<std::string> seen;
    for (const auto& x : states) seen.insert(key(x));
    for (std::size_t i = 0; i < states.size() && ok; ++i)
      for (int to = states[i].admitted + 1; to <= join_count && ok; ++to) {
        const auto r = planner.lose(states[i].s, {}, joiners(states[i].admitted, to));
        if (!continues(r)) ok = false;
        add(states, seen, {planner_model::after(r), to});
      }
    return states;
  };
  std::vector<state> states{{planner.initial(), 0}};
  for (const auto& [step, victims] : faults) {
    const bool joins = join_count > 0 && step > join_step;  // the joined workers may have registered
    if (joins) states = admissions(states);
    std::vector<state> next;
    std::set<std::string> seen;
    // Every order in which the victims may be lost, in every grouping of consecutive ones.
    std::vector<int> order = victims;
    std::sort(order.begin(), order.end());
    do {
      for (int cuts = 0; cuts < (1 << (order.size() - 1)); ++cuts) {
        std::vector<std::vector<int>> groups{{}};
        for (std::size_t i = 0; i < order.size(); ++i) {
          groups.back().push_back(order[i]);
          if (i + 1 < order.size() && (cuts >> i & 1)) groups.emplace_back();
        }
        auto current = states;
        for (const auto& group : groups) {
          std::vector<state> after;
          std::set<std::string> after_seen;
          for (const auto& x : current) {
            for (int v : group)
              if (pipeline_of(x.s, v) < 0) return false;  // idle: its fault would never fire
            for (int to = x.admitted; to <= (joins ? join_count : x.admitted); ++to) {
              const auto r = planner.lose(x.s, group, joiners(x.admitted, to));
              if (!continues(r)) return false;
              add(after, after_seen, {planner_model::after(r), to});
            }
          }
          current = joins ? admissions(std::move(after)) : std::move(after);
          if (!ok) return false;
        }
        for (auto& x : current) add(next, seen, std::move(x));
      }
    } while (std::next_permutation(order.begin(), order.end()));
    states = std::move(next);
  }
  if (join_count > 0) admissions(states);  // joins after the last fault
  return ok;
}

namespace {

/// The coordinator's own faults, drawn after the rest (a seed's worker faults and joins stay those
/// it drew before these existed): in two schedules of three, the coordinator is killed in the middle of
/// a step (1/2), killed right after deciding a commit that reached one node (1/3; its metrics
/// record dies with it), or frozen past the heartbeat timeout (1/6: each costs
/// chaos_coordinator_hang_s, where a kill costs a fraction of a second); a kill is followed by a
/// second one (of the replacement) with probability 1/4. The policy is not involved: a replacement adopts
/// the configuration that formed last, with every node (nothing is lost), so survivable() holds.
/// Each fault is at a step (1 or later) where no worker fault (nor a stage error that the step survives) is due: a worker lost while the coordinator is away
/// comes back to nobody, and the replacement registers it under an id of its own (as lost), which
/// these checks, naming nodes by their ids, cannot follow. With joins, the coordinator faults come
/// no later than the join step: the joined workers start once it committed, so they register with
/// the coordinator that is there (a fresh worker that reaches a replacement before the nodes it
/// adopts takes the first ids, and the adopted nodes' ids change).
void draw_coordinator_faults(seeded& rng, chaos_schedule& s) {
  if (rng.below(3) == 0) return;
  std::set<int> busy;
  for (const auto& [step, ids] : s.faults()) busy.insert(step);
  for (const auto& [step, ids] : s.blips) busy.insert(step);
  // (And before every worker fault: a replacement numbers the workers that join it from the
  // highest id it adopted, so a joined worker could take the id of a node lost before the kill.)
  const int last = s.join_count > 0 ? std::min(s.join_step, busy.empty() ? s.join_step : *busy.begin() - 1) : chaos_steps - 3;
  auto free_step = [&](int from) {
    std::vector<int> free;
    for (int k = from; k <= last; ++k)
      if (!busy.count(k)) free.push_back(k);
    return free.empty() ? -1 : free[static_cast<std::size_t>(rng.below(static_cast<int>(free.size())))];
  };
  const int kind = rng.below(6);
  const int step = free_step(1);
  if (step < 0) return;
  if (kind == 5) {
    s.coordinator_hang_step = step;
    return;
  }
  s.coordinator_kills.push_back({step, kind >= 3});
  if (rng.below(4) == 0)
    if (const int again = free_step(step + 1); again >= 0) s.coordinator_kills.push_back({again, rng.below(2) == 0});
}

}  // namespace

chaos_schedule draw_schedule(const std::string& apps_dir, std::uint64_t seed) {
  seeded rng{seed * 7919 + 17};
  for (;;) {
    chaos_schedule s;
    s.shape = chaos_jobs[seed % std::size(chaos_jobs)];  // each shape 4 times in 20 seeds
    const planner_model planner(make_job(apps_dir, s.shape.nodes, s.shape.f, s.shape.memory, chaos_heartbeats));
    std::vector<int> alive(static_cast<std::size_t>(s.shape.nodes));
    for (int i = 0; i < s.shape.nodes; ++i) alive[static_cast<std::size_t>(i)] = i;
    // Half the schedules start 1 or 2 workers that join after step 0..3 (the victims are among
    // the first nodes: a joined node may not be in a pipeline yet when its fault is due).
    if (rng.below(2) == 0) {
      s.join_step = rng.below(4);
      s.join_count = 1 + rng.below(2);
    }
    // 1 to 3 fault events of 1..f victims each (at most f in one step); a victim freezes
    // instead of dying with probability 1/3, at most 2 hangs per schedule (each costs the
    // heartbeat timeout).
    const int events = 1 + rng.below(3);
    int hangs = 0;
    for (int e = 0; e < events; ++e) {
      const int step = 2 + rng.below(chaos_steps - 4);  // 2 .. steps - 3
      const int count = 1 + rng.below(s.shape.f);
      for (int v = 0; v < count && !alive.empty(); ++v) {
        const auto in_step = s.kills[step].size() + s.hangs[step].size();
        if (static_cast<int>(in_step) >= s.shape.f) break;
        const auto at = static_cast<std::size_t>(rng.below(static_cast<int>(alive.size())));
        const bool hang = rng.below(3) == 0 && hangs < 2;
        hangs += hang;
        (hang ? s.hangs : s.kills)[step].push_back(alive[at]);
        alive.erase(alive.begin() + static_cast<std::ptrdiff_t>(at));
      }
    }
    std::erase_if(s.kills, [](const auto& e) { return e.second.empty(); });
    std::erase_if(s.hangs, [](const auto& e) { return e.second.empty(); });
    // Stage faults, drawn after the rest (the kills, hangs and joins above stay those of the same
    // seed before they existed): a killed victim's stage throws in every attempt of its step
    // instead (evicted after 3) with probability 1/4, or, once per schedule, busy-loops instead
    // (evicted after its second stall) with probability 1/5; and with probability 1/3 a node's
    // stage throws once in step 1 (before any loss, so it runs a stage then): not lost.
    bool stalled = false;
    for (auto& [step, ids] : s.kills)
      for (auto it = ids.begin(); it != ids.end();) {
        if (rng.below(4) == 0) {
          s.errors[step].push_back(*it);
          it = ids.erase(it);
        } else if (!stalled && rng.below(5) == 0) {
          stalled = true;
          s.stalls[step].push_back(*it);
          it = ids.erase(it);
        } else {
          ++it;
        }
      }
    std::erase_if(s.kills, [](const auto& e) { return e.second.empty(); });
    if (rng.below(3) == 0) s.blips[1].push_back(rng.below(s.shape.nodes));
    // A schedule the job cannot survive (in some order of events): draw again.
    if (!survivable(planner, s.shape.nodes, s.faults(), s.join_step, s.join_count)) continue;
    draw_coordinator_faults(rng, s);
    std::ostringstream t;
    t << "seed " << seed << ": " << s.shape.nodes << " nodes, f = " << s.shape.f << ", slot memory " << s.shape.memory
      << ";";
    for (const auto& a : s.args()) t << " " << a;
    s.text = t.str();
    return s;
  }
}

}  // namespace oobleck::testing
