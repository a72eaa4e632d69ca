#include "actors/admission.hpp"

#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include "messages/input_error.hpp"
#include "messages/protocol.hpp"

using namespace oobleck::actors;
using namespace oobleck::messages;
using namespace std::chrono_literals;

TEST_CASE("admission: HMAC-SHA256 and SHA-256 match their published test vectors") {
  // RFC 4231, test case 2.
  CHECK(hmac_sha256_hex("Jefe", "what do ya want for nothing?") ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // FIPS 180-2, "abc".
  CHECK(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(random_hex(16).size() == 32);
  CHECK(random_hex(16) != random_hex(16));
}

TEST_CASE("admission: a nonce is good once, within its lifetime, and the book stays bounded") {
  nonce_book book(10s, 4);
  const auto t0 = nonce_book::clock::time_point{} + 1h;
  const std::string a = book.issue(t0).value();
  CHECK(book.consume(a, t0 + 1s));
  CHECK_FALSE(book.consume(a, t0 + 2s));  // replay
  const std::string b = book.issue(t0).value();
  CHECK_FALSE(book.consume(b, t0 + 11s));  // expired
  CHECK_FALSE(book.consume("not a nonce", t0));
  std::set<std::string> many;
  for (int i = 0; i < 100; ++i) many.insert(book.issue(t0).value());
  CHECK(many.size() == 100);
  CHECK(book.outstanding() <= 4);
}

TEST_CASE("admission: a flood of nonce requests cannot take a worker's pending nonce away") {
  const auto t0 = nonce_book::clock::time_point{} + 1h;
  SUBCASE("one asker flooding: it only ever holds its own few nonces") {
    nonce_book book(60s, 16, 4);
    const std::string mine = book.issue(t0, "worker").value();
    std::string last;
    for (int i = 0; i < 10'000; ++i) last = book.issue(t0 + 1s, "stranger").value();
    CHECK(book.outstanding("stranger") == 4u);
    CHECK(book.outstanding() == 5u);
    CHECK(book.consume(last, t0 + 2s));   // the flooder's newest is good
    CHECK(book.consume(mine, t0 + 2s));   // and the worker's survived it
  }
  SUBCASE("many askers: the fullest asker's oldest goes first, a single nonce never") {
    nonce_book book(60s, 8, 4);
    const std::string mine = book.issue(t0, "worker").value();
    for (int i = 0; i < 4; ++i) CHECK(book.issue(t0, "greedy").has_value());
    for (int i = 0; i < 3; ++i) CHECK(book.issue(t0, "one-" + std::to_string(i)).has_value());
    CHECK(book.outstanding() == 8u);
    // The book is full: new askers take the greedy one's nonces, one by one ...
    for (int i = 3; i < 6; ++i) CHECK(book.issue(t0, "one-" + std::to_string(i)).has_value());
    CHECK(book.outstanding("greedy") == 1u);
    CHECK(book.outstanding() == 8u);
    // ... and once everyone holds a single nonce, a newcomer is refused instead of evicting one.
    CHECK_FALSE(book.issue(t0, "late").has_value());
    CHECK(book.outstanding() == 8u);
    CHECK(book.consume(mine, t0 + 1s));
    // Expired nonces make room again.
    CHECK(book.issue(t0 + 61s, "late").has_value());
    CHECK(book.outstanding() == 1u);
  }
}

namespace {

struct registration_case {
  admission_policy policy{std::string(64, 't'), "job-hash-1", protocol_version};
  nonce_book book;
  nonce_book::clock::time_point now = nonce_book::clock::time_point{} + 1h;

  register_node good(const std::string& token) {
    register_node r;
    r.protocol_version = protocol_version;
    r.job_hash = "job-hash-1";
    r.name = "node-a";
    r.slots = 1;
    r.data = {"127.0.0.1", 4000};
    r.nonce = book.issue(now).value();
    r.proof = admission_proof(token, r.nonce, r.name);
    return r;
  }
  std::string refusal(const register_node& r) {
    auto err = check_registration(r, policy, book, now);
    return err ? describe(err) : "admitted";
  }
};

}  // namespace

TEST_CASE("admission: registrations are refused with the reason, and only a correct proof passes") {
  registration_case c;
  CHECK(c.refusal(c.good(c.policy.token)) == "admitted");

  auto wrong_token = c.good(std::string(64, 'x'));
  CHECK(c.refusal(wrong_token).rfind("bad_proof: the worker's token differs", 0) == 0);

  auto replay = c.good(c.policy.token);
  CHECK(c.refusal(replay) == "admitted");
  CHECK(c.refusal(replay) == "bad_proof: unknown, expired or reused nonce");

  auto renamed = c.good(c.policy.token);
  renamed.name = "node-b";  // the proof covers the name
  CHECK(c.refusal(renamed).rfind("bad_proof", 0) == 0);

  auto other_job = c.good(c.policy.token);
  other_job.job_hash = "job-hash-2";
  CHECK(c.refusal(other_job) == "wrong_job: the worker was started for job job-hash-2, the coordinator runs job job-hash-1");

  auto any_job = c.good(c.policy.token);
  any_job.job_hash.clear();  // a worker without --config takes the coordinator's job
  CHECK(c.refusal(any_job) == "admitted");

  auto old = c.good(c.policy.token);
  old.protocol_version = protocol_version + 1;
  CHECK(c.refusal(old).rfind("wrong_version: the worker speaks protocol", 0) == 0);

  auto no_port = c.good(c.policy.token);
  no_port.data.port = 0;
  CHECK(c.refusal(no_port).rfind("bad_request", 0) == 0);

  // The planner cuts pipelines for nodes of exactly the job's M slots.
  auto two_slots = c.good(c.policy.token);
  two_slots.slots = 2;
  CHECK(c.refusal(two_slots) ==
        "wrong_slots: the worker has 2 slot(s), the job's nodes have 1 (cluster.slots_per_node); start it with --slots 1");
  c.policy.slots_per_node = 2;
  auto matching = c.good(c.policy.token);
  matching.slots = 2;
  CHECK(c.refusal(matching) == "admitted");
  auto one_slot = c.good(c.policy.token);
  CHECK(c.refusal(one_slot).rfind("wrong_slots: the worker has 1 slot(s), the job's nodes have 2", 0) == 0);
}

TEST_CASE("admission: a worker computing on another kind of device than the job's is refused") {
  registration_case c;
  auto gpu = c.good(c.policy.token);
  gpu.device = "cuda";
  CHECK(c.refusal(gpu) ==
        "wrong_device: the worker computes on cuda, the job's stages run on cpu (cluster.device); start it with --device cpu");
  c.policy.device = "cuda";
  auto cpu = c.good(c.policy.token);
  CHECK(c.refusal(cpu).rfind("wrong_device: the worker computes on cpu, the job's stages run on cuda", 0) == 0);
  auto matching = c.good(c.policy.token);
  matching.device = "cuda";
  CHECK(c.refusal(matching) == "admitted");
}

TEST_CASE("admission: operator requests need a proof made with a fresh nonce") {
  registration_case c;
  const std::string n = c.book.issue(c.now).value();
  CHECK_FALSE(check_control({n, control_proof_of(c.policy.token, n)}, c.policy, c.book, c.now));
  CHECK(check_control({n, control_proof_of(c.policy.token, n)}, c.policy, c.book, c.now));  // reused
  const std::string m = c.book.issue(c.now).value();
  // A registration proof is not a control proof.
  CHECK(check_control({m, admission_proof(c.policy.token, m, "control")}, c.policy, c.book, c.now));
}

TEST_CASE("admission: token files are created private and refused when readable by others") {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("oobleck-token-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "token").string();
  const std::string token = create_token_file(path);
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  CHECK(read_token_file(path) == token);
  CHECK_THROWS_WITH_AS(create_token_file(path), doctest::Contains("File exists"), input_error);
  ::chmod(path.c_str(), 0644);
  CHECK_THROWS_WITH_AS(read_token_file(path), doctest::Contains("chmod 600"), input_error);
  {
    std::ofstream(dir / "short") << "abc\n";
    ::chmod((dir / "short").c_str(), 0600);
  }
  // Bad input, as every program reports it (exit status 2), not an internal error.
  CHECK_THROWS_WITH_AS(read_token_file((dir / "short").string()), doctest::Contains("at least 32"), input_error);
  CHECK_THROWS_WITH_AS(read_token_file((dir / "missing").string()), doctest::Contains("No such file"), input_error);
  std::filesystem::remove_all(dir);
}
