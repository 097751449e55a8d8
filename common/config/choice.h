// A config key that names one of a fixed set of values (policy.mode = "async"): an enum while
// the program runs, its name in TOML, JSON, --set and messages.
//
// A field of type Choice<E> is parsed when the config is loaded: a name that is not one of E's
// is refused there, naming the key and the names it takes. Code compares it with E's
// enumerators (or switches on it); a string never reaches a comparison. A name written in the
// source (`c.policy.mode = "async"` in a test) is looked up when compiling, so a misspelt one
// does not compile. Each E lists its names once, in a specialisation of ChoiceNames.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace fedfleet::config {

// ChoiceNames<E>::kNames: every value of E with its name, in the order messages list them.
template <typename E>
struct ChoiceNames;

template <typename E>
class Choice {
 public:
  using Enum = E;

  constexpr Choice(E value) : value_(value) {}  // NOLINT: a Choice is its value
  // A literal name, checked when compiling: an unknown one is a compile error.
  template <size_t N>
  consteval Choice(const char (&name)[N])  // NOLINT
      : value_(byName(std::string_view(name, N - 1))) {}

  constexpr operator E() const { return value_; }  // NOLINT: compares and switches as E
  constexpr E value() const { return value_; }
  constexpr std::string_view name() const {
    for (const auto& [value, name] : ChoiceNames<E>::kNames) {
      if (value == value_) return name;
    }
    return "?";
  }

  // The value named `name`, or none.
  static constexpr std::optional<E> parse(std::string_view name) {
    for (const auto& [value, n] : ChoiceNames<E>::kNames) {
      if (n == name) return value;
    }
    return std::nullopt;
  }
  // "a, b, c": every name, for messages.
  static std::string list() {
    std::string out;
    for (const auto& entry : ChoiceNames<E>::kNames) {
      if (entry.second.empty()) continue;  // "": not set (data.format)
      if (!out.empty()) out += ", ";
      out += entry.second;
    }
    return out;
  }

 private:
  static consteval E byName(std::string_view name) {
    for (const auto& [value, n] : ChoiceNames<E>::kNames) {
      if (n == name) return value;
    }
    throw "not a name of this config choice";  // in a constant expression: a compile error
  }

  E value_;
};

template <typename T>
inline constexpr bool kIsChoice = false;
template <typename E>
inline constexpr bool kIsChoice<Choice<E>> = true;

// The name of a choice, for messages: std::string(choiceName(c)) + "...".
template <typename E>
std::string choiceName(Choice<E> c) {
  return std::string(c.name());
}

}  // namespace fedfleet::config
