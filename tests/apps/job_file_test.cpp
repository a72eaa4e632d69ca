#include "apps/job_file.hpp"

#include <doctest/doctest.h>

#include "apps/cli_args.hpp"
#include "planning/profile.hpp"
#include "support/comma_locale.hpp"

using namespace oobleck;

namespace {

std::string error_of(const std::string& text) {
  try {
    apps::parse_job_file(text, "job.toml");
  } catch (const planning::planning_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a job file sets the model and training knobs") {
  const auto job = apps::parse_job_file(R"(# a comment
[model]
vocab = 100   # trailing comment
d_model = 48
heads = 6
blocks = 3
seq_len = 64
dropout = 0.1
seed = 9

[training]
microbatch = 2
global_batch = 32
[cluster]
device_memory_bytes = 1000000
)");
  CHECK(job.model.vocab == 100);
  CHECK(job.model.d_model == 48);
  CHECK(job.model.heads == 6);
  CHECK(job.model.dropout == 0.1);
  CHECK(job.microbatch == 2);
  CHECK(job.global_batch == 32);
  CHECK(job.device_memory_bytes == 1000000);
}

TEST_CASE("job file errors name the file and line") {
  CHECK(error_of("[model]\nd_modle = 3\n") == "job.toml:2: unknown key model.d_modle");
  CHECK(error_of("[model]\nblocks = many\n") == "job.toml:2: expected an integer, got many");
  CHECK(error_of("[model\n") == "job.toml:1: unterminated section header");
  CHECK(error_of("vocab\n") == "job.toml:1: expected key = value");
  CHECK(error_of("[model]\nheads = 5\n").find("multiple of heads") != std::string::npos);
  CHECK(error_of("[training]\nmicrobatch = 3\nglobal_batch = 64\n").find("not a multiple") != std::string::npos);
}

TEST_CASE("fuzz finding: an int field above INT_MAX is refused, not narrowed to a zero divisor") {
  // microbatch = 2^32 narrowed to 0, and the global batch check divided by it (SIGFPE).
  CHECK(error_of("[training]\nmicrobatch = 4294967296\n") == "job.toml:2: must be <= 2147483647, got 4294967296");
  CHECK(error_of("[training]\nglobal_batch = 2147483648\n") == "job.toml:2: must be <= 2147483647, got 2147483648");
  CHECK(error_of("[profile]\nrepeats = 4294967297\n") == "job.toml:2: must be <= 2147483647, got 4294967297");
}

TEST_CASE("numbers in job files and flags read the same under a comma-decimal C locale") {
  oobleck::test::comma_locale comma(std::string(OOBLECK_SOURCE_DIR) + "/tests/messages/data/locale");
  REQUIRE_MESSAGE(comma.active(), "no comma-decimal locale could be set; the locale test would prove nothing");
  // std::stod read "0.1" as 0 with one character used here, so the job file was refused.
  CHECK(apps::parse_job_file("[model]\ndropout = 0.25\n").model.dropout == 0.25);
  CHECK(apps::parse_number("1e-3") == 1e-3);
}

TEST_CASE("integers and numbers are the whole text, base 10") {
  CHECK(apps::parse_integer("42") == 42);
  CHECK(apps::parse_integer("+42") == 42);
  CHECK(apps::parse_integer("-7") == -7);
  CHECK_FALSE(apps::parse_integer("4x"));
  CHECK_FALSE(apps::parse_integer(" 4"));
  CHECK_FALSE(apps::parse_integer("+-4"));
  CHECK_FALSE(apps::parse_integer("9223372036854775808"));
  CHECK_FALSE(apps::parse_integer(""));
  CHECK(apps::parse_number("2.5") == 2.5);
  CHECK(apps::parse_number("+.5") == 0.5);
  CHECK_FALSE(apps::parse_number("nan"));
  CHECK_FALSE(apps::parse_number("inf"));
  CHECK_FALSE(apps::parse_number("1e400"));
  CHECK_FALSE(apps::parse_number("1,5"));
}
