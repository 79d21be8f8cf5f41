// The one reader of the process environment. Every variable wiola reads (its
// settings, the launchers' rank variables, the debug switches, the refused
// former switches and the test hooks of util/test_hooks.h) is read through
// env_value, here and nowhere else; docs/testing.md ("Test hooks and every
// environment variable") has one row for each, and the ctest arch.env_vars
// holds that table to the names passed to these functions.
#pragma once

#include <initializer_list>
#include <optional>
#include <string>

namespace wiola {

// The variable's value; nullopt when it is unset (set but empty: "").
std::optional<std::string> env_value(const char* name);
// The value, or "" when unset: for variables where unset and empty mean the same.
std::string env_text(const char* name);
// An on/off switch: set, non-empty and not "0".
bool env_flag(const char* name);
// The first of `names` that is set, as a whole number (atoi); -1 when none is.
int env_first_int(std::initializer_list<const char*> names);

}  // namespace wiola
