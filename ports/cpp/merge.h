// The merge of two attention partials (SPEC section 1c) and the prefill context
// loop built on it, bit for bit as the oracle's Triton kernel computes them on a
// CPU under Triton's interpreter (float32 numpy arithmetic, one rounding per
// operation, in the kernel's order; see float32_math.h and float_casts.h).
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "float32_math.h"
#include "float_casts.h"
#include "json.h"
#include "safetensors.h"

namespace port {

// Element `i` of a value tensor as the kernel sees it once promoted to fp32.
inline float load_as_fp32(const Tensor& t, i64 i) {
  switch (t.dtype) {
    case DType::F32: return t.f32(i);
    case DType::BF16: return bits_float(interpreter_bf16_to_fp32(t.bits16(i)));
    case DType::F16: return bits_float(numpy_fp16_to_fp32(t.bits16(i)));
    case DType::I32: break;
  }
  throw std::runtime_error("an I32 tensor is not a value tensor");
}

// Stores an fp32 result into element `i` the way the kernel's tl.store casts it.
inline void store_from_fp32(Tensor& t, i64 i, float v) {
  switch (t.dtype) {
    case DType::F32: t.set_f32(i, v); return;
    case DType::BF16: t.set_bits16(i, interpreter_fp32_to_bf16(float_bits(v))); return;
    case DType::F16: t.set_bits16(i, numpy_fp32_to_fp16(float_bits(v))); return;
    case DType::I32: break;
  }
  throw std::runtime_error("an I32 tensor is not a value tensor");
}

// Copies element `from_index` of `from` into element `to_index` of `to` (same dtype), bits unchanged.
inline void copy_element(const Tensor& from, i64 from_index, Tensor& to, i64 to_index) {
  const size_t size = dtype_size(from.dtype);
  std::memcpy(to.data.data() + size * to_index, from.data.data() + size * from_index, size);
}

// numpy's float32 maximum: a NaN in the first operand wins, then one in the
// second, and of two equal values (+0 and -0) the second.
inline float numpy_maximum(float a, float b) {
  if (a != a) return a;
  if (b != b) return b;
  return a > b ? a : b;
}

// A partial: values [tokens, heads, >= dim] (dim lanes used) and LSE [heads, tokens] fp32.
struct PartialView {
  const Tensor* values;
  const Tensor* lse;
  i64 token_offset;  // first token of the view within the tensors
};

// Merges `prefix` and `suffix` over `tokens` tokens and `heads` heads, the first
// `dim` lanes of each, into `out` (values, lanes [0, dim) of each row, starting at
// token `out_offset`) and `out_lse`. Tokens at or past `tokens_with_context` copy
// the suffix (values and LSE) unchanged and never read the prefix. `out` may be
// the prefix's own tensors at the same offset: each element is read before it is
// written.
inline void merge_partials(const PartialView& prefix, const PartialView& suffix, i64 tokens, i64 heads, i64 dim,
                           i64 tokens_with_context, Tensor& out, Tensor& out_lse, i64 out_offset) {
  const float inf = std::numeric_limits<float>::infinity();
  const i64 prefix_width = prefix.values->shape[2], suffix_width = suffix.values->shape[2];
  const i64 out_width = out.shape[2];
  const i64 prefix_lse_tokens = prefix.lse->shape[1], suffix_lse_tokens = suffix.lse->shape[1];
  const i64 out_lse_tokens = out_lse.shape[1];
  std::vector<float> p_values(static_cast<size_t>(dim)), s_values(static_cast<size_t>(dim));
  for (i64 token = 0; token < tokens; ++token) {
    const i64 pt = prefix.token_offset + token, st = suffix.token_offset + token, ot = out_offset + token;
    for (i64 head = 0; head < heads; ++head) {
      const i64 p_row = (pt * heads + head) * prefix_width;
      const i64 s_row = (st * heads + head) * suffix_width;
      const i64 o_row = (ot * heads + head) * out_width;
      const i64 s_lse_at = head * suffix_lse_tokens + st;
      const i64 o_lse_at = head * out_lse_tokens + ot;
      if (token >= tokens_with_context) {
        out_lse.set_bits32(o_lse_at, suffix.lse->bits32(s_lse_at));
        for (i64 lane = 0; lane < dim; ++lane) copy_element(*suffix.values, s_row + lane, out, o_row + lane);
        continue;
      }
      float p_lse = prefix.lse->f32(head * prefix_lse_tokens + pt);
      float s_lse = suffix.lse->f32(s_lse_at);
      // FlashAttention-2 reports "nothing attended" as +inf; it means -inf.
      if (p_lse == inf) p_lse = -inf;
      if (s_lse == inf) s_lse = -inf;
      const float top = numpy_maximum(p_lse, s_lse);
      const float p_weight = oracle_exp(p_lse - top);
      const float s_weight = oracle_exp(s_lse - top);
      const float total = p_weight + s_weight;
      const bool empty = top == -inf;
      out_lse.set_f32(o_lse_at, empty ? -inf : oracle_log(total) + top);
      // Weights first, then values: never exp() into the values.
      const float p_scale = p_weight / total;
      const float s_scale = s_weight / total;
      for (i64 lane = 0; lane < dim; ++lane) {
        p_values[static_cast<size_t>(lane)] = load_as_fp32(*prefix.values, p_row + lane);
        s_values[static_cast<size_t>(lane)] = load_as_fp32(*suffix.values, s_row + lane);
      }
      for (i64 lane = 0; lane < dim; ++lane) {
        const float p_term = p_values[static_cast<size_t>(lane)] * p_scale;
        const float s_term = s_values[static_cast<size_t>(lane)] * s_scale;
        store_from_fp32(out, o_row + lane, empty ? 0.0f : p_term + s_term);
      }
    }
  }
}

// ---------------------------------------------------------------------------
// The protocol's tensor ops.
// ---------------------------------------------------------------------------

inline const Tensor& tensor(const TensorMap& tensors, const std::string& name, const std::string& path) {
  auto found = tensors.find(name);
  if (found == tensors.end()) throw std::runtime_error(path + ": no tensor '" + name + "'");
  return found->second;
}

inline void expect_shape(const Tensor& t, const std::string& name, const std::vector<i64>& shape) {
  if (t.shape != shape) {
    Tensor wanted;
    wanted.dtype = t.dtype;
    wanted.shape = shape;
    throw std::runtime_error("tensor '" + name + "' is " + t.describe() + ", expected " + wanted.describe());
  }
}

inline void expect_rank(const Tensor& t, const std::string& name, size_t rank) {
  if (t.shape.size() != rank)
    throw std::runtime_error("tensor '" + name + "' is " + t.describe() + ", expected rank " + std::to_string(rank));
}

inline void expect_fp32(const Tensor& t, const std::string& name) {
  if (t.dtype != DType::F32) throw std::runtime_error("tensor '" + name + "' is " + t.describe() + ", expected F32");
}

// The `merge` op (L2): inputs prefix_output, suffix_output [tokens, heads, head_size]
// and prefix_lse, suffix_lse [heads, tokens] fp32; outputs `output` (the partials'
// dtype) and `lse`.
inline void merge_op(const Json& request) {
  const std::string& inputs_path = request.string_at("inputs");
  const TensorMap in = read_safetensors(inputs_path);
  const Tensor& prefix = tensor(in, "prefix_output", inputs_path);
  const Tensor& suffix = tensor(in, "suffix_output", inputs_path);
  const Tensor& prefix_lse = tensor(in, "prefix_lse", inputs_path);
  const Tensor& suffix_lse = tensor(in, "suffix_lse", inputs_path);
  expect_rank(suffix, "suffix_output", 3);
  const i64 tokens = suffix.shape[0], heads = suffix.shape[1], dim = suffix.shape[2];
  expect_shape(prefix, "prefix_output", suffix.shape);
  expect_shape(prefix_lse, "prefix_lse", {heads, tokens});
  expect_shape(suffix_lse, "suffix_lse", {heads, tokens});
  expect_fp32(prefix_lse, "prefix_lse");
  expect_fp32(suffix_lse, "suffix_lse");
  i64 with_context = tokens;
  if (request.has("prefill_tokens_with_context") && !request.at("prefill_tokens_with_context").is_null())
    with_context = request.int_at("prefill_tokens_with_context");
  Tensor output = Tensor::zeros(suffix.dtype, suffix.shape);
  Tensor lse = Tensor::zeros(DType::F32, {heads, tokens});
  merge_partials({&prefix, &prefix_lse, 0}, {&suffix, &suffix_lse, 0}, tokens, heads, dim, with_context, output, lse,
                 0);
  write_safetensors(request.string_at("outputs"), {{"output", &output}, {"lse", &lse}});
}

struct LoopChunk {
  i64 token_start, token_end, continuation_token_end;
  bool is_continuation;
};

// The `prefill` op (L3): the context loop over the port's own layout, folding the
// chunk partials the harness computed, then the final merge with the new-token partial.
inline void prefill_op(const Json& request) {
  const std::string& inputs_path = request.string_at("inputs");
  const TensorMap in = read_safetensors(inputs_path);
  const Json& layout = request.at("layout");
  const i64 v_head_dim = request.int_at("v_head_dim");
  const Tensor& suffix = tensor(in, "suffix_output", inputs_path);
  const Tensor& suffix_lse = tensor(in, "suffix_lse", inputs_path);
  expect_rank(suffix, "suffix_output", 3);
  const i64 tokens = suffix.shape[0], heads = suffix.shape[1];
  if (v_head_dim <= 0 || v_head_dim > suffix.shape[2])
    throw std::runtime_error("v_head_dim " + std::to_string(v_head_dim) + " does not fit suffix_output " +
                             suffix.describe());
  expect_shape(suffix_lse, "suffix_lse", {heads, tokens});
  expect_fp32(suffix_lse, "suffix_lse");
  const std::string& outputs_path = request.string_at("outputs");

  std::vector<LoopChunk> chunks;
  for (const Json& c : layout.array_at("chunks"))
    chunks.push_back({c.int_at("token_start"), c.int_at("token_end"), c.int_at("continuation_token_end"),
                      c.bool_at("is_continuation")});
  std::vector<std::pair<i64, i64>> empty_slices;
  for (const Json& s : layout.array_at("empty_token_slices")) {
    std::vector<i64> bounds = s.as_ints();
    if (bounds.size() != 2 || bounds[0] < 0 || bounds[1] < bounds[0] || bounds[1] > tokens)
      throw std::runtime_error("layout has an empty token slice outside [0, " + std::to_string(tokens) + ")");
    empty_slices.emplace_back(bounds[0], bounds[1]);
  }

  if (chunks.empty()) {
    write_safetensors(outputs_path, {{"output", &suffix}, {"lse", &suffix_lse}});
    return;
  }

  std::vector<const Tensor*> chunk_values, chunk_lses;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const LoopChunk& c = chunks[i];
    if (c.token_start < 0 || c.token_end < c.token_start || c.token_end > tokens ||
        c.continuation_token_end < c.token_start || c.continuation_token_end > c.token_end)
      throw std::runtime_error("layout chunk " + std::to_string(i) + " has token bounds outside [0, " +
                               std::to_string(tokens) + "]");
    const std::string out_name = "chunk_output." + std::to_string(i), lse_name = "chunk_lse." + std::to_string(i);
    const Tensor& values = tensor(in, out_name, inputs_path);
    const Tensor& lse = tensor(in, lse_name, inputs_path);
    expect_rank(values, out_name, 3);
    expect_shape(values, out_name, {c.token_end - c.token_start, heads, values.shape[2]});
    if (values.shape[2] < v_head_dim)
      throw std::runtime_error("tensor '" + out_name + "' is narrower than v_head_dim " + std::to_string(v_head_dim));
    if (i > 0 && (values.shape[2] != chunk_values[0]->shape[2] || values.dtype != chunk_values[0]->dtype))
      throw std::runtime_error("tensor '" + out_name + "' differs in dtype or width from chunk_output.0");
    expect_shape(lse, lse_name, {heads, c.token_end - c.token_start});
    expect_fp32(lse, lse_name);
    chunk_values.push_back(&values);
    chunk_lses.push_back(&lse);
  }
  const i64 context_width = chunk_values[0]->shape[2];

  Tensor context_values, context_lse;
  if (chunks.size() == 1 && empty_slices.empty()) {
    // One chunk covering every token: its partial is the context partial as it is.
    if (chunks[0].token_start != 0 || chunks[0].token_end != tokens)
      throw std::runtime_error("the layout's only chunk does not cover every token");
    context_values = *chunk_values[0];
    context_lse = *chunk_lses[0];
  } else {
    // Zeros, not uninitialised memory: a token that no chunk and no empty slice
    // covers (a layout with a gap) keeps output 0 and LSE 0, and the harness
    // judges that layout; nothing here ever reads an unwritten byte.
    context_values = Tensor::zeros(chunk_values[0]->dtype, {tokens, heads, context_width});
    context_lse = Tensor::zeros(DType::F32, {heads, tokens});
    const float neg_inf = -std::numeric_limits<float>::infinity();
    for (const auto& [start, stop] : empty_slices)
      for (i64 head = 0; head < heads; ++head)
        for (i64 token = start; token < stop; ++token) context_lse.set_f32(head * tokens + token, neg_inf);
    const size_t element = dtype_size(context_values.dtype);
    const size_t row_bytes = static_cast<size_t>(heads * context_width) * element;
    for (size_t i = 0; i < chunks.size(); ++i) {
      const LoopChunk& c = chunks[i];
      const Tensor& values = *chunk_values[i];
      const Tensor& lse = *chunk_lses[i];
      const i64 chunk_tokens = c.token_end - c.token_start;
      i64 first_visit = c.token_start;
      if (c.is_continuation) {
        // The continued request's tokens: fold this chunk into what earlier chunks left.
        first_visit = c.continuation_token_end;
        const i64 merged = first_visit - c.token_start;
        merge_partials({&context_values, &context_lse, c.token_start}, {&values, &lse, 0}, merged, heads,
                       context_width, merged, context_values, context_lse, c.token_start);
      }
      // Every other token is visited for the first time: write the chunk's partial.
      const i64 done = first_visit - c.token_start;
      const size_t written_bytes = static_cast<size_t>(c.token_end - first_visit) * row_bytes;
      // Skipped when empty: an empty tensor's data() may be null, and memcpy from null is undefined even for 0 bytes.
      if (written_bytes > 0)
        std::memcpy(context_values.data.data() + static_cast<size_t>(first_visit) * row_bytes,
                    values.data.data() + static_cast<size_t>(done) * row_bytes, written_bytes);
      for (i64 head = 0; head < heads; ++head)
        for (i64 token = done; token < chunk_tokens; ++token)
          context_lse.set_bits32(head * tokens + c.token_start + token, lse.bits32(head * chunk_tokens + token));
    }
  }

  Tensor output = Tensor::zeros(suffix.dtype, {tokens, heads, v_head_dim});
  Tensor lse = Tensor::zeros(DType::F32, {heads, tokens});
  merge_partials({&context_values, &context_lse, 0}, {&suffix, &suffix_lse, 0}, tokens, heads, v_head_dim, tokens,
                 output, lse, 0);
  write_safetensors(outputs_path, {{"context_output", &context_values},
                                   {"context_lse", &context_lse},
                                   {"output", &output},
                                   {"lse", &lse}});
}

}  // namespace port
