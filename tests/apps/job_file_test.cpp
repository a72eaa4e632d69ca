#include "apps/job_file.hpp"

#include <doctest/doctest.h>

#include "messages/input_error.hpp"

using namespace oobleck;

namespace {

std::string error_of(const std::string& text) {
  try {
    apps::parse_job(text, "job.toml");
  } catch (const messages::input_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a job file sets the model and training knobs") {
  const auto job = apps::parse_job(R"(# a comment
[model]
vocab = 300   # trailing comment
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
[profile]
warmup = 0
repeats = 3
)");
  CHECK(job.model.vocab == 300);
  CHECK(job.model.d_model == 48);
  CHECK(job.model.heads == 6);
  CHECK(job.model.blocks == 3);
  CHECK(job.model.seq_len == 64);
  CHECK(job.model.dropout == 0.1);
  CHECK(job.model.seed == 9);
  CHECK(job.microbatch == 2);
  CHECK(job.global_batch == 32);
  CHECK(job.device_memory_bytes == 1000000);
  CHECK(job.profile_warmup == 0);
  CHECK(job.profile_repeats == 3);
}

TEST_CASE("an empty job file is the defaults, and an integer dropout is a number") {
  const auto job = apps::parse_job("", "job.toml");
  CHECK(job.model.hash() == runtime::gpt_config{}.hash());
  CHECK(job.microbatch == 4);
  CHECK(apps::parse_job("model.dropout = 0\nmodel.blocks = 2\n").model.blocks == 2);
}

TEST_CASE("job file errors name the file, line and key path") {
  CHECK(error_of("[model]\nd_modle = 3\n") == "job.toml:2: unknown key model.d_modle");
  CHECK(error_of("[modle]\nblocks = 3\n") == "job.toml:2: unknown key modle.blocks");
  CHECK(error_of("vocab = 300\n") == "job.toml:1: unknown key vocab");
  CHECK(error_of("model = 3\n") == "job.toml:1: model: expected a table [model]");
  CHECK(error_of("[model]\nblocks = \"3\"\n") == "job.toml:2: model.blocks: expected an integer, got string");
  CHECK(error_of("[model]\ndropout = true\n") == "job.toml:2: model.dropout: expected a number, got boolean");
  CHECK(error_of("[model]\ndropout = nan\n") == "job.toml:2: model.dropout must be finite");
  CHECK(error_of("[model]\n\nblocks = 0\n") == "job.toml:3: model.blocks must be >= 1, got 0");
  CHECK(error_of("[model]\nseed = -1\n") == "job.toml:2: model.seed must be >= 0, got -1");
  // An int knob never narrows: 2^32 + 1 is not 1.
  CHECK(error_of("[training]\nmicrobatch = 4294967297\n") ==
        "job.toml:2: training.microbatch must be <= 2147483647, got 4294967297");
  // The corpus is bytes: token ids up to 255 must have embeddings.
  CHECK(error_of("[model]\nvocab = 100\n") ==
        "job.toml:2: model.vocab must be >= 256 (the byte-level corpus has token ids 0..255), got 100");
  CHECK(error_of("[model]\nheads = 5\n").find("multiple of heads") != std::string::npos);
  CHECK(error_of("[training]\nmicrobatch = 3\nglobal_batch = 64\n").find("not a multiple") != std::string::npos);
}

TEST_CASE("TOML syntax errors and duplicates are refused with the line") {
  CHECK(error_of("[model]\nblocks = many\n").rfind("job.toml:2: ", 0) == 0);
  CHECK(error_of("[model\n").rfind("job.toml:1: ", 0) == 0);
  CHECK(error_of("vocab\n").rfind("job.toml:1: ", 0) == 0);
  CHECK(error_of("[model]\nblocks = 2\nblocks = 3\n").rfind("job.toml:3: ", 0) == 0);
  CHECK(error_of("[model]\nblocks = 2\n[model]\n").rfind("job.toml:3: ", 0) == 0);
  CHECK(error_of("[model]\nseed = 99999999999999999999\n").rfind("job.toml:2: ", 0) == 0);
  CHECK(!error_of(std::string("[model]\nblocks = 2\0\n", 19)).empty());
}

TEST_CASE("an unreadable job file is an input error naming the path") {
  CHECK_THROWS_WITH_AS(apps::read_job_file("/nonexistent/job.toml"),
                       "cannot read job file /nonexistent/job.toml: No such file or directory", messages::input_error);
  CHECK_THROWS_WITH_AS(apps::read_job_file("/tmp"), "cannot read job file /tmp: Is a directory",
                       messages::input_error);
}
