// Just enough JSON for the external-port protocol and safetensors headers:
// objects, arrays, strings (with the standard escapes), integers, booleans, null.
// Integers are 64-bit; a larger one parses, and reading it is the error.
// Requests never carry fractional numbers; one is rejected with a clear error.
#pragma once

#include <cctype>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace port {

using i64 = std::int64_t;

struct Json {
  enum Kind { Null, Bool, Int, String, Array, Object } kind = Null;
  bool boolean = false;
  i64 integer = 0;
  // An integer literal past int64 is valid JSON (Python writes any size), so it
  // parses and only reading it as an integer fails: the reply to a request
  // carrying one still repeats the request's id.
  bool out_of_range = false;
  std::string text;  // a string's value; an out-of-range integer's digits
  std::vector<Json> items;
  std::map<std::string, Json> fields;

  const Json& at(const std::string& key) const {
    auto found = fields.find(key);
    if (kind != Object || found == fields.end()) throw std::runtime_error("missing field '" + key + "'");
    return found->second;
  }
  bool has(const std::string& key) const { return kind == Object && fields.count(key) > 0; }
  bool is_null() const { return kind == Null; }
  const char* kind_name() const {
    switch (kind) {
      case Null: return "null";
      case Bool: return "a boolean";
      case Int: return "an integer";
      case String: return "a string";
      case Array: return "an array";
      case Object: return "an object";
    }
    return "?";
  }
  i64 as_int() const {
    if (kind != Int) throw std::runtime_error(std::string("expected an integer, got ") + kind_name());
    if (out_of_range) throw std::runtime_error("integer " + text + " does not fit in 64 bits");
    return integer;
  }
  bool as_bool() const {
    if (kind != Bool) throw std::runtime_error(std::string("expected a boolean, got ") + kind_name());
    return boolean;
  }
  const std::string& as_string() const {
    if (kind != String) throw std::runtime_error(std::string("expected a string, got ") + kind_name());
    return text;
  }
  const std::vector<Json>& as_array() const {
    if (kind != Array) throw std::runtime_error(std::string("expected an array, got ") + kind_name());
    return items;
  }
  std::vector<i64> as_ints() const {
    std::vector<i64> out;
    for (const Json& v : as_array()) {
      try {
        out.push_back(v.as_int());
      } catch (const std::runtime_error& e) {
        throw std::runtime_error("element " + std::to_string(out.size()) + ": " + e.what());
      }
    }
    return out;
  }

  // Field readers whose errors name the field.
  i64 int_at(const std::string& key) const { return read_field(key, &Json::as_int); }
  bool bool_at(const std::string& key) const { return read_field(key, &Json::as_bool); }
  const std::string& string_at(const std::string& key) const { return read_field(key, &Json::as_string); }
  const std::vector<Json>& array_at(const std::string& key) const { return read_field(key, &Json::as_array); }
  std::vector<i64> ints_at(const std::string& key) const { return read_field(key, &Json::as_ints); }

 private:
  template <class Result>
  Result read_field(const std::string& key, Result (Json::*read)() const) const {
    const Json& value = at(key);
    try {
      return (value.*read)();
    } catch (const std::runtime_error& e) {
      throw std::runtime_error("field '" + key + "': " + e.what());
    }
  }
};

class Parser {
 public:
  explicit Parser(const std::string& s) : s_(s) {}
  Json parse() {
    Json v = value();
    skip();
    if (pos_ != s_.size()) throw std::runtime_error("trailing characters");
    return v;
  }

 private:
  // Nesting deeper than this is refused: each level is a recursive call, and a
  // line of a million '[' must be an error, not a stack overflow.
  static constexpr int kMaxDepth = 256;

  const std::string& s_;
  size_t pos_ = 0;
  int depth_ = 0;

  // Counts one level of nesting for as long as it lives.
  class Nesting {
   public:
    explicit Nesting(int& depth) : depth_(depth) {
      if (depth_ >= kMaxDepth) throw std::runtime_error("nested deeper than " + std::to_string(kMaxDepth) + " levels");
      ++depth_;
    }
    ~Nesting() { --depth_; }
    Nesting(const Nesting&) = delete;
    Nesting& operator=(const Nesting&) = delete;

   private:
    int& depth_;
  };

  void skip() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\r' || s_[pos_] == '\n')) ++pos_;
  }
  char peek() {
    skip();
    if (pos_ >= s_.size()) throw std::runtime_error("unexpected end of JSON");
    return s_[pos_];
  }
  void expect(char c) {
    if (peek() != c) throw std::runtime_error(std::string("expected '") + c + "'");
    ++pos_;
  }
  Json value() {
    char c = peek();
    Json v;
    if (c == '{') {
      const Nesting level(depth_);
      v.kind = Json::Object;
      ++pos_;
      if (peek() == '}') { ++pos_; return v; }
      while (true) {
        Json key = string_value();
        expect(':');
        v.fields[key.text] = value();
        if (peek() == ',') { ++pos_; continue; }
        expect('}');
        return v;
      }
    }
    if (c == '[') {
      const Nesting level(depth_);
      v.kind = Json::Array;
      ++pos_;
      if (peek() == ']') { ++pos_; return v; }
      while (true) {
        v.items.push_back(value());
        if (peek() == ',') { ++pos_; continue; }
        expect(']');
        return v;
      }
    }
    if (c == '"') return string_value();
    if (s_.compare(pos_, 4, "true") == 0) { pos_ += 4; v.kind = Json::Bool; v.boolean = true; return v; }
    if (s_.compare(pos_, 5, "false") == 0) { pos_ += 5; v.kind = Json::Bool; return v; }
    if (s_.compare(pos_, 4, "null") == 0) { pos_ += 4; return v; }
    return integer_value();
  }
  Json integer_value() {
    const size_t start = pos_;
    const bool negative = s_[pos_] == '-';
    if (negative) ++pos_;
    const size_t digits = pos_;
    while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    if (pos_ < s_.size() && (s_[pos_] == '.' || s_[pos_] == 'e' || s_[pos_] == 'E'))
      throw std::runtime_error("only integers are expected");
    if (digits == pos_) {
      if (pos_ >= s_.size()) throw std::runtime_error("unexpected end of JSON");
      throw std::runtime_error(std::string("unexpected character '") + s_[pos_] + "'");
    }
    Json v;
    v.kind = Json::Int;
    // The magnitude, accumulated unsigned so that -2^63 fits and overflow is detected, not undefined.
    const std::uint64_t limit = negative ? std::uint64_t{1} << 63 : (std::uint64_t{1} << 63) - 1;
    std::uint64_t magnitude = 0;
    for (size_t i = digits; i < pos_ && !v.out_of_range; ++i) {
      const unsigned digit = static_cast<unsigned>(s_[i] - '0');
      v.out_of_range = __builtin_mul_overflow(magnitude, std::uint64_t{10}, &magnitude) ||
                       __builtin_add_overflow(magnitude, std::uint64_t{digit}, &magnitude) || magnitude > limit;
    }
    if (v.out_of_range) {
      const size_t length = pos_ - start;  // shown cut short: the error line stays one readable line
      v.text = length <= 32 ? s_.substr(start, length) : s_.substr(start, 32) + "... (" + std::to_string(length) + " characters)";
      return v;
    }
    // -2^63 has no positive counterpart in int64: negate one less, then step down.
    v.integer = !negative ? static_cast<i64>(magnitude) : magnitude == 0 ? 0 : -static_cast<i64>(magnitude - 1) - 1;
    return v;
  }
  static void append_utf8(std::string& out, unsigned code) {
    if (code < 0x80) {
      out += static_cast<char>(code);
    } else if (code < 0x800) {
      out += static_cast<char>(0xC0 | (code >> 6));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else if (code < 0x10000) {
      out += static_cast<char>(0xE0 | (code >> 12));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (code >> 18));
      out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    }
  }
  // Exactly four hex digits (std::stoul would also take a sign, "0x" or fewer digits).
  unsigned hex4() {
    if (pos_ + 4 > s_.size()) throw std::runtime_error("truncated \\u escape");
    unsigned code = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = s_[pos_++];
      unsigned digit;
      if (c >= '0' && c <= '9') digit = static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f') digit = static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') digit = static_cast<unsigned>(c - 'A' + 10);
      else throw std::runtime_error("\\u escape with a non-hex digit");
      code = code * 16 + digit;
    }
    return code;
  }
  Json string_value() {
    expect('"');
    Json v;
    v.kind = Json::String;
    while (pos_ < s_.size() && s_[pos_] != '"') {
      char c = s_[pos_++];
      if (c != '\\') { v.text += c; continue; }
      if (pos_ >= s_.size()) break;
      char e = s_[pos_++];
      switch (e) {
        case 'n': v.text += '\n'; break;
        case 't': v.text += '\t'; break;
        case 'r': v.text += '\r'; break;
        case 'b': v.text += '\b'; break;
        case 'f': v.text += '\f'; break;
        case 'u': {
          unsigned code = hex4();
          // A surrogate pair spells one code point past the basic plane. A high
          // surrogate without a low one stays alone, as Python's json keeps it.
          if (code >= 0xD800 && code < 0xDC00 && s_.compare(pos_, 2, "\\u") == 0) {
            const size_t after_high = pos_;
            pos_ += 2;
            const unsigned low = hex4();
            if (low >= 0xDC00 && low < 0xE000) code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
            else pos_ = after_high;
          }
          append_utf8(v.text, code);
          break;
        }
        default: v.text += e;  // \" \\ \/
      }
    }
    expect('"');
    return v;
  }
};

inline std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') { out += '\\'; out += c; continue; }
    if (c == '\n') { out += "\\n"; continue; }
    if (static_cast<unsigned char>(c) < 0x20) { out += ' '; continue; }
    out += c;
  }
  return out + "\"";
}

inline std::string ints(const std::vector<i64>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
  return out + "]";
}

}  // namespace port
