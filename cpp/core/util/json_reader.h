// A strict JSON pull reader over one text, for the team server's hot path: an ingest batch is
// decoded straight into rows (store/row_json.h) without building a document first. Building a
// document with nlohmann-json cost 0.71 µs a GPU sample row (columns layout), its SAX
// interface 0.59 µs; this reader, rows built, 0.23 µs (row_json_benchmark, docs/benchmarks.md,
// "Team server").
//
// Strict as RFC 8259: the number grammar, escapes, UTF-8 (no overlong forms, surrogates or
// code points past U+10FFFF; a \u escape pair must be a valid surrogate pair), no control
// characters in strings, nothing but whitespace after the value (a UTF-8 byte order mark before
// it is passed over). The first error stops the
// reader: every later call returns false, and error() says what was wrong and at which byte.
//
// Usage: the caller walks the value it expects and reads the others with Skip():
//   if (!r.EnterObject()) ...;
//   for (std::string key; r.NextKey(&key);) { if (key == "n") r.Int(&n); else r.Skip(); }
//   if (!r.ok()) ... r.error();
// Not thread-safe; the text must outlive the reader and the views it returns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gpuprof {

class JsonReader {
 public:
  enum class Type : uint8_t { kObject, kArray, kString, kNumber, kBool, kNull };
  // nlohmann-json's names, so that messages read the same whichever decoder wrote them:
  // "object", "array", "string", "number", "boolean", "null".
  static const char* TypeName(Type type);

  // A number as read: `integral` when written without a fraction or exponent; then `in_range`
  // says whether it fits int64 (`integer`). `real` is the value as a double (always finite).
  struct Number {
    bool integral = false;
    bool in_range = false;
    int64_t integer = 0;
    double real = 0;
  };

  // `max_depth` bounds the nesting of containers entered with EnterObject/EnterArray (Skip()
  // reads any depth without recursion).
  explicit JsonReader(std::string_view text, size_t max_depth = 64);

  bool ok() const { return error_.empty(); }
  // "not valid JSON: <what> at byte N"; empty while ok().
  const std::string& error() const { return error_; }
  // Fails the reader with `what` at the current byte (a caller's own syntax rule).
  bool Fail(const char* what);

  // The type of the next value, without consuming it; false at the end of the text or at a byte
  // that starts no value (the reader fails then).
  bool Peek(Type* type);

  // '{' or '[': a container is entered; then NextKey / NextItem walk it.
  bool EnterObject();
  bool EnterArray();
  // The next member's key of the innermost entered object (its value is read next). False at
  // its '}' (consumed; the object is left) or on an error.
  bool NextKey(std::string* key);
  // Whether another element of the innermost entered array follows. False at its ']'
  // (consumed; the array is left) or on an error.
  bool NextItem();

  // One value of the named type; false (the reader fails) on a value of another type, except
  // where a caller checks Peek() first. String() decodes escapes into *out.
  bool String(std::string* out);
  bool Num(Number* out);
  bool Bool(bool* out);
  bool Null();
  // Any value, whole; `raw` (optional) is its text.
  bool Skip(std::string_view* raw = nullptr);
  // Only whitespace remains (call after the top value).
  bool End();

  size_t offset() const { return pos_; }

 private:
  void SkipSpace();
  bool Enter(char open);           // '{' or '[': EnterObject / EnterArray
  bool Advance(bool object);       // NextKey / NextItem up to the member or element
  bool ScanKey(std::string* out);  // a member's key and its ':'; out may be null
  bool Literal(std::string_view word);
  bool ScanString(std::string* out);  // at '"'; out may be null (validate only)
  bool ScanNumber(Number* out);       // out may be null (validate only)

  std::string_view text_;
  size_t pos_ = 0;
  size_t max_depth_;
  // Per entered container: whether it is an object, and whether its first member/element has
  // been read (a ',' is then expected before the next).
  struct Frame {
    bool object;
    bool started;
  };
  std::vector<Frame> stack_;
  std::string error_;
};

}  // namespace gpuprof
