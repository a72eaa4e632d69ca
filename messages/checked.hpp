#pragma once
// Conversions of decoded integers to the types the program keeps them in. A value that does not
// fit is bad input, never a silent narrowing: 4294967298 as an int is 2, a valid microbatch size.

#include <concepts>
#include <limits>
#include <string>
#include <string_view>
#include <utility>

#include "messages/input_error.hpp"

namespace oobleck::messages {

/// `value` as a To; throws input_error "PATH: VALUE is out of range (at most MAX)" when it does not fit.
template <std::integral To, std::integral From>
To checked_cast(From value, std::string_view path) {
  if (!std::in_range<To>(value)) {
    const bool above = std::cmp_greater(value, std::numeric_limits<To>::max());
    throw input_error(std::string(path) + ": " + std::to_string(value) + " is out of range (" +
                      (above ? "at most " + std::to_string(std::numeric_limits<To>::max())
                             : "at least " + std::to_string(std::numeric_limits<To>::min())) +
                      ")");
  }
  return static_cast<To>(value);
}

}  // namespace oobleck::messages
