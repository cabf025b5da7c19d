// The lean Llama forward's decoding step in one call: the layer loop, with the small operations between
// the products (RMS norms, rotary, cache writes, attention, SiLU) as fused loops. The products stay
// torch's (the int4 kernel, oneDNN's prepacked bf16 product, F.linear).
//
// Every row's arithmetic depends only on that row and the cache before it, in a fixed order (no
// reduction is split by the number of rows, no thread splits a sum), so a position gets the same bits
// decoded alone and inside a verify pass, and a tree node the same bits as the chain through it.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <cmath>
#include <mutex>
#include <vector>

using at::Tensor;

namespace {

constexpr int LANES = 16;  // partial sums of a dot product or a sum of squares, combined in a fixed order

template <typename T>
inline float f(T v) { return static_cast<float>(v); }

// sum_i a[i] * b[i] in a fixed order: 16 interleaved partial sums, then a fixed tree
inline float dot(const float* a, const float* b, int64_t n) {
  float acc[LANES] = {0};
  int64_t i = 0;
  for (; i + LANES <= n; i += LANES)
    for (int l = 0; l < LANES; ++l) acc[l] += a[i + l] * b[i + l];
  for (; i < n; ++i) acc[i % LANES] += a[i] * b[i];
  for (int w = LANES / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0];
}

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

Tensor rms_norm(const Tensor& x, const Tensor& w, double eps) {
  auto xc = x.contiguous();
  auto out = at::empty_like(xc);
  int64_t d = xc.size(-1), rows = xc.numel() / d;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, xc.scalar_type(), "rms_norm", [&] {
    rms_rows<scalar_t>(xc.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), rows, d, static_cast<float>(eps));
  });
  return out;
}

// A product y = x @ W^T (+ b) in one of the engine's forms (engine/quant.py).
struct Product {
  int64_t kind;  // 0: F.linear, 1: oneDNN prepacked, 2: int4 kernel
  Tensor a, b;   // weight | packed weight | int4 codes, and (int4) scale-and-zero
  c10::optional<Tensor> bias;
  // A call of fewer rows than `min_rows` runs as that many, the first row repeated: products whose one-row
  // kernel rounds differently from their multi-row one (F.linear) then give a lone row its verify bits.
  Tensor operator()(const Tensor& x, int64_t min_rows) const {
    int64_t t = x.size(0);
    if (t >= min_rows) return run(x);
    return run(at::cat({x, x.narrow(0, 0, 1).expand({min_rows - t, x.size(1)})})).narrow(0, 0, t);
  }
  Tensor run(const Tensor& x) const {
    switch (kind) {
      case 0: return at::linear(x, a, bias);
      case 1: {
        static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
        std::vector<c10::IValue> stack{x, a, bias ? c10::IValue(*bias) : c10::IValue(), c10::IValue("none"),
                                       c10::IValue(c10::List<c10::optional<at::Scalar>>()), c10::IValue("")};
        op.callBoxed(&stack);
        return stack[0].toTensor();
      }
      default: {
        Tensor y = at::_weight_int4pack_mm_for_cpu(x, a, 32, b);
        return bias ? y.add_(*bias) : y;
      }
    }
  }
};

struct Layer {
  Product qkv, o, gate_up, down;
  Tensor in_norm, post_norm;
};

struct Model {
  std::vector<Layer> layers;
  int64_t n_heads, n_kv, head_dim, inter, min_rows;
  double eps, scale;
};

std::mutex registry_lock;
std::vector<Model> registry;

// products: per layer qkv, o, gate_up, down, each as (kind, a, b, bias) in four lists
int64_t prepare(const std::vector<Tensor>& a, const std::vector<Tensor>& b, const std::vector<c10::optional<Tensor>>& bias,
                const std::vector<int64_t>& kinds, const std::vector<Tensor>& norms, int64_t n_heads, int64_t n_kv,
                int64_t head_dim, int64_t inter, int64_t min_rows, double eps, double scale) {
  Model m{{}, n_heads, n_kv, head_dim, inter, min_rows, eps, scale};
  TORCH_CHECK(kinds.size() % 4 == 0 && norms.size() == kinds.size() / 2, "4 products and 2 norms per layer");
  for (size_t l = 0; l < kinds.size() / 4; ++l) {
    Product p[4];
    for (int i = 0; i < 4; ++i) p[i] = Product{kinds[4 * l + i], a[4 * l + i], b[4 * l + i], bias[4 * l + i]};
    m.layers.push_back(Layer{p[0], p[1], p[2], p[3], norms[2 * l], norms[2 * l + 1]});
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
// fp32 cache at slots start..start+T-1. pos[r]: the rotary position of row r.
template <typename T>
void rotate_and_store(const T* qkv, const float* cos, const float* sin, const int64_t* pos, float* q, float* kc, float* vc,
                      int64_t t, int64_t h, int64_t kv, int64_t hd, int64_t cap, int64_t start, float scale) {
  int64_t half = hd / 2, width = (h + 2 * kv) * hd;
  for (int64_t r = 0; r < t; ++r) {
    const float* c = cos + pos[r] * hd;
    const float* s = sin + pos[r] * hd;  // sin with its first half negated: rotate_half folded in
    const T* row = qkv + r * width;
    for (int64_t head = 0; head < h + kv; ++head) {
      const T* x = row + head * hd;
      float* out = head < h ? q + (head * t + r) * hd : kc + ((head - h) * cap + start + r) * hd;
      float mul = head < h ? scale : 1.0f;
      for (int64_t j = 0; j < hd; ++j) out[j] = (f(x[j]) * c[j] + f(x[(j + half) % hd]) * s[j]) * mul;
    }
    for (int64_t head = 0; head < kv; ++head) {
      const T* x = row + (h + kv + head) * hd;
      float* out = vc + (head * cap + start + r) * hd;
      for (int64_t j = 0; j < hd; ++j) out[j] = f(x[j]);
    }
  }
}

// Attention of query rows (H, T, hd) over the fp32 cache: row r sees slots 0..start-1 and the slots
// start + j of the rows j it descends from (`ancestors` (T, T), or j <= r for a chain), in slot order.
// Out (T, H * hd) in the model's dtype. Threads split the (row, head) pairs; each pair is computed by
// one thread, in the same order whatever the split.
template <typename T>
void attend(const float* q, const float* kc, const float* vc, const bool* ancestors, T* out, int64_t t, int64_t h,
            int64_t kv, int64_t hd, int64_t cap, int64_t start) {
  int64_t groups = h / kv;
  int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, (start + t) * hd));
  at::parallel_for(0, t * h, grain, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> keys;
    std::vector<float> e;
    std::vector<float> acc(hd);
    for (int64_t pair = begin; pair < end; ++pair) {
      int64_t r = pair / h, head = pair % h;
      keys.clear();
      for (int64_t j = 0; j < start; ++j) keys.push_back(j);
      for (int64_t j = 0; j <= r; ++j)
        if (ancestors ? ancestors[r * t + j] : true) keys.push_back(start + j);
      int64_t n = static_cast<int64_t>(keys.size());
      e.resize(n);
      const float* qr = q + (head * t + r) * hd;
      const float* k = kc + (head / groups) * cap * hd;
      const float* v = vc + (head / groups) * cap * hd;
      float m = -INFINITY;
      for (int64_t i = 0; i < n; ++i) {
        e[i] = dot(qr, k + keys[i] * hd, hd);
        m = std::max(m, e[i]);
      }
      float* ep = e.data();
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) ep[i] = std::exp(ep[i] - m);
      float lanes[LANES] = {0};
      for (int64_t i = 0; i < n; ++i) lanes[i % LANES] += ep[i];
      for (int w = LANES / 2; w > 0; w /= 2)
        for (int l = 0; l < w; ++l) lanes[l] += lanes[l + w];
      float* a = acc.data();
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t i = 0; i < n; ++i) {
        const float* vi = v + keys[i] * hd;
        float p = ep[i];
#pragma omp simd
        for (int64_t j = 0; j < hd; ++j) a[j] += p * vi[j];
      }
      T* o = out + r * h * hd + head * hd;
      for (int64_t j = 0; j < hd; ++j) o[j] = static_cast<T>(a[j] / lanes[0]);
    }
  });
}

// gate_up (T, 2I) -> silu(gate) * up (T, I)
template <typename T>
void silu_mul(const T* gu, T* out, int64_t t, int64_t inter) {
  for (int64_t r = 0; r < t; ++r) {
    const T* g = gu + r * 2 * inter;
    const T* u = g + inter;
    for (int64_t j = 0; j < inter; ++j) {
      float x = f(g[j]);
      out[r * inter + j] = static_cast<T>(x / (1.0f + std::exp(-x)) * f(u[j]));
    }
  }
}

// x (T, D) after the embedding -> x after `n_layers` layers; the caches get the new keys and values.
Tensor forward(int64_t handle, const Tensor& x_in, const Tensor& k_cache, const Tensor& v_cache, const Tensor& cos,
               const Tensor& sin, const Tensor& pos, int64_t start, const c10::optional<Tensor>& ancestors, int64_t n_layers) {
  const Model* m;
  {
    std::lock_guard<std::mutex> g(registry_lock);
    TORCH_CHECK(handle >= 0 && handle < static_cast<int64_t>(registry.size()), "unknown model handle");
    m = &registry[handle];
  }
  TORCH_CHECK(n_layers >= 0 && n_layers <= static_cast<int64_t>(m->layers.size()), "the model has ", m->layers.size(), " layers");
  Tensor x = x_in.contiguous().clone();
  int64_t t = x.size(0), h = m->n_heads, kv = m->n_kv, hd = m->head_dim, cap = k_cache.size(2);
  TORCH_CHECK(k_cache.scalar_type() == at::kFloat && k_cache.is_contiguous() && v_cache.is_contiguous(), "fp32 contiguous caches");
  TORCH_CHECK(start + t <= cap, "the cache holds ", cap, " positions");
  Tensor q = at::empty({h, t, hd}, x.options().dtype(at::kFloat));
  Tensor attn = at::empty({t, h * hd}, x.options());
  Tensor act = at::empty({t, m->inter}, x.options());
  Tensor anc = ancestors ? ancestors->contiguous() : Tensor();
  const int64_t* p = pos.data_ptr<int64_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "forward", [&] {
    for (int64_t l = 0; l < n_layers; ++l) {
      const Layer& layer = m->layers[l];
      int64_t layer_off = l * kv * cap * hd;
      Tensor h1 = rms_norm(x, layer.in_norm, m->eps);
      Tensor qkv = layer.qkv(h1, m->min_rows);
      rotate_and_store<scalar_t>(qkv.data_ptr<scalar_t>(), cos.data_ptr<float>(), sin.data_ptr<float>(), p, q.data_ptr<float>(),
                                 k_cache.data_ptr<float>() + layer_off, v_cache.data_ptr<float>() + layer_off, t, h, kv, hd,
                                 cap, start, static_cast<float>(m->scale));
      attend<scalar_t>(q.data_ptr<float>(), k_cache.data_ptr<float>() + layer_off, v_cache.data_ptr<float>() + layer_off,
                       anc.defined() ? anc.data_ptr<bool>() : nullptr, attn.data_ptr<scalar_t>(), t, h, kv, hd, cap, start);
      x.add_(layer.o(attn, m->min_rows));
      Tensor h2 = rms_norm(x, layer.post_norm, m->eps);
      Tensor gu = layer.gate_up(h2, m->min_rows).contiguous();
      silu_mul<scalar_t>(gu.data_ptr<scalar_t>(), act.data_ptr<scalar_t>(), t, m->inter);
      x.add_(layer.down(act, m->min_rows));
    }
  });
  return x;
}

}  // namespace

TORCH_LIBRARY(specula_step, lib) {
  lib.def("prepare(Tensor[] a, Tensor[] b, Tensor?[] bias, int[] kinds, Tensor[] norms, int n_heads, int n_kv, "
          "int head_dim, int inter, int min_rows, float eps, float scale) -> int", &prepare);
  lib.def("forward(int handle, Tensor x, Tensor k_cache, Tensor v_cache, Tensor cos, Tensor sin, Tensor pos, int start, "
          "Tensor? ancestors, int n_layers) -> Tensor", &forward);
  lib.def("release(int handle) -> ()", &release);
  lib.def("rms_norm(Tensor x, Tensor w, float eps) -> Tensor", &rms_norm);
}
