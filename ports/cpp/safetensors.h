// Reading and writing safetensors files: an 8-byte little-endian header length,
// a JSON header {name: {dtype, shape, data_offsets}, optional __metadata__},
// then the raw little-endian data. Only the dtypes the protocol exchanges (BF16,
// F16, F32 values; I32 top-k indices and masks) are accepted; anything else is an
// error naming the tensor.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "json.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the tensors are read and written in host order, which must be little-endian"
#endif

namespace port {

enum class DType { BF16, F16, F32, I32 };

inline const char* dtype_name(DType d) {
  switch (d) {
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::F32: return "F32";
    case DType::I32: return "I32";
  }
  return "?";
}

inline size_t dtype_size(DType d) { return d == DType::F32 || d == DType::I32 ? 4 : 2; }

// The number of elements of `shape`. A negative dimension is an error, and so is
// a shape whose size in `element_size`-byte elements overflows int64 counting its
// non-zero dimensions only: then every element count, byte count and row stride
// computed from the shape fits, even when a zero dimension makes it empty (a
// [0, 2^32, 2^32] tensor holds nothing, but its rows would be 2^64 elements wide).
inline i64 checked_numel(const std::vector<i64>& shape, size_t element_size) {
  i64 nonzero_bytes = static_cast<i64>(element_size);
  bool empty = false;
  for (i64 d : shape) {
    if (d < 0) throw std::runtime_error("shape " + ints(shape) + " has a negative dimension");
    if (d == 0) empty = true;
    else if (__builtin_mul_overflow(nonzero_bytes, d, &nonzero_bytes))
      throw std::runtime_error("shape " + ints(shape) + " overflows 64-bit sizes");
  }
  return empty ? 0 : nonzero_bytes / static_cast<i64>(element_size);
}

// A dense row-major tensor holding raw element bits.
struct Tensor {
  DType dtype = DType::F32;
  std::vector<i64> shape;
  std::vector<std::uint8_t> data;

  static Tensor zeros(DType dtype, std::vector<i64> shape) {
    Tensor t;
    t.dtype = dtype;
    t.shape = std::move(shape);
    t.data.assign(static_cast<size_t>(t.byte_size()), 0);
    return t;
  }
  // Both throw on a negative or overflowing shape (checked_numel); the product in
  // byte_size cannot overflow once numel has returned.
  i64 numel() const { return checked_numel(shape, dtype_size(dtype)); }
  i64 byte_size() const { return numel() * static_cast<i64>(dtype_size(dtype)); }
  std::uint32_t bits32(i64 i) const {
    std::uint32_t v;
    std::memcpy(&v, data.data() + 4 * i, 4);
    return v;
  }
  std::uint16_t bits16(i64 i) const {
    std::uint16_t v;
    std::memcpy(&v, data.data() + 2 * i, 2);
    return v;
  }
  void set_bits32(i64 i, std::uint32_t v) { std::memcpy(data.data() + 4 * i, &v, 4); }
  void set_bits16(i64 i, std::uint16_t v) { std::memcpy(data.data() + 2 * i, &v, 2); }
  float f32(i64 i) const {
    float v;
    std::memcpy(&v, data.data() + 4 * i, 4);
    return v;
  }
  void set_f32(i64 i, float v) { std::memcpy(data.data() + 4 * i, &v, 4); }
  std::int32_t i32(i64 i) const {
    std::int32_t v;
    std::memcpy(&v, data.data() + 4 * i, 4);
    return v;
  }
  void set_i32(i64 i, std::int32_t v) { std::memcpy(data.data() + 4 * i, &v, 4); }
  std::string describe() const { return dtype_name(dtype) + ints(shape); }
};

using TensorMap = std::map<std::string, Tensor>;

inline DType parse_dtype(const std::string& name, const std::string& where) {
  if (name == "BF16") return DType::BF16;
  if (name == "F16") return DType::F16;
  if (name == "F32") return DType::F32;
  if (name == "I32") return DType::I32;
  throw std::runtime_error(where + ": dtype '" + name + "' is not one of BF16, F16, F32, I32");
}

inline TensorMap read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  in.seekg(0, std::ios::end);
  const std::streamoff end = in.tellg();
  if (end < 0) throw std::runtime_error("cannot find the size of " + path);
  const std::uint64_t file_size = static_cast<std::uint64_t>(end);
  in.seekg(0);
  unsigned char length_bytes[8];
  if (file_size < 8 || !in.read(reinterpret_cast<char*>(length_bytes), 8))
    throw std::runtime_error(path + ": shorter than a safetensors header length");
  std::uint64_t header_len = 0;
  for (int b = 7; b >= 0; --b) header_len = (header_len << 8) | length_bytes[b];
  if (header_len > file_size - 8) throw std::runtime_error(path + ": header length runs past the end of the file");
  std::string header(static_cast<size_t>(header_len), '\0');
  in.read(&header[0], static_cast<std::streamsize>(header_len));
  const std::uint64_t data_size = file_size - 8 - header_len;
  std::vector<std::uint8_t> data(static_cast<size_t>(data_size));
  if (data_size > 0) in.read(reinterpret_cast<char*>(data.data()), static_cast<std::streamsize>(data_size));
  if (!in) throw std::runtime_error(path + ": cannot read its data");

  Json meta;
  try {
    meta = Parser(header).parse();
  } catch (const std::exception& e) {
    throw std::runtime_error(path + ": header is not valid JSON (" + e.what() + ")");
  }
  if (meta.kind != Json::Object) throw std::runtime_error(path + ": header is not a JSON object");
  TensorMap tensors;
  for (const auto& [name, entry] : meta.fields) {
    if (name == "__metadata__") continue;
    const std::string where = path + ": tensor '" + name + "'";
    try {
      Tensor t;
      if (entry.kind != Json::Object) throw std::runtime_error(std::string("is ") + entry.kind_name() + ", not an object");
      t.dtype = parse_dtype(entry.string_at("dtype"), where);
      t.shape = entry.ints_at("shape");
      const i64 needed = t.byte_size();  // throws on a negative or overflowing shape
      const std::vector<i64> offsets = entry.ints_at("data_offsets");
      if (offsets.size() != 2) throw std::runtime_error("data_offsets must be [begin, end]");
      const std::string span = "data_offsets " + ints(offsets);
      if (offsets[0] < 0 || offsets[1] < 0 || static_cast<std::uint64_t>(offsets[1]) > data_size)
        throw std::runtime_error(span + " lie outside the file's " + std::to_string(data_size) + " data bytes");
      if (offsets[1] < offsets[0]) throw std::runtime_error(span + " are out of order");
      const i64 bytes = offsets[1] - offsets[0];  // both in [0, data_size]: no overflow
      if (bytes != needed)
        throw std::runtime_error(span + " span " + std::to_string(bytes) + " bytes, " + t.describe() + " needs " +
                                 std::to_string(needed));
      t.data.assign(data.begin() + offsets[0], data.begin() + offsets[1]);
      tensors.emplace(name, std::move(t));
    } catch (const std::runtime_error& e) {
      const std::string what = e.what();
      throw std::runtime_error(what.rfind(path, 0) == 0 ? what : where + ": " + what);
    }
  }
  return tensors;
}

// Writes `tensors` in the given order, the header padded with spaces to 8 bytes
// (as the reference writer does), through a temporary file renamed into place so
// that a reader never sees half a file.
inline void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, const Tensor*>>& tensors) {
  std::string header = "{";
  std::uint64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = *tensors[i].second;
    const std::uint64_t end = offset + t.data.size();
    header += (i ? "," : "") + quote(tensors[i].first) + ":{\"dtype\":\"" + dtype_name(t.dtype) +
              "\",\"shape\":" + ints(t.shape) + ",\"data_offsets\":[" + std::to_string(offset) + "," +
              std::to_string(end) + "]}";
    offset = end;
  }
  header += "}";
  while (header.size() % 8 != 0) header += ' ';
  const std::string partial = path + ".partial";
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    if (!out) throw std::runtime_error("cannot write " + partial);
    unsigned char length_bytes[8];
    std::uint64_t n = header.size();
    for (int b = 0; b < 8; ++b) length_bytes[b] = static_cast<unsigned char>((n >> (8 * b)) & 0xFF);
    out.write(reinterpret_cast<const char*>(length_bytes), 8);
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    for (const auto& item : tensors)
      out.write(reinterpret_cast<const char*>(item.second->data.data()),
                static_cast<std::streamsize>(item.second->data.size()));
    if (!out) throw std::runtime_error("cannot write " + partial);
  }
  if (std::rename(partial.c_str(), path.c_str()) != 0) throw std::runtime_error("cannot rename into " + path);
}

}  // namespace port
