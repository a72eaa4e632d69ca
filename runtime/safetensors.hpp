#pragma once
// The safetensors format (https://huggingface.co/docs/safetensors), without LibTorch: an 8-byte
// little-endian header length N, N bytes of a JSON object {name: {"dtype", "shape",
// "data_offsets": [begin, end]}, "__metadata__": {string: string}} (optionally padded with
// spaces), then the byte buffer the offsets point into. Read: every tensor's bytes checked
// against its shape and dtype, the buffer covered exactly (no gap, no overlap, nothing past its
// end), names unique; F32, F16 and BF16 values converted to float. Written: F32.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace oobleck::runtime {

/// A file or buffer that is not valid safetensors, or a tensor that cannot be read as asked.
/// The message names the origin (the path) and what is wrong.
class safetensors_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// One tensor of a safetensors buffer: where its bytes are, relative to the byte buffer.
struct safetensors_entry {
  std::string name;
  std::string dtype;  ///< as the file spells it: "F32", "F16", "BF16", "I64", ...
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;

  std::int64_t numel() const;
  bool operator==(const safetensors_entry&) const = default;
};

/// A parsed safetensors file (its bytes held in memory).
class safetensors_file {
 public:
  /// Parses and validates `bytes`; `origin` (a path) starts every error message.
  static safetensors_file parse(std::vector<std::byte> bytes, const std::string& origin = "safetensors");
  /// Maps the file at `path` (read-only; nothing is read until asked) and parses it.
  static safetensors_file read(const std::string& path);

  /// The tensors in the order of their data offsets.
  const std::vector<safetensors_entry>& tensors() const { return entries_; }
  /// The tensor of that name, or nullptr.
  const safetensors_entry* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// The values of a tensor as floats (F32 as is; F16 and BF16 converted exactly). Another dtype
  /// throws safetensors_error naming the tensor and its dtype.
  std::vector<float> floats(const safetensors_entry& e) const;
  /// The raw bytes of a tensor.
  std::span<const std::byte> bytes(const safetensors_entry& e) const;

 private:
  static safetensors_file parse(std::shared_ptr<const void> owner, std::span<const std::byte> bytes,
                               const std::string& origin);

  std::string origin_;
  std::shared_ptr<const void> owner_;  ///< keeps bytes_ alive: a vector or a file mapping
  std::span<const std::byte> bytes_;
  std::size_t data_start_ = 0;
  std::vector<safetensors_entry> entries_;
  std::map<std::string, std::string> metadata_;
};

/// A float32 tensor to write: `values` holds product(shape) floats, row-major.
struct safetensors_tensor {
  std::string name;
  std::vector<std::int64_t> shape;
  std::span<const float> values;
};

/// The bytes of a safetensors file of F32 tensors, in the given order, with `metadata` (e.g.
/// {"format": "pt"}, which Hugging Face's loaders expect). Throws safetensors_error for a duplicate or
/// empty name, the reserved name "__metadata__", or values that do not match the shape.
std::vector<std::byte> encode_safetensors(const std::vector<safetensors_tensor>& tensors,
                                          const std::map<std::string, std::string>& metadata = {});
/// encode_safetensors written to `path` (through a temporary file renamed into place).
void write_safetensors(const std::string& path, const std::vector<safetensors_tensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

/// IEEE half and bfloat16 to float (exact).
float half_to_float(std::uint16_t h);
float bfloat16_to_float(std::uint16_t b);

}  // namespace oobleck::runtime
