// The lean Llama forward's decoding step in one call: the layer loop, with the small operations between
// the products (RMS norms, rotary, cache writes, attention, SiLU) as fused loops. The products are the
// engine's own over a file's blocks (blocks.h) and bf16 weights (tiles.h), or torch's.
//
// Every row's arithmetic depends only on that row and the cache before it, in a fixed order (no
// reduction is split by the number of rows, no thread splits a sum), so a position gets the same bits
// decoded alone and inside a verify pass, and a tree node the same bits as the chain through it.

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <cmath>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <type_traits>
#include <vector>

#include "blocks.h"
#include "simd.h"
#include "tiles.h"

using at::Tensor;

namespace {

constexpr int LANES = 16;  // partial sums of a dot product or a sum of squares, combined in a fixed order

template <typename T>
inline float f(T v) { return static_cast<float>(v); }

template <typename T>
inline float sum_squares(const T* a, int64_t n) {
  float acc[LANES] = {0};
  int64_t i = 0;
  for (; i + LANES <= n; i += LANES)
    for (int l = 0; l < LANES; ++l) { float v = f(a[i + l]); acc[l] += v * v; }
  for (; i < n; ++i) { float v = f(a[i]); acc[i % LANES] += v * v; }
  for (int w = LANES / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0];
}

// transformers' RMSNorm: normalise in fp32, round to the model's dtype, scale by the weight
template <typename T>
void rms_rows(const T* x, const T* w, T* out, int64_t rows, int64_t d, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * d;
    float inv = 1.0f / std::sqrt(sum_squares(xr, d) / static_cast<float>(d) + eps);
    for (int64_t j = 0; j < d; ++j) out[r * d + j] = static_cast<T>(f(w[j]) * f(static_cast<T>(f(xr[j]) * inv)));
  }
}

// Gemma's RMSNorm: normalise in fp32, scale by the fp32 weight (its 1 + w), round once to the model's dtype
template <typename T>
void rms_rows_wide(const T* x, const float* w, T* out, int64_t rows, int64_t d, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * d;
    float inv = 1.0f / std::sqrt(sum_squares(xr, d) / static_cast<float>(d) + eps);
    for (int64_t j = 0; j < d; ++j) out[r * d + j] = static_cast<T>(w[j] * (f(xr[j]) * inv));
  }
}

// rms_rows over x's last dimension (x contiguous) into `out`, made when its shape is not x's (a pass's buffer);
// `wide`: rms_rows_wide with an fp32 weight
template <typename T>
Tensor& rms_into(const Tensor& x, const Tensor& w, double eps, Tensor& out, bool wide = false) {
  if (!out.defined() || out.sizes() != x.sizes() || out.scalar_type() != x.scalar_type()) out = at::empty_like(x);
  const int64_t d = x.size(-1), rows = x.numel() / d;
  if (wide) {
    TORCH_CHECK(w.scalar_type() == at::kFloat && w.numel() == d, "a wide norm's weight: fp32, one per element");
    rms_rows_wide<T>(x.data_ptr<T>(), w.data_ptr<float>(), out.data_ptr<T>(), rows, d, static_cast<float>(eps));
  } else {
    rms_rows<T>(x.data_ptr<T>(), w.data_ptr<T>(), out.data_ptr<T>(), rows, d, static_cast<float>(eps));
  }
  return out;
}

Tensor rms_norm(const Tensor& x, const Tensor& w, double eps, bool wide = false) {
  const Tensor xc = x.contiguous();
  Tensor out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, xc.scalar_type(), "rms_norm",
                                  [&] { rms_into<scalar_t>(xc, w, eps, out, wide); });
  return out;
}

constexpr int64_t PROMPT_ROWS = 64;  // as cpu/products.py's: calls of this many rows are prompts, not steps

// A product y = x @ W^T (+ b) in one of the engine's forms (cpu/products.py).
struct Product {
  // 0: F.linear, 1: oneDNN prepacked, 2: torch's int4 kernel, 3: the file's blocks (blocks.h), 4: bf16 tiles (tiles.h),
  // 5: bf16 tiles whose prompts take F.linear over the weight as it is, 6: bf16 tiles alone (prompts unpack them)
  int64_t kind;
  // weight | packed weight | int4 codes and scale-and-zero | tiled blocks and their parts | tiles and the packed weight
  // | tiles and the weight | tiles and an (outputs, 0) tensor that gives their number
  Tensor a, b;
  c10::optional<Tensor> bias;
  // A call of fewer rows than `min_rows` runs as that many, the first row repeated: products whose one-row
  // kernel rounds differently from their multi-row one (F.linear, oneDNN's longer sums) then give a lone
  // row its verify bits (quant.in_rows).
  int64_t min_rows;
  Tensor operator()(const Tensor& x) const {
    int64_t t = x.size(0);
    if (t >= min_rows) return run(x);
    return run(at::cat({x, x.narrow(0, 0, 1).expand({min_rows - t, x.size(1)})})).narrow(0, 0, t);
  }
  Tensor prepacked(const Tensor& x, const Tensor& w) const {  // oneDNN's product over its own layout of w
    static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
    std::vector<c10::IValue> stack{x, w, bias ? c10::IValue(*bias) : c10::IValue(), c10::IValue("none"),
                                   c10::IValue(c10::List<c10::optional<at::Scalar>>()), c10::IValue("")};
    op.callBoxed(&stack);
    return stack[0].toTensor();
  }
  // The own products' tables, read once where the model is registered: a packed weight's parts (kind 3) and
  // the bias in fp32 (kinds 3 and 4), as blocks::mm and tiles::mm would read them on every call.
  blocks::Parts parts;
  int64_t inputs = 0, outputs = 0;  // kinds 3 and 4
  Tensor bias32;
  void read_tables() {
    if (kind == 3) {
      inputs = blocks::input_size(b, a.numel());
      parts = blocks::read_parts(b, inputs, a.numel());
      outputs = parts.total_cols;
    } else if (kind == 4 || kind == 5 || kind == 6) {
      outputs = b.size(0);
      inputs = a.numel() * 2 / tiles::tiles(outputs) / tiles::CHUNK * 2;
      TORCH_CHECK(a.numel() * 2 == tiles::tiles(outputs) * tiles::tile_bytes(inputs), "bf16 tiles of ", outputs, " outputs");
    }
    if ((kind == 3 || kind == 4 || kind == 5 || kind == 6) && bias) {
      TORCH_CHECK(bias->numel() == outputs, "a bias per output");
      bias32 = bias->to(at::kFloat).contiguous();
    }
  }
  // y = x @ W^T (+ b) into `buf` where the product is the engine's own (the file's blocks; bf16 tiles below a
  // prompt's rows): the same arithmetic as their ops, without a new tensor or reading the tables again; `buf`
  // is (re)made when its shape is not y's. Other forms return a new tensor. x: contiguous, in T.
  template <typename T>
  Tensor into(const Tensor& x, Tensor& buf) const {
    const int64_t t = x.size(0);
    const bool own = (kind == 3 || ((kind == 4 || kind == 5 || kind == 6) && t < PROMPT_ROWS)) && t >= min_rows && t > 0;
    if (!own) return (*this)(x);
    TORCH_CHECK(x.is_contiguous() && x.size(1) == inputs, "a product's input of ", inputs, " columns");
    if (!buf.defined() || buf.size(0) != t || buf.size(1) != outputs || buf.scalar_type() != x.scalar_type())
      buf = at::empty({t, outputs}, x.options());
    const float* bp = bias32.defined() ? bias32.data_ptr<float>() : nullptr;
    if (kind == 3)
      blocks::product<T, T>(x.data_ptr<T>(), t, inputs, a.data_ptr<uint8_t>(), parts, bp, buf.data_ptr<T>());
    else
      tiles::product<T, T>(x.data_ptr<T>(), t, inputs, reinterpret_cast<const uint16_t*>(a.data_ptr<at::BFloat16>()),
                           outputs, bp, buf.data_ptr<T>());
    return buf;
  }
  Tensor run(const Tensor& x) const {
    switch (kind) {
      case 0: return at::linear(x, a, bias);
      case 1: return prepacked(x, a);
      case 3: return blocks::mm(x, a, b, bias, false);
      case 4:  // a prompt's many rows: oneDNN's product, faster there (products.PROMPT_ROWS)
        return x.size(0) >= PROMPT_ROWS ? prepacked(x, b) : tiles::mm(x, a, b.size(0), bias, false);
      case 5:  // the same, b the weight as it is (a GGUF's, where the file keeps it: no prepacked copy)
        return x.size(0) >= PROMPT_ROWS ? at::linear(x, b, bias) : tiles::mm(x, a, b.size(0), bias, false);
      case 6:  // the same over the tiles unpacked for the call (no plain copy of the weight is kept)
        return x.size(0) >= PROMPT_ROWS ? tiles::linear(x, a, b.size(0), bias) : tiles::mm(x, a, b.size(0), bias, false);
      default: {
        Tensor y = at::_weight_int4pack_mm_for_cpu(x, a, 32, b);
        return bias ? y.add_(*bias) : y;
      }
    }
  }
};

struct Layer {
  Product qkv, o, gate_up, down;
  Tensor attn_in, mlp_in;  // the norms before attention and before the MLP, or undefined (OLMo 2: no attn_in)
  Tensor q_norm, k_norm;  // per-head norms of the queries and keys before rotary (Qwen3, Gemma 3), or undefined
  Tensor attn_out, mlp_out;  // norms of the attention's and the MLP's outputs (Gemma), or undefined
  bool rotary = true;  // false: the layer's queries and keys take no rotary (SmolLM3's every fourth layer)
  int64_t window = 0;  // a sliding-window layer sees the keys of the last `window` positions up to its own; 0: all
  int64_t rope_set = 0;  // which of the rotary tables the layer reads (Gemma 3: its local or global base)
};

struct Model {
  std::vector<Layer> layers;
  int64_t n_heads, n_kv, head_dim, inter;
  double eps, scale;
  bool wide_norms = false;  // Gemma's norms: fp32 weights, the rows scaled before rounding (rms_rows_wide)
  bool gelu = false;  // the MLP's gate through GELU (tanh), not SiLU
  double residual = 1.0;  // each attention and MLP output times this before it is added (Granite's multiplier)
  double softcap = 0.0;  // attention scores capped at cap * tanh(score / cap) (Gemma 2); 0: none
};

// A norm tensor given as empty: the layer has none
inline Tensor optional_norm(const Tensor& t) { return t.numel() ? t : Tensor(); }

std::mutex registry_lock;
std::deque<Model> registry;  // a deque: entries stay where they are as others are added

// A model as one table of named fields (cpu/step.py: `register`): per layer, four products (q/k/v, o, gate/up, down)
// as "a", "b", "bias", "kind" and "min_rows", and each of StepLayer's fields by its name (a norm empty where the
// layer has none there); StepModel's numbers by theirs. A field the table lacks is an error naming it.
using Tensors = c10::Dict<std::string, std::vector<Tensor>>;
using Ints = c10::Dict<std::string, std::vector<int64_t>>;
using Numbers = c10::Dict<std::string, double>;

template <typename D>
auto field(const D& table, const char* name) {
  auto it = table.find(name);
  TORCH_CHECK(it != table.end(), "the compiled step's table has no field '", name, "'");
  return it->value();
}

int64_t prepare(const Tensors& tensors, const Ints& ints, const Numbers& numbers) {
  Model m;
  m.n_heads = static_cast<int64_t>(field(numbers, "n_heads"));
  m.n_kv = static_cast<int64_t>(field(numbers, "n_kv"));
  m.head_dim = static_cast<int64_t>(field(numbers, "head_dim"));
  m.inter = static_cast<int64_t>(field(numbers, "inter"));
  m.eps = field(numbers, "eps"), m.scale = field(numbers, "scale");
  m.wide_norms = field(numbers, "wide_norms") != 0, m.gelu = field(numbers, "gelu") != 0;
  m.residual = field(numbers, "residual"), m.softcap = field(numbers, "softcap");
  const auto a = field(tensors, "a"), b = field(tensors, "b"), bias = field(tensors, "bias");
  const auto kinds = field(ints, "kind"), min_rows = field(ints, "min_rows");
  const size_t n_layers = kinds.size() / 4;
  TORCH_CHECK(kinds.size() % 4 == 0 && n_layers > 0, "4 products per layer");
  TORCH_CHECK(a.size() == kinds.size() && b.size() == kinds.size() && bias.size() == kinds.size() &&
                  min_rows.size() == kinds.size(), "a, b, bias and min_rows for every product");
  const auto per_layer = [&](const char* name) {
    auto values = field(tensors, name);
    TORCH_CHECK(values.size() == n_layers, "one '", name, "' per layer");
    return values;
  };
  const auto per_layer_int = [&](const char* name) {
    auto values = field(ints, name);
    TORCH_CHECK(values.size() == n_layers, "one '", name, "' per layer");
    return values;
  };
  const auto attn_in = per_layer("attn_in"), mlp_in = per_layer("mlp_in"), q_norm = per_layer("q_norm"),
             k_norm = per_layer("k_norm"), attn_out = per_layer("attn_out"), mlp_out = per_layer("mlp_out");
  const auto rotary = per_layer_int("rotary"), windows = per_layer_int("window"), rope_sets = per_layer_int("rope_set");
  for (size_t l = 0; l < n_layers; ++l) {
    Product p[4];
    for (size_t i = 0; i < 4; ++i) {
      const size_t j = 4 * l + i;
      p[i] = Product{kinds[j], a[j], b[j], bias[j].numel() ? c10::optional<Tensor>(bias[j]) : c10::nullopt, min_rows[j]};
      p[i].read_tables();
    }
    Layer layer;  // each field by its name in the table (cpu/step.py's StepLayer)
    layer.qkv = p[0], layer.o = p[1], layer.gate_up = p[2], layer.down = p[3];
    layer.attn_in = optional_norm(attn_in[l]), layer.mlp_in = optional_norm(mlp_in[l]);
    layer.q_norm = optional_norm(q_norm[l]), layer.k_norm = optional_norm(k_norm[l]);
    layer.attn_out = optional_norm(attn_out[l]), layer.mlp_out = optional_norm(mlp_out[l]);
    TORCH_CHECK(layer.q_norm.defined() == layer.k_norm.defined(), "per-head norms of both queries and keys, or of neither");
    TORCH_CHECK(!layer.q_norm.defined() || (layer.q_norm.numel() == m.head_dim && layer.k_norm.numel() == m.head_dim) ||
                    (layer.q_norm.numel() == m.n_heads * m.head_dim && layer.k_norm.numel() == m.n_kv * m.head_dim),
                "q/k norms per head of ", m.head_dim, " or over all heads");
    for (const Tensor* w : {&layer.attn_in, &layer.mlp_in, &layer.q_norm, &layer.k_norm, &layer.attn_out, &layer.mlp_out})
      TORCH_CHECK(!w->defined() || !m.wide_norms || w->scalar_type() == at::kFloat, "wide norms' weights are fp32");
    layer.rotary = rotary[l] != 0;
    layer.window = windows[l];
    layer.rope_set = rope_sets[l];
    TORCH_CHECK(layer.window >= 0 && layer.rope_set >= 0, "windows and rotary tables are not negative");
    m.layers.push_back(layer);
  }
  std::lock_guard<std::mutex> g(registry_lock);
  registry.push_back(std::move(m));
  return static_cast<int64_t>(registry.size()) - 1;
}

// Let go of a model's weights (its runner's owner was collected).
void release(int64_t handle) {
  std::lock_guard<std::mutex> g(registry_lock);
  if (handle >= 0 && handle < static_cast<int64_t>(registry.size())) registry[handle].layers.clear();
}

// qkv (T, (H + 2KV) * hd) -> queries (H, T, hd) fp32, rotated and scaled; keys rotated and values into the
// fp32 cache at slots start..start+T-1. pos[r]: the rotary position of row r. `rotary` false: queries and keys as
// they are (a layer without rotary), the same operations with cos 1 and sin 0. rd: the dimensions of a head that
// rotate (the tables' width; hd, or fewer: the rest pass as they are, Phi-4-mini's).
template <typename T>
void rotate_and_store(const T* qkv, const float* cos, const float* sin, const int64_t* pos, float* q, float* kc, float* vc,
                      int64_t t, int64_t h, int64_t kv, int64_t hd, int64_t cap, int64_t start, float scale,
                      bool rotary = true, int64_t rd = 0) {
  if (rd <= 0) rd = hd;
  int64_t half = rd / 2, width = (h + 2 * kv) * hd;
  for (int64_t r = 0; r < t; ++r) {
    const float* c = cos + pos[r] * rd;
    const float* s = sin + pos[r] * rd;  // sin with its first half negated: rotate_half folded in
    const T* row = qkv + r * width;
    for (int64_t head = 0; head < h + kv; ++head) {
      const T* x = row + head * hd;
      float* out = head < h ? q + (head * t + r) * hd : kc + ((head - h) * cap + start + r) * hd;
      float mul = head < h ? scale : 1.0f;
      if (!rotary) {
        for (int64_t j = 0; j < hd; ++j) out[j] = f(x[j]) * mul;
        continue;
      }
      // each half with its partner in the other (two loops without a modulo, so that they run in vectors)
      for (int64_t j = 0; j < half; ++j) out[j] = (f(x[j]) * c[j] + f(x[j + half]) * s[j]) * mul;
      for (int64_t j = half; j < rd; ++j) out[j] = (f(x[j]) * c[j] + f(x[j - half]) * s[j]) * mul;
      for (int64_t j = rd; j < hd; ++j) out[j] = f(x[j]) * mul;
    }
    for (int64_t head = 0; head < kv; ++head) {
      const T* x = row + (h + kv + head) * hd;
      float* out = vc + (head * cap + start + r) * hd;
      for (int64_t j = 0; j < hd; ++j) out[j] = f(x[j]);
    }
  }
}

constexpr int KB = 16;  // keys per block of the transposed key cache: (kv, cap / KB, hd, KB)

// Slots [from, to) of one layer's key cache (kv, cap, hd) copied into its transposed twin.
void transpose_keys(const float* kc, float* kt, int64_t kv, int64_t hd, int64_t cap, int64_t from, int64_t to) {
  for (int64_t head = 0; head < kv; ++head)
    for (int64_t slot = from; slot < to; ++slot) {
      const float* k = kc + (head * cap + slot) * hd;
      float* dst = kt + head * cap * hd + (slot / KB) * hd * KB + slot % KB;
      for (int64_t j = 0; j < hd; ++j) dst[j * KB] = k[j];
    }
}

// Slots [from, to) of one layer's fp32 value cache (kv, cap, hd) copied into its bf16 twin: a bf16 model's values
// are bf16 numbers, so the copy holds the same numbers in half the bytes (what a single step reads: it reads the
// whole cache once, and that is most of its time at long contexts).
void narrow_values(const float* vc, c10::BFloat16* vn, int64_t kv, int64_t hd, int64_t cap, int64_t from, int64_t to) {
  for (int64_t head = 0; head < kv; ++head)
    for (int64_t i = (head * cap + from) * hd, e = (head * cap + to) * hd; i < e; ++i) vn[i] = static_cast<c10::BFloat16>(vc[i]);
}

// Attention of query rows (H, T, hd) over the fp32 cache: row r sees slots 0..start-1 and the slots
// start + j of the rows j it descends from (`ancestors` (T, T), or j <= r for a chain), in slot order;
// or, where `visible` (T, start + T) is given, the slots up to start + r that it allows (a draft head's
// tree: the real context and the node's ancestors, written by earlier calls).
// Out (T, H * hd) in the model's dtype. A thread takes query heads, and those of one key/value head
// together with all their rows, so that each block of keys and of values is read from memory once for
// all of them: scores come from the transposed keys, KB keys at a time, each a sum over the head's
// dimensions in order; a row's softmax sum runs over its own keys in order; its weighted values go to two
// interleaved sums, the row's keys of even rank to one and those of odd rank to the other, each in rank
// order, then added (one chain of dependent sums would wait on each addition). No sum depends on the
// other rows of the call, nor on how heads are shared out, and a key's place in a row's sums is its rank
// among the row's keys, as in the chain through a tree row.
constexpr int SCORE_BLOCKS = 8;  // key blocks scored together (32 KB of keys): independent sums in flight
constexpr int64_t VALUE_CHUNK = 128;  // slots of values summed for every head and row before the next ones

// PP query rows (pairs of a query head and a row) against NB blocks of KB keys (the transposed keys kb), on the
// vector vocabulary (simd.h) with registers V: each score a sum over the head's dimensions in order, an fma per
// dimension from zero, so the same bits in any V; each key vector loaded once for all the rows.
template <typename V, int NB, int PP>
inline void score_tile(const float* const* qs, const float* kb, int64_t hd, float* const* outs) {
  constexpr int P = KB / simd::width<V>;  // vectors per block of keys
  V acc[PP][NB][P];
  for (int i = 0; i < PP; ++i)
    for (int b = 0; b < NB; ++b)
      for (int k = 0; k < P; ++k) acc[i][b][k] = simd::splat<V>(0.0f);
  for (int64_t j = 0; j < hd; ++j) {
    V keys[NB][P];
    for (int b = 0; b < NB; ++b)
      for (int k = 0; k < P; ++k) keys[b][k] = simd::load<V>(kb + b * hd * KB + j * KB + k * simd::width<V>);
    for (int i = 0; i < PP; ++i) {
      const V qj = simd::splat<V>(qs[i][j]);
      for (int b = 0; b < NB; ++b)
        for (int k = 0; k < P; ++k) acc[i][b][k] = simd::fma(qj, keys[b][k], acc[i][b][k]);
    }
  }
  for (int i = 0; i < PP; ++i)
    for (int b = 0; b < NB; ++b)
      for (int k = 0; k < P; ++k) simd::store(outs[i] + b * KB + k * simd::width<V>, acc[i][b][k]);
}

// PP rows' weighted values of slots from..to-1 into their two sums, ranks being slots (a slot's parity names its sum),
// on the vector vocabulary: NW vectors V of dimensions d0.. of each (hd: the values' row and the sums' stride), each
// value vector loaded once for all the rows; every sum an fma per slot in slot order, as add_values_portable's.
template <typename V, int NW, int PP, typename T>
inline void value_tile(const float* const* ps, int64_t from, int64_t to, const T* v, int64_t hd, int64_t d0,
                       float* const* sums) {
  constexpr int W = simd::width<V>;
  V a[PP][2][NW];
  for (int i = 0; i < PP; ++i)
    for (int odd = 0; odd < 2; ++odd)
      for (int k = 0; k < NW; ++k) a[i][odd][k] = simd::load<V>(sums[i] + odd * hd + d0 + k * W);
  auto one = [&](int64_t slot, auto odd) {  // a single slot into the sum its parity names (a constant: in registers)
    V vals[NW];
    for (int k = 0; k < NW; ++k) vals[k] = simd::load<V>(v + slot * hd + d0 + k * W);
    for (int i = 0; i < PP; ++i) {
      const V pi = simd::splat<V>(ps[i][slot]);
      for (int k = 0; k < NW; ++k) a[i][odd()][k] = simd::fma(pi, vals[k], a[i][odd()][k]);
    }
  };
  int64_t s = from;
  if (s < to && (s & 1)) one(s++, std::integral_constant<int, 1>());
  for (; s + 2 <= to; s += 2) {
    V v0[NW], v1[NW];
    for (int k = 0; k < NW; ++k)
      v0[k] = simd::load<V>(v + s * hd + d0 + k * W), v1[k] = simd::load<V>(v + (s + 1) * hd + d0 + k * W);
    for (int i = 0; i < PP; ++i) {
      const V p0 = simd::splat<V>(ps[i][s]), p1 = simd::splat<V>(ps[i][s + 1]);
      for (int k = 0; k < NW; ++k) {
        a[i][0][k] = simd::fma(p0, v0[k], a[i][0][k]);
        a[i][1][k] = simd::fma(p1, v1[k], a[i][1][k]);
      }
    }
  }
  if (s < to) one(s, std::integral_constant<int, 0>());  // s is even here
  for (int i = 0; i < PP; ++i)
    for (int odd = 0; odd < 2; ++odd)
      for (int k = 0; k < NW; ++k) simd::store(sums[i] + odd * hd + d0 + k * W, a[i][odd][k]);
}

// One row's weighted values of slots from..to-1: those `ok` lets it see, ranked from `rank` (a key's rank names its
// sum), or every slot (ok null: ranks are slots); value_tile's vectors. Returns the rank after them.
template <typename V, int NW, typename T>
inline int64_t value_row(const float* p, const uint8_t* ok, int64_t from, int64_t to, int64_t rank, const T* v, int64_t hd,
                         int64_t d0, float* sums) {
  if (!ok) {
    value_tile<V, NW, 1>(&p, from, to, v, hd, d0, &sums);
    return to;
  }
  constexpr int W = simd::width<V>;
  V a[2][NW];
  for (int odd = 0; odd < 2; ++odd)
    for (int k = 0; k < NW; ++k) a[odd][k] = simd::load<V>(sums + odd * hd + d0 + k * W);
  for (int64_t i = from; i < to; ++i) {
    if (!ok[i]) continue;
    const V pi = simd::splat<V>(p[i]);
    auto add = [&](auto odd) {  // the parity a constant: the sums stay in registers
      for (int k = 0; k < NW; ++k) a[odd()][k] = simd::fma(pi, simd::load<V>(v + i * hd + d0 + k * W), a[odd()][k]);
    };
    if (rank++ & 1) add(std::integral_constant<int, 1>());
    else add(std::integral_constant<int, 0>());
  }
  for (int odd = 0; odd < 2; ++odd)
    for (int k = 0; k < NW; ++k) simd::store(sums + odd * hd + d0 + k * W, a[odd][k]);
  return rank;
}

// nb (<= SCORE_BLOCKS) blocks of KB scores of query row qr, one float at a time (no vector path)
inline void score_blocks_portable(const float* qr, const float* kb, int64_t hd, int64_t nb, float* out) {
  for (int64_t b = 0; b < nb; ++b) score_tile<float, 1, 1>(&qr, kb + b * hd * KB, hd, &out), out += KB;
}

// Slots from..to-1 of one row's weighted values into its two sums (sums: 2 x hd, kept between chunks);
// ok: the slots the row sees (nullptr: all, and a slot's rank is the slot). Returns the rank after them.
// Values V: fp32, or bf16 (a bf16 model's values, each widened exactly).
template <typename V>
inline int64_t add_values_portable(const float* p, const uint8_t* ok, int64_t from, int64_t to, int64_t rank,
                                   const V* v, int64_t hd, float* sums) {
  if (!ok) rank = from;  // every slot seen: ranks are slots
  for (int64_t i = from; i < to; ++i) {
    if (ok && !ok[i]) continue;
    float* a = sums + (rank++ & 1) * hd;
    const V* vi = v + i * hd;
    float pi = p[i];
    for (int64_t j = 0; j < hd; ++j) a[j] = std::fma(pi, f(vi[j]), a[j]);
  }
  return rank;
}

#ifdef __AVX512F__
static_assert(KB == 16, "a block of keys is one vector of 16 scores");

// The same sums in registers, one block of keys a vector.
inline void score_blocks(const float* qr, const float* kb, int64_t hd, int64_t nb, float* out) {
  switch (nb) {
    case 1: return score_tile<__m512, 1, 1>(&qr, kb, hd, &out);
    case 2: return score_tile<__m512, 2, 1>(&qr, kb, hd, &out);
    case 3: return score_tile<__m512, 3, 1>(&qr, kb, hd, &out);
    case 4: return score_tile<__m512, 4, 1>(&qr, kb, hd, &out);
    case 5: return score_tile<__m512, 5, 1>(&qr, kb, hd, &out);
    case 6: return score_tile<__m512, 6, 1>(&qr, kb, hd, &out);
    case 7: return score_tile<__m512, 7, 1>(&qr, kb, hd, &out);
    default: return score_tile<__m512, SCORE_BLOCKS, 1>(&qr, kb, hd, &out);
  }
}

// Several query rows (PP: pairs of a query head and a row) against the same blocks of keys: each key vector
// loaded once for all of them; every score the same sum as score_blocks'.
template <int PP>
inline void score_pairs_of(const float* const* qs, const float* kb, int64_t hd, int64_t nb, float* const* outs) {
  switch (nb) {  // at most 4 blocks per call: PP x 4 sums in registers
    case 1: return score_tile<__m512, 1, PP>(qs, kb, hd, outs);
    case 2: return score_tile<__m512, 2, PP>(qs, kb, hd, outs);
    case 3: return score_tile<__m512, 3, PP>(qs, kb, hd, outs);
    default: return score_tile<__m512, 4, PP>(qs, kb, hd, outs);
  }
}
#else
inline void score_blocks(const float* qr, const float* kb, int64_t hd, int64_t nb, float* out) {
  score_blocks_portable(qr, kb, hd, nb, out);
}
#endif

template <typename V>
inline int64_t add_values(const float* p, const uint8_t* ok, int64_t from, int64_t to, int64_t rank, const V* v,
                          int64_t hd, float* sums) {
#ifdef __AVX512F__
  // add_values_portable with the two sums in registers (hd = 16 NV): the same operations in the same order
  switch (hd) {
    case 16: return value_row<__m512, 1>(p, ok, from, to, rank, v, hd, 0, sums);
    case 32: return value_row<__m512, 2>(p, ok, from, to, rank, v, hd, 0, sums);
    case 64: return value_row<__m512, 4>(p, ok, from, to, rank, v, hd, 0, sums);
    case 128: return value_row<__m512, 8>(p, ok, from, to, rank, v, hd, 0, sums);
    default:
      if (hd % 128 == 0) {  // wider heads (Gemma's 256) in slices of 128 dimensions: each element's sums as they were
        int64_t after = rank;
        for (int64_t d0 = 0; d0 < hd; d0 += 128) after = value_row<__m512, 8>(p, ok, from, to, rank, v, hd, d0, sums);
        return after;
      }
      break;
  }
#endif
  return add_values_portable(p, ok, from, to, rank, v, hd, sums);
}

// query rows scored together against each block of keys (AVX-512: 6 x 4 sums, 4 key vectors and a query's
// broadcast in its 32 registers)
constexpr int64_t PAIRS = 6;

// Scores of n query rows (pairs of a query head and a row) against nb blocks of keys: score_blocks for each.
inline void score_pairs(const float* const* qs, int64_t n, const float* kb, int64_t hd, int64_t nb, float* const* outs) {
#ifdef __AVX512F__
  if (n == 1) return score_blocks(qs[0], kb, hd, nb, outs[0]);  // up to SCORE_BLOCKS sums in flight
  for (int64_t b0 = 0; b0 < nb; b0 += 4) {
    const int64_t m = std::min<int64_t>(4, nb - b0);
    const float* kbb = kb + b0 * hd * KB;
    for (int64_t i = 0; i < n;) {
      const int64_t left = n - i;
      int64_t take = std::min<int64_t>(PAIRS, left);
      if (left - take == 1) --take;  // never one alone
      float* o[PAIRS];
      for (int64_t k = 0; k < take; ++k) o[k] = outs[i + k] + b0 * KB;
      switch (take) {
        case 1: score_blocks(qs[i], kbb, hd, m, o[0]); break;
        case 2: score_pairs_of<2>(qs + i, kbb, hd, m, o); break;
        case 3: score_pairs_of<3>(qs + i, kbb, hd, m, o); break;
        case 4: score_pairs_of<4>(qs + i, kbb, hd, m, o); break;
        case 5: score_pairs_of<5>(qs + i, kbb, hd, m, o); break;
        default: score_pairs_of<6>(qs + i, kbb, hd, m, o); break;
      }
      i += take;
    }
  }
#elif defined(SIMD_HAS_8)
  // AVX2 (16 registers of 8 floats): two blocks of keys, two rows at a time (13 registers), each key vector loaded
  // once for both; every score the same sum as score_blocks_portable's (an fma per dimension, in order, from zero)
  for (int64_t b0 = 0; b0 < nb; b0 += 2) {
    const bool two = nb - b0 >= 2;
    const float* kbb = kb + b0 * hd * KB;
    for (int64_t i = 0; i < n; i += 2) {
      float* o[2] = {outs[i] + b0 * KB, i + 1 < n ? outs[i + 1] + b0 * KB : nullptr};
      if (i + 1 < n) two ? score_tile<__m256, 2, 2>(qs + i, kbb, hd, o) : score_tile<__m256, 1, 2>(qs + i, kbb, hd, o);
      else two ? score_tile<__m256, 2, 1>(qs + i, kbb, hd, o) : score_tile<__m256, 1, 1>(qs + i, kbb, hd, o);
    }
  }
#else
  for (int64_t i = 0; i < n; ++i) score_blocks(qs[i], kb, hd, nb, outs[i]);
#endif
}

// Slots from..to-1 of n rows' weighted values, rows that see every slot (ranks are slots).
template <typename V>
inline void add_values_pairs(const float* const* ps, int64_t n, int64_t from, int64_t to, const V* v, int64_t hd,
                             float* const* sums) {
#ifdef __AVX512F__
  if (hd == 16 || hd == 32 || hd == 64) {
    const int64_t per = hd == 64 ? 2 : 4;  // rows per call: their sums and two slots' values in registers
    for (int64_t i = 0; i < n; i += per) {
      const int64_t m = std::min(per, n - i);
      if (hd == 64 && m == 2) value_tile<__m512, 4, 2>(ps + i, from, to, v, hd, 0, sums + i);
      else if (hd == 64) value_tile<__m512, 4, 1>(ps + i, from, to, v, hd, 0, sums + i);
      else if (hd == 32 && m == 4) value_tile<__m512, 2, 4>(ps + i, from, to, v, hd, 0, sums + i);
      else if (hd == 16 && m == 4) value_tile<__m512, 1, 4>(ps + i, from, to, v, hd, 0, sums + i);
      else
        for (int64_t k = i; k < i + m; ++k) add_values(ps[k], nullptr, from, to, from, v, hd, sums[k]);
    }
    return;
  }
#elif defined(SIMD_HAS_8)
  // two rows at a time, 16 dimensions at a time (a row's two sums of them in 4 registers), each value vector loaded
  // once for both; every sum the same as add_values_portable's (an fma per slot, in slot order)
  if (hd % 16 == 0) {
    for (int64_t i = 0; i < n; i += 2)
      for (int64_t d0 = 0; d0 < hd; d0 += 16) {
        if (i + 1 < n) value_tile<__m256, 2, 2>(ps + i, from, to, v, hd, d0, sums + i);
        else value_tile<__m256, 2, 1>(ps + i, from, to, v, hd, d0, sums + i);
      }
    return;
  }
#endif
  for (int64_t k = 0; k < n; ++k) add_values(ps[k], nullptr, from, to, from, v, hd, sums[k]);
}

// With a sliding `window` (> 0), row r at rotary position pos[r] sees only the slots of positions above
// pos[r] - window: the cache's slots from pos[r] - window + 1 on, and the rows of this pass (pos) within it; its
// keys are then gathered as a tree row's are, so a position's sums are the same alone and in a pass.
template <typename T, typename V>
void attend(const float* q, const float* kt, const V* vc, const bool* ancestors, const bool* visible, T* out,
            int64_t t, int64_t h, int64_t kv, int64_t hd, int64_t cap, int64_t start, const int64_t* pos = nullptr,
            int64_t window = 0, float softcap = 0.0f) {
  int64_t groups = h / kv;
  int64_t last = start + t;  // slots scored: 0..last-1
  int64_t blocks = (last + KB - 1) / KB;
  int64_t width = blocks * KB;
  // allowed[r * width + slot]: whether row r sees the slot
  std::vector<uint8_t> allowed(t * width, 0);
  std::vector<int64_t> ends(t);  // one past row r's last slot
  int64_t lowest = start;  // the first slot any row sees (below it, nothing is scored or summed)
  bool cut = false;  // whether a window hides some of the cache from a row
  for (int64_t r = 0; r < t; ++r) {
    ends[r] = start + r + 1;
    if (visible) {
      for (int64_t slot = 0; slot < ends[r]; ++slot) allowed[r * width + slot] = visible[r * last + slot];
      lowest = 0;
      continue;
    }
    const int64_t first = window > 0 && pos ? std::max<int64_t>(0, pos[r] - window + 1) : 0;  // the first position seen
    cut = cut || first > 0;
    lowest = std::min(lowest, std::min(first, start));
    std::fill(allowed.begin() + r * width + std::min(first, start), allowed.begin() + r * width + start, 1);
    for (int64_t j = 0; j <= r; ++j)
      if ((ancestors ? ancestors[r * t + j] : true) && (!pos || pos[j] >= first)) allowed[r * width + start + j] = 1;
  }
  const bool gather = ancestors || visible || cut;  // rows that skip slots: their keys moved together for the softmax
  // the first slots every row sees (a pass's cache, and a chain's or token tree's first row): their values are
  // summed for all rows together, each value loaded once (a key's rank is its slot there, so each sum takes
  // the same operations in the same order as a row's own loop)
  int64_t shared = visible || cut ? 0 : start;
  for (bool all = true; all && shared < last;) {
    for (int64_t r = 0; r < t && all; ++r) all = shared < ends[r] && allowed[r * width + shared];
    shared += all;
  }
  at::parallel_for(0, h, 1, [&](int64_t begin, int64_t end) {
    std::unique_ptr<float[]> p(new float[groups * t * width]);  // (heads of the group, rows, slots): all scored first
    std::vector<float> total(groups * t);
    std::vector<float> sums(groups * t * 2 * hd);
    std::vector<int64_t> rank(groups * t);
    std::vector<const float*> qs(groups * t);
    std::vector<float*> ps(groups * t), sp(groups * t), outs(groups * t);
    for (int64_t g = begin / groups; g * groups < end; ++g) {  // a key/value head, and its query heads here
      const int64_t h0 = std::max(begin, g * groups), nh = std::min(end, (g + 1) * groups) - h0;
      const float* kh = kt + g * cap * hd;
      const V* v = vc + g * cap * hd;
      const int64_t pairs = nh * t;  // (query head, row), head by head
      for (int64_t hr = 0; hr < pairs; ++hr) {
        qs[hr] = q + ((h0 + hr / t) * t + hr % t) * hd;
        ps[hr] = p.get() + hr * width;
        sp[hr] = sums.data() + hr * 2 * hd;
      }
      // each block of keys once for all the pairs whose row sees a slot of it: a row's scores past its own last
      // key are never read, so a prompt chunk's first rows skip the chunk's later blocks (consecutive pairs are
      // consecutive rows of a head, so those that need as many of these blocks are runs, each scored together)
      for (int64_t blk0 = lowest / KB; blk0 < blocks; blk0 += SCORE_BLOCKS) {
        const int64_t nb = std::min<int64_t>(SCORE_BLOCKS, blocks - blk0);
        auto need = [&](int64_t hr) {
          return std::clamp<int64_t>((ends[hr % t] + KB - 1) / KB - blk0, 0, nb);
        };
        for (int64_t hr = 0; hr < pairs; ++hr) outs[hr] = ps[hr] + blk0 * KB;
        for (int64_t i = 0; i < pairs;) {
          const int64_t m = need(i);
          int64_t j = i + 1;
          while (j < pairs && need(j) == m) ++j;
          if (m > 0) score_pairs(qs.data() + i, j - i, kh + blk0 * hd * KB, hd, m, outs.data() + i);
          i = j;
        }
      }
      for (int64_t hr = 0; hr < nh * t; ++hr) {  // softmax over the row's own keys, in order
        const int64_t r = hr % t;
        float* pr = p.get() + hr * width;
        int64_t n = ends[r];  // a chain row's keys are slots 0..n-1
        if (gather) {  // a tree row's keys moved together in order, in place: element i is key i, as in the chain
          const uint8_t* ok = allowed.data() + r * width;
          n = shared;  // the slots every row sees stay where they are
          for (int64_t i = shared; i < ends[r]; ++i)
            if (ok[i]) pr[n++] = pr[i];
        }
        if (softcap > 0.0f)  // Gemma 2: each of the row's scores capped, in a loop of its own (no lanes: the same bits)
          for (int64_t i = 0; i < n; ++i) pr[i] = softcap * simd::tanh_fixed(pr[i] / softcap);
        float most[LANES];  // the largest score (a maximum is exact in any order: lanes, then across them)
        std::fill(most, most + LANES, -INFINITY);
        int64_t i0 = 0;
        for (; i0 + LANES <= n; i0 += LANES)
          for (int l = 0; l < LANES; ++l) most[l] = std::max(most[l], pr[i0 + l]);
        for (; i0 < n; ++i0) most[0] = std::max(most[0], pr[i0]);
        float m = *std::max_element(most, most + LANES);
        int64_t e = 0;
        // e^x by simd::exp_fixed (+, *, fma and rounding only: Cephes' expf polynomial, about 1 ulp), so that a score
        // gets the same bits in a vector lane and in the loop's scalar remainder, whichever it falls in (the library's
        // vector and scalar exp need not agree; the library is built with -ffp-contract=off: no fusing but these)
#ifdef SIMD_HAS_8
        for (const __m256 mv = simd::splat<__m256>(m); e + 8 <= n; e += 8)
          simd::store(pr + e, simd::exp_fixed(simd::sub(simd::load<__m256>(pr + e), mv)));
#endif
        for (; e < n; ++e) pr[e] = simd::exp_fixed(pr[e] - m);
        float lanes[LANES] = {0};
        int64_t i = 0;
        for (; i + LANES <= n; i += LANES)
          for (int l = 0; l < LANES; ++l) lanes[l] += pr[i + l];
        for (; i < n; ++i) lanes[i % LANES] += pr[i];
        for (int w = LANES / 2; w > 0; w /= 2)
          for (int l = 0; l < w; ++l) lanes[l] += lanes[l + w];
        total[hr] = lanes[0];
        if (gather) {  // back to the row's slots, from the last (key i never lies past its slot)
          const uint8_t* ok = allowed.data() + r * width;
          for (int64_t k = n, slot = ends[r] - 1; slot >= shared; --slot)
            if (ok[slot]) pr[slot] = pr[--k];
        }
      }
      std::fill(sums.begin(), sums.end(), 0.0f);
      std::fill(rank.begin(), rank.end(), shared);  // a row's own slots start after the shared ones
      for (int64_t c0 = lowest / VALUE_CHUNK * VALUE_CHUNK; c0 < last; c0 += VALUE_CHUNK) {  // each chunk of values once for all
        // the slots all rows see together, then each row's own last ones
        const int64_t common = std::min(c0 + VALUE_CHUNK, shared);
        if (common > c0) add_values_pairs(ps.data(), pairs, c0, common, v, hd, sp.data());
        for (int64_t hr = 0; hr < pairs; ++hr) {
          const int64_t r = hr % t, to = std::min(c0 + VALUE_CHUNK, ends[r]);
          const int64_t from = std::max(c0, common);
          if (from < to)
            rank[hr] = add_values(ps[hr], gather ? allowed.data() + r * width : nullptr, from, to, rank[hr], v, hd, sp[hr]);
        }
      }
      for (int64_t hr = 0; hr < nh * t; ++hr) {
        const int64_t r = hr % t;
        const float* a = sums.data() + hr * 2 * hd;
        T* o = out + r * h * hd + (h0 + hr / t) * hd;
        for (int64_t j = 0; j < hd; ++j) o[j] = static_cast<T>((a[j] + a[hd + j]) / total[hr]);
      }
    }
  });
}

// op over elements [from, to): simd::gated_span for float and bf16, one element at a time in float otherwise (fp16,
// double), rounded once to T
template <typename T, typename Op>
inline void gated_span(const T* g, const T* u, T* out, int64_t from, int64_t to, bool vectors, Op op) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, c10::BFloat16>) {
    simd::gated_span(g, u, out, from, to, vectors, op);
  } else {
    for (int64_t j = from; j < to; ++j) out[j] = static_cast<T>(op(f(g[j]), f(u[j])));
  }
}

// The MLP's gated activations: simd::silu_gate (gate / (1 + e^-gate) * up) and simd::gelu_gate (GELU-tanh of gate
// times up), each rounded once to T
struct Silu {
  template <typename V>
  V operator()(V g, V u) const { return simd::silu_gate(g, u); }
};
struct Gelu {
  template <typename V>
  V operator()(V g, V u) const { return simd::gelu_gate(g, u); }
};

constexpr int64_t SILU_SPAN = 256;  // elements of a row a thread takes at a time

// gate_up (T, 2I) -> act(gate) * up (T, I); a single row on the calling thread, more rows shared out. Each element in
// vectors where the build has them and `vectors` with the same operations as alone, so the same bits either way (and
// whatever the split between threads)
template <typename T, typename Op>
void gated_mul(const T* gu, T* out, int64_t t, int64_t inter, Op op, bool vectors = true) {
  const int64_t spans = (inter + SILU_SPAN - 1) / SILU_SPAN;
  at::parallel_for(0, t * spans, spans + 1, [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) {
      int64_t r = s / spans, from = s % spans * SILU_SPAN, to = std::min(inter, from + SILU_SPAN);
      const T* g = gu + r * 2 * inter;
      gated_span(g, g + inter, out + r * inter, from, to, vectors, op);
    }
  });
}

// gated_mul as an operation (tests): gate_up (T, 2I) -> (T, I), in vectors where the build has them or not
template <typename Op>
Tensor gated_mul_op(const Tensor& gu_in, bool vectors) {
  TORCH_CHECK(gu_in.dim() == 2 && gu_in.size(1) % 2 == 0, "gate_up: (rows, 2 * inter)");
  Tensor gu = gu_in.contiguous();
  Tensor out = at::empty({gu.size(0), gu.size(1) / 2}, gu.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gu.scalar_type(), "gated_mul", [&] {
    gated_mul<scalar_t>(gu.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), gu.size(0), out.size(1), Op{}, vectors);
  });
  return out;
}

// The registered model behind a handle, checked to have at least n_layers layers.
const Model* model_of(int64_t handle, int64_t n_layers) {
  const Model* m;
  {
    std::lock_guard<std::mutex> g(registry_lock);
    TORCH_CHECK(handle >= 0 && handle < static_cast<int64_t>(registry.size()), "unknown model handle");
    m = &registry[handle];
  }
  TORCH_CHECK(n_layers >= 0 && n_layers <= static_cast<int64_t>(m->layers.size()), "the model has ", m->layers.size(), " layers");
  return m;
}

// The bf16 copy of a value cache (v_narrow, or nullptr where none is kept), checked against the cache (v) and the
// activations' dtype x: only a bf16 model's values are bf16 numbers.
c10::BFloat16* narrow_copy(const c10::optional<Tensor>& v_narrow, const Tensor& v, const Tensor& x) {
  if (!v_narrow || !v_narrow->defined() || v_narrow->numel() == 0) return nullptr;
  TORCH_CHECK(x.scalar_type() == at::kBFloat16, "a bf16 copy of the values is kept for a bf16 model only");
  TORCH_CHECK(v_narrow->scalar_type() == at::kBFloat16 && v_narrow->is_contiguous() && v_narrow->sizes() == v.sizes(),
              "v_narrow: a contiguous bf16 tensor of the value cache's shape");
  return v_narrow->data_ptr<c10::BFloat16>();
}

// One layer's cache writes and attention for t rows at slots start..start+t-1 (kc, kt, vc, vn: the layer's slices of
// the caches): the rows' keys and values stored, the step's copies (the transposed keys, and the bf16 values where vn)
// brought up to date from kt_from, then the attention. A single step reads the bf16 values (half the bytes, the
// same numbers); a pass, whose rows share each value read, the fp32 ones (no widening to pay for each row).
template <typename T>
void store_and_attend(const T* qkv, const float* cos, const float* sin, const int64_t* pos, float* q, float* kc, float* kt,
                      float* vc, c10::BFloat16* vn, int64_t kt_from, const bool* ancestors, T* out, int64_t t, int64_t h,
                      int64_t kv, int64_t hd, int64_t cap, int64_t start, float scale, bool rotary, int64_t window,
                      int64_t rd, float softcap) {
  rotate_and_store(qkv, cos, sin, pos, q, kc, vc, t, h, kv, hd, cap, start, scale, rotary, rd);
  transpose_keys(kc, kt, kv, hd, cap, kt_from, start + t);
  if (vn) narrow_values(vc, vn, kv, hd, cap, kt_from, start + t);
  if (vn && t == 1)
    attend(q, kt, static_cast<const c10::BFloat16*>(vn), ancestors, nullptr, out, t, h, kv, hd, cap, start, pos, window,
           softcap);
  else attend(q, kt, static_cast<const float*>(vc), ancestors, nullptr, out, t, h, kv, hd, cap, start, pos, window, softcap);
}

// The first of a layer's rotary tables: the tables (sets, positions, head_dim) or (positions, head_dim) for one set
inline const float* rope_table(const Tensor& table, const Layer& layer) {
  const int64_t sets = table.dim() == 3 ? table.size(0) : 1;
  TORCH_CHECK(layer.rope_set < sets, "a layer reads rotary table ", layer.rope_set, " of ", sets);
  return table.data_ptr<float>() + layer.rope_set * table.size(-2) * table.size(-1);
}

// Qwen3's per-head norms, in place on a pass's q/k/v rows (t, (H + 2KV) * hd): each query and key head as the
// layer's norms are (rms_rows), before rotary; nothing where the layer has none.
template <typename T>
void head_norms(Tensor& qkv, const Layer& layer, const Model& m) {
  if (!layer.q_norm.defined()) return;
  const int64_t h = m.n_heads, kv = m.n_kv, hd = m.head_dim, t = qkv.size(0), width = qkv.size(1);
  T* base = qkv.data_ptr<T>();
  const float eps = static_cast<float>(m.eps);
  // a norm as wide as the heads together (OLMo 2) takes all query heads as one row, and all key heads as one
  const bool whole = layer.q_norm.numel() != hd;
  const int64_t qn = whole ? 1 : h, qd = whole ? h * hd : hd, kn = whole ? 1 : kv, kd = whole ? kv * hd : hd;
  for (int64_t r = 0; r < t; ++r) {
    T* row = base + r * width;
    if (m.wide_norms) {
      rms_rows_wide<T>(row, layer.q_norm.data_ptr<float>(), row, qn, qd, eps);
      rms_rows_wide<T>(row + h * hd, layer.k_norm.data_ptr<float>(), row + h * hd, kn, kd, eps);
    } else {
      rms_rows<T>(row, layer.q_norm.data_ptr<T>(), row, qn, qd, eps);
      rms_rows<T>(row + h * hd, layer.k_norm.data_ptr<T>(), row + h * hd, kn, kd, eps);
    }
  }
}

// A pass's buffers, made at its first layer and reused by the others (the norms' outputs, the products'
// outputs, SiLU's): no tensor is made per layer.
struct Scratch {
  Tensor normed, qkv, y, gate_up, act, out_normed;
};

// x += y row by row, each element as ATen's add_ computes it (in T's op-math type, rounded once to T); with a
// multiplier m != 1, x += y * m as ATen computes the two (y * m rounded to T first: Granite's residual multiplier)
template <typename T>
void add_rows(Tensor& x, const Tensor& y_in, double m = 1.0) {
  using M = at::opmath_type<T>;
  const Tensor y = y_in.contiguous();
  T* xp = x.data_ptr<T>();
  const T* yp = y.data_ptr<T>();
  if (m != 1.0) {
    const M mm = static_cast<M>(m);
    for (int64_t i = 0, n = x.numel(); i < n; ++i)
      xp[i] = static_cast<T>(static_cast<M>(xp[i]) + static_cast<M>(static_cast<T>(static_cast<M>(yp[i]) * mm)));
    return;
  }
  for (int64_t i = 0, n = x.numel(); i < n; ++i) xp[i] = static_cast<T>(static_cast<M>(xp[i]) + static_cast<M>(yp[i]));
}

// x normed into `out` by one of a layer's norms, or x itself where the layer has none there (an input norm: OLMo 2's
// layers; an output norm: all but Gemma's and OLMo 2's)
template <typename T>
const Tensor& normed(const Tensor& x, const Tensor& norm, Tensor& out, const Model& m) {
  return norm.defined() ? rms_into<T>(x.contiguous(), norm, m.eps, out, m.wide_norms) : x;
}

// A layer after its attention: x += o(attn), then x += down(act(gate) * up) over the norm before the MLP (each
// output normed first where the layer norms it).
template <typename T>
void finish_layer(Tensor& x, const Tensor& attn, Scratch& s, const Layer& layer, const Model& m) {
  add_rows<T>(x, normed<T>(layer.o.into<T>(attn, s.y), layer.attn_out, s.out_normed, m), m.residual);
  Tensor gu = layer.gate_up.into<T>(normed<T>(x, layer.mlp_in, s.normed, m), s.gate_up).contiguous();
  if (!s.act.defined() || s.act.size(0) != x.size(0)) s.act = at::empty({x.size(0), m.inter}, x.options());
  if (m.gelu) gated_mul<T>(gu.data_ptr<T>(), s.act.data_ptr<T>(), x.size(0), m.inter, Gelu{});
  else gated_mul<T>(gu.data_ptr<T>(), s.act.data_ptr<T>(), x.size(0), m.inter, Silu{});
  add_rows<T>(x, normed<T>(layer.down.into<T>(s.act, s.y), layer.mlp_out, s.out_normed, m), m.residual);
}

// x (T, D) after the embedding -> x after `n_layers` layers; the caches get the new keys and values.
// kt_cache: the keys transposed in blocks (layers, kv, cap / KB, hd, KB), in step with k_cache for slots
// before `kt_from`; slots kt_from..start-1 (written by the eager prefill) are brought in first.
Tensor forward(int64_t handle, const Tensor& x_in, const Tensor& k_cache, const Tensor& v_cache, const Tensor& kt_cache,
               int64_t kt_from, const Tensor& cos, const Tensor& sin, const Tensor& pos, int64_t start,
               const c10::optional<Tensor>& ancestors, int64_t n_layers, const c10::optional<Tensor>& aux,
               at::IntArrayRef aux_layers, const c10::optional<Tensor>& v_narrow) {
  const Model* m = model_of(handle, n_layers);
  Tensor x = x_in.contiguous().clone();
  int64_t t = x.size(0), h = m->n_heads, kv = m->n_kv, hd = m->head_dim, cap = k_cache.size(2);
  TORCH_CHECK(k_cache.scalar_type() == at::kFloat && v_cache.scalar_type() == at::kFloat && k_cache.is_contiguous() &&
                  v_cache.is_contiguous() && v_cache.sizes() == k_cache.sizes(),
              "fp32 contiguous caches");
  c10::BFloat16* narrow = narrow_copy(v_narrow, v_cache, x);
  TORCH_CHECK(start + t <= cap, "the cache holds ", cap, " positions");
  TORCH_CHECK(cap % KB == 0 && kt_cache.is_contiguous() && kt_cache.numel() == k_cache.numel(), "a transposed key cache");
  TORCH_CHECK(0 <= kt_from && kt_from <= start, "kt_from within the cache");
  TORCH_CHECK(cos.scalar_type() == at::kFloat && cos.is_contiguous() && sin.is_contiguous() && sin.sizes() == cos.sizes() &&
                  cos.size(-1) <= hd && cos.size(-1) % 2 == 0,
              "fp32 rotary tables ([tables,] positions, rotated dimensions)");
  TORCH_CHECK(!aux || (aux->dim() == 3 && aux->size(0) == t && aux->size(1) == static_cast<int64_t>(aux_layers.size()) &&
                       aux->size(2) == x.size(1) && aux->scalar_type() == x.scalar_type()),
              "aux: (rows, layers kept, hidden) in x's dtype");
  Tensor q = at::empty({h, t, hd}, x.options().dtype(at::kFloat));
  Tensor attn = at::empty({t, h * hd}, x.options());
  Scratch scratch;
  Tensor anc = ancestors ? ancestors->contiguous() : Tensor();
  const int64_t* p = pos.data_ptr<int64_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "forward", [&] {
    for (int64_t l = 0; l < n_layers; ++l) {
      const Layer& layer = m->layers[l];
      for (size_t j = 0; aux && j < aux_layers.size(); ++j)  // the hidden states entering the layers kept (EAGLE-3)
        if (aux_layers[j] == l) aux->select(1, static_cast<int64_t>(j)).copy_(x);
      int64_t layer_off = l * kv * cap * hd;
      Tensor qkv = layer.qkv.into<scalar_t>(normed<scalar_t>(x, layer.attn_in, scratch.normed, *m), scratch.qkv).contiguous();
      head_norms<scalar_t>(qkv, layer, *m);
      store_and_attend(qkv.data_ptr<scalar_t>(), rope_table(cos, layer), rope_table(sin, layer), p, q.data_ptr<float>(),
                       k_cache.data_ptr<float>() + layer_off, kt_cache.data_ptr<float>() + layer_off,
                       v_cache.data_ptr<float>() + layer_off, narrow ? narrow + layer_off : nullptr, kt_from,
                       anc.defined() ? anc.data_ptr<bool>() : nullptr, attn.data_ptr<scalar_t>(), t, h, kv, hd, cap, start,
                       static_cast<float>(m->scale), layer.rotary, layer.window, cos.size(-1),
                       static_cast<float>(m->softcap));
      finish_layer<scalar_t>(x, attn, scratch, layer, *m);
    }
  });
  return x;
}

// One decoding step of several independent sequences (batched plain decoding): row b of x continues
// sequence b, whose caches are k_caches[b], v_caches[b] and kt_caches[b] (each as `forward` takes them) at
// slot starts[b], with kt_from[b] as there and its own rotary tables. The products run once over all rows
// (the own products give a row the bits it gets alone); each row attends over its own cache only, as a
// single step of its sequence would.
Tensor forward_rows(int64_t handle, const Tensor& x_in, const std::vector<Tensor>& k_caches, const std::vector<Tensor>& v_caches,
                    const std::vector<Tensor>& kt_caches, at::IntArrayRef kt_from, const std::vector<Tensor>& cos,
                    const std::vector<Tensor>& sin, at::IntArrayRef starts, int64_t n_layers,
                    const std::vector<Tensor>& v_narrow, const c10::optional<Tensor>& aux, at::IntArrayRef aux_layers) {
  const Model* m = model_of(handle, n_layers);
  Tensor x = x_in.contiguous().clone();
  int64_t rows = x.size(0), h = m->n_heads, kv = m->n_kv, hd = m->head_dim;
  TORCH_CHECK(!aux || (aux->dim() == 3 && aux->size(0) == rows && aux->size(1) == static_cast<int64_t>(aux_layers.size()) &&
                       aux->size(2) == x.size(1) && aux->scalar_type() == x.scalar_type()),
              "aux: (rows, layers kept, hidden) in x's dtype");
  size_t n = static_cast<size_t>(rows);
  TORCH_CHECK(k_caches.size() == n && v_caches.size() == n && kt_caches.size() == n && kt_from.size() == n &&
                  cos.size() == n && sin.size() == n && starts.size() == n,
              "one cache, rotary table and start per row");
  TORCH_CHECK(v_narrow.empty() || v_narrow.size() == n, "a bf16 copy of the values for every row, or for none");
  std::vector<c10::BFloat16*> narrow(n, nullptr);
  for (size_t b = 0; b < n; ++b) {
    const Tensor& k = k_caches[b];
    TORCH_CHECK(k.scalar_type() == at::kFloat && v_caches[b].scalar_type() == at::kFloat && k.is_contiguous() &&
                    v_caches[b].is_contiguous() && k.dim() == 4 && k.size(0) >= n_layers && k.size(1) == kv && k.size(3) == hd &&
                    v_caches[b].sizes() == k.sizes(),
                "fp32 contiguous caches (layers, kv, capacity, head_dim)");
    if (!v_narrow.empty()) narrow[b] = narrow_copy(v_narrow[b], v_caches[b], x);
    TORCH_CHECK(k.size(2) % KB == 0 && kt_caches[b].is_contiguous() && kt_caches[b].numel() == k.numel(), "a transposed key cache");
    TORCH_CHECK(0 <= kt_from[b] && kt_from[b] <= starts[b] && starts[b] < k.size(2), "row ", b, ": its start within its cache");
    TORCH_CHECK(cos[b].is_contiguous() && sin[b].is_contiguous() && cos[b].size(-2) > starts[b] && cos[b].size(-1) <= hd &&
                    cos[b].size(-1) % 2 == 0 &&
                    sin[b].sizes() == cos[b].sizes() && cos[b].scalar_type() == at::kFloat && sin[b].scalar_type() == at::kFloat,
                "fp32 rotary tables covering each row's position");
  }
  Tensor q = at::empty({rows, h, 1, hd}, x.options().dtype(at::kFloat));
  Tensor attn = at::empty({rows, h * hd}, x.options());
  Scratch scratch;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "forward_rows", [&] {
    for (int64_t l = 0; l < n_layers; ++l) {
      const Layer& layer = m->layers[l];
      for (size_t j = 0; aux && j < aux_layers.size(); ++j)  // the hidden states entering the layers kept (EAGLE-3)
        if (aux_layers[j] == l) aux->select(1, static_cast<int64_t>(j)).copy_(x);
      Tensor qkv = layer.qkv.into<scalar_t>(normed<scalar_t>(x, layer.attn_in, scratch.normed, *m), scratch.qkv).contiguous();
      head_norms<scalar_t>(qkv, layer, *m);
      // a thread takes whole rows (attend's own split over heads runs inline inside this one)
      at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
        for (int64_t b = begin; b < end; ++b) {
          int64_t cap = k_caches[b].size(2), start = starts[b], layer_off = l * kv * cap * hd;
          store_and_attend(qkv.data_ptr<scalar_t>() + b * qkv.size(1), rope_table(cos[b], layer), rope_table(sin[b], layer),
                           &start, q.data_ptr<float>() + b * h * hd, k_caches[b].data_ptr<float>() + layer_off,
                           kt_caches[b].data_ptr<float>() + layer_off, v_caches[b].data_ptr<float>() + layer_off,
                           narrow[b] ? narrow[b] + layer_off : nullptr, kt_from[b], nullptr,
                           attn.data_ptr<scalar_t>() + b * h * hd, 1, h, kv, hd, cap, start, static_cast<float>(m->scale),
                           layer.rotary, layer.window, cos[b].size(-1), static_cast<float>(m->softcap));
        }
      });
      finish_layer<scalar_t>(x, attn, scratch, layer, *m);
    }
  });
  return x;
}

// A draft head's decoder layer (EAGLE: a one-layer model registered by `prepare`) over t rows at cache slots
// start..start+t-1. h (t, D): the residual stream entering; the attention reads rms(h, attn_in), or, where e
// (t, D) is given (EAGLE-3: the next tokens' embeddings), [rms(e, e_norm), rms(h, attn_in)] (2D). Row r has
// rotary position pos[r] and sees the slots `visible` (t, start + t) allows, or 0..start+r. The caches
// (kv, cap, hd) fp32 and the transposed keys (kv, cap / KB, hd, KB) get the new rows. -> the layer's output.
Tensor head_layer(int64_t handle, const Tensor& h_in, const c10::optional<Tensor>& e, const c10::optional<Tensor>& e_norm,
                  const Tensor& k_cache, const Tensor& v_cache, const Tensor& kt_cache, const Tensor& cos, const Tensor& sin,
                  const Tensor& pos, int64_t start, const c10::optional<Tensor>& visible) {
  const Model* m = model_of(handle, 1);
  TORCH_CHECK(!m->layers.empty(), "a released head");
  const Layer& layer = m->layers[0];
  Tensor x = h_in.contiguous().clone();
  int64_t t = x.size(0), h = m->n_heads, kv = m->n_kv, hd = m->head_dim;
  TORCH_CHECK(k_cache.dim() == 3 && k_cache.size(0) == kv && k_cache.size(2) == hd && k_cache.scalar_type() == at::kFloat &&
                  v_cache.scalar_type() == at::kFloat && k_cache.is_contiguous() && v_cache.is_contiguous() &&
                  v_cache.sizes() == k_cache.sizes(),
              "fp32 contiguous caches (kv, capacity, head_dim)");
  int64_t cap = k_cache.size(1);
  TORCH_CHECK(start >= 0 && start + t <= cap, "the cache holds ", cap, " positions");
  TORCH_CHECK(cap % KB == 0 && kt_cache.is_contiguous() && kt_cache.numel() == k_cache.numel(), "a transposed key cache");
  TORCH_CHECK(pos.scalar_type() == at::kLong && pos.numel() == t, "a rotary position per row");
  TORCH_CHECK(cos.scalar_type() == at::kFloat && cos.is_contiguous() && sin.is_contiguous() && cos.size(1) == hd &&
                  sin.sizes() == cos.sizes(),
              "fp32 rotary tables (positions, head_dim)");
  TORCH_CHECK(!visible || (visible->scalar_type() == at::kBool && visible->size(0) == t && visible->size(1) == start + t),
              "visible: (rows, start + rows) bool");
  TORCH_CHECK(!e || (e_norm && e->sizes() == x.sizes() && e->scalar_type() == x.scalar_type()), "e: as h, with its norm");
  Tensor a = rms_norm(x, layer.attn_in, m->eps, m->wide_norms);
  if (e) a = at::cat({rms_norm(*e, *e_norm, m->eps, m->wide_norms), a}, 1);
  Tensor q = at::empty({h, t, hd}, x.options().dtype(at::kFloat));
  Tensor attn = at::empty({t, h * hd}, x.options());
  Scratch scratch;
  Tensor vis = visible ? visible->contiguous() : Tensor();
  Tensor p = pos.contiguous();
  for (int64_t r = 0; r < t; ++r)
    TORCH_CHECK(p.data_ptr<int64_t>()[r] >= 0 && p.data_ptr<int64_t>()[r] < cos.size(0), "a position past the rotary tables");
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "head_layer", [&] {
    Tensor qkv = layer.qkv.into<scalar_t>(a.contiguous(), scratch.qkv).contiguous();
    float* kc = k_cache.data_ptr<float>();
    float* kt = kt_cache.data_ptr<float>();
    float* vc = v_cache.data_ptr<float>();
    rotate_and_store(qkv.data_ptr<scalar_t>(), cos.data_ptr<float>(), sin.data_ptr<float>(), p.data_ptr<int64_t>(),
                     q.data_ptr<float>(), kc, vc, t, h, kv, hd, cap, start, static_cast<float>(m->scale));
    transpose_keys(kc, kt, kv, hd, cap, start, start + t);
    attend(q.data_ptr<float>(), kt, vc, nullptr, vis.defined() ? vis.data_ptr<bool>() : nullptr, attn.data_ptr<scalar_t>(), t, h,
           kv, hd, cap, start);
    finish_layer<scalar_t>(x, attn, scratch, layer, *m);
  });
  return x;
}

}  // namespace

TORCH_LIBRARY(specula_step, lib) {
  lib.def("prepare(Dict(str, Tensor[]) tensors, Dict(str, int[]) ints, Dict(str, float) numbers) -> int", &prepare);
  lib.def("forward(int handle, Tensor x, Tensor k_cache, Tensor v_cache, Tensor kt_cache, int kt_from, Tensor cos, "
          "Tensor sin, Tensor pos, int start, Tensor? ancestors, int n_layers, Tensor? aux=None, int[] aux_layers=[], "
          "Tensor? v_narrow=None) -> Tensor",
          &forward);
  lib.def("forward_rows(int handle, Tensor x, Tensor[] k_caches, Tensor[] v_caches, Tensor[] kt_caches, int[] kt_from, "
          "Tensor[] cos, Tensor[] sin, int[] starts, int n_layers, Tensor[] v_narrow, Tensor? aux=None, "
          "int[] aux_layers=[]) -> Tensor",
          &forward_rows);
  lib.def("head_layer(int handle, Tensor h, Tensor? e, Tensor? e_norm, Tensor k_cache, Tensor v_cache, Tensor kt_cache, "
          "Tensor cos, Tensor sin, Tensor pos, int start, Tensor? visible) -> Tensor", &head_layer);
  lib.def("release(int handle) -> ()", &release);
  lib.def("rms_norm(Tensor x, Tensor w, float eps, bool wide=False) -> Tensor", &rms_norm);
  lib.def("silu_mul(Tensor gate_up, bool vectors) -> Tensor", &gated_mul_op<Silu>);
  lib.def("gelu_mul(Tensor gate_up, bool vectors) -> Tensor", &gated_mul_op<Gelu>);
  lib.def("blocks_pack(Tensor raw, int format) -> Tensor", &blocks::pack_op);
  lib.def("blocks_pack_parts(Tensor[] raws, int[] formats) -> Tensor", &blocks::pack_parts_op);
  lib.def("blocks_packed_bytes(int rows, int row_bytes, int format) -> int", &blocks::packed_bytes);
  lib.def("blocks_file_layout(int format) -> int[]", &blocks::file_layout_op);
  lib.def("blocks_mm(Tensor x, Tensor packed, Tensor parts, Tensor? bias, bool out_float) -> Tensor", &blocks::mm);
  lib.def("blocks_path(int path) -> int", &blocks::set_path);
  lib.def("tiles_pack(Tensor w) -> Tensor", &tiles::pack_op);
  lib.def("tiles_pack_parts(Tensor[] parts) -> Tensor", &tiles::pack_parts_op);
  lib.def("tiles_mm(Tensor x, Tensor packed, int n, Tensor? bias, bool out_float) -> Tensor", &tiles::mm);
  lib.def("tiles_linear(Tensor x, Tensor packed, int n, Tensor? bias) -> Tensor", &tiles::linear);
  lib.def("tiles_unpack(Tensor packed, int n, int k) -> Tensor", &tiles::unpack_op);
}
