#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <algorithm>
#include <sstream>
#include <thread>
#include <vector>

#include <caf/scoped_actor.hpp>

#include "actors/admission.hpp"
#include "actors/monitor.hpp"
#include "actors/stage.hpp"
#include "apps/job_file.hpp"
#include "apps/stage_job.hpp"
#include "apps/cluster_commands.hpp"
#include "apps/cluster_common.hpp"
#include "apps/coordinator_link.hpp"
#include "apps/flags.hpp"
#include "apps/profile_measure.hpp"
#include "apps/tls.hpp"
#include "messages/profile_json.hpp"
#include "messages/input_error.hpp"

namespace oobleck::apps {

namespace {

std::string default_name() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  return std::string(host) + "-" + std::to_string(::getpid());
}

/// One attempt to reach a coordinator at `at` (see tcp_reachable): nullopt when none answered;
/// `listening` (if given) says whether something accepted the TCP connection.
std::optional<messages::coordinator_actor> reach_coordinator(caf::actor_system& sys, const host_port& at,
                                                             bool* listening = nullptr) {
  const bool open = tcp_reachable(at, std::chrono::milliseconds(1000));
  if (listening) *listening = open;
  if (!open) return std::nullopt;
  return try_coordinator(sys, at, std::chrono::milliseconds(1000));
}

}  // namespace

int run_worker_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  CLI::App app{"oobleck-worker: one node of a job. Registers with the coordinator (proving the job\n"
               "token), then runs what the coordinator assigns until it is shut down.\n"
               "Exit status: 0 shut down by the coordinator; 2 bad flags or refused (token, job or\n"
               "protocol version); 3 lost contact with the coordinator (it stopped, or declared this\n"
               "node lost after a hang, and no coordinator came back within --coordinator-grace), or evicted (its stages failed or stalled again and again).",
               "oobleck-worker"};
  std::string coordinator, token_file, name = default_name(), config, data_host;
  int slots = 1, data_port = 0;
  double connect_timeout = 60;
  int heartbeat_ms = 250, silence_ms = 1500;
  tls_flags tls_given;
  add_text(app, "--coordinator", coordinator,
           "HOST:PORT of the coordinator, or a comma-separated list (a standby first tried when the coordinator "
           "is lost)")
      ->type_name("HOST:PORT[,HOST:PORT]")
      ->required();
  add_text(app, "--token-file", token_file, "the job token (the coordinator's --token-file)")
      ->type_name("FILE")
      ->required();
  add_text(app, "--name", name, "this node's name in status and logs (default: HOSTNAME-PID)")->type_name("NAME");
  add_integer(app, "--slots", slots, 1, 64,
              "slots of this node (default 1): must equal the job's cluster.slots_per_node; on CPU a slot is "
              "one LibTorch thread, and a node runs one stage actor per stage it is given");
  std::string device_text = "cpu";
  add_text(app, "--device", device_text,
           "where this node's stages compute: cpu (default), cuda (GPU 0) or cuda:N; its kind must equal the "
           "job's cluster.device, and cuda needs a build with OOBLECK_WITH_CUDA (scripts/gpu/build.sh)")
      ->type_name("cpu|cuda[:N]");
  add_text(app, "--config", config,
           "the job file this worker was started for; refused if the coordinator runs another job (its [tls] "
           "table, if any, is this worker's TLS unless --tls-* flags replace it)")
      ->type_name("JOB.toml");
  add_text(app, "--data-host", data_host,
           "address other nodes reach this node's data plane at (default: 127.0.0.1 for a local "
           "coordinator, else the host name)")
      ->type_name("HOST");
  add_integer(app, "--data-port", data_port, 0, 65535, "data-plane port (default 0: a free port)");
  add_number(app, "--connect-timeout", connect_timeout, 0,
             "seconds to keep trying to reach the coordinator (default 60)");
  add_integer(app, "--heartbeat-interval-ms", heartbeat_ms, 10, 3'600'000,
              "heartbeat on the connection to the coordinator (default 250; the job's "
              "cluster.heartbeat_interval_ms should match)");
  add_integer(app, "--connection-timeout-ms", silence_ms, 20, 86'400'000,
              "a coordinator silent this long is gone (default 1500)");
  double grace = 60;
  add_number(app, "--coordinator-grace", grace, 0,
             "seconds a node that lost its coordinator keeps its state and looks for one (the same one back, or a "
             "replacement at any --coordinator address) before it exits with status 3 (default 60; 0: exit at once)");
  add_tls_flags(app, tls_given);
  if (!parse_flags(app, args, out)) return 0;
  if (silence_ms < 2 * heartbeat_ms)
    throw messages::input_error("--connection-timeout-ms must be at least twice --heartbeat-interval-ms");
  const runtime::device_spec device = parse_device_flag(device_text);
  if (device.kind == "cuda" && slots > 1)
    throw messages::input_error("--device cuda runs one GPU per worker process: --slots must be 1");

  std::vector<host_port> addresses;
  for (std::size_t from = 0; from <= coordinator.size();) {
    const auto comma = std::min(coordinator.find(',', from), coordinator.size());
    addresses.push_back(parse_host_port("--coordinator", coordinator.substr(from, comma - from)));
    from = comma + 1;
  }
  const host_port at = addresses.front();
  const std::string token = actors::read_token_file(token_file);
  std::string job_hash;
  tls_section job_tls;
  if (!config.empty()) {
    std::ifstream in(config, std::ios::binary);
    if (!in) throw messages::input_error(config + ": cannot open the job file");
    std::ostringstream s;
    s << in.rdbuf();
    job_hash = actors::sha256_hex(s.str());
    job_tls = read_job_file(config).tls;
  }
  const tls_section tls = resolve_tls(job_tls, tls_given);
  if (data_host.empty()) {
    const bool local = at.host == "127.0.0.1" || at.host == "localhost" || at.host == "::1";
    data_host = local ? "127.0.0.1" : default_name().substr(0, default_name().rfind('-'));
  }
  auto log = progress_printer("worker " + name);

  cluster_config cfg;
  cfg.set_heartbeat(heartbeat_ms, silence_ms);
  use_tls(cfg, tls);
  caf::actor_system sys{cfg};
  // The first address that answers (each tried in turn until --connect-timeout); a coordinator
  // that speaks another way (TLS on one side only) is said at once, as with one address.
  const auto connect_deadline = std::chrono::steady_clock::now() +
                                std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                    std::chrono::duration<double>(connect_timeout));
  const messages::coordinator_actor coord =
      connect_first_coordinator(sys, addresses, connect_deadline, seconds_text(connect_timeout) + " s", log);
  actors::monitor_deps deps;
  deps.coordinator = coord;
  deps.token = token;
  deps.name = name;
  deps.slots = slots;
  deps.device = device.kind;
  deps.device_index = device.index;
  // Held until the process ends (it exits with std::_Exit below, and the kernel closes it).
  std::optional<port_reservation> reserved;
  if (data_port == 0) reserved.emplace();
  deps.data = {data_host, data_port ? static_cast<std::uint16_t>(data_port) : reserved->port()};
  deps.job_hash = job_hash;
  deps.grace_s = grace;
  if (addresses.size() > 1)
    deps.announce_term = [&sys, addresses, grace, token, log](std::uint64_t term, const messages::coordinator_actor& current) {
      // A coordinator at another address may be the one this node lost, frozen: once it answers
      // (it woke), it learns it was replaced and stops. Tried every second for the grace period.
      std::thread([&sys, addresses, grace, token, log, term, current] {
        const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace);
        std::vector<bool> done(addresses.size(), false);
        while (std::chrono::steady_clock::now() < until &&
               std::find(done.begin(), done.end(), false) != done.end()) {
          for (std::size_t i = 0; i < addresses.size(); ++i) {
            if (done[i]) continue;
            auto c = reach_coordinator(sys, addresses[i]);
            if (!c) continue;
            if (*c == current) {
              done[i] = true;
              continue;
            }
            // Until one answers (a stale connection to it, or it still frozen: tried again).
            try {
              caf::scoped_actor self{sys};
              std::string nonce;
              self->request(*c, std::chrono::seconds(5), messages::nonce_request{messages::protocol_version})
                  .receive([&](std::string& n) { nonce = std::move(n); }, [](caf::error&) {});
              if (nonce.empty()) continue;
              const messages::control_proof proof{nonce, actors::control_proof_of(token, nonce)};
              self->request(*c, std::chrono::seconds(5), messages::replaced_atom_v, term, proof)
                  .receive(
                      [&](std::string& answer) {
                        done[i] = true;
                        log("told the coordinator at " + addresses[i].host + ":" + std::to_string(addresses[i].port) +
                            " it was replaced: " + answer);
                      },
                      [](caf::error&) {});
            } catch (const std::exception&) {
            }
          }
          std::this_thread::sleep_for(std::chrono::seconds(1));
        }
      }).detach();
    };
  if (grace > 0) {
    deps.find_coordinator = [&sys, addresses, silent = std::vector<bool>(addresses.size(), false),
                             not_before = std::vector<std::chrono::steady_clock::time_point>(addresses.size())]() mutable
        -> std::optional<messages::coordinator_actor> {
      // In the list's order, but an address that did not answer the last time goes after those
      // that did: a frozen coordinator's kernel still completes TCP handshakes, so each try of it
      // costs a full handshake wait, and once it wakes it would win over a standby that was ready
      // all along (which then waits for nodes that never come). A live coordinator that declared
      // this node lost still answers, and is asked first (it tells the node it was removed).
      for (const bool answered_before : {true, false})
        for (std::size_t i = 0; i < addresses.size(); ++i) {
          if (silent[i] == answered_before || std::chrono::steady_clock::now() < not_before[i]) continue;
          bool listening = false;
          auto c = reach_coordinator(sys, addresses[i], &listening);
          silent[i] = !c;
          if (c) return c;
          // A listener whose CAF handshake failed: CAF's first heartbeat after a hang closes a
          // connection still in its handshake (connection_timeout, within a millisecond of the
          // connect). The next connection waits until the coordinator has seen that one end: see
          // coordinator_link.hpp.
          if (listening) not_before[i] = std::chrono::steady_clock::now() + handshake_retry_wait;
        }
      return std::nullopt;
    };
    deps.relink_wait = coordinator_link_settle;
    deps.drop_coordinator_link = [addresses] {
      std::size_t dropped = 0;
      for (const auto& a : addresses) dropped += shut_down_connections_to(a);
      return dropped;
    };
  }
  deps.log = log;
  deps.profile_job = [log, device](const messages::admission& a) {
    // The job's [profile] repeats; the link measured on loopback, as oobleck-profile does by
    // default (the data plane between two transports on this host).
    const auto job = parse_job(a.job_toml, "the coordinator's job file");
    const auto started = std::chrono::steady_clock::now();
    const auto profile = measure_job_profile(job, job.profile.repeats, {}, nullptr, device);
    log("profiled the job's model (" + std::to_string(profile.num_layers()) + " layers) in " +
        std::to_string(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count()) + " s");
    return messages::profile_json_text(profile, 0);
  };
  deps.make_stage = [&sys, slots, token, device](const messages::admission& a) {
    auto job = stage_job_for(parse_job(a.job_toml, "the coordinator's job file"));
    job.data_token = token;  // the data plane's key
    job.device_index = device.index;  // the kind was checked at admission
    return actors::spawn_stage(sys, job, slots);
  };
  // Detached: its handlers block (building the job's corpus at admission, aborting a data plane),
  // and CAF's cooperative threads must not.
  auto mon = sys.spawn<caf::detached>(actors::monitor, deps);

  caf::error reason;
  {
    caf::scoped_actor self{sys};
    self->monitor(mon);
    self->receive([&](caf::down_msg& dm) { reason = dm.reason; });
  }
  int status = 0;
  if (messages::is_protocol_error(reason) &&
      reason.code() == static_cast<std::uint8_t>(messages::protocol_error::evicted)) {
    err << "error: " << messages::describe(reason) << " (the coordinator evicted this node; the job goes on without it)\n";
    status = 3;
  } else if (messages::is_protocol_error(reason) &&
             reason.code() == static_cast<std::uint8_t>(messages::protocol_error::unknown_node)) {
    err << "error: " << messages::describe(reason) << "\n";
    status = 3;
  } else if (reason && messages::is_protocol_error(reason)) {
    err << "error: refused by the coordinator: " << messages::describe(reason) << "\n";
    status = 2;
  } else if (reason) {
    err << "error: lost contact with the coordinator at " << coordinator
        << " (it stopped, or it declared this node lost, and none came back within --coordinator-grace)\n";
    status = 3;
  }
  // The node's part of the job is over and nothing is left to write. The actor system's
  // destructor is not waited for: CAF 0.17 can keep a detached stage actor that a remote node
  // once addressed referenced after it ended, and then waits for its thread forever (seen: a
  // worker hung on exit after training, 1 run in 2 to 4).
  out.flush();
  err.flush();
  std::cout.flush();
  std::cerr.flush();
  std::_Exit(status);
}

}  // namespace oobleck::apps
