#pragma once
// A double inside a CAF message. CAF 0.17.6 encodes floating-point numbers with pack754, which
// never terminates on an infinity or a NaN (found by fuzz/caf_message): a diverging loss, or a
// peer's crafted `seconds`, would hang the actor that sends it. On the wire a wire_double is its
// IEEE-754 bits in a uint64; in code it reads and writes like the double it holds.

#include <bit>
#include <cstdint>

#include <caf/error.hpp>
#include <caf/meta/load_callback.hpp>
#include <caf/meta/type_name.hpp>

namespace oobleck::messages {

struct wire_double {
  double value = 0;

  wire_double() = default;
  wire_double(double v) : value(v) {}  // NOLINT: converts like the double it stands for
  operator double() const { return value; }
  wire_double& operator+=(double x) {
    value += x;
    return *this;
  }
  /// Against a plain double: by value, as doubles compare.
  bool operator==(double x) const { return value == x; }
  /// Bitwise: a NaN equals the same NaN, so a round trip compares equal.
  bool operator==(const wire_double& o) const {
    return std::bit_cast<std::uint64_t>(value) == std::bit_cast<std::uint64_t>(o.value);
  }
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, wire_double& x) {
  std::uint64_t bits = std::bit_cast<std::uint64_t>(x.value);
  return f(caf::meta::type_name("double"), bits, caf::meta::load_callback([&x, &bits]() -> caf::error {
             x.value = std::bit_cast<double>(bits);
             return caf::none;
           }));
}

}  // namespace oobleck::messages
