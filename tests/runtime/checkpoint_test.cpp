#include "runtime/checkpoint.hpp"

#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

using namespace oobleck::runtime;
namespace fs = std::filesystem;

namespace {

/// A fresh root directory, removed at the end of the test.
struct scratch {
  fs::path root;
  scratch() {
    static int n = 0;
    root = fs::temp_directory_path() / ("oobleck-ckpt-test-" + std::to_string(::getpid()) + "-" + std::to_string(n++));
    fs::remove_all(root);
  }
  ~scratch() { fs::remove_all(root); }
};

std::vector<std::byte> layer_bytes(int layer, std::size_t size) {
  std::vector<std::byte> b(size);
  for (std::size_t i = 0; i < size; ++i) b[i] = static_cast<std::byte>((i * 31 + static_cast<std::size_t>(layer) * 7) & 0xff);
  return b;
}

constexpr int layers = 3;
const std::string job = "job-hash-0123456789abcdef";

/// A complete checkpoint of step 5 with 3 layers under root.
fs::path write_checkpoint(const fs::path& root, std::uint64_t step = 5) {
  const auto temp = begin_checkpoint(root, step);
  checkpoint_manifest m;
  m.job_hash = job;
  m.step = step;
  m.model_seed = 1234;
  m.sample_seed = 1;
  m.num_layers = layers;
  for (int l = layers - 1; l >= 0; --l) m.files.push_back(write_layer_file(temp, l, layer_bytes(l, 1000 + 10 * l)));
  return finish_checkpoint(temp, m);
}

void flip_byte(const fs::path& p, std::size_t at) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  char c = 0;
  f.get(c);
  f.seekp(static_cast<std::streamoff>(at));
  f.put(static_cast<char>(c ^ 0x01));
}

std::string refusal(const fs::path& dir, const std::string& hash = job, int n = layers) {
  try {
    read_checkpoint(dir, hash, n);
  } catch (const checkpoint_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("checkpoint: a written checkpoint reads back with every layer's bytes") {
  scratch s;
  const auto dir = write_checkpoint(s.root);
  CHECK(dir == s.root / "step-00000005");
  const auto m = read_checkpoint(dir, job, layers);
  CHECK(m.step == 5);
  CHECK(m.model_seed == 1234);
  CHECK(m.sample_seed == 1);
  CHECK(m.format_version == checkpoint_format_version);
  REQUIRE(m.files.size() == static_cast<std::size_t>(layers));
  for (int l = 0; l < layers; ++l) {
    CHECK(m.files[static_cast<std::size_t>(l)].layer == l);  // sorted by layer
    CHECK(read_layer_file(dir, file_of(m, l)) == layer_bytes(l, 1000 + 10 * l));
  }
  // Nothing temporary is left once it is complete.
  int entries = 0;
  for (const auto& e : fs::directory_iterator(s.root)) entries += e.path().filename().string().rfind(".tmp-", 0) == 0;
  CHECK(entries == 0);
  CHECK(list_checkpoints(s.root) == std::vector<fs::path>{dir});
}

TEST_CASE("checkpoint: a flipped byte in a layer file is refused, naming the file") {
  scratch s;
  const auto dir = write_checkpoint(s.root);
  flip_byte(dir / layer_file_name(1), 500);
  const auto why = refusal(dir);
  CHECK(why.find(layer_file_name(1)) != std::string::npos);
  CHECK(why.find("corrupt") != std::string::npos);
  // read_layer_file checks again (the files may change after validation).
  const checkpoint_file entry{1, layer_file_name(1), 1010, sha256_hex(layer_bytes(1, 1010))};
  CHECK_THROWS_AS(read_layer_file(dir, entry), checkpoint_error);
}

TEST_CASE("checkpoint: a truncated layer file is refused, naming the file") {
  scratch s;
  const auto dir = write_checkpoint(s.root);
  fs::resize_file(dir / layer_file_name(2), 100);
  const auto why = refusal(dir);
  CHECK(why.find(layer_file_name(2)) != std::string::npos);
  CHECK(why.find("truncated") != std::string::npos);
}

TEST_CASE("checkpoint: a missing layer file is refused") {
  scratch s;
  const auto dir = write_checkpoint(s.root);
  fs::remove(dir / layer_file_name(0));
  const auto why = refusal(dir);
  CHECK(why.find(layer_file_name(0)) != std::string::npos);
  CHECK(why.find("missing") != std::string::npos);
}

TEST_CASE("checkpoint: a missing or truncated manifest is refused") {
  scratch s;
  const auto dir = write_checkpoint(s.root);
  SUBCASE("truncated") {
    fs::resize_file(dir / checkpoint_manifest_name, 12);
    CHECK(refusal(dir).find(checkpoint_manifest_name) != std::string::npos);
  }
  SUBCASE("cut at a word boundary") {
    fs::resize_file(dir / checkpoint_manifest_name, 16);
    CHECK(refusal(dir).find(checkpoint_manifest_name) != std::string::npos);
  }
  SUBCASE("missing") {
    fs::remove(dir / checkpoint_manifest_name);
    const auto why = refusal(dir);
    CHECK(why.find(checkpoint_manifest_name) != std::string::npos);
    CHECK(why.find("missing") != std::string::npos);
  }
  CHECK(refusal(s.root / "no-such-checkpoint").find("no such checkpoint directory") != std::string::npos);
}

TEST_CASE("checkpoint: another job's or another model's checkpoint is refused") {
  scratch s;
  const auto dir = write_checkpoint(s.root);
  CHECK(refusal(dir, "another-job-hash").find("another job") != std::string::npos);
  CHECK(refusal(dir, job, layers + 1).find("layers") != std::string::npos);
  CHECK(refusal(dir).empty());
}

TEST_CASE("checkpoint: an incomplete write never counts: leftover temporary directories are ignored") {
  scratch s;
  // A writer that died before its manifest: its temporary directory holds layer files only.
  const auto torn = begin_checkpoint(s.root, 9);
  write_layer_file(torn, 0, layer_bytes(0, 1000));
  CHECK(list_checkpoints(s.root).empty());
  CHECK(refusal(torn).find("missing") != std::string::npos);
  const auto dir = write_checkpoint(s.root, 5);
  CHECK(list_checkpoints(s.root) == std::vector<fs::path>{dir});
  // A second checkpoint of the same step keeps the first (the same state) and cleans up.
  CHECK(write_checkpoint(s.root, 5) == dir);
  const auto later = write_checkpoint(s.root, 7);
  CHECK(list_checkpoints(s.root) == std::vector<fs::path>{dir, later});
}

TEST_CASE("checkpoint: a manifest that misses a layer is refused when it is finished") {
  scratch s;
  const auto temp = begin_checkpoint(s.root, 3);
  checkpoint_manifest m;
  m.job_hash = job;
  m.step = 3;
  m.num_layers = layers;
  m.files.push_back(write_layer_file(temp, 0, layer_bytes(0, 10)));
  m.files.push_back(write_layer_file(temp, 2, layer_bytes(2, 10)));
  try {
    finish_checkpoint(temp, m);
    FAIL("finished an incomplete checkpoint");
  } catch (const checkpoint_error& e) {
    CHECK(std::string(e.what()).find("no file for layer 1") != std::string::npos);
  }
  CHECK(list_checkpoints(s.root).empty());
}

TEST_CASE("checkpoint: every prefix and every flipped byte of a manifest decodes or is refused, never crashes") {
  checkpoint_manifest m;
  m.job_hash = job;
  m.step = 12;
  m.num_layers = 2;
  m.files = {{0, layer_file_name(0), 10, std::string(64, 'a')}, {1, layer_file_name(1), 11, std::string(64, 'b')}};
  const auto bytes = manifest_to_capnp(m);
  CHECK(manifest_from_capnp(bytes, "m") == m);
  int refused = 0;
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    try {
      manifest_from_capnp(std::span(bytes.data(), n), "m");
    } catch (const checkpoint_error&) {
      ++refused;
    }
  }
  CHECK(refused == static_cast<int>(bytes.size()));  // no proper prefix is a whole message
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    auto flipped = bytes;
    flipped[i] ^= std::byte{0x80};
    try {
      const auto back = manifest_from_capnp(flipped, "m");
      CHECK(manifest_from_capnp(manifest_to_capnp(back), "m") == back);
    } catch (const checkpoint_error&) {
    }
  }
}

TEST_CASE("checkpoint: fuzz finding: a manifest whose pointers share data is refused or round-trips") {
  // fuzz/checkpoint_manifest: a small message standing for a large value (shared pointers)
  // decoded, and its re-encoding exceeded the reading limit. Decoded values are bounded now.
  std::ifstream in(std::string(OOBLECK_SOURCE_DIR) + "/fuzz/corpus/checkpoint_manifest/finding-shared-pointers.bin",
                   std::ios::binary);
  REQUIRE(in);
  std::vector<char> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto bytes = std::as_bytes(std::span(raw.data(), raw.size()));
  try {
    const auto m = manifest_from_capnp(bytes, "finding");
    CHECK(manifest_from_capnp(manifest_to_capnp(m), "re-encoded") == m);
  } catch (const checkpoint_error&) {
  }
}

TEST_CASE("checkpoint: a writer's stale partial file does not stop another writer, and the final file is the complete one") {
  scratch s;
  const auto temp = begin_checkpoint(s.root, 5);
  const auto full = layer_bytes(1, 4000);
  // A first writer died mid-write: half of layer 1 under its own temporary name, and (as a writer of
  // the previous format would have left it) half under the final name.
  const auto stale = temp / layer_temp_file_name(1, "node0.req1.a1");
  for (const auto& p : {stale, temp / layer_file_name(1)}) {
    std::ofstream f(p, std::ios::binary);
    f.write(reinterpret_cast<const char*>(full.data()), static_cast<std::streamsize>(full.size() / 2));
  }
  // The replacement writer (another node) writes the same layer: no EEXIST.
  checkpoint_file written;
  REQUIRE_NOTHROW(written = write_layer_file(temp, 1, full, "node3.req1.a1"));
  CHECK(written.name == layer_file_name(1));
  CHECK(written.bytes == full.size());
  CHECK(fs::file_size(temp / layer_file_name(1)) == full.size());
  CHECK(!fs::exists(temp / layer_temp_file_name(1, "node3.req1.a1")));  // renamed into place
  CHECK(fs::exists(stale));
  // The writer's own temporary name: only [A-Za-z0-9._-] of its tag.
  CHECK(layer_temp_file_name(1, "node3/../x y") == "layer-0001.bin.node3_.._x_y.tmp");

  checkpoint_manifest m;
  m.job_hash = job;
  m.step = 5;
  m.num_layers = layers;
  m.files.push_back(written);
  for (int l : {0, 2}) m.files.push_back(write_layer_file(temp, l, layer_bytes(l, 1000), "node3.req1.a1"));
  const auto dir = finish_checkpoint(temp, m);
  // The dead writer's leftover is gone; the checkpoint reads back whole, layer 1 complete.
  CHECK(!fs::exists(dir / stale.filename()));
  std::size_t entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++entries;
  CHECK(entries == static_cast<std::size_t>(layers) + 1);  // the layer files and the manifest
  const auto back = read_checkpoint(dir, job, layers);
  CHECK(read_layer_file(dir, file_of(back, 1)) == full);
}
