#include "support/test_pki.hpp"

#include <stdexcept>
#include <utility>
#include <vector>

#include "support/subprocess.hpp"

namespace oobleck::testing {

namespace {

void openssl(const std::vector<std::string>& args) {
  const auto r = run_process("/usr/bin/openssl", args);
  if (r.exit_status != 0) {
    std::string line = "openssl";
    for (const auto& a : args) line += " " + a;
    throw std::runtime_error(line + " failed (" + std::to_string(r.exit_status) + "): " + r.err);
  }
}

const std::vector<std::string> new_ec_key{"-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"};

}  // namespace

test_pki::test_pki(std::filesystem::path dir, std::string name) : dir_(std::move(dir)), name_(std::move(name)) {
  ca_file_ = (dir_ / (name_ + "-ca.pem")).string();
  ca_key_ = (dir_ / (name_ + "-ca.key")).string();
  std::vector<std::string> args{"req", "-x509"};
  args.insert(args.end(), new_ec_key.begin(), new_ec_key.end());
  args.insert(args.end(), {"-keyout", ca_key_, "-out", ca_file_, "-days", "2", "-subj", "/CN=" + name_ + " test CA"});
  openssl(args);
}

test_identity test_pki::issue(const std::string& subject, const std::string& passphrase) const {
  const auto base = (dir_ / (name_ + "-" + subject)).string();
  test_identity id{base + ".pem", base + ".key"};
  std::vector<std::string> args{"req"};
  args.insert(args.end(), new_ec_key.begin(), new_ec_key.end());
  args.insert(args.end(), {"-keyout", id.key, "-out", base + ".csr", "-subj", "/CN=" + subject});
  openssl(args);
  openssl({"x509", "-req", "-in", base + ".csr", "-CA", ca_file_, "-CAkey", ca_key_, "-CAcreateserial", "-out",
           id.certificate, "-days", "2"});
  if (!passphrase.empty()) {
    const std::string plain = id.key;
    id.key = base + ".enc.key";
    openssl({"pkey", "-in", plain, "-aes256", "-passout", "pass:" + passphrase, "-out", id.key});
  }
  return id;
}

}  // namespace oobleck::testing
