#pragma once
// Where the programs under test are: OOBLECK_APPS_DIR, which tests/CMakeLists.txt defines for each
// test program that runs them. One per translation unit (a unity batch of several test files too).

#include <string>

#ifndef OOBLECK_APPS_DIR
#error "OOBLECK_APPS_DIR is defined in tests/CMakeLists.txt for the test programs that run the apps"
#endif

static const std::string bin = OOBLECK_APPS_DIR;
