// Status and Result<T>: how expected failures travel in fedfleet.
//
// Expected failures (peer gone, timeout, malformed frame, SQLITE_BUSY, unknown key, bad config)
// are values, never exceptions across a thread or an event loop. Broken invariants are
// FEDFLEET_CHECK aborts (common/check.h). docs/ERRORS.md states the policy.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace fedfleet {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     // bad config value, bad flag, bad input data
  kNotFound,            // file, key, client, run not found
  kCorrupt,             // malformed frame, checksum mismatch, bad file format
  kIoError,             // file system or database error (includes a full disk)
  kTimeout,             // a wait ran out
  kUnavailable,         // peer gone, socket closed
  kPermissionDenied,    // key not allowed
  kFailedPrecondition,  // operation not valid in the current state (stale token, wrong round)
  kResourceExhausted,   // size limit exceeded
  kInternal,            // a library reported something unexpected
};

const char* statusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return Status(); }

  bool isOk() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return isOk(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "CODE: message", or "OK".
  std::string toString() const;

  // Returns a copy whose message is "context: message".
  Status withContext(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status invalidArgument(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status notFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status corrupt(std::string m) { return {StatusCode::kCorrupt, std::move(m)}; }
inline Status ioError(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
inline Status timeoutError(std::string m) { return {StatusCode::kTimeout, std::move(m)}; }
inline Status unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status permissionDenied(std::string m) {
  return {StatusCode::kPermissionDenied, std::move(m)};
}
inline Status failedPrecondition(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
inline Status resourceExhausted(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
inline Status internalError(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

// Either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}         // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {}  // NOLINT: implicit by design

  bool isOk() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return isOk(); }

  // Precondition: isOk().
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

  // OK when holding a value.
  Status status() const { return isOk() ? Status() : std::get<Status>(v_); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace fedfleet

// Returns the Status from the enclosing function when `expr` is not OK.
#define FEDFLEET_RETURN_IF_ERROR(expr) \
  do {                                 \
    ::fedfleet::Status _st = (expr);   \
    if (!_st.isOk()) return _st;       \
  } while (0)

#define FEDFLEET_CONCAT_INNER(a, b) a##b
#define FEDFLEET_CONCAT(a, b) FEDFLEET_CONCAT_INNER(a, b)
// Declares `lhs` from a Result expression, or returns its Status.
#define FEDFLEET_ASSIGN_OR_RETURN(lhs, expr) \
  FEDFLEET_ASSIGN_OR_RETURN_IMPL(FEDFLEET_CONCAT(_res_, __LINE__), lhs, expr)
#define FEDFLEET_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                   \
  if (!tmp.isOk()) return tmp.status();                \
  lhs = std::move(tmp).value()
