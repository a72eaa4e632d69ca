#pragma once
// TLS on the coordinator's CAF port (CAF's OpenSSL module, libcaf-openssl): off by default; when a
// job sets it, every CAF connection of the job (workers, oobleck-ctl, oobleck-local's injector)
// runs over TLS with mutual authentication: each side presents a certificate that the job's CA
// signed, and refuses a peer without one. CAF checks the CA signature only (no host names): the
// CA is the job's own, so a certificate it signed is what proves a peer belongs to the job.
//
// The settings come from the job file's [tls] table, and from --tls-* flags that replace its keys
// one by one. They are checked in full before anything listens or connects (half a configuration,
// an unreadable file, a key that is not the certificate's, a certificate the CA did not sign, an
// encrypted key without its passphrase): CAF itself would find those out on the network thread,
// at the first connection, and end the process (or prompt for a passphrase on the terminal).

#include <string>
#include <vector>

#include "apps/job_file.hpp"

namespace CLI {
class App;
}
namespace caf {
class actor_system_config;
}

namespace oobleck::apps {

/// The --tls-* flags as given (empty: not given).
struct tls_flags {
  std::string certificate;
  std::string key;
  std::string ca_file;
  std::string passphrase_file;  ///< a file holding the key's passphrase (its first line)
};

/// Adds --tls-certificate, --tls-key, --tls-ca-file and --tls-passphrase-file to `app`; their help
/// names the job file's [tls] keys as defaults where the program reads a job file.
void add_tls_flags(CLI::App& app, tls_flags& flags, bool reads_job_file = true);

/// The program's TLS settings: `job`'s [tls] (empty without a job file) with each given flag in
/// place of its key, checked as this file's comment says. Throws messages::input_error naming
/// the flag or key and the file.
tls_section resolve_tls(const tls_section& job, const tls_flags& flags);

/// Loads CAF's OpenSSL module configured with `tls` (before the actor system is built); does
/// nothing when TLS is off. Connections then go through apps::connect_first_coordinator and
/// apps::publish_coordinator, which pick TLS when the module is loaded.
void use_tls(caf::actor_system_config& cfg, const tls_section& tls);

/// The flags that hand `tls` on to a program this one starts (oobleck-local): absolute paths, and
/// the passphrase through `passphrase_file` (written by the caller, mode 0600) when there is one.
/// Empty when TLS is off.
std::vector<std::string> tls_args(const tls_section& tls, const std::string& passphrase_file);

/// A line for the log: "TLS on (CA FILE)" or "TLS off".
std::string describe_tls(const tls_section& tls);

}  // namespace oobleck::apps
