#include "runtime/checkpoint.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>

#include "messages/checkpoint.capnp.h"

namespace oobleck::runtime {

namespace fs = std::filesystem;

namespace {

// Limits that keep a decoded manifest small whatever the bytes (Cap'n Proto lets pointers share
// data, so a small message can stand for a large value): its re-encoding stays below the reading
// limit (found by fuzz/checkpoint_manifest).
constexpr std::uint64_t max_manifest_bytes = 64ull << 20;
constexpr std::size_t max_text_bytes = 256;
constexpr std::uint32_t max_layers = 100'000;

[[noreturn]] void fail_errno(const std::string& what, const fs::path& p) {
  throw checkpoint_error(p.string() + ": " + what + ": " + std::strerror(errno));
}

/// An fd that closes itself.
struct fd_guard {
  int fd = -1;
  ~fd_guard() {
    if (fd >= 0) ::close(fd);
  }
};

void write_file_synced(const fs::path& p, std::span<const std::byte> bytes, bool exclusive = true) {
  fd_guard f{::open(p.c_str(), O_WRONLY | O_CREAT | (exclusive ? O_EXCL : O_TRUNC) | O_CLOEXEC, 0644)};
  if (f.fd < 0) fail_errno("cannot create", p);
  const auto* data = reinterpret_cast<const char*>(bytes.data());
  std::size_t left = bytes.size();
  while (left > 0) {
    const ssize_t n = ::write(f.fd, data, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail_errno("cannot write", p);
    }
    data += n;
    left -= static_cast<std::size_t>(n);
  }
  if (::fsync(f.fd) != 0) fail_errno("cannot fsync", p);
}

void fsync_dir(const fs::path& p) {
  fd_guard f{::open(p.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (f.fd < 0) fail_errno("cannot open the directory", p);
  if (::fsync(f.fd) != 0) fail_errno("cannot fsync the directory", p);
}

std::vector<std::byte> read_whole(const fs::path& p, std::uint64_t limit, const std::string& missing_hint) {
  std::error_code ec;
  if (!fs::is_regular_file(p, ec)) throw checkpoint_error(p.string() + ": missing" + missing_hint);
  const auto size = fs::file_size(p, ec);
  if (ec) throw checkpoint_error(p.string() + ": cannot read its size: " + ec.message());
  if (size > limit)
    throw checkpoint_error(p.string() + ": " + std::to_string(size) + " bytes, above the limit of " +
                           std::to_string(limit));
  std::vector<std::byte> out(size);
  std::ifstream in(p, std::ios::binary);
  if (!in || !in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(size)))
    throw checkpoint_error(p.string() + ": cannot read it");
  return out;
}

std::string text(capnp::Text::Reader t, const fs::path& p, const char* field) {
  if (t.size() > max_text_bytes) throw checkpoint_error(p.string() + ": " + field + " is too long");
  return std::string(t.begin(), t.size());
}

capnp::Text::Reader text_of(const std::string& s) { return capnp::Text::Reader(s.data(), s.size()); }

std::vector<std::byte> encode_manifest(const checkpoint_manifest& m) {
  capnp::MallocMessageBuilder message;
  auto root = message.initRoot<messages::schema::CheckpointManifest>();
  root.setFormatVersion(m.format_version);
  root.setJobHash(text_of(m.job_hash));
  root.setStep(m.step);
  root.setModelSeed(m.model_seed);
  root.setSampleSeed(m.sample_seed);
  root.setNumLayers(static_cast<std::uint32_t>(m.num_layers));
  auto files = root.initFiles(static_cast<unsigned>(m.files.size()));
  for (std::size_t i = 0; i < m.files.size(); ++i) {
    auto f = files[static_cast<unsigned>(i)];
    f.setLayer(static_cast<std::uint32_t>(m.files[i].layer));
    f.setName(text_of(m.files[i].name));
    f.setBytes(m.files[i].bytes);
    f.setSha256(text_of(m.files[i].sha256));
  }
  const auto words = capnp::messageToFlatArray(message);
  const auto bytes = words.asBytes();
  return {reinterpret_cast<const std::byte*>(bytes.begin()), reinterpret_cast<const std::byte*>(bytes.end())};
}

checkpoint_manifest decode_manifest(std::span<const std::byte> bytes, const fs::path& p) {
  if (bytes.size() % sizeof(capnp::word) != 0 || bytes.empty())
    throw checkpoint_error(p.string() + ": truncated (" + std::to_string(bytes.size()) +
                           " bytes is not a whole Cap'n Proto message)");
  std::vector<capnp::word> words(bytes.size() / sizeof(capnp::word));
  std::memcpy(words.data(), bytes.data(), bytes.size());
  checkpoint_manifest m;
  try {
    capnp::ReaderOptions options;
    options.traversalLimitInWords = max_manifest_bytes / sizeof(capnp::word);
    options.nestingLimit = 8;
    capnp::FlatArrayMessageReader reader(kj::ArrayPtr<const capnp::word>(words.data(), words.size()), options);
    if (reader.getEnd() != words.data() + words.size())
      throw checkpoint_error(p.string() + ": bytes after the end of the manifest");
    const auto root = reader.getRoot<messages::schema::CheckpointManifest>();
    m.format_version = root.getFormatVersion();
    m.job_hash = text(root.getJobHash(), p, "jobHash");
    m.step = root.getStep();
    m.model_seed = root.getModelSeed();
    m.sample_seed = root.getSampleSeed();
    if (root.getNumLayers() > max_layers) throw checkpoint_error(p.string() + ": numLayers out of range");
    m.num_layers = static_cast<std::int32_t>(root.getNumLayers());
    if (root.getFiles().size() > max_layers) throw checkpoint_error(p.string() + ": too many files");
    for (auto f : root.getFiles()) {
      if (f.getLayer() >= max_layers) throw checkpoint_error(p.string() + ": a layer number out of range");
      m.files.push_back({static_cast<std::int32_t>(f.getLayer()), text(f.getName(), p, "name"), f.getBytes(),
                         text(f.getSha256(), p, "sha256")});
    }
  } catch (const kj::Exception& e) {
    throw checkpoint_error(p.string() + ": not a checkpoint manifest (" + std::string(e.getDescription().cStr()) + ")");
  }
  return m;
}

/// Manifest-level checks (no file access).
/// `job_hash` null: any job.
void check_manifest(const checkpoint_manifest& m, const fs::path& dir, const std::string* job_hash, int num_layers) {
  const auto where = (dir / checkpoint_manifest_name).string();
  if (m.format_version != checkpoint_format_version)
    throw checkpoint_error(where + ": checkpoint format version " + std::to_string(m.format_version) +
                           ", this program reads version " + std::to_string(checkpoint_format_version));
  if (job_hash && m.job_hash != *job_hash)
    throw checkpoint_error(dir.string() + ": a checkpoint of another job (job hash " + m.job_hash.substr(0, 16) +
                           "..., this job's is " + job_hash->substr(0, 16) +
                           "...): the model, data, training or optimizer settings differ");
  if (m.num_layers != num_layers)
    throw checkpoint_error(where + ": " + std::to_string(m.num_layers) + " layers, the job's model has " +
                           std::to_string(num_layers));
  std::set<int> seen;
  for (const auto& f : m.files) {
    if (f.layer < 0 || f.layer >= num_layers)
      throw checkpoint_error(where + ": a file for layer " + std::to_string(f.layer) + ", which does not exist");
    if (!seen.insert(f.layer).second)
      throw checkpoint_error(where + ": layer " + std::to_string(f.layer) + " is listed twice");
    if (f.name != layer_file_name(f.layer))
      throw checkpoint_error(where + ": layer " + std::to_string(f.layer) + " has the file name '" + f.name +
                             "', expected " + layer_file_name(f.layer));
  }
  for (int l = 0; l < num_layers; ++l)
    if (!seen.count(l)) throw checkpoint_error(where + ": no file for layer " + std::to_string(l));
}

void check_file(const fs::path& dir, const checkpoint_file& f, std::vector<std::byte>* keep) {
  const auto p = dir / f.name;
  auto bytes = read_whole(p, f.bytes + 1, " (the checkpoint is incomplete)");
  if (bytes.size() != f.bytes)
    throw checkpoint_error(p.string() + ": " + std::to_string(bytes.size()) + " bytes, the manifest says " +
                           std::to_string(f.bytes) + (bytes.size() < f.bytes ? " (truncated)" : ""));
  if (sha256_hex(bytes) != f.sha256)
    throw checkpoint_error(p.string() + ": its SHA-256 differs from the manifest's (the file is corrupt)");
  if (keep) *keep = std::move(bytes);
}

}  // namespace

std::vector<std::byte> manifest_to_capnp(const checkpoint_manifest& manifest) { return encode_manifest(manifest); }

checkpoint_manifest manifest_from_capnp(std::span<const std::byte> bytes, const std::string& origin) {
  return decode_manifest(bytes, origin);
}

std::string layer_file_name(int layer) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "layer-%04d.bin", layer);
  return buf;
}

std::string checkpoint_dir_name(std::uint64_t step) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "step-%08llu", static_cast<unsigned long long>(step));
  return buf;
}

std::string sha256_hex(std::span<const std::byte> bytes) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (!EVP_Digest(bytes.data(), bytes.size(), out, &len, EVP_sha256(), nullptr))
    throw std::runtime_error("SHA-256 failed");
  static constexpr char hex[] = "0123456789abcdef";
  std::string s;
  for (unsigned i = 0; i < len; ++i) {
    s += hex[out[i] >> 4];
    s += hex[out[i] & 15];
  }
  return s;
}

void ensure_checkpoint_root(const fs::path& root, const std::string& named) {
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) throw checkpoint_error(named + ": cannot create the checkpoint directory: " + ec.message());
  if (::access(root.c_str(), W_OK | X_OK) != 0)
    throw checkpoint_error(named + ": cannot write into it: " + std::strerror(errno));
}

fs::path begin_checkpoint(const fs::path& root, std::uint64_t step) {
  ensure_checkpoint_root(root, root.string());
  std::error_code ec;
  const auto nonce = std::chrono::steady_clock::now().time_since_epoch().count();
  const auto temp = root / (".tmp-" + checkpoint_dir_name(step) + "-" + std::to_string(::getpid()) + "-" +
                            std::to_string(nonce));
  if (!fs::create_directory(temp, ec) || ec)
    throw checkpoint_error(temp.string() + ": cannot create it: " + (ec ? ec.message() : "it exists"));
  return temp;
}

std::string layer_temp_file_name(int layer, const std::string& writer) {
  std::string w = writer.empty() ? "w" + std::to_string(::getpid()) : writer;
  for (char& c : w)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) c = '_';
  return layer_file_name(layer) + "." + w + ".tmp";
}

checkpoint_file write_layer_file(const fs::path& dir, int layer, std::span<const std::byte> bytes,
                                 const std::string& writer) {
  checkpoint_file f{layer, layer_file_name(layer), bytes.size(), sha256_hex(bytes)};
  const auto temp = dir / layer_temp_file_name(layer, writer);
  // Not O_EXCL: the name is this writer's own (a retry of the same order may find its own partial file).
  try {
    write_file_synced(temp, bytes, false);
  } catch (...) {
    std::error_code ec;
    fs::remove(temp, ec);
    throw;
  }
  const auto final_path = dir / f.name;
  if (::rename(temp.c_str(), final_path.c_str()) != 0) {
    const int err = errno;
    std::error_code ec;
    fs::remove(temp, ec);
    errno = err;
    fail_errno("cannot rename " + temp.filename().string() + " to it", final_path);
  }
  fsync_dir(dir);
  return f;
}

fs::path finish_checkpoint(const fs::path& temp, const checkpoint_manifest& manifest) {
  auto m = manifest;
  std::sort(m.files.begin(), m.files.end(), [](const auto& a, const auto& b) { return a.layer < b.layer; });
  {
    // Only what the manifest lists stays: writers that died or were replaced leave temporary files.
    std::set<std::string> listed;
    for (const auto& f : m.files) listed.insert(f.name);
    std::error_code ec;
    std::vector<fs::path> stray;
    for (const auto& e : fs::directory_iterator(temp, ec))
      if (!listed.count(e.path().filename().string())) stray.push_back(e.path());
    if (ec) throw checkpoint_error(temp.string() + ": cannot list it: " + ec.message());
    for (const auto& p : stray) fs::remove_all(p, ec);
  }
  write_file_synced(temp / checkpoint_manifest_name, encode_manifest(m));
  read_checkpoint(temp, m.job_hash, m.num_layers);  // what a resume will check, before it counts
  fsync_dir(temp);
  const auto root = temp.parent_path();
  const auto final_dir = root / checkpoint_dir_name(m.step);
  std::error_code ec;
  if (fs::exists(final_dir, ec)) {
    // The same step was checkpointed before (a periodic checkpoint, then a stop before the next
    // commit): the same state. Keep the one that is there if it is whole.
    read_checkpoint(final_dir, m.job_hash, m.num_layers);
    fs::remove_all(temp, ec);
    return final_dir;
  }
  if (::rename(temp.c_str(), final_dir.c_str()) != 0) fail_errno("cannot rename " + temp.string() + " to it", final_dir);
  fsync_dir(root);
  return final_dir;
}

checkpoint_manifest read_manifest(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw checkpoint_error(dir.string() + ": no such checkpoint directory");
  const auto manifest_path = dir / checkpoint_manifest_name;
  auto m = decode_manifest(read_whole(manifest_path, max_manifest_bytes,
                             " (not a complete checkpoint: its manifest is written last)"),
                  manifest_path);
  check_manifest(m, dir, nullptr, m.num_layers);
  return m;
}

checkpoint_manifest read_checkpoint(const fs::path& dir, const std::string& job_hash, int num_layers) {
  const auto m = read_manifest(dir);
  check_manifest(m, dir, &job_hash, num_layers);
  for (const auto& f : m.files) check_file(dir, f, nullptr);
  return m;
}

std::vector<std::byte> read_layer_file(const fs::path& dir, const checkpoint_file& entry) {
  std::vector<std::byte> bytes;
  check_file(dir, entry, &bytes);
  return bytes;
}

const checkpoint_file& file_of(const checkpoint_manifest& manifest, int layer) {
  for (const auto& f : manifest.files)
    if (f.layer == layer) return f;
  throw std::out_of_range("the checkpoint has no file for layer " + std::to_string(layer));
}

std::vector<fs::path> list_checkpoints(const fs::path& root) {
  std::vector<std::pair<std::uint64_t, fs::path>> found;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return {};
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const auto name = e.path().filename().string();
    if (name.rfind("step-", 0) != 0 || name.size() <= 5) continue;
    if (name.find_first_not_of("0123456789", 5) != std::string::npos) continue;
    if (!fs::is_regular_file(e.path() / checkpoint_manifest_name, ec)) continue;
    found.emplace_back(std::stoull(name.substr(5)), e.path());
  }
  std::sort(found.begin(), found.end());
  std::vector<fs::path> out;
  for (auto& [step, p] : found) out.push_back(std::move(p));
  return out;
}

}  // namespace oobleck::runtime
