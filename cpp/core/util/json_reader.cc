#include "util/json_reader.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string>

namespace gpuprof {
namespace {

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

void AppendUtf8(std::string* out, uint32_t cp) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// The length of the valid UTF-8 sequence at s[0..n) whose first byte is >= 0x80, or 0.
size_t Utf8Length(const unsigned char* s, size_t n) {
  auto cont = [&](size_t i, unsigned char lo = 0x80, unsigned char hi = 0xBF) {
    return i < n && s[i] >= lo && s[i] <= hi;
  };
  const unsigned char c = s[0];
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c == 0xE0) return cont(1, 0xA0) && cont(2) ? 3 : 0;
  if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) return cont(1) && cont(2) ? 3 : 0;
  if (c == 0xED) return cont(1, 0x80, 0x9F) && cont(2) ? 3 : 0;  // no surrogates
  if (c == 0xF0) return cont(1, 0x90) && cont(2) && cont(3) ? 4 : 0;
  if (c >= 0xF1 && c <= 0xF3) return cont(1) && cont(2) && cont(3) ? 4 : 0;
  if (c == 0xF4) return cont(1, 0x80, 0x8F) && cont(2) && cont(3) ? 4 : 0;
  return 0;
}

}  // namespace

const char* JsonReader::TypeName(Type type) {
  switch (type) {
    case Type::kObject:
      return "object";
    case Type::kArray:
      return "array";
    case Type::kString:
      return "string";
    case Type::kNumber:
      return "number";
    case Type::kBool:
      return "boolean";
    case Type::kNull:
      return "null";
  }
  return "value";
}

JsonReader::JsonReader(std::string_view text, size_t max_depth)
    : text_(text), max_depth_(max_depth) {
  // A UTF-8 byte order mark before the text is passed over (RFC 8259 allows it; nlohmann-json,
  // which the server decoded with before, does the same).
  if (text_.substr(0, 3) == "\xEF\xBB\xBF") pos_ = 3;
}

bool JsonReader::Fail(const char* what) {
  if (ok()) error_ = std::string("not valid JSON: ") + what + " at byte " + std::to_string(pos_);
  return false;
}

void JsonReader::SkipSpace() {
  while (pos_ < text_.size()) {
    const char c = text_[pos_];
    if (c != ' ' && c != '\n' && c != '\r' && c != '\t') return;
    ++pos_;
  }
}

bool JsonReader::Peek(Type* type) {
  if (!ok()) return false;
  SkipSpace();
  if (pos_ >= text_.size()) return Fail("unexpected end");
  const char c = text_[pos_];
  switch (c) {
    case '{':
      *type = Type::kObject;
      return true;
    case '[':
      *type = Type::kArray;
      return true;
    case '"':
      *type = Type::kString;
      return true;
    case 't':
    case 'f':
      *type = Type::kBool;
      return true;
    case 'n':
      *type = Type::kNull;
      return true;
    default:
      if (c == '-' || IsDigit(c)) {
        *type = Type::kNumber;
        return true;
      }
      return Fail("unexpected character");
  }
}

bool JsonReader::Enter(char open) {
  if (!ok()) return false;
  SkipSpace();
  const bool object = open == '{';
  if (pos_ >= text_.size() || text_[pos_] != open) {
    return Fail(object ? "expected an object" : "expected an array");
  }
  if (stack_.size() >= max_depth_) return Fail("nested too deeply");
  ++pos_;
  stack_.push_back({object, false});
  return true;
}

bool JsonReader::EnterObject() { return Enter('{'); }
bool JsonReader::EnterArray() { return Enter('['); }

bool JsonReader::Advance(bool object) {
  if (!ok()) return false;
  if (stack_.empty() || stack_.back().object != object) {
    return Fail(object ? "no object entered" : "no array entered");
  }
  SkipSpace();
  if (pos_ >= text_.size()) return Fail("unexpected end");
  if (text_[pos_] == (object ? '}' : ']')) {
    ++pos_;
    stack_.pop_back();
    return false;
  }
  if (stack_.back().started) {
    if (text_[pos_] != ',') return Fail(object ? "expected ',' or '}'" : "expected ',' or ']'");
    ++pos_;
  }
  stack_.back().started = true;
  return true;
}

bool JsonReader::NextKey(std::string* key) { return Advance(true) && ScanKey(key); }
bool JsonReader::NextItem() { return Advance(false); }

bool JsonReader::ScanKey(std::string* out) {
  SkipSpace();
  if (pos_ >= text_.size() || text_[pos_] != '"') return Fail("expected a key");
  if (!ScanString(out)) return false;
  SkipSpace();
  if (pos_ >= text_.size() || text_[pos_] != ':') return Fail("expected ':'");
  ++pos_;
  return true;
}

bool JsonReader::String(std::string* out) {
  if (!ok()) return false;
  SkipSpace();
  if (pos_ >= text_.size() || text_[pos_] != '"') return Fail("expected a string");
  return ScanString(out);
}

bool JsonReader::ScanString(std::string* out) {
  ++pos_;  // the opening quote
  if (out != nullptr) out->clear();
  const size_t n = text_.size();
  const auto* s = reinterpret_cast<const unsigned char*>(text_.data());
  while (true) {
    const size_t run = pos_;
    while (pos_ < n && s[pos_] >= 0x20 && s[pos_] < 0x80 && s[pos_] != '"' && s[pos_] != '\\') {
      ++pos_;
    }
    if (out != nullptr && pos_ > run) out->append(text_.data() + run, pos_ - run);
    if (pos_ >= n) return Fail("unterminated string");
    const unsigned char c = s[pos_];
    if (c == '"') {
      ++pos_;
      return true;
    }
    if (c < 0x20) return Fail("control character in a string");
    if (c >= 0x80) {
      const size_t len = Utf8Length(s + pos_, n - pos_);
      if (len == 0) return Fail("invalid UTF-8 in a string");
      if (out != nullptr) out->append(text_.data() + pos_, len);
      pos_ += len;
      continue;
    }
    // A backslash
    if (pos_ + 1 >= n) return Fail("unterminated string");
    const char e = text_[pos_ + 1];
    char plain = 0;
    switch (e) {
      case '"':
        plain = '"';
        break;
      case '\\':
        plain = '\\';
        break;
      case '/':
        plain = '/';
        break;
      case 'b':
        plain = '\b';
        break;
      case 'f':
        plain = '\f';
        break;
      case 'n':
        plain = '\n';
        break;
      case 'r':
        plain = '\r';
        break;
      case 't':
        plain = '\t';
        break;
      case 'u':
        break;
      default:
        return Fail("invalid escape in a string");
    }
    if (e != 'u') {
      if (out != nullptr) out->push_back(plain);
      pos_ += 2;
      continue;
    }
    auto hex4 = [&](size_t at, uint32_t* v) {
      if (at + 4 > n) return false;
      *v = 0;
      for (size_t i = 0; i < 4; ++i) {
        const int h = HexValue(text_[at + i]);
        if (h < 0) return false;
        *v = *v * 16 + static_cast<uint32_t>(h);
      }
      return true;
    };
    uint32_t cp = 0;
    if (!hex4(pos_ + 2, &cp)) return Fail("invalid \\u escape in a string");
    pos_ += 6;
    if (cp >= 0xDC00 && cp <= 0xDFFF) return Fail("a lone low surrogate in a string");
    if (cp >= 0xD800 && cp <= 0xDBFF) {
      uint32_t low = 0;
      if (pos_ + 1 >= n || text_[pos_] != '\\' || text_[pos_ + 1] != 'u' || !hex4(pos_ + 2, &low) ||
          low < 0xDC00 || low > 0xDFFF) {
        return Fail("a high surrogate without its low half in a string");
      }
      pos_ += 6;
      cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
    }
    if (out != nullptr) AppendUtf8(out, cp);
  }
}

bool JsonReader::ScanNumber(Number* out) {
  const size_t start = pos_;
  const size_t n = text_.size();
  if (pos_ < n && text_[pos_] == '-') ++pos_;
  if (pos_ < n && text_[pos_] == '0') {
    ++pos_;
  } else if (pos_ < n && IsDigit(text_[pos_])) {
    while (pos_ < n && IsDigit(text_[pos_])) ++pos_;
  } else {
    return Fail("invalid number");
  }
  bool integral = true;
  if (pos_ < n && text_[pos_] == '.') {
    ++pos_;
    if (pos_ >= n || !IsDigit(text_[pos_])) return Fail("invalid number");
    while (pos_ < n && IsDigit(text_[pos_])) ++pos_;
    integral = false;
  }
  if (pos_ < n && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
    ++pos_;
    if (pos_ < n && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
    if (pos_ >= n || !IsDigit(text_[pos_])) return Fail("invalid number");
    while (pos_ < n && IsDigit(text_[pos_])) ++pos_;
    integral = false;
  }
  const char* first = text_.data() + start;
  const char* last = text_.data() + pos_;
  Number num;
  num.integral = integral;
  if (integral) {
    auto [end, ec] = std::from_chars(first, last, num.integer);
    num.in_range = ec == std::errc() && end == last;
    if (num.in_range) {
      num.real = static_cast<double>(num.integer);
      if (out != nullptr) *out = num;
      return true;
    }
    num.integer = 0;
  }
  auto [end, ec] = std::from_chars(first, last, num.real);
  if (ec == std::errc::result_out_of_range) {
    // Past the range of a double: an overflow is refused (nlohmann-json does the same), an
    // underflow reads as strtod rounds it (0 or a subnormal).
    num.real = std::strtod(std::string(first, last).c_str(), nullptr);
    if (!std::isfinite(num.real)) {
      pos_ = start;
      return Fail("number out of range");
    }
  } else if (ec != std::errc() || end != last) {
    pos_ = start;
    return Fail("invalid number");
  }
  if (out != nullptr) *out = num;
  return true;
}

bool JsonReader::Num(Number* out) {
  if (!ok()) return false;
  SkipSpace();
  if (pos_ >= text_.size() || (text_[pos_] != '-' && !IsDigit(text_[pos_]))) {
    return Fail("expected a number");
  }
  return ScanNumber(out);
}

bool JsonReader::Literal(std::string_view word) {
  if (text_.substr(pos_, word.size()) != word) return Fail("invalid literal");
  pos_ += word.size();
  return true;
}

bool JsonReader::Bool(bool* out) {
  if (!ok()) return false;
  SkipSpace();
  if (pos_ < text_.size() && text_[pos_] == 't') {
    *out = true;
    return Literal("true");
  }
  if (pos_ < text_.size() && text_[pos_] == 'f') {
    *out = false;
    return Literal("false");
  }
  return Fail("expected true or false");
}

bool JsonReader::Null() {
  if (!ok()) return false;
  SkipSpace();
  return Literal("null");
}

bool JsonReader::Skip(std::string_view* raw) {
  if (!ok()) return false;
  SkipSpace();
  const size_t start = pos_;
  std::vector<bool> open;  // per container being skipped: whether it is an object
  const size_t n = text_.size();
  while (true) {
    // A value starts here.
    SkipSpace();
    if (pos_ >= n) return Fail("unexpected end");
    const char c = text_[pos_];
    bool done_value = true;
    if (c == '{' || c == '[') {
      ++pos_;
      SkipSpace();
      if (pos_ < n && text_[pos_] == (c == '{' ? '}' : ']')) {
        ++pos_;
      } else {
        open.push_back(c == '{');
        if (c == '{' && !ScanKey(nullptr)) return false;
        done_value = false;
      }
    } else if (c == '"') {
      if (!ScanString(nullptr)) return false;
    } else if (c == '-' || IsDigit(c)) {
      if (!ScanNumber(nullptr)) return false;
    } else if (c == 't') {
      if (!Literal("true")) return false;
    } else if (c == 'f') {
      if (!Literal("false")) return false;
    } else if (c == 'n') {
      if (!Literal("null")) return false;
    } else {
      return Fail("unexpected character");
    }
    if (!done_value) continue;
    // After a value: close containers, or move to the next member / element.
    bool next = false;
    while (!open.empty() && !next) {
      SkipSpace();
      if (pos_ >= n) return Fail("unexpected end");
      const char d = text_[pos_];
      if (d == ',') {
        ++pos_;
        if (open.back() && !ScanKey(nullptr)) return false;
        next = true;
      } else if (d == (open.back() ? '}' : ']')) {
        ++pos_;
        open.pop_back();
      } else {
        return Fail(open.back() ? "expected ',' or '}'" : "expected ',' or ']'");
      }
    }
    if (!next) break;
  }
  if (raw != nullptr) *raw = text_.substr(start, pos_ - start);
  return true;
}

bool JsonReader::End() {
  if (!ok()) return false;
  SkipSpace();
  if (pos_ != text_.size()) return Fail("unexpected text after the value");
  return true;
}

}  // namespace gpuprof
