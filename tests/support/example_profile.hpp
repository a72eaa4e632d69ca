#pragma once
// The repository's example profile (examples/profiles/gpt-synthetic-24l.json), for the tests of the
// programs that read one. OOBLECK_SOURCE_DIR is defined in tests/CMakeLists.txt. One per translation
// unit (a unity batch of several test files too).

#include <string>

#ifndef OOBLECK_SOURCE_DIR
#error "OOBLECK_SOURCE_DIR is defined in tests/CMakeLists.txt for the test programs that read the examples"
#endif

static const std::string kProfile = std::string(OOBLECK_SOURCE_DIR) + "/examples/profiles/gpt-synthetic-24l.json";
