#include <algorithm>
#include <chrono>
#include <iomanip>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <caf/scoped_actor.hpp>

#include "actors/admission.hpp"
#include "apps/cluster_commands.hpp"
#include "apps/cluster_common.hpp"
#include "apps/flags.hpp"
#include "apps/program_main.hpp"
#include "apps/status_report.hpp"
#include "apps/tls.hpp"
#include "messages/input_error.hpp"

namespace oobleck::apps {

namespace {

using namespace oobleck::messages;

void print_status(std::ostream& out, const job_status& s) {
  out << "job: " << s.state << ", epoch " << s.epoch << ", " << s.committed_steps
      << " committed step(s)";
  if (s.committed_steps > 0)
    out << ", loss " << s.last_loss << ", " << std::fixed << std::setprecision(1)
        << s.samples_per_second << " samples/s";
  if (s.state == "waiting") {
    // Below its minimum: how many live nodes it has, and how many it waits for.
    const auto live = std::count_if(s.nodes.begin(), s.nodes.end(), [](const node_status& n) { return n.state != "lost"; });
    out << "\nwaiting for nodes: " << live << " live, " << s.nodes_needed << " needed to go on";
  }
  out << "\nnodes:\n";
  for (const auto& n : s.nodes) {
    out << "  " << std::setw(4) << n.node << "  " << std::left << std::setw(24) << n.name
        << std::right << "  " << n.state;
    if (n.rank >= 0) out << " (rank " << n.rank << ")";
    out << "\n";
  }
  if (!s.pipelines.empty()) out << "pipelines:\n";
  for (std::size_t i = 0; i < s.pipelines.size(); ++i) {
    out << "  " << i << ": nodes";
    for (auto n : s.pipelines[i].nodes) out << " " << n;
    out << ", " << s.pipelines[i].microbatches << " microbatch(es)\n";
  }
}

/// The coordinator went away (its connection ended, or it did not answer), as opposed to a
/// coordinator that answered with a refusal (messages::input_error).
struct coordinator_gone : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Sends `xs...` with a fresh proof; returns the reply or throws with the coordinator's error.
template <class Reply, class... Ts>
Reply ask(caf::actor_system& sys, const coordinator_actor& c, const std::string& token, const Ts&... xs) {
  caf::scoped_actor self{sys};
  auto failed = [&sys](const std::string& what, const caf::error& e) {
    if (is_protocol_error(e)) throw input_error("the coordinator refused" + what + ": " + describe(e));
    throw coordinator_gone("the coordinator did not answer" + what + ": " + sys.render(e));
  };
  // (A connection that the middleman still held for a coordinator that went away answers nothing:
  // a nonce is quick, so a short wait tells.)
  control_proof proof;
  self->request(c, std::chrono::seconds(5), nonce_request{protocol_version})
      .receive([&](std::string& nonce) { proof = {nonce, actors::control_proof_of(token, nonce)}; },
               [&](caf::error& e) { failed(" a nonce", e); });
  Reply reply{};
  self->request(c, std::chrono::seconds(30), xs..., proof)
      .receive([&](Reply& r) { reply = std::move(r); }, [&](caf::error& e) { failed("", e); });
  return reply;
}

/// "HOST:PORT" or a list "HOST:PORT,HOST:PORT" (a coordinator and its standbys, as workers take).
std::vector<host_port> parse_coordinators(const std::string& text) {
  std::vector<host_port> out;
  for (std::size_t from = 0; from <= text.size();) {
    const auto comma = std::min(text.find(',', from), text.size());
    out.push_back(parse_host_port("--coordinator", text.substr(from, comma - from)));
    from = comma + 1;
  }
  return out;
}

double seconds_until(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(t - std::chrono::steady_clock::now()).count();
}

}  // namespace

int run_ctl_command(const std::vector<std::string>& args, std::ostream& out, std::ostream&) {
  CLI::App app{"oobleck-ctl: asks a running job's coordinator for its status, injects failures,\n"
               "or shuts the job down. Every request proves the job token.",
               "oobleck-ctl"};
  std::string coordinator, token_file, reason = "requested by oobleck-ctl";
  bool json = false;
  int node = -1;
  double seconds = 0, timeout = 10;
  tls_flags tls_given;
  add_text(app, "--coordinator", coordinator,
           "HOST:PORT of the coordinator, or a list HOST:PORT,HOST:PORT (a coordinator and its standbys): each is "
           "tried in turn")
      ->type_name("HOST:PORT[,HOST:PORT]")
      ->required();
  add_text(app, "--token-file", token_file, "the job token (the coordinator's --token-file)")
      ->type_name("FILE")
      ->required();
  add_number(app, "--connect-timeout", timeout, 0,
             "seconds to keep trying to reach a coordinator (default 10); a coordinator that goes away before it "
             "answered (killed, frozen) is looked for again at every address until then, so a replacement or a "
             "standby answers (a request whose answer was lost is sent again)");
  add_tls_flags(app, tls_given, false);  // no job file: flags only
  auto* status = app.add_subcommand("status", "nodes, pipelines, epoch, step, loss, samples/s");
  status->add_flag("--json", json, "print JSON instead of a table");
  auto* kill = app.add_subcommand("kill-node", "the node's process kills itself (SIGKILL), as in a crash");
  add_integer(*kill, "id", node, 0, 1 << 30, "node id (see status)")->required();
  auto* hang = app.add_subcommand("hang-node", "the node's process freezes itself (SIGSTOP), as in a hang");
  add_integer(*hang, "id", node, 0, 1 << 30, "node id (see status)")->required();
  add_number(*hang, "--seconds", seconds, 0, "wake up (SIGCONT) after this long; 0: stay frozen (default)");
  auto* error = app.add_subcommand("error-node",
                                   "the node's stage throws (a c10::Error, \"injected: out of memory\") in the middle "
                                   "of every attempt of the next step it runs; the step runs again, and a node that "
                                   "fails [faults] evict_after times in a row is evicted");
  add_integer(*error, "id", node, 0, 1 << 30, "node id (see status)")->required();
  int attempts = 0;
  add_integer(*error, "--attempts", attempts, 0, 1 << 30, "throw in at most this many attempts; 0: every attempt (default)");
  auto* shutdown = app.add_subcommand("shutdown", "stop the job: the coordinator and every worker exit");
  add_text(*shutdown, "--reason", reason, "said to every worker")->type_name("TEXT");
  bool checkpoint = false;
  shutdown->add_flag("--checkpoint", checkpoint,
                     "first write a checkpoint of the last committed step into the job's checkpoint folder "
                     "(when it has one and every layer has a live holder; the log says why not otherwise)");
  for (auto* sub : {status, kill, hang, error, shutdown})
    sub->footer(
        "oobleck-ctl's own flags come before the subcommand: oobleck-ctl --coordinator HOST:PORT "
        "--token-file FILE " +
        sub->get_name() + " ... (see oobleck-ctl --help)");
  app.require_subcommand(1);
  if (!parse_flags(app, args, out)) return 0;

  const auto addresses = parse_coordinators(coordinator);
  const std::string token = actors::read_token_file(token_file);
  const tls_section tls = resolve_tls({}, tls_given);
  cluster_config cfg;
  use_tls(cfg, tls);
  caf::actor_system sys{cfg};
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(timeout));
  // The request, at the first coordinator that answers; again at the next one found when the one
  // asked went away first (a refusal is final: messages::input_error).
  auto at_coordinator = [&](const auto& request) {
    for (;;) {
      const auto c = connect_first_coordinator(
          sys, addresses, deadline, seconds_text(timeout) + " s (--connect-timeout)", [](const std::string&) {});
      try {
        return request(c);
      } catch (const coordinator_gone& e) {
        if (seconds_until(deadline) <= 0) throw unavailable(e.what());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  };
  if (status->parsed()) {
    const auto s = at_coordinator([&](const coordinator_actor& c) { return ask<job_status>(sys, c, token, status_atom_v); });
    if (json)
      out << status_json(s).dump(2) << "\n";
    else
      print_status(out, s);
  } else if (kill->parsed() || hang->parsed()) {
    inject_fault f{node, kill->parsed() ? fault_kind::kill : fault_kind::hang, -1, seconds};
    out << at_coordinator([&](const coordinator_actor& c) { return ask<std::string>(sys, c, token, f); }) << "\n";
  } else if (error->parsed()) {
    inject_fault f{node, fault_kind::error, -1, 0, attempts};
    out << at_coordinator([&](const coordinator_actor& c) { return ask<std::string>(sys, c, token, f); }) << "\n";
  } else {
    out << at_coordinator([&](const coordinator_actor& c) {
      return ask<std::string>(sys, c, token, shutdown_atom_v, reason, checkpoint);
    }) << "\n";
  }
  return 0;
}

}  // namespace oobleck::apps
