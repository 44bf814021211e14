// Just enough JSON for the external-port protocol and safetensors headers:
// objects, arrays, strings (with the standard escapes), integers, booleans, null.
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
  std::string text;
  std::vector<Json> items;
  std::map<std::string, Json> fields;

  const Json& at(const std::string& key) const {
    auto found = fields.find(key);
    if (kind != Object || found == fields.end()) throw std::runtime_error("missing field '" + key + "'");
    return found->second;
  }
  bool has(const std::string& key) const { return kind == Object && fields.count(key) > 0; }
  bool is_null() const { return kind == Null; }
  i64 as_int() const {
    if (kind != Int) throw std::runtime_error("expected an integer");
    return integer;
  }
  bool as_bool() const {
    if (kind != Bool) throw std::runtime_error("expected a boolean");
    return boolean;
  }
  const std::string& as_string() const {
    if (kind != String) throw std::runtime_error("expected a string");
    return text;
  }
  std::vector<i64> as_ints() const {
    if (kind != Array) throw std::runtime_error("expected an array");
    std::vector<i64> out;
    for (const Json& v : items) out.push_back(v.as_int());
    return out;
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
  const std::string& s_;
  size_t pos_ = 0;

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
    size_t start = pos_;
    if (s_[pos_] == '-') ++pos_;
    while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    if (start == pos_ || (pos_ < s_.size() && (s_[pos_] == '.' || s_[pos_] == 'e' || s_[pos_] == 'E')))
      throw std::runtime_error("only integers are expected");
    v.kind = Json::Int;
    v.integer = std::stoll(s_.substr(start, pos_ - start));
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
  unsigned hex4() {
    if (pos_ + 4 > s_.size()) throw std::runtime_error("truncated \\u escape");
    unsigned code = std::stoul(s_.substr(pos_, 4), nullptr, 16);
    pos_ += 4;
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
          // A surrogate pair spells one code point past the basic plane.
          if (code >= 0xD800 && code < 0xDC00 && s_.compare(pos_, 2, "\\u") == 0) {
            pos_ += 2;
            unsigned low = hex4();
            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
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
