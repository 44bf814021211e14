// A C++17 reference port of the per-request MLA chunk planner (SPEC section 1b),
// the merge of attention partials and the prefill context loop (SPEC section 1c),
// speaking the harness's external-port protocol (docs/external-port-protocol.md):
// newline-delimited JSON on stdin and stdout, one reply per request, tensors
// exchanged as safetensors files.
//
// Written from the contract, like ports/per_request; it shares no code with vLLM.
// The sparse path (SPEC 1d: sparse workspace, route, mask shapes, mask builder,
// remap) is sparse.inc.
// The merge is bit-exact with the oracle's Triton kernel as Triton's interpreter
// runs it on a CPU: see merge.h, float32_math.h and float_casts.h for what that takes.
// Build: g++ -O2 -std=c++17 -ffp-contract=off -o build/cpp-port ports/cpp/per_request_port.cpp
#include <algorithm>
#include <cstdint>
#include <iostream>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "float32_math.h"
#include "float_casts.h"
#include "json.h"
#include "merge.h"
#include "safetensors.h"

namespace {

using port::i64;
using port::ints;
using port::Json;
using port::Parser;
using port::quote;

// [[value, count], ...] for one chunk-local request index per gathered row.
std::string run_lengths(const std::vector<i64>& rows_per_request) {
  std::string out = "[";
  bool first = true;
  for (size_t r = 0; r < rows_per_request.size(); ++r) {
    if (rows_per_request[r] == 0) continue;
    out += (first ? "" : ",") + std::string("[") + std::to_string(r) + "," + std::to_string(rows_per_request[r]) + "]";
    first = false;
  }
  return out + "]";
}

// Callers pass lists whose totals planner_ints bounded, so no sum overflows.
std::vector<i64> prefix_sums(const std::vector<i64>& v) {
  std::vector<i64> out{0};
  for (i64 x : v) out.push_back(out.back() + x);
  return out;
}

// ---------------------------------------------------------------------------
// Checked input: sizes and lengths the planner and workspace_size accept.
// ---------------------------------------------------------------------------

// The largest length, size or total they take: far above any real batch (the
// harness caps a case at 2^26 context rows and a workspace at 2^22), and low
// enough that no sum or product they form from accepted input overflows int64.
constexpr i64 kPlannerLimit = i64{1} << 40;
constexpr const char* kPlannerLimitText = "2^40";

std::string range_text(i64 minimum) { return "[" + std::to_string(minimum) + ", " + kPlannerLimitText + "]"; }

// The integer field `key` of `c`, in [minimum, kPlannerLimit]; `fallback` when absent, if given.
i64 planner_int(const Json& c, const std::string& key, i64 minimum, std::optional<i64> fallback = std::nullopt) {
  const i64 value = fallback && !c.has(key) ? *fallback : c.int_at(key);
  if (value < minimum || value > kPlannerLimit)
    throw std::runtime_error("field '" + key + "' is " + std::to_string(value) + ", outside " + range_text(minimum));
  return value;
}

// The integer field `key` of `c`, at least `minimum`, read as kPlannerLimit past it:
// for a size whose exact value past the limit cannot change the answer.
i64 capped_int(const Json& c, const std::string& key, i64 minimum) {
  const i64 value = c.int_at(key);
  if (value < minimum)
    throw std::runtime_error("field '" + key + "' is " + std::to_string(value) + ", below " + std::to_string(minimum));
  return std::min(value, kPlannerLimit);
}

// The integer list `key` of `c`: each entry and their total in [minimum, kPlannerLimit].
std::vector<i64> planner_ints(const Json& c, const std::string& key, i64 minimum) {
  const std::vector<i64> values = c.ints_at(key);
  i64 total = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i] < minimum || values[i] > kPlannerLimit)
      throw std::runtime_error(key + "[" + std::to_string(i) + "] is " + std::to_string(values[i]) + ", outside " +
                               range_text(minimum));
    total += values[i];  // at most kPlannerLimit before adding one more in range: no overflow
    if (total > kPlannerLimit) throw std::runtime_error(key + " totals more than " + kPlannerLimitText);
  }
  return values;
}

// a * b for positive a, b; an error naming `what` when it overflows int64.
i64 checked_product(i64 a, i64 b, const std::string& what) {
  i64 product;
  if (__builtin_mul_overflow(a, b, &product)) throw std::runtime_error(what + " overflows 64-bit integers");
  return product;
}

// lcm(a, b) for positive a, b; std::lcm's overflow would be undefined.
i64 checked_lcm(i64 a, i64 b, const std::string& what) { return checked_product(a / std::gcd(a, b), b, what); }

// ---------------------------------------------------------------------------
// The planner (SPEC section 1b).
// ---------------------------------------------------------------------------
struct Geometry {
  i64 budget, alignment, max_span, world, interleave;

  // Sizes must lie in [1, kPlannerLimit] (planner_int checks them). A workspace
  // of at least one alignment unit then bounds the alignment, and so the DCP
  // stride, by kPlannerLimit, which keeps padded() and cost() within int64.
  static Geometry make(i64 workspace, i64 block, bool align, i64 world, i64 interleave) {
    if (block < 1 || world < 1 || interleave < 1)
      throw std::runtime_error("block_size, dcp_world_size and cp_kv_cache_interleave_size must be at least 1");
    i64 alignment = align ? block : 1;
    i64 budget = workspace;
    if (world > 1) {
      const std::string unit = "the alignment unit lcm(block, dcp_world_size * cp_kv_cache_interleave_size)";
      alignment = checked_lcm(alignment, checked_product(world, interleave, unit), unit);
      budget = workspace / world;
    }
    i64 max_span = workspace / alignment * alignment;
    if (max_span <= 0)
      throw std::runtime_error("workspace of " + std::to_string(workspace) + " rows is below one alignment unit (" +
                               std::to_string(alignment) + " rows)");
    return {budget, alignment, max_span, world, interleave};
  }
  // Rows one rank holds of the first `rows` context rows.
  i64 padded(i64 rows) const {
    if (world <= 1) return rows;
    i64 stride = interleave * world;
    return (rows + stride - 1) / stride * interleave;
  }
  i64 cost(i64 start, i64 length) const { return padded(start + length) - padded(start); }
};

struct Span { i64 start, length; };
struct Planned { i64 first; std::vector<Span> spans; };

// The longest aligned prefix, strictly shorter than what remains, within max_span, that fits.
i64 largest_split(const Geometry& g, i64 start, i64 remaining, i64 free_rows) {
  i64 longest = std::min(g.max_span, (remaining - 1) / g.alignment * g.alignment);
  i64 lo = 0, hi = longest / g.alignment;
  while (lo < hi) {
    i64 mid = (lo + hi + 1) / 2;
    if (g.cost(start, mid * g.alignment) <= free_rows) lo = mid; else hi = mid - 1;
  }
  return lo * g.alignment;
}

std::vector<Planned> plan(const std::vector<i64>& context, const Geometry& g) {
  std::vector<Planned> chunks;
  size_t request = 0;
  i64 offset = 0;
  while (request < context.size()) {
    if (context[request] == 0) { ++request; continue; }
    Planned chunk{static_cast<i64>(request), {}};
    i64 used = 0;
    while (request < context.size() && context[request] > 0) {
      i64 remaining = context[request] - offset;
      i64 need = g.cost(offset, remaining);
      if (used + need <= g.budget) {
        chunk.spans.push_back({offset, remaining});
        used += need;
        ++request;
        offset = 0;
        continue;
      }
      i64 cut = largest_split(g, offset, remaining, g.budget - used);
      if (cut > 0) {
        chunk.spans.push_back({offset, cut});
        offset += cut;
      }
      break;
    }
    if (chunk.spans.empty()) throw std::runtime_error("planner made no progress");
    chunks.push_back(std::move(chunk));
  }
  return chunks;
}

std::vector<i64> rank_context_lens(i64 context, i64 world, i64 interleave) {
  i64 stride = world * interleave;
  i64 rounds = context / stride, tail = context - rounds * stride;
  std::vector<i64> out;
  for (i64 rank = 0; rank < world; ++rank)
    out.push_back(rounds * interleave + std::min(std::max<i64>(tail - rank * interleave, 0), interleave));
  return out;
}

std::string layout_json(const Json& c) {
  const std::vector<i64> context = planner_ints(c, "context_lens", 0), query = planner_ints(c, "query_lens", 0);
  if (context.size() != query.size())
    throw std::runtime_error("context_lens has " + std::to_string(context.size()) + " entries, query_lens " +
                             std::to_string(query.size()));
  const i64 world = planner_int(c, "dcp_world_size", 1, 1);
  const i64 interleave = planner_int(c, "cp_kv_cache_interleave_size", 1, 1);
  const bool align = !c.has("align_to_block") || c.bool_at("align_to_block");
  Geometry g = Geometry::make(planner_int(c, "workspace_size", 1), planner_int(c, "block_size", 1), align, world,
                              interleave);
  // As ports/per_request does: a batch without context, an empty batch included,
  // has no chunked-context metadata at all.
  if (std::all_of(context.begin(), context.end(), [](i64 rows) { return rows == 0; }))
    return "{\"chunks\":[],\"empty_token_slices\":[]}";
  std::vector<i64> qsl = prefix_sums(query);

  std::ostringstream out;
  out << "{\"chunks\":[";
  std::vector<Planned> chunks = plan(context, g);
  for (size_t index = 0; index < chunks.size(); ++index) {
    const Planned& p = chunks[index];
    i64 first = p.first, end = p.first + static_cast<i64>(p.spans.size());
    std::vector<i64> starts, lens, local_qsl, local_starts, local_lens;
    for (const Span& s : p.spans) {
      starts.push_back(s.start);
      lens.push_back(s.length);
      local_starts.push_back(g.padded(s.start));
      local_lens.push_back(g.cost(s.start, s.length));
    }
    for (i64 r = first; r <= end; ++r) local_qsl.push_back(qsl[r] - qsl[first]);
    i64 max_query = 0;
    for (i64 r = first; r < end; ++r) max_query = std::max(max_query, query[r]);
    bool sharded = world > 1;
    out << (index ? "," : "") << "{"
        << "\"index\":" << index << ",\"request_start\":" << first << ",\"request_end\":" << end
        << ",\"token_start\":" << qsl[first] << ",\"token_end\":" << qsl[end]
        << ",\"continuation_token_end\":" << qsl[first + 1]
        << ",\"is_continuation\":" << (starts[0] > 0 ? "true" : "false")
        << ",\"num_context_tokens\":" << std::accumulate(lens.begin(), lens.end(), i64{0})
        << ",\"query_start_loc\":" << ints(local_qsl) << ",\"max_query_len\":" << max_query
        << ",\"cu_seq_lens\":" << ints(prefix_sums(lens))
        << ",\"starts\":" << ints(sharded ? local_starts : starts)  // the gather takes local starts under DCP
        << ",\"seq_lens\":" << ints(lens) << ",\"max_seq_len\":" << *std::max_element(lens.begin(), lens.end())
        << ",\"token_to_seq\":" << run_lengths(lens);
    if (sharded) {
      out << ",\"local_starts\":" << ints(local_starts) << ",\"padded_local_seq_lens\":" << ints(local_lens)
          << ",\"padded_local_cu_seq_lens\":" << ints(prefix_sums(local_lens))
          << ",\"padded_local_token_to_seq\":" << run_lengths(local_lens) << ",\"local_context_lens_allranks\":[";
      for (i64 r = first; r < end; ++r) out << (r > first ? "," : "") << ints(rank_context_lens(context[r], world, interleave));
      out << "],\"num_local_context_tokens\":" << std::accumulate(local_lens.begin(), local_lens.end(), i64{0});
    } else {
      out << ",\"local_starts\":null,\"padded_local_seq_lens\":null,\"padded_local_cu_seq_lens\":null"
          << ",\"padded_local_token_to_seq\":null,\"local_context_lens_allranks\":null,\"num_local_context_tokens\":null";
    }
    out << "}";
  }
  out << "],\"empty_token_slices\":[";
  bool first_slice = true;
  for (size_t r = 0; r < context.size(); ++r) {
    if (context[r] != 0) continue;
    out << (first_slice ? "" : ",") << "[" << qsl[r] << "," << qsl[r + 1] << "]";
    first_slice = false;
  }
  out << "]}";
  return out.str();
}

// The dense workspace: min(max(8 * max_model_len, 4 * max_num_seqs * block), 65536),
// at least one alignment unit, rounded up to it. No max_num_seqs * block floor.
i64 workspace_size(const Json& c) {
  constexpr i64 kDenseWorkspaceCap = 65536;
  const i64 block = planner_int(c, "block_size", 1);
  const i64 world = planner_int(c, "dcp_world_size", 1, 1);
  const i64 interleave = planner_int(c, "cp_kv_cache_interleave_size", 1, 1);
  const std::string unit_name = "the alignment unit lcm(block, dcp_world_size * cp_kv_cache_interleave_size)";
  const i64 unit = world > 1 ? checked_lcm(block, checked_product(world, interleave, unit_name), unit_name) : block;
  if (unit > kPlannerLimit)
    throw std::runtime_error("alignment unit " + std::to_string(unit) + " exceeds " + kPlannerLimitText);
  // 4 * max_num_seqs * block may pass int64 for sizes in range; past the cap its
  // exact value does not matter, so an overflow reads as the cap.
  i64 page_rows;
  // max_num_seqs and max_model_len past 2^40 give the cap as surely as at 2^40.
  if (__builtin_mul_overflow(4 * capped_int(c, "max_num_seqs", 1), block, &page_rows)) page_rows = kDenseWorkspaceCap;
  i64 wanted = std::min(std::max(8 * capped_int(c, "max_model_len", 1), page_rows), kDenseWorkspaceCap);
  wanted = std::max(wanted, unit);
  return (wanted + unit - 1) / unit * unit;
}

#include "sparse.inc"

std::string reply(i64 id, const std::string& body) { return "{\"id\":" + std::to_string(id) + ",\"ok\":true" + body + "}"; }

// Not a protocol level: the element-wise pieces of the merge on given inputs, so
// that tests can hold them against numpy and Triton's interpreter bit for bit.
// Inputs: `x` F32 [n], `half_bf16` BF16 [m], `half_fp16` F16 [m]. Outputs: `exp`,
// `log` (F32 [n]), `to_bf16` (BF16 [n]), `to_fp16` (F16 [n]), `bf16_to_fp32`,
// `fp16_to_fp32` (F32 [m]). The reply names the exp/log path in use.
std::string numerics_selftest(const Json& request) {
  using namespace port;
  const std::string& inputs_path = request.string_at("inputs");
  const TensorMap in = read_safetensors(inputs_path);
  const Tensor& x = tensor(in, "x", inputs_path);
  const Tensor& half_bf16 = tensor(in, "half_bf16", inputs_path);
  const Tensor& half_fp16 = tensor(in, "half_fp16", inputs_path);
  expect_fp32(x, "x");
  if (half_bf16.dtype != DType::BF16 || half_fp16.dtype != DType::F16)
    throw std::runtime_error("half_bf16 must be BF16 and half_fp16 F16");
  const i64 n = x.numel(), m = half_bf16.numel();
  if (half_fp16.numel() != m) throw std::runtime_error("half_bf16 and half_fp16 differ in size");
  Tensor exp_out = Tensor::zeros(DType::F32, {n}), log_out = Tensor::zeros(DType::F32, {n});
  Tensor to_bf16 = Tensor::zeros(DType::BF16, {n}), to_fp16 = Tensor::zeros(DType::F16, {n});
  Tensor bf16_to_fp32 = Tensor::zeros(DType::F32, {m}), fp16_to_fp32 = Tensor::zeros(DType::F32, {m});
  for (i64 i = 0; i < n; ++i) {
    exp_out.set_f32(i, oracle_exp(x.f32(i)));
    log_out.set_f32(i, oracle_log(x.f32(i)));
    store_from_fp32(to_bf16, i, x.f32(i));
    store_from_fp32(to_fp16, i, x.f32(i));
  }
  for (i64 i = 0; i < m; ++i) {
    bf16_to_fp32.set_f32(i, load_as_fp32(half_bf16, i));
    fp16_to_fp32.set_f32(i, load_as_fp32(half_fp16, i));
  }
  write_safetensors(request.string_at("outputs"),
                    {{"exp", &exp_out}, {"log", &log_out}, {"to_bf16", &to_bf16}, {"to_fp16", &to_fp16},
                     {"bf16_to_fp32", &bf16_to_fp32}, {"fp16_to_fp32", &fp16_to_fp32}});
  return std::string(",\"float32_math\":\"") + float32_math_name(float32_math()) + "\"";
}

}  // namespace

int main() {
  std::ios::sync_with_stdio(false);
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    i64 id = 0;
    try {
      Json request = Parser(line).parse();
      id = request.has("id") ? request.int_at("id") : 0;
      const std::string op = request.string_at("op");
      if (op == "hello") {
        std::cout << reply(id, ",\"protocol\":1,\"name\":\"cpp-per-request\",\"version\":\"1.0\",\"levels\":[\"layout\",\"merge\",\"prefill\",\"sparse-layout\",\"sparse-mask\",\"sparse-prefill\"],\"ops\":[\"layout\",\"workspace_size\",\"merge\",\"prefill\",\"sparse_layout\",\"sparse_workspace_size\",\"topk_mask\",\"topk_remap\",\"sparse_prefill\"]");
      } else if (op == "layout") {
        std::cout << reply(id, ",\"layout\":" + layout_json(request.at("case")));
      } else if (op == "workspace_size") {
        std::cout << reply(id, ",\"workspace_size\":" + std::to_string(workspace_size(request.at("config"))));
      } else if (op == "merge") {
        port::merge_op(request);
        std::cout << reply(id, "");
      } else if (op == "prefill") {
        port::prefill_op(request);
        std::cout << reply(id, "");
      } else if (op == "sparse_prefill") {
        // After b38e111d3e the masked loop folds its chunks as the dense loop
        // does (SPEC 1d): the same fold and final merge over this port's own
        // layout; the partials were computed on this port's own selections
        // (its topk_remap / topk_mask answers), sent along for the record.
        const std::string route = request.string_at("route");
        if (route != "dense-mha" && route != "masked-mha")
          throw std::runtime_error("sparse_prefill on route " + route + ", which has no prefill loop here");
        port::prefill_op(request);
        std::cout << reply(id, "");
      } else if (op == "sparse_layout") {
        std::cout << reply(id, ",\"sparse_layout\":" + sparse_layout_json(request.at("case")));
      } else if (op == "sparse_workspace_size") {
        std::cout << reply(id, ",\"workspace_size\":" + std::to_string(sparse_workspace_size(request.at("config"))));
      } else if (op == "topk_mask") {
        topk_mask_op(request);
        std::cout << reply(id, "");
      } else if (op == "topk_remap") {
        topk_remap_op(request);
        std::cout << reply(id, "");
      } else if (op == "numerics_selftest") {
        std::cout << reply(id, numerics_selftest(request));
      } else if (op == "bye") {
        return 0;
      } else {
        std::cout << "{\"id\":" << id << ",\"ok\":false,\"error\":" << quote("unsupported op '" + op + "'") << "}";
      }
    } catch (const std::exception& e) {
      std::cout << "{\"id\":" << id << ",\"ok\":false,\"error\":" << quote(e.what()) << "}";
    }
    std::cout << "\n" << std::flush;
  }
  return 0;
}
