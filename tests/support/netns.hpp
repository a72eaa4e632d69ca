#pragma once
// A private network of Linux network namespaces for partition tests (issue 23): one bridge in a
// namespace of its own and hosts in namespaces of their own, each host linked to the bridge by a
// veth pair, with addresses on a private /24 that only these namespaces carry. A program runs on a
// host with `ip netns exec`; cutting a host's link sets its bridge port down (a switch port
// unplugged: the host keeps its address and its sockets, nothing it sends arrives and nothing
// reaches it), healing sets it up again. Hosts know each other's hardware addresses for good
// (permanent neighbour entries), so a cut drops packets silently, as in a routed network, instead
// of failing connections fast when ARP goes unanswered. Nothing outside the namespaces made here is
// touched or addressed. Everything is removed by the destructor, however the test ends; namespaces
// left by an earlier run that crashed (same naming pattern, a process id that no longer runs) are
// removed too.

#include <string>
#include <vector>

namespace oobleck::testing {

/// Why network namespaces cannot be made here, or "" when they can: not root, no `ip` program,
/// or the kernel or container refuses a namespace, a veth pair or a bridge (tried once, in a probe
/// namespace removed at once).
std::string netns_unavailable();

/// The `ip` program (iproute2), found on PATH or in /usr/sbin, /sbin, /usr/bin, /bin; "" when none.
const std::string& ip_program();

/// Removes the namespaces named `oobk<PID>-...` whose process PID no longer runs: leftovers of a
/// test binary that was killed before its destructors ran. Returns their names.
std::vector<std::string> remove_stale_namespaces();

class netns_lan {
 public:
  /// Makes the bridge namespace and one host namespace per name (`oobk<pid>-<n><name>`; a name
  /// is a few letters and digits), host i at 10.213.<n % 250>.<i + 1>/24. Throws
  /// std::runtime_error naming the `ip` command that failed, after removing what it made.
  explicit netns_lan(const std::vector<std::string>& hosts);
  ~netns_lan();
  netns_lan(const netns_lan&) = delete;
  netns_lan& operator=(const netns_lan&) = delete;

  /// The namespace of host `i`.
  [[nodiscard]] const std::string& ns(std::size_t i) const { return namespaces_.at(i + 1); }
  /// The IPv4 address of host `i` (no prefix length).
  [[nodiscard]] std::string address(std::size_t i) const;
  /// The program and arguments that run `program args...` on host `i`: `ip netns exec NS program
  /// args...` (ip execs the program: the process id is the program's, so is its exit status).
  [[nodiscard]] std::vector<std::string> exec_args(std::size_t i, const std::string& program,
                                                   const std::vector<std::string>& args) const;
  /// Cuts host `i`'s link (its bridge port down) / heals it (up again).
  void cut(std::size_t i);
  void heal(std::size_t i);
  /// Whether host `i`'s bridge port is up (as the kernel reports it).
  [[nodiscard]] bool linked(std::size_t i) const;

 private:
  void remove_all() noexcept;

  std::string prefix_;
  int subnet_ = 0;
  std::vector<std::string> hosts_;
  std::vector<std::string> namespaces_;  ///< [0] the bridge's, then one per host; only those made
};

}  // namespace oobleck::testing
