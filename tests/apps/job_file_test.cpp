#include "apps/job_file.hpp"

#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "messages/input_error.hpp"
#include "planning/planner.hpp"
#include "planning/synthetic_profile.hpp"
#include "support/comma_locale.hpp"
#include "support/job_file_text.hpp"

using namespace oobleck;
using testing::error_of;
using testing::kSource;
using testing::read_text;

namespace {

/// Every key of the schema, as README's "Job files" example must list it.
const std::vector<std::string> kKeys = {
    "model.vocab", "model.d_model", "model.heads", "model.blocks", "model.seq_len", "model.dropout", "model.seed",
    "model.architecture", "model.preset", "model.tie_embeddings",
    "model.init",
    "data.corpus_bytes", "data.corpus_seed", "data.train", "data.dtype", "data.text", "data.validation",
    "eval.every", "eval.windows",
    "training.steps", "training.global_batch", "training.microbatch", "training.seed", "training.precision",
    "optimizer.lr", "optimizer.beta1", "optimizer.beta2", "optimizer.eps", "optimizer.weight_decay",
    "optimizer.schedule", "optimizer.warmup_steps", "optimizer.min_lr",
    "cluster.nodes", "cluster.slots_per_node", "cluster.device", "cluster.data_plane", "cluster.fault_tolerance", "cluster.device_memory_bytes", "cluster.heartbeat_interval_ms",
    "cluster.connection_timeout_ms",
    "checkpoint.dir", "checkpoint.every",
    "http.port",
    "profile.warmup", "profile.repeats", "profile.file", "profile.cache",
    "faults.evict_after", "faults.evict_after_stalls", "faults.step_deadline_min_ms", "faults.step_deadline_factor",
    "faults.first_step_deadline_ms", "faults.form_deadline_ms", "faults.digest_every",
    "tls.certificate", "tls.key", "tls.ca_file", "tls.passphrase",
};

}  // namespace

TEST_CASE("an empty job file is a valid job with the documented defaults") {
  const auto job = apps::parse_job("", "job.toml");
  CHECK(job.model == runtime::gpt_config{});
  CHECK(job.data.corpus_bytes == 1 << 20);
  CHECK(job.data.corpus_seed == 7);
  CHECK(job.training.steps == 1000);
  CHECK(job.training.global_batch == 64);
  CHECK(job.training.microbatch == 4);
  CHECK(job.training.seed == 1);
  CHECK(job.optimizer.lr.peak == 1e-3);
  CHECK(job.optimizer.beta1 == 0.9);
  CHECK(job.optimizer.beta2 == 0.95);
  CHECK(job.optimizer.eps == 1e-8);
  CHECK(job.optimizer.weight_decay == 0.1);
  CHECK(job.optimizer.lr.decay == runtime::lr_decay::cosine);
  CHECK(job.optimizer.lr.warmup_steps == 10);
  CHECK(job.optimizer.lr.min_lr == 1e-4);
  CHECK(job.optimizer.lr.total_steps == job.training.steps);
  CHECK(job.cluster.nodes == 2);
  CHECK(job.cluster.slots_per_node == 1);
  CHECK(job.cluster.fault_tolerance == 1);
  CHECK(job.cluster.device_memory_bytes == 4LL << 30);
  CHECK(job.cluster.heartbeat_interval_ms == 250);
  CHECK(job.cluster.connection_timeout_ms == 1500);
  CHECK(job.checkpoint.dir.empty());
  CHECK(job.checkpoint.every == 0);
  CHECK(job.http.port == 0);
  CHECK(job.profile.warmup == 2);
  CHECK(job.profile.repeats == 7);
  CHECK(job.profile.file.empty());
  CHECK(job.faults.digest_every == 100);
  CHECK(apps::parse_job("[faults]\ndigest_every = 1\n").faults.digest_every == 1);
  CHECK(error_of("[faults]\ndigest_every = 0\n").find("faults.digest_every") != std::string::npos);
  CHECK(apps::parse_job("# nothing but a comment\n\n") == job);
  CHECK(apps::parse_job("[model]\n[http]\n") == job);  // empty sections are fine too
}

TEST_CASE("every section's keys are read") {
  const auto job = apps::parse_job(R"(# a comment
[model]
vocab = 300   # trailing comment
d_model = 48
heads = 6
blocks = 3
seq_len = 64
dropout = 0.1
seed = 9

[data]
corpus_bytes = 5000
corpus_seed = 11

[training]
steps = 500
global_batch = 32
microbatch = 2
seed = 3

[optimizer]
lr = 3e-3
beta1 = 0.8
beta2 = 0.99
eps = 1e-6
weight_decay = 0
schedule = "linear"
warmup_steps = 25
min_lr = 3e-4

[cluster]
nodes = 6
fault_tolerance = 2
device_memory_bytes = 1000000
heartbeat_interval_ms = 200
connection_timeout_ms = 400

[checkpoint]
dir = "ckpt"
every = 50

[http]
port = 8080

[profile]
warmup = 0
repeats = 3
file = "profile.json"
)");
  CHECK(job.model == runtime::gpt_config{.vocab = 300, .d_model = 48, .heads = 6, .blocks = 3, .seq_len = 64,
                                         .dropout = 0.1, .seed = 9});
  CHECK(job.data.corpus_bytes == 5000);
  CHECK(job.data.corpus_seed == 11);
  CHECK(job.training.steps == 500);
  CHECK(job.training.global_batch == 32);
  CHECK(job.training.microbatch == 2);
  CHECK(job.training.seed == 3);
  CHECK(job.optimizer == runtime::adamw_options{.beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0,
                                                .lr = {.peak = 3e-3, .warmup_steps = 25, .total_steps = 500,
                                                       .min_lr = 3e-4, .decay = runtime::lr_decay::linear}});
  CHECK(job.cluster.nodes == 6);
  CHECK(job.cluster.fault_tolerance == 2);
  CHECK(job.cluster.device_memory_bytes == 1000000);
  CHECK(job.cluster.heartbeat_interval_ms == 200);
  CHECK(job.cluster.connection_timeout_ms == 400);
  CHECK(job.checkpoint.dir == "ckpt");  // parse_job leaves paths as written
  CHECK(job.checkpoint.every == 50);
  CHECK(job.http.port == 8080);
  CHECK(job.profile.warmup == 0);
  CHECK(job.profile.repeats == 3);
  CHECK(job.profile.file == "profile.json");
  // Dotted keys and inline tables are the same keys.
  CHECK(apps::parse_job("model.dropout = 0\nmodel.blocks = 2\n").model.blocks == 2);
  CHECK(apps::parse_job("optimizer = { lr = 0.5, min_lr = 0.25 }\n").optimizer.lr.min_lr == 0.25);
}

TEST_CASE("the job's optimizer gives the learning rate of each step: warm-up, decay, floor") {
  const auto job = apps::parse_job(
      "[training]\nsteps = 110\n[optimizer]\nlr = 1.0\nwarmup_steps = 10\nmin_lr = 0.1\nschedule = \"cosine\"\n");
  const auto& s = job.optimizer.lr;
  CHECK(runtime::learning_rate(s, 5) == doctest::Approx(0.5));   // half way up the warm-up
  CHECK(runtime::learning_rate(s, 10) == 1.0);                     // the peak
  CHECK(runtime::learning_rate(s, 60) == doctest::Approx(0.55));  // half way down the cosine
  CHECK(runtime::learning_rate(s, 110) == 0.1);                   // the last step reaches min_lr
  CHECK(runtime::learning_rate(s, 111) == 0.1);
  const auto flat = apps::parse_job("[optimizer]\nschedule = \"constant\"\nwarmup_steps = 0\n").optimizer.lr;
  CHECK(runtime::learning_rate(flat, 1) == 1e-3);
  CHECK(runtime::learning_rate(flat, 1000) == 1e-3);
}

TEST_CASE("unknown sections and keys are refused with file, line and key path") {
  CHECK(error_of("[model]\nd_modle = 3\n") == "job.toml:2: unknown key model.d_modle");
  CHECK(error_of("[modle]\nblocks = 3\n") == "job.toml:2: unknown key modle.blocks");
  CHECK(error_of("vocab = 300\n") == "job.toml:1: unknown key vocab");
  CHECK(error_of("[training]\nlr = 0.1\n") == "job.toml:2: unknown key training.lr");
  CHECK(error_of("[optimizer]\nlr_schedule = \"cosine\"\n") == "job.toml:2: unknown key optimizer.lr_schedule");
  CHECK(error_of("[cluster]\nheartbeat_ms = 5\n") == "job.toml:2: unknown key cluster.heartbeat_ms");
  CHECK(error_of("[data]\nfile = \"corpus.txt\"\n") == "job.toml:2: unknown key data.file");
  CHECK(error_of("\n[http]\nhost = \"0.0.0.0\"\n") == "job.toml:3: unknown key http.host");
  CHECK(error_of("[checkpoint.dir]\n") == "job.toml:1: checkpoint.dir: expected a string, got table");
}

TEST_CASE("a value of the wrong type is refused naming the key and both types") {
  CHECK(error_of("model = 3\n") == "job.toml:1: model: expected a table [model]");
  CHECK(error_of("cluster = \"big\"\n") == "job.toml:1: cluster: expected a table [cluster]");
  CHECK(error_of("[model]\nblocks = \"3\"\n") == "job.toml:2: model.blocks: expected an integer, got string");
  CHECK(error_of("[model]\ndropout = true\n") == "job.toml:2: model.dropout: expected a number, got boolean");
  CHECK(error_of("[training]\nsteps = 1.5\n") == "job.toml:2: training.steps: expected an integer, got floating-point");
  CHECK(error_of("[optimizer]\nschedule = 1\n") == "job.toml:2: optimizer.schedule: expected a string, got integer");
  CHECK(error_of("[optimizer]\nlr = \"1e-3\"\n") == "job.toml:2: optimizer.lr: expected a number, got string");
  CHECK(error_of("[checkpoint]\ndir = 0\n") == "job.toml:2: checkpoint.dir: expected a string, got integer");
  CHECK(error_of("[profile]\nfile = [\"a\"]\n") == "job.toml:2: profile.file: expected a string, got array");
  CHECK(error_of("[http]\nport = \"8080\"\n") == "job.toml:2: http.port: expected an integer, got string");
  // A whole number is a number: lr = 1 is 1.0.
  CHECK(apps::parse_job("[optimizer]\nlr = 1\nmin_lr = 0\n").optimizer.lr.peak == 1.0);
}

TEST_CASE("a value out of its range is refused naming the key, the range and the value") {
  CHECK(error_of("[model]\ndropout = nan\n") == "job.toml:2: model.dropout must be finite");
  CHECK(error_of("[model]\n\nblocks = 0\n") == "job.toml:3: model.blocks must be >= 1, got 0");
  CHECK(error_of("[model]\nseed = -1\n") == "job.toml:2: model.seed must be >= 0, got -1");
  // An int knob never narrows: 2^32 + 1 is not 1.
  CHECK(error_of("[training]\nmicrobatch = 4294967297\n") ==
        "job.toml:2: training.microbatch must be <= 2147483647, got 4294967297");
  // The corpus is bytes: token ids up to 255 must have embeddings.
  CHECK(error_of("[model]\nvocab = 100\n") ==
        "job.toml:2: model.vocab must be >= 256 with byte-level data (the generated corpus has token ids 0..255), got 100");
  CHECK(error_of("[model]\nheads = 5\n").find("multiple of heads") != std::string::npos);
  CHECK(error_of("[data]\ncorpus_bytes = 2147483648\n") ==
        "job.toml:2: data.corpus_bytes must be <= 1073741824, got 2147483648");
  CHECK(error_of("[training]\nsteps = 0\n") == "job.toml:2: training.steps must be >= 1, got 0");
  CHECK(error_of("[optimizer]\nlr = 0\n") == "job.toml:2: optimizer.lr must be > 0, got 0");
  CHECK(error_of("[optimizer]\nbeta1 = 1.0\n") == "job.toml:2: optimizer.beta1 must be in [0, 1), got 1");
  CHECK(error_of("[optimizer]\nbeta2 = -0.5\n") == "job.toml:2: optimizer.beta2 must be in [0, 1), got -0.5");
  CHECK(error_of("[optimizer]\neps = 0\n") == "job.toml:2: optimizer.eps must be > 0, got 0");
  CHECK(error_of("[optimizer]\nweight_decay = -0.1\n") == "job.toml:2: optimizer.weight_decay must be >= 0, got -0.1");
  CHECK(error_of("[optimizer]\nmin_lr = -1e-5\n") == "job.toml:2: optimizer.min_lr must be >= 0, got -1e-05");
  CHECK(error_of("[optimizer]\nwarmup_steps = -1\n") == "job.toml:2: optimizer.warmup_steps must be >= 0, got -1");
  CHECK(error_of("[optimizer]\nschedule = \"cosnie\"\n") ==
        "job.toml:2: optimizer.schedule must be \"constant\", \"linear\" or \"cosine\", got \"cosnie\"");
  CHECK(error_of("[cluster]\nnodes = 0\n") == "job.toml:2: cluster.nodes must be >= 1, got 0");
  CHECK(error_of("[cluster]\nfault_tolerance = -1\n") == "job.toml:2: cluster.fault_tolerance must be >= 0, got -1");
  CHECK(error_of("[cluster]\nslots_per_node = 0\n") == "job.toml:2: cluster.slots_per_node must be >= 1, got 0");
  CHECK(error_of("[cluster]\nslots_per_node = 128\n") == "job.toml:2: cluster.slots_per_node must be <= 64, got 128");
  CHECK(error_of("[cluster]\n\nslots_per_node = 3\n") ==
        "job.toml:3: cluster.slots_per_node must be a power of two (1, 2, 4, ..., 64), got 3");
  CHECK(error_of("[cluster]\ndevice_memory_bytes = 0\n") ==
        "job.toml:2: cluster.device_memory_bytes must be >= 1, got 0");
  CHECK(error_of("[cluster]\nheartbeat_interval_ms = 0\n") ==
        "job.toml:2: cluster.heartbeat_interval_ms must be >= 1, got 0");
  CHECK(error_of("[checkpoint]\nevery = -5\n") == "job.toml:2: checkpoint.every must be >= 0, got -5");
  CHECK(error_of("[http]\nport = 65536\n") == "job.toml:2: http.port must be <= 65535, got 65536");
  CHECK(error_of("[profile]\nrepeats = 0\n") == "job.toml:2: profile.repeats must be >= 1, got 0");
}

TEST_CASE("rules across keys name the line of the key the file sets") {
  CHECK(error_of("[training]\nmicrobatch = 3\nglobal_batch = 64\n") ==
        "job.toml:3: training.global_batch 64 is not a multiple of training.microbatch 3");
  // Only microbatch is set: the default global batch is not blamed on a line the file lacks.
  CHECK(error_of("\n[training]\nmicrobatch = 5\n") ==
        "job.toml:3: training.global_batch 64 is not a multiple of training.microbatch 5");
  CHECK(error_of("[model]\nseq_len = 64\n[data]\ncorpus_bytes = 64\n") ==
        "job.toml:4: data.corpus_bytes 64 holds no sample: it must be >= model.seq_len + 1 = 65");
  CHECK(error_of("[model]\nseq_len = 64\n[data]\ncorpus_bytes = 65\n").empty());
  CHECK(error_of("[optimizer]\nmin_lr = 0.01\n") == "job.toml:2: optimizer.min_lr 0.01 is above optimizer.lr 0.001");
  CHECK(error_of("[optimizer]\nlr = 0.01\nmin_lr = 0.01\n").empty());
  CHECK(error_of("[cluster]\nfault_tolerance = 2\n") ==
        "job.toml:2: cluster.nodes 2 cannot hold cluster.fault_tolerance + 1 = 3 pipelines");
  CHECK(error_of("[cluster]\nheartbeat_interval_ms = 6000\n") ==
        "job.toml:2: cluster.connection_timeout_ms 1500 must be >= 2 * cluster.heartbeat_interval_ms = 12000 "
        "(one late heartbeat must not lose a node)");
  CHECK(error_of("[checkpoint]\nevery = 100\n") == "job.toml:2: checkpoint.every needs checkpoint.dir");
  CHECK(error_of("[checkpoint]\ndir = \"/tmp/ckpt\"\nevery = 100\n").empty());
}

TEST_CASE("[model] architecture: oobleck-gpt by default, gpt2 ties its embeddings unless told not to") {
  using runtime::model_architecture;
  CHECK(apps::parse_job("").model.architecture == model_architecture::oobleck_gpt);
  CHECK_FALSE(apps::parse_job("").model.tie_embeddings);
  const auto gpt2 = apps::parse_job("[model]\narchitecture = \"gpt2\"\n").model;
  CHECK(gpt2.architecture == model_architecture::gpt2);
  CHECK(gpt2.tie_embeddings);
  CHECK(gpt2.d_model == runtime::gpt_config{}.d_model);  // sizes stay the job's
  const auto untied = apps::parse_job("[model]\ntie_embeddings = false\narchitecture = \"gpt2\"\n").model;
  CHECK(untied.architecture == model_architecture::gpt2);
  CHECK_FALSE(untied.tie_embeddings);
  CHECK(gpt2.hash() != untied.hash());
  // oobleck-gpt's head is a matrix of its own: saying so is fine, asking to tie it is not.
  CHECK(apps::parse_job("[model]\ntie_embeddings = false\n").model == runtime::gpt_config{});
  CHECK(error_of("[model]\n\ntie_embeddings = true\n") ==
        "job.toml:3: model.tie_embeddings = true needs model.architecture = \"gpt2\" (oobleck-gpt's LM head is a "
        "matrix of its own)");
  CHECK(error_of("[model]\narchitecture = \"gpt-2\"\n") ==
        "job.toml:2: model.architecture must be \"oobleck-gpt\" or \"gpt2\", got \"gpt-2\"");
  CHECK(error_of("[model]\narchitecture = 2\n") == "job.toml:2: model.architecture: expected a string, got integer");
  CHECK(error_of("[model]\ntie_embeddings = \"yes\"\n") == "job.toml:2: model.tie_embeddings must be true or false");
}

TEST_CASE("[model] preset fills GPT-2's sizes, the keys beside it override, whatever their order") {
  const auto small = apps::parse_job("[model]\npreset = \"gpt2\"\n").model;
  CHECK(small == runtime::preset("gpt2"));
  CHECK(small.d_model == 768);
  CHECK(small.blocks == 12);
  CHECK(small.vocab == 50257);
  CHECK(small.seq_len == 1024);
  CHECK(small.tie_embeddings);
  CHECK(apps::parse_job("[model]\npreset = \"gpt2-xl\"\n").model == runtime::preset("gpt2-xl"));
  // Keys that sort before "preset" (blocks, dropout) and after it (seq_len, tie_embeddings).
  const auto tuned = apps::parse_job(
                         "[model]\nseq_len = 128\npreset = \"gpt2-medium\"\nblocks = 2\ndropout = 0.0\n"
                         "tie_embeddings = false\narchitecture = \"gpt2\"\n")
                         .model;
  auto expected = runtime::preset("gpt2-medium");
  expected.seq_len = 128;
  expected.blocks = 2;
  expected.dropout = 0.0;
  expected.tie_embeddings = false;
  CHECK(tuned == expected);
  // Empty (README lists it so): no preset.
  CHECK(apps::parse_job("[model]\npreset = \"\"\n").model == runtime::gpt_config{});
  CHECK(error_of("[model]\n\npreset = \"gpt3\"\n") ==
        "job.toml:3: model.preset: unknown model preset \"gpt3\" (known: gpt2, gpt2-medium, gpt2-large, gpt2-xl)");
  CHECK(error_of("[model]\npreset = \"gpt2\"\narchitecture = \"oobleck-gpt\"\n") ==
        "job.toml:3: model.architecture \"oobleck-gpt\" contradicts model.preset \"gpt2\", a gpt2 model");
  CHECK(error_of("[model]\npreset = 2\n") == "job.toml:2: model.preset: expected a string, got integer");
  // The preset's sizes go through the same rules as written ones.
  CHECK(error_of("[model]\npreset = \"gpt2\"\nheads = 7\n").find("multiple of heads") != std::string::npos);
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

TEST_CASE("read_job_file: relative paths are relative to the job file's folder") {
  const auto dir = std::filesystem::temp_directory_path() / ("oobleck-job-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = (dir / "job.toml").string();
  std::ofstream(path) << "[profile]\nfile = \"p/profile.json\"\ncache = \"profiles\"\n[checkpoint]\ndir = \"ckpt\"\n";
  auto job = apps::read_job_file(path);
  CHECK(job.profile.file == (dir / "p/profile.json").string());
  CHECK(job.profile.cache == (dir / "profiles").string());
  CHECK(job.checkpoint.dir == (dir / "ckpt").string());
  std::ofstream(path) << "[profile]\nfile = \"/abs/profile.capnp\"\n";
  job = apps::read_job_file(path);
  CHECK(job.profile.file == "/abs/profile.capnp");
  CHECK(job.checkpoint.dir.empty());  // empty stays off, not the folder
  std::ofstream(path) << "[http]\nport = -1\n";
  CHECK_THROWS_WITH_AS(apps::read_job_file(path), (path + ":2: http.port must be >= 0, got -1").c_str(),
                       messages::input_error);
  std::filesystem::remove_all(dir);
}

TEST_CASE("[tls]: off by default, and certificate, key and CA file together or refused at the line") {
  CHECK_FALSE(apps::parse_job("").tls.enabled());
  const auto job = apps::parse_job(
      "[tls]\ncertificate = \"node.pem\"\nkey = \"node.key\"\nca_file = \"/pki/ca.pem\"\npassphrase = \"p w\"\n");
  CHECK(job.tls == apps::tls_section{"node.pem", "node.key", "/pki/ca.pem", "p w"});
  CHECK(job.tls.enabled());
  CHECK(error_of("[cluster]\nnodes = 2\n[tls]\ncertificate = \"node.pem\"\n") ==
        "job.toml:4: [tls] needs tls.certificate, tls.key and tls.ca_file together: tls.key and tls.ca_file not set");
  CHECK(error_of("[tls]\nca_file = \"ca.pem\"\nkey = \"k\"\n") ==
        "job.toml:3: [tls] needs tls.certificate, tls.key and tls.ca_file together: tls.certificate not set");
  CHECK(error_of("[tls]\npassphrase = \"x\"\n") ==
        "job.toml:2: [tls] needs tls.certificate, tls.key and tls.ca_file together: tls.certificate, tls.key "
        "and tls.ca_file not set");
  CHECK(error_of("[tls]\ncert = \"node.pem\"\n") == "job.toml:2: unknown key tls.cert");
  CHECK(error_of("[tls]\ncertificate = 1\n") == "job.toml:2: tls.certificate: expected a string, got integer");
  CHECK(error_of("tls = \"on\"\n") == "job.toml:1: tls: expected a table [tls]");
}

TEST_CASE("read_job_file: [tls] files are relative to the job file's folder") {
  const auto dir = std::filesystem::temp_directory_path() / ("oobleck-job-tls-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = (dir / "job.toml").string();
  std::ofstream(path) << "[tls]\ncertificate = \"pki/node.pem\"\nkey = \"pki/node.key\"\nca_file = \"/etc/ca.pem\"\n";
  const auto job = apps::read_job_file(path);
  CHECK(job.tls.certificate == (dir / "pki/node.pem").string());
  CHECK(job.tls.key == (dir / "pki/node.key").string());
  CHECK(job.tls.ca_file == "/etc/ca.pem");
  std::filesystem::remove_all(dir);
}

TEST_CASE("an unreadable job file is an input error naming the path") {
  CHECK_THROWS_WITH_AS(apps::read_job_file("/nonexistent/job.toml"),
                       "cannot read job file /nonexistent/job.toml: No such file or directory", messages::input_error);
  CHECK_THROWS_WITH_AS(apps::read_job_file("/tmp"), "cannot read job file /tmp: Is a directory",
                       messages::input_error);
}

TEST_CASE("every example job parses") {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kSource / "examples/jobs")) {
    if (entry.path().extension() != ".toml") continue;
    CAPTURE(entry.path().string());
    CHECK_NOTHROW(apps::read_job_file(entry.path().string()));
    ++count;
  }
  CHECK(count >= 1);
}

TEST_CASE("the default local job needs two nodes per pipeline on its synthetic profile, and has 2 pipelines") {
  const auto job = apps::read_job_file((kSource / "examples/jobs/default.toml").string());
  CHECK(job.cluster.fault_tolerance == 1);
  CHECK(job.profile.file.empty());
  const auto profile = planning::synthetic_gpt_profile(apps::synthetic_model(job));
  CHECK(profile.layers.size() == static_cast<std::size_t>(job.model.num_layers()));
  const auto plan = planning::plan_job(profile, {.nodes = job.cluster.nodes,
                                                 .fault_tolerance = job.cluster.fault_tolerance,
                                                 .global_batch = job.training.global_batch,
                                                 .microbatch = job.training.microbatch,
                                                 .device_memory_bytes = job.cluster.device_memory_bytes});
  CHECK(plan.spec.n0 == 2);
  CHECK(job.cluster.nodes == (job.cluster.fault_tolerance + 1) * plan.spec.n0);
  CHECK(plan.pipelines.size() == 2);
  CHECK(plan.idle_nodes.empty());
  auto huge = job;
  huge.model.d_model = 1LL << 40;
  CHECK_THROWS_WITH_AS(apps::synthetic_model(huge), "model.d_model 1099511627776 is too large for a synthetic profile",
                       messages::input_error);
}

TEST_CASE("the synthetic profile has the job's slots per node, and plans nodes of that many slots") {
  const auto job = apps::parse_job("[model]\nblocks = 4\n[cluster]\nslots_per_node = 2\n", "job.toml");
  const auto profile = planning::synthetic_gpt_profile(apps::synthetic_model(job));
  CHECK(profile.gpus_per_node == 2);
  CHECK(profile.layers.front().forward_ms.size() == 2);  // widths 1 and 2
  const auto plan = planning::plan_job(profile, {.nodes = 2, .fault_tolerance = 1, .global_batch = job.training.global_batch,
                                                 .microbatch = job.training.microbatch,
                                                 .device_memory_bytes = job.cluster.device_memory_bytes});
  for (const auto& t : plan.templates.templates) {
    std::vector<int> used(static_cast<std::size_t>(t.nodes), 0);
    for (const auto& s : t.stages) used.at(static_cast<std::size_t>(s.node)) += s.gpus;
    for (int u : used) CHECK(u == 2);  // every node's stages use exactly its M slots
  }
}

TEST_CASE("README's job file example lists every key, at its default") {
  const std::string readme = read_text(kSource / "README.md");
  const auto section = readme.find("\n## Job files");
  REQUIRE(section != std::string::npos);
  const auto begin = readme.find("```toml\n", section);
  REQUIRE(begin != std::string::npos);
  const auto end = readme.find("```\n", begin + 8);
  REQUIRE(end != std::string::npos);
  const std::string example = readme.substr(begin + 8, end - begin - 8);
  CHECK(apps::parse_job(example, "README.md") == apps::parse_job(""));
  for (const auto& key : kKeys) {
    CAPTURE(key);
    const auto dot = key.find('.');
    const auto in_section = example.find("[" + key.substr(0, dot) + "]");
    REQUIRE(in_section != std::string::npos);
    const auto next_section = example.find("\n[", in_section + 1);
    const auto at = example.find("\n" + key.substr(dot + 1) + " = ", in_section);
    CHECK(at < next_section);
    // The parser knows the key: a value of no type any key takes is refused as a type error.
    CHECK(error_of("[" + key.substr(0, dot) + "]\n" + key.substr(dot + 1) + " = 1979-05-27\n").find("unknown") ==
          std::string::npos);
  }
}

TEST_CASE("fuzz finding: an int field above INT_MAX is refused, not narrowed to a zero divisor") {
  // microbatch = 2^32 narrowed to 0, and the global batch check divided by it (SIGFPE).
  CHECK(error_of("[training]\nmicrobatch = 4294967296\n") ==
        "job.toml:2: training.microbatch must be <= 2147483647, got 4294967296");
  CHECK(error_of("[training]\nglobal_batch = 2147483648\n") ==
        "job.toml:2: training.global_batch must be <= 2147483647, got 2147483648");
  CHECK(error_of("[profile]\nrepeats = 4294967297\n") ==
        "job.toml:2: profile.repeats must be <= 2147483647, got 4294967297");
}

TEST_CASE("numbers in job files read and print the same under a comma-decimal C locale") {
  oobleck::test::comma_locale comma(std::string(OOBLECK_SOURCE_DIR) + "/tests/messages/data/locale");
  REQUIRE_MESSAGE(comma.active(), "no comma-decimal locale could be set; the locale test would prove nothing");
  // std::stod read "0.1" as 0 with one character used here, so the job file was refused.
  CHECK(apps::parse_job("[model]\ndropout = 0.25\n").model.dropout == 0.25);
  CHECK(apps::parse_job("[optimizer]\nlr = 1e-3\nmin_lr = 2.5e-4\n").optimizer.lr.min_lr == 2.5e-4);
  // Errors print numbers with '.', whatever the C locale.
  CHECK(error_of("[optimizer]\nbeta2 = -0.5\n") == "job.toml:2: optimizer.beta2 must be in [0, 1), got -0.5");
  CHECK(error_of("[optimizer]\nmin_lr = 0.01\n") == "job.toml:2: optimizer.min_lr 0.01 is above optimizer.lr 0.001");
}
