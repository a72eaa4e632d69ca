#include "support/netns.hpp"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <regex>
#include <sstream>
#include <stdexcept>

#include "support/subprocess.hpp"

namespace oobleck::testing {

namespace {

/// The bridge's port to a host, in the bridge namespace (interface names: 15 characters at most).
std::string port_name(const std::string& host) { return "p" + host; }

process_result run_ip(const std::vector<std::string>& args) { return run_process(ip_program(), args); }

std::string command_line(const std::vector<std::string>& args) {
  std::string s = "ip";
  for (const auto& a : args) s += " " + a;
  return s;
}

/// Runs `ip ARGS`; throws naming the command and what ip said when it fails.
void ip(const std::vector<std::string>& args) {
  const auto r = run_ip(args);
  if (r.exit_status != 0)
    throw std::runtime_error("'" + command_line(args) + "' failed (exit " + std::to_string(r.exit_status) +
                             "): " + r.err + r.out);
}

std::vector<std::string> namespace_names() {
  std::vector<std::string> out;
  std::istringstream lines(run_ip({"netns", "list"}).out);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);  // "NAME" or "NAME (id: N)"
    std::string name;
    if (words >> name) out.push_back(name);
  }
  return out;
}

bool process_runs(long pid) { return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH; }

}  // namespace

const std::string& ip_program() {
  static const std::string path = [] {
    std::vector<std::string> dirs;
    if (const char* p = std::getenv("PATH")) {
      std::istringstream s(p);
      for (std::string d; std::getline(s, d, ':');)
        if (!d.empty()) dirs.push_back(d);
    }
    for (const char* d : {"/usr/sbin", "/sbin", "/usr/bin", "/bin"}) dirs.emplace_back(d);
    for (const auto& d : dirs)
      if (::access((d + "/ip").c_str(), X_OK) == 0) return d + "/ip";
    return std::string();
  }();
  return path;
}

std::string netns_unavailable() {
  if (::geteuid() != 0) return "not running as root (network namespaces, veth pairs and bridges need it)";
  if (ip_program().empty()) return "no 'ip' program (iproute2) on PATH or in /usr/sbin, /sbin, /usr/bin, /bin";
  const std::string probe = "oobk" + std::to_string(::getpid()) + "-probe";
  run_ip({"netns", "del", probe});  // a leftover of this very pid, if any
  std::string why;
  try {
    ip({"netns", "add", probe});
    ip({"-n", probe, "link", "add", "name", "va", "type", "veth", "peer", "name", "vb"});
    ip({"-n", probe, "link", "add", "name", "br0", "type", "bridge"});
  } catch (const std::exception& e) {
    why = std::string("cannot make a network namespace with a veth pair and a bridge: ") + e.what();
  }
  run_ip({"netns", "del", probe});
  return why;
}

std::vector<std::string> remove_stale_namespaces() {
  static const std::regex ours("oobk([0-9]+)-.*");
  std::vector<std::string> removed;
  if (ip_program().empty()) return removed;
  for (const auto& name : namespace_names()) {
    std::smatch m;
    if (!std::regex_match(name, m, ours)) continue;
    const long pid = std::strtol(m[1].str().c_str(), nullptr, 10);
    if (pid == ::getpid() || process_runs(pid)) continue;
    if (run_ip({"netns", "del", name}).exit_status == 0) removed.push_back(name);
  }
  return removed;
}

netns_lan::netns_lan(const std::vector<std::string>& hosts) : hosts_(hosts) {
  static std::atomic<int> counter{0};
  const int n = counter++;
  prefix_ = "oobk" + std::to_string(::getpid()) + "-" + std::to_string(n);
  subnet_ = n % 250;
  static const std::regex name_ok("[a-z0-9]{1,8}");
  for (const auto& h : hosts_)
    if (!std::regex_match(h, name_ok)) throw std::invalid_argument("netns_lan: bad host name '" + h + "'");
  if (hosts_.size() > 250) throw std::invalid_argument("netns_lan: at most 250 hosts");
  try {
    const std::string bridge_ns = prefix_ + "br";
    // A namespace of this pid with this name can only be a leftover of a dead process that had
    // the same pid: never one of ours alive (the counter).
    run_ip({"netns", "del", bridge_ns});
    ip({"netns", "add", bridge_ns});
    namespaces_.push_back(bridge_ns);
    ip({"-n", bridge_ns, "link", "add", "name", "br0", "type", "bridge"});
    ip({"-n", bridge_ns, "link", "set", "br0", "up"});
    for (std::size_t i = 0; i < hosts_.size(); ++i) {
      const std::string host_ns = prefix_ + hosts_[i];
      const std::string port = port_name(hosts_[i]);
      run_ip({"netns", "del", host_ns});
      ip({"netns", "add", host_ns});
      namespaces_.push_back(host_ns);
      ip({"-n", bridge_ns, "link", "add", "name", port, "type", "veth", "peer", "name", "eth0", "netns", host_ns});
      ip({"-n", bridge_ns, "link", "set", port, "master", "br0"});
      ip({"-n", bridge_ns, "link", "set", port, "up"});
      ip({"-n", host_ns, "link", "set", "lo", "up"});
      ip({"-n", host_ns, "addr", "add", address(i) + "/24", "dev", "eth0"});
      ip({"-n", host_ns, "link", "set", "eth0", "up"});
    }
    // Every host knows every other's hardware address for good (permanent neighbour entries), as
    // hosts behind a router know the router's: a cut link then drops what is sent, silently, as a
    // partition of a routed network does. Without them, a host that looks for a cut-off peer learns
    // within 3 s that ARP failed ("no route to host"), which a real partition never says: a connect
    // would fail fast instead of waiting for SYN retransmissions (seconds to minutes).
    std::vector<std::string> macs;
    for (std::size_t i = 0; i < hosts_.size(); ++i) {
      const auto r = run_ip({"-n", prefix_ + hosts_[i], "-o", "link", "show", "eth0"});
      const auto at = r.out.find("link/ether ");
      if (r.exit_status != 0 || at == std::string::npos)
        throw std::runtime_error("no hardware address for host " + hosts_[i] + ": " + r.err + r.out);
      macs.push_back(r.out.substr(at + 11, 17));
    }
    for (std::size_t i = 0; i < hosts_.size(); ++i)
      for (std::size_t j = 0; j < hosts_.size(); ++j)
        if (i != j)
          ip({"-n", prefix_ + hosts_[i], "neigh", "replace", address(j), "lladdr", macs[j], "dev", "eth0", "nud",
              "permanent"});
  } catch (...) {
    remove_all();
    throw;
  }
}

netns_lan::~netns_lan() { remove_all(); }

void netns_lan::remove_all() noexcept {
  // Removing a namespace removes its end of each veth pair, and with it the other end; the
  // bridge goes with its namespace. Hosts first, the bridge last.
  for (auto it = namespaces_.rbegin(); it != namespaces_.rend(); ++it) {
    try {
      run_ip({"netns", "del", *it});
    } catch (...) {  // a destructor must not throw; remove_stale_namespaces() gets it next time
    }
  }
  namespaces_.clear();
}

std::string netns_lan::address(std::size_t i) const {
  return "10.213." + std::to_string(subnet_) + "." + std::to_string(i + 1);
}

std::vector<std::string> netns_lan::exec_args(std::size_t i, const std::string& program,
                                              const std::vector<std::string>& args) const {
  std::vector<std::string> out{"netns", "exec", ns(i), program};
  out.insert(out.end(), args.begin(), args.end());
  return out;
}

void netns_lan::cut(std::size_t i) { ip({"-n", namespaces_.at(0), "link", "set", port_name(hosts_.at(i)), "down"}); }

void netns_lan::heal(std::size_t i) { ip({"-n", namespaces_.at(0), "link", "set", port_name(hosts_.at(i)), "up"}); }

bool netns_lan::linked(std::size_t i) const {
  const auto r = run_ip({"-n", namespaces_.at(0), "-o", "link", "show", port_name(hosts_.at(i))});
  if (r.exit_status != 0) throw std::runtime_error("no bridge port for host " + hosts_.at(i) + ": " + r.err);
  // "3: pw0@if2: <BROADCAST,MULTICAST,UP,LOWER_UP> ...": the administrative flag UP.
  const auto open = r.out.find('<'), close = r.out.find('>');
  const std::string flags = "," + r.out.substr(open + 1, close - open - 1) + ",";
  return flags.find(",UP,") != std::string::npos;
}

}  // namespace oobleck::testing
