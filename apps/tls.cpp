#include "apps/tls.hpp"

#include <dlfcn.h>

#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include <CLI/CLI.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/io/middleman.hpp>
#include <caf/openssl/manager.hpp>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include "apps/flags.hpp"
#include "messages/input_error.hpp"

namespace oobleck::apps {

using messages::input_error;

namespace {

/// Where a setting came from, for messages: "--tls-key FILE" or "[tls] key FILE".
struct origin {
  std::string flag, key;
  bool from_flag = false;
  [[nodiscard]] std::string of(const std::string& file) const {
    return (from_flag ? flag : "[tls] " + key) + " " + file;
  }
};

/// OpenSSL's queued errors, as one line (and the queue emptied).
std::string ssl_errors() {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    const char* reason = ERR_reason_error_string(e);
    if (!reason) continue;
    if (!out.empty()) out += "; ";
    out += reason;
  }
  return out.empty() ? "" : " (" + out + ")";
}

void check_readable(const origin& o, const std::string& file) {
  std::error_code ec;
  if (std::filesystem::is_directory(file, ec)) throw input_error(o.of(file) + ": is a directory, not a PEM file");
  std::ifstream in(file, std::ios::binary);
  if (!in) throw input_error(o.of(file) + ": cannot read it: " + std::strerror(errno));
}

/// Hands OpenSSL the passphrase; with none, refuses (OpenSSL would prompt on the terminal).
int passphrase_callback(char* buf, int size, int, void* user) {
  const auto* passphrase = static_cast<const std::string*>(user);
  if (passphrase->empty() || static_cast<int>(passphrase->size()) >= size) return -1;
  std::memcpy(buf, passphrase->data(), passphrase->size());
  return static_cast<int>(passphrase->size());
}

/// Loads the files the way CAF's session does (openssl/session.cpp), and checks the certificate
/// against the CA, so that every mistake is named here rather than at the first connection.
void check_files(const tls_section& t, const origin& cert, const origin& key, const origin& ca) {
  check_readable(cert, t.certificate);
  check_readable(key, t.key);
  check_readable(ca, t.ca_file);
  ERR_clear_error();
  const std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> ctx(SSL_CTX_new(TLS_method()), &SSL_CTX_free);
  if (!ctx) throw std::runtime_error("TLS: cannot create an OpenSSL context" + ssl_errors());
  if (SSL_CTX_use_certificate_chain_file(ctx.get(), t.certificate.c_str()) != 1)
    throw input_error(cert.of(t.certificate) + ": not a PEM certificate" + ssl_errors());
  // Read as SSL_CTX_use_PrivateKey_file does (PEM), but apart from the match with the certificate,
  // so that each failure gets its own message.
  std::string passphrase = t.passphrase;
  const std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(t.key.c_str(), "rb"), &std::fclose);
  const std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> pkey(
      file ? PEM_read_PrivateKey(file.get(), nullptr, passphrase_callback, &passphrase) : nullptr, &EVP_PKEY_free);
  if (!pkey)
    throw input_error(key.of(t.key) + ": cannot load the private key: not a PEM key, or " +
                      (t.passphrase.empty() ? "an encrypted one and no passphrase is given ([tls] passphrase, --tls-passphrase-file)"
                                            : "the passphrase is wrong") +
                      ssl_errors());
  if (SSL_CTX_use_PrivateKey(ctx.get(), pkey.get()) != 1 || SSL_CTX_check_private_key(ctx.get()) != 1)
    throw input_error(key.of(t.key) + ": this key does not belong to the certificate " + t.certificate + ssl_errors());

  const std::unique_ptr<X509_STORE, decltype(&X509_STORE_free)> store(X509_STORE_new(), &X509_STORE_free);
  if (!store || X509_STORE_load_locations(store.get(), t.ca_file.c_str(), nullptr) != 1)
    throw input_error(ca.of(t.ca_file) + ": not a PEM CA certificate" + ssl_errors());
  // CAF's session loads the CA file with SSL_CTX_load_verify_locations: the same must succeed.
  if (SSL_CTX_load_verify_locations(ctx.get(), t.ca_file.c_str(), nullptr) != 1)
    throw input_error(ca.of(t.ca_file) + ": not a PEM CA certificate" + ssl_errors());
  const std::unique_ptr<X509_STORE_CTX, decltype(&X509_STORE_CTX_free)> verify(X509_STORE_CTX_new(),
                                                                                &X509_STORE_CTX_free);
  STACK_OF(X509)* chain = nullptr;
  SSL_CTX_get0_chain_certs(ctx.get(), &chain);
  if (!verify || X509_STORE_CTX_init(verify.get(), store.get(), SSL_CTX_get0_certificate(ctx.get()), chain) != 1)
    throw std::runtime_error("TLS: cannot verify the certificate" + ssl_errors());
  if (X509_verify_cert(verify.get()) != 1)
    throw input_error(cert.of(t.certificate) + ": not valid under the CA " + t.ca_file + ": " +
                      X509_verify_cert_error_string(X509_STORE_CTX_get_error(verify.get())));
  ERR_clear_error();
}

std::string read_passphrase(const std::string& file) {
  check_readable({"--tls-passphrase-file", "", true}, file);
  std::ifstream in(file, std::ios::binary);
  std::string line;
  std::getline(in, line);
  if (!line.empty() && line.back() == '\r') line.pop_back();
  if (line.empty()) throw input_error("--tls-passphrase-file " + file + ": its first line is empty");
  return line;
}

}  // namespace

void add_tls_flags(CLI::App& app, tls_flags& flags, bool reads_job_file) {
  auto or_job = [reads_job_file](const std::string& key) {
    return reads_job_file ? " (default: the job file's [tls] " + key + ")" : std::string();
  };
  add_text(app, "--tls-certificate", flags.certificate,
           "TLS on the CAF port, with --tls-key and --tls-ca-file: this program's certificate (PEM), signed by the "
           "job's CA" + or_job("certificate") + "; TLS is off when none is given")
      ->type_name("FILE");
  add_text(app, "--tls-key", flags.key, "TLS: the certificate's private key (PEM)" + or_job("key"))->type_name("FILE");
  add_text(app, "--tls-ca-file", flags.ca_file,
           "TLS: the job's CA certificate (PEM): peers must present a certificate it signed" + or_job("ca_file"))
      ->type_name("FILE");
  add_text(app, "--tls-passphrase-file", flags.passphrase_file,
           "TLS: a file whose first line is the passphrase of an encrypted key" + or_job("passphrase"))
      ->type_name("FILE");
}

tls_section resolve_tls(const tls_section& job, const tls_flags& flags) {
  tls_section t = job;
  const origin cert{"--tls-certificate", "certificate", !flags.certificate.empty()};
  const origin key{"--tls-key", "key", !flags.key.empty()};
  const origin ca{"--tls-ca-file", "ca_file", !flags.ca_file.empty()};
  if (cert.from_flag) t.certificate = flags.certificate;
  if (key.from_flag) t.key = flags.key;
  if (ca.from_flag) t.ca_file = flags.ca_file;
  if (!flags.passphrase_file.empty()) t.passphrase = read_passphrase(flags.passphrase_file);
  if (!t.enabled()) {
    if (!flags.passphrase_file.empty())
      throw input_error("--tls-passphrase-file goes with --tls-certificate, --tls-key and --tls-ca-file");
    return t;
  }
  std::string missing;
  for (const auto& [o, value] : {std::pair{&cert, &t.certificate}, std::pair{&key, &t.key}, std::pair{&ca, &t.ca_file}})
    if (value->empty()) missing += (missing.empty() ? "" : ", ") + o->flag;
  if (!missing.empty()) {
    std::string given;
    for (const auto& [o, value] : {std::pair{&cert, &t.certificate}, std::pair{&key, &t.key}, std::pair{&ca, &t.ca_file}})
      if (!value->empty()) given += (given.empty() ? "" : ", ") + (o->from_flag ? o->flag : "[tls] " + o->key);
    throw input_error("TLS needs a certificate, its key and the job's CA together: " + given + " given, " + missing +
                      " (or the job file's [tls] key) missing");
  }
  check_files(t, cert, key, ca);
  return t;
}

void use_tls(caf::actor_system_config& cfg, const tls_section& tls) {
  if (!tls.enabled()) return;
  cfg.openssl_certificate = tls.certificate;
  cfg.openssl_key = tls.key;
  cfg.openssl_cafile = tls.ca_file;
  cfg.openssl_passphrase = tls.passphrase;
  cfg.load<caf::openssl::manager>();
}

std::vector<std::string> tls_args(const tls_section& tls, const std::string& passphrase_file) {
  if (!tls.enabled()) return {};
  auto absolute = [](const std::string& p) { return std::filesystem::absolute(p).string(); };
  std::vector<std::string> args{"--tls-certificate", absolute(tls.certificate), "--tls-key", absolute(tls.key),
                                "--tls-ca-file", absolute(tls.ca_file)};
  if (!tls.passphrase.empty()) args.insert(args.end(), {"--tls-passphrase-file", passphrase_file});
  return args;
}

std::string describe_tls(const tls_section& tls) {
  return tls.enabled() ? "TLS on (peers must present a certificate signed by " + tls.ca_file + ")" : "TLS off";
}

}  // namespace oobleck::apps

// CAF 0.17.6's OpenSSL session calls SSL_read, SSL_write, SSL_connect and SSL_accept without
// clearing the thread's OpenSSL error queue first, and reads SSL_get_error after them; it drains
// the queue only inside a log statement, which Debian's CAF (log level quiet) compiles out. So once
// one TLS connection of a process fails (a peer killed: ECONNRESET), its error stays queued on the
// middleman's thread, and the next read or write of ANY other connection that merely has to wait
// (SSL_ERROR_WANT_READ) is taken for a failure and that healthy connection is closed: a worker
// killed mid-step took a second, healthy worker with it (seen in tls_e2e_tests, every run). OpenSSL
// requires an empty queue before each of these calls; these definitions, which the dynamic linker
// binds CAF's calls to, empty it and call OpenSSL's own.
namespace {

template <class F>
F openssl_function(const char* name) {
  void* f = ::dlsym(RTLD_NEXT, name);
  if (!f) std::abort();  // libssl is linked into every program that has this file
  return reinterpret_cast<F>(f);
}

}  // namespace

extern "C" int SSL_read(SSL* ssl, void* buf, int num) {
  static const auto real = openssl_function<int (*)(SSL*, void*, int)>("SSL_read");
  ERR_clear_error();
  return real(ssl, buf, num);
}

extern "C" int SSL_write(SSL* ssl, const void* buf, int num) {
  static const auto real = openssl_function<int (*)(SSL*, const void*, int)>("SSL_write");
  ERR_clear_error();
  return real(ssl, buf, num);
}

extern "C" int SSL_connect(SSL* ssl) {
  static const auto real = openssl_function<int (*)(SSL*)>("SSL_connect");
  ERR_clear_error();
  return real(ssl);
}

extern "C" int SSL_accept(SSL* ssl) {
  static const auto real = openssl_function<int (*)(SSL*)>("SSL_accept");
  ERR_clear_error();
  return real(ssl);
}
