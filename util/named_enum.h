// Enums with a closed set of names (a config key's values: parallel.schedule,
// parallel.data_plane, ...). An enum E opts in by declaring, beside itself,
//   constexpr std::array<std::string_view, N> enum_names(E) { return {...}; }
// with one name per enumerator, in enumerator order (0, 1, ...). Then
// to_string(e) is the name every output writes (reports, logs, manifests,
// the effective config), parse_enum<E>(text) reads it back, and
// enum_choices<E>() lists the names for error messages.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

namespace wiola {

template <class E>
concept NamedEnum = std::is_enum_v<E> && requires(E e) {
  enum_names(e);
};

template <NamedEnum E>
std::string_view to_string(E e) {
  return enum_names(E{})[static_cast<size_t>(e)];
}

// The enumerator named `name`, or nothing.
template <NamedEnum E>
std::optional<E> parse_enum(std::string_view name) {
  const auto names = enum_names(E{});
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return static_cast<E>(i);
  return std::nullopt;
}

// "\"a\", \"b\" or \"c\"": the names as a message lists them.
template <NamedEnum E>
std::string enum_choices() {
  const auto names = enum_names(E{});
  std::string s;
  for (size_t i = 0; i < names.size(); ++i)
    s += std::string(i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + "\"" + std::string(names[i]) + "\"";
  return s;
}

}  // namespace wiola
