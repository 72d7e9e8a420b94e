// CPU implementation of the same Problem: the JAX CPU target and the tests' C++ reference.
// Double accumulation; fp16/bf16 are converted by value with round-to-nearest-even on output.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "launch.h"

namespace gemvx {
namespace {

float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (man << 13));  // inf / nan
  if (exp == 0) {
    if (man == 0) return bits_to_float(sign);
    const float v = std::ldexp(float(man), -24);  // subnormal
    return sign ? -v : v;
  }
  return bits_to_float(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t float_to_half(float f) {
  const uint32_t u = float_to_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const float a = std::fabs(f);
  if (std::isnan(f)) return uint16_t(sign | 0x7e00u);
  if (a >= 65520.0f) return uint16_t(sign | 0x7c00u);  // rounds to inf
  if (a < 6.103515625e-05f) {
    // subnormal range: multiples of 2^-24, nearbyint rounds half to even
    const float q = std::nearbyint(a * 16777216.0f);
    return uint16_t(sign | uint16_t(q));
  }
  const uint32_t au = float_to_bits(a);
  uint32_t mant = au & 0x7fffffu;
  uint32_t exp = (au >> 23) - 112;
  uint32_t h = (exp << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // carries into the exponent correctly
  return uint16_t(sign | h);
}

float bf16_to_float(uint16_t b) { return bits_to_float(uint32_t(b) << 16); }

uint16_t float_to_bf16(float f) {
  uint32_t u = float_to_bits(f);
  if (std::isnan(f)) return uint16_t((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

struct F32 {
  using Storage = float;
  static double load(float v) { return v; }
  static float store(double v) { return float(v); }
};
struct F16 {
  using Storage = uint16_t;
  static double load(uint16_t v) { return half_to_float(v); }
  static uint16_t store(double v) { return float_to_half(float(v)); }
};
struct BF16 {
  using Storage = uint16_t;
  static double load(uint16_t v) { return bf16_to_float(v); }
  static uint16_t store(double v) { return float_to_bf16(float(v)); }
};

// y = alpha * W x + beta * y_in for vectors of storage E; weight(g, m, k) is element (m, k) of
// matrix g of op(W), in double.
template <typename E, typename Weight>
void run_with(const Problem& p, Weight weight) {
  using S = typename E::Storage;
  const S* X = static_cast<const S*>(p.x);
  const S* Yin = static_cast<const S*>(p.y_in);
  S* Y = static_cast<S*>(p.y);
  for (int64_t g = 0; g < p.groups; ++g) {
    for (int64_t v = 0; v < p.nvec; ++v) {
      const S* x = X + g * p.x_group + v * p.x_vec;
      S* y = Y + g * p.y_group + v * p.y_vec;
      const S* yin = p.beta != 0.0f ? Yin + g * p.y_in_group + v * p.y_in_vec : nullptr;
      for (int64_t m = 0; m < p.M; ++m) {
        double acc = 0.0;
        for (int64_t k = 0; k < p.K; ++k) acc += weight(g, m, k) * E::load(x[k]);
        double out = double(p.alpha) * acc;
        if (yin != nullptr) out += double(p.beta) * E::load(yin[m]);
        y[m] = E::store(out);
      }
    }
  }
}

template <typename E>
void run(const Problem& p) {
  using S = typename E::Storage;
  const S* W = static_cast<const S*>(p.W);
  run_with<E>(p, [&](int64_t g, int64_t m, int64_t k) {
    const S* Wg = W + g * p.w_group;
    return E::load(p.trans ? Wg[k * p.ldw + m] : Wg[m * p.ldw + k]);
  });
}

double load_scale(const Problem& p, int64_t i) {
  switch (p.scale_dtype) {
    case DType::kFloat32: return static_cast<const float*>(p.scales)[i];
    case DType::kFloat16: return F16::load(static_cast<const uint16_t*>(p.scales)[i]);
    case DType::kBFloat16: return BF16::load(static_cast<const uint16_t*>(p.scales)[i]);
  }
  return 0.0;
}

// Weight-only quantised W: each element is dequantised exactly, (q - z) * s in double.
template <typename E>
void run_quant(const Problem& p) {
  const uint8_t* W = static_cast<const uint8_t*>(p.W);
  run_with<E>(p, [&](int64_t g, int64_t m, int64_t k) {
    const uint8_t* row = W + g * p.w_group + m * p.ldw;
    const int64_t j = p.group_size > 0 ? k / p.group_size : 0;
    int q = 0, z = 0;
    if (p.wbits == 8) {
      q = int(int8_t(row[k]));
    } else {
      q = (k % 2 == 0) ? (row[k / 2] & 15) : (row[k / 2] >> 4);
      z = p.zeros != nullptr ? (p.zeros[g * p.z_group + m * p.ldz + j] & 15) : 8;
    }
    return double(q - z) * load_scale(p, g * p.s_group + m * p.lds + j);
  });
}

}  // namespace

Status reference(const Problem& p) {
  Status st = validate(p);
  if (!st.ok()) return st;
  if (p.M == 0 || p.groups == 0 || p.nvec == 0) return {};
  if (p.wbits != 0) {
    if (p.dtype == DType::kFloat16) run_quant<F16>(p);
    else run_quant<BF16>(p);
    return {};
  }
  switch (p.dtype) {
    case DType::kFloat32: run<F32>(p); break;
    case DType::kFloat16: run<F16>(p); break;
    case DType::kBFloat16: run<BF16>(p); break;
  }
  return {};
}

}  // namespace gemvx
