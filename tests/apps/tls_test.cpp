// TLS settings (apps/tls.hpp): the --tls-* flags replace the job file's [tls] keys one by one, and
// every mistake a user can make with the files is refused before anything connects, naming the
// flag or key and the file: half a configuration, an unreadable or wrong file, a key that is not
// the certificate's, a certificate another CA signed, an encrypted key without its passphrase
// (which CAF would otherwise ask for on the terminal, or fail on at the first connection).

#include "apps/tls.hpp"

#include <doctest/doctest.h>

#include <sys/stat.h>

#include <fstream>
#include <string>

#include "messages/input_error.hpp"
#include "support/temp_dir.hpp"
#include "support/test_pki.hpp"

using namespace oobleck;
using namespace oobleck::testing;
using apps::resolve_tls;
using apps::tls_flags;
using apps::tls_section;

namespace {

/// The message of the input_error `f` throws ("" when it throws none).
template <class F>
std::string refusal(F&& f) {
  try {
    f();
  } catch (const messages::input_error& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

struct pki_fixture {
  temp_dir dir{"oobleck-tls-"};
  test_pki job{dir.path(), "job"};
  test_pki other{dir.path(), "other"};
  test_identity node = job.issue("node");
  test_identity second = job.issue("second");
  test_identity stranger = other.issue("stranger");

  [[nodiscard]] tls_flags flags(const test_identity& id) const { return {id.certificate, id.key, job.ca_file(), ""}; }
  [[nodiscard]] std::string write(const std::string& name, const std::string& text) const {
    const auto path = (dir.path() / name).string();
    std::ofstream(path) << text;
    return path;
  }
};

}  // namespace

TEST_CASE("TLS is off without a [tls] table or flags") {
  const auto t = resolve_tls({}, {});
  CHECK_FALSE(t.enabled());
  CHECK(apps::tls_args(t, "/unused").empty());
}

TEST_CASE("the --tls-* flags give a whole TLS configuration, checked") {
  pki_fixture p;
  const auto t = resolve_tls({}, p.flags(p.node));
  CHECK(t.enabled());
  CHECK(t.certificate == p.node.certificate);
  CHECK(t.key == p.node.key);
  CHECK(t.ca_file == p.job.ca_file());
  CHECK(t.passphrase.empty());
  const auto args = apps::tls_args(t, "/unused");
  CHECK(args == std::vector<std::string>{"--tls-certificate", p.node.certificate, "--tls-key", p.node.key,
                                         "--tls-ca-file", p.job.ca_file()});
}

TEST_CASE("flags win over the job file's [tls], key by key") {
  pki_fixture p;
  const tls_section job{p.node.certificate, p.node.key, p.job.ca_file(), ""};
  SUBCASE("no flag: the job file's") { CHECK(resolve_tls(job, {}) == job); }
  SUBCASE("a certificate and key by flag, the CA from the job file") {
    const auto t = resolve_tls(job, {p.second.certificate, p.second.key, "", ""});
    CHECK(t.certificate == p.second.certificate);
    CHECK(t.key == p.second.key);
    CHECK(t.ca_file == p.job.ca_file());
  }
  SUBCASE("a flag's file is checked, not the job file's it replaces") {
    const tls_section broken{"/nonexistent/node.pem", "/nonexistent/node.key", p.job.ca_file(), ""};
    CHECK(resolve_tls(broken, {p.node.certificate, p.node.key, "", ""}).certificate == p.node.certificate);
  }
  SUBCASE("a key by flag that does not belong to the job file's certificate is refused") {
    const auto why = refusal([&] { resolve_tls(job, {"", p.second.key, "", ""}); });
    CHECK(has(why, "--tls-key " + p.second.key));
    CHECK(has(why, "does not belong to the certificate " + p.node.certificate));
  }
}

TEST_CASE("half a TLS configuration is refused, naming what is given and what is missing") {
  pki_fixture p;
  const auto only_certificate = refusal([&] { resolve_tls({}, {p.node.certificate, "", "", ""}); });
  CHECK(has(only_certificate, "--tls-certificate given"));
  CHECK(has(only_certificate, "--tls-key, --tls-ca-file"));
  CHECK(has(only_certificate, "missing"));
  const auto no_ca = refusal([&] { resolve_tls({}, {p.node.certificate, p.node.key, "", ""}); });
  CHECK(has(no_ca, "--tls-ca-file"));
  CHECK_FALSE(has(no_ca, "--tls-key,"));
  // Given half in the job file and half by flag: still half.
  const auto mixed = refusal([&] { resolve_tls({"", "", p.job.ca_file(), ""}, {p.node.certificate, "", "", ""}); });
  CHECK(has(mixed, "--tls-certificate, [tls] ca_file given"));
  CHECK(has(mixed, "--tls-key"));
  const auto passphrase_alone = refusal([&] { resolve_tls({}, {"", "", "", p.write("pass", "secret\n")}); });
  CHECK(has(passphrase_alone, "--tls-passphrase-file goes with"));
}

TEST_CASE("unreadable or wrong TLS files are refused, naming the flag or key and the file") {
  pki_fixture p;
  const auto missing = refusal([&] { resolve_tls({}, {"/nonexistent/node.pem", p.node.key, p.job.ca_file(), ""}); });
  CHECK(has(missing, "--tls-certificate /nonexistent/node.pem: cannot read it"));
  const auto from_job = refusal([&] { resolve_tls({p.node.certificate, "/nonexistent/k", p.job.ca_file(), ""}, {}); });
  CHECK(has(from_job, "[tls] key /nonexistent/k: cannot read it"));
  const auto directory = refusal([&] { resolve_tls({}, {p.node.certificate, p.node.key, p.dir.path().string(), ""}); });
  CHECK(has(directory, "is a directory"));
  const auto garbage = p.write("garbage.pem", "not a certificate\n");
  CHECK(has(refusal([&] { resolve_tls({}, {garbage, p.node.key, p.job.ca_file(), ""}); }),
            "--tls-certificate " + garbage + ": not a PEM certificate"));
  CHECK(has(refusal([&] { resolve_tls({}, {p.node.certificate, garbage, p.job.ca_file(), ""}); }),
            "--tls-key " + garbage + ": cannot load the private key"));
  CHECK(has(refusal([&] { resolve_tls({}, {p.node.certificate, p.node.key, garbage, ""}); }),
            "--tls-ca-file " + garbage + ": not a PEM CA certificate"));
  CHECK(has(refusal([&] { resolve_tls({}, {p.node.certificate, p.second.key, p.job.ca_file(), ""}); }),
            "does not belong to the certificate"));
  if (::geteuid() != 0) {  // root reads a file of mode 0000 anyway
    const auto locked = p.write("locked.key", "x");
    ::chmod(locked.c_str(), 0);
    CHECK(has(refusal([&] { resolve_tls({}, {p.node.certificate, locked, p.job.ca_file(), ""}); }),
              "--tls-key " + locked + ": cannot read it: Permission denied"));
  }
}

TEST_CASE("a certificate the job's CA did not sign is refused before it is used") {
  pki_fixture p;
  const auto why = refusal([&] { resolve_tls({}, {p.stranger.certificate, p.stranger.key, p.job.ca_file(), ""}); });
  CHECK(has(why, "--tls-certificate " + p.stranger.certificate + ": not valid under the CA " + p.job.ca_file()));
  // Its own CA accepts it: a whole other PKI is consistent here, and refused by the peer.
  CHECK(resolve_tls({}, {p.stranger.certificate, p.stranger.key, p.other.ca_file(), ""}).enabled());
}

TEST_CASE("an encrypted key needs its passphrase: refused without it, never prompted for") {
  pki_fixture p;
  const auto locked = p.job.issue("locked", "s3cret phrase");
  const auto none = refusal([&] { resolve_tls({}, {locked.certificate, locked.key, p.job.ca_file(), ""}); });
  CHECK(has(none, "no passphrase is given"));
  const auto wrong = refusal([&] { resolve_tls({}, {locked.certificate, locked.key, p.job.ca_file(), p.write("w", "wrong\n")}); });
  CHECK(has(wrong, "the passphrase is wrong"));
  const auto by_file = resolve_tls({}, {locked.certificate, locked.key, p.job.ca_file(), p.write("ok", "s3cret phrase\n")});
  CHECK(by_file.passphrase == "s3cret phrase");
  CHECK(apps::tls_args(by_file, "/scratch/pass").back() == "/scratch/pass");
  const tls_section job{locked.certificate, locked.key, p.job.ca_file(), "s3cret phrase"};
  CHECK(resolve_tls(job, {}) == job);
  CHECK(has(refusal([&] { resolve_tls({}, {"", "", "", p.write("empty", "\n")}); }), "its first line is empty"));
}
