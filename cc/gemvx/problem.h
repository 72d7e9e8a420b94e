// gemvx core: the problem description and the status every entry point returns.
// No Python, JAX or CuPy types here: the doors translate their arrays into a Problem.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gemvx {

// Element type of W, x and y (they always share one type).
enum class DType : int32_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

inline constexpr int kNumDTypes = 3;

inline constexpr std::size_t dtype_size(DType t) {
  return t == DType::kFloat32 ? 4 : 2;
}

// Status codes. Code 0 is success; every other code maps to a Python exception in the doors.
enum class Code : int32_t {
  kOk = 0,
  kInvalidArgument = 1,   // a Problem field is inconsistent (negative size, null pointer, ...)
  kInvalidConfig = 2,     // config id not compiled, or the config does not fit the layout
  kWorkspaceTooSmall = 3, // split-K needs more workspace than was given
  kNoDevice = 4,          // no CUDA driver or no GPU
  kCudaError = 5,         // a CUDA runtime call or a launch failed; Status::cuda_error has the code
  kUnsupported = 6,       // a size the kernels cannot address (documented limits)
};

struct Status {
  Code code = Code::kOk;
  int32_t cuda_error = 0;  // cudaError_t value when code == kCudaError
  bool ok() const { return code == Code::kOk; }
};

// Human readable text for a Status (static storage, never null).
const char* status_message(Code code);

// y[g, v, :] = alpha * op(W[g]) @ x[g, v, :] + beta * y_in[g, v, :]
//
//   trans == false : W[g] is (M, K) row-major with row stride ldw (elements), op(W) = W.
//   trans == true  : W[g] is stored (K, M) row-major with row stride ldw, op(W) = W^T.
//
// The problem is a grid of `groups` independent matrices, each multiplied with `nvec` vectors.
// A W group stride of 0 broadcasts one matrix over all groups. Vectors and outputs have unit
// stride along K and M; every other stride is in elements and may be any non-negative value.
// Accumulation is fp32; beta == 0 means y_in is never read (it may be null).
struct Problem {
  DType dtype = DType::kFloat32;
  bool trans = false;
  int64_t M = 0;       // length of y
  int64_t K = 0;       // length of x
  int64_t groups = 1;  // independent matrices
  int64_t nvec = 1;    // vectors per matrix (multi-vector kernels read W once per chunk)

  const void* W = nullptr;
  int64_t ldw = 0;      // row stride of the stored matrix
  int64_t w_group = 0;  // stride between matrices (0 = broadcast)

  const void* x = nullptr;
  int64_t x_vec = 0;    // stride between vectors of one group
  int64_t x_group = 0;  // stride between groups

  void* y = nullptr;
  int64_t y_vec = 0;
  int64_t y_group = 0;

  const void* y_in = nullptr;  // may equal y (in-place update); unused when beta == 0
  int64_t y_in_vec = 0;
  int64_t y_in_group = 0;

  float alpha = 1.0f;
  float beta = 0.0f;

  // Weight-only quantisation. wbits == 0: W is dense, of `dtype`. wbits == 8 or 4: W holds
  // integer codes and `dtype` is the dtype of x and y (float16 or bfloat16); layout N only.
  //   wbits 8: W is int8 (M, K), one signed code per byte.
  //   wbits 4: W is uint8 (M, ceil(K / 2)), two codes per byte along K, even k in the low nibble.
  // ldw and w_group count bytes. Element (m, k) is (q - z) * s with s the scale of its group
  // (group_size consecutive k; 0 = one group per row) and z its zero point: zeros[...] & 15 when
  // zeros is given (int4 only), else 8 for int4 (codes stored offset by 8) and 0 for int8.
  int32_t wbits = 0;
  int64_t group_size = 0;  // a power of two >= 32, or 0 (per channel)
  DType scale_dtype = DType::kFloat32;
  const void* scales = nullptr;  // (groups, M, ceil(K / group_size)) as addressed by lds / s_group
  int64_t lds = 0;               // scale row stride (elements)
  int64_t s_group = 0;           // scale matrix stride (elements, 0 = broadcast)
  const uint8_t* zeros = nullptr;  // uint8 zero points, the shape of the scales; may be null
  int64_t ldz = 0;
  int64_t z_group = 0;
};

// Number of scale groups per row of a quantised problem (1 per channel); 0 when K == 0.
inline int64_t quant_groups(const Problem& p) {
  if (p.K == 0) return 0;
  return p.group_size > 0 ? (p.K + p.group_size - 1) / p.group_size : 1;
}

// Bytes of one packed row of a quantised problem.
inline int64_t quant_row_bytes(const Problem& p) { return p.wbits == 4 ? (p.K + 1) / 2 : p.K; }

// Checks the fields every implementation relies on (sizes, strides, pointers).
Status validate(const Problem& p);

}  // namespace gemvx
