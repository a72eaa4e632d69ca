#pragma once
// Runs a test under a C locale whose decimal point is ',' (LC_NUMERIC only), then restores "C".
// Uses an installed German or French locale, else the compiled de_DE LC_NUMERIC shipped in
// tests/messages/data/locale (through LOCPATH). `active()` says whether one could be set.

#include <clocale>
#include <cstdlib>
#include <cstring>
#include <string>

namespace oobleck::test {

class comma_locale {
 public:
  explicit comma_locale(const std::string& shipped_dir) {
    for (const char* name : {"de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8", "fr_FR.utf8"})
      if (try_set(name)) return;
    // glibc reads LOCPATH on every setlocale call.
    ::setenv("LOCPATH", shipped_dir.c_str(), 1);
    set_locpath_ = true;
    try_set("de_DE.UTF-8");
  }
  ~comma_locale() {
    std::setlocale(LC_NUMERIC, "C");
    if (set_locpath_) ::unsetenv("LOCPATH");
  }
  comma_locale(const comma_locale&) = delete;
  comma_locale& operator=(const comma_locale&) = delete;

  bool active() const { return active_; }

 private:
  bool try_set(const char* name) {
    if (!std::setlocale(LC_NUMERIC, name)) return false;
    active_ = std::strcmp(std::localeconv()->decimal_point, ",") == 0;
    if (!active_) std::setlocale(LC_NUMERIC, "C");
    return active_;
  }

  bool active_ = false;
  bool set_locpath_ = false;
};

}  // namespace oobleck::test
