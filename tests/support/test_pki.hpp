#pragma once
// A certificate authority of a test's own, made with the openssl command-line tool in a folder of
// the test: a self-signed CA, and certificates it signs (EC P-256, valid for two days), as a user
// makes them by following the README's "TLS" section.

#include <filesystem>
#include <string>

namespace oobleck::testing {

/// A certificate and its key.
struct test_identity {
  std::string certificate;
  std::string key;
};

class test_pki {
 public:
  /// A new CA in `dir`, its files named after `name` (dir/NAME-ca.pem, dir/NAME-ca.key).
  test_pki(std::filesystem::path dir, std::string name);

  /// A certificate for `subject`, signed by this CA. With a `passphrase`, the key file is encrypted.
  test_identity issue(const std::string& subject, const std::string& passphrase = "") const;

  [[nodiscard]] const std::string& ca_file() const { return ca_file_; }

 private:
  std::filesystem::path dir_;
  std::string name_;
  std::string ca_file_, ca_key_;
};

}  // namespace oobleck::testing
