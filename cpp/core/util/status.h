// Status / Expected for cold paths (open, configure, load). Hot paths return bool and count.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace gpuprof {

// An error carries a message meant for a human: it names the problem and, where possible,
// what to do about it.
class Status {
 public:
  Status() = default;  // OK
  static Status Ok() { return Status(); }
  static Status Error(std::string message) { return Status(std::move(message), true); }

  bool ok() const { return !failed_; }
  const std::string& message() const { return message_; }
  explicit operator bool() const { return ok(); }

 private:
  Status(std::string message, bool failed) : message_(std::move(message)), failed_(failed) {}
  std::string message_;
  bool failed_ = false;
};

// Either a value or an error Status.
template <typename T>
class Expected {
 public:
  Expected(T value) : v_(std::move(value)) {}       // NOLINT(implicit)
  Expected(Status error) : v_(std::move(error)) {}  // NOLINT(implicit)
  bool ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &std::get<T>(v_); }
  const T* operator->() const { return &std::get<T>(v_); }
  T& operator*() { return std::get<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  const std::string& error() const { return status().message(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace gpuprof
