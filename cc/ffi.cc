// XLA FFI handlers for the JAX door (typed FFI, api_version 1): one handler per platform. Each
// decodes the buffers and attributes into the core Problem, re-checks them against the buffers
// (an inconsistent call returns an FFI error, never touches memory out of bounds), and runs the
// same launcher as the CuPy door (CUDA) or the C++ reference (CPU).
//
// The CUDA handler allocates nothing and never synchronises: split-K scratch comes in as a second
// result buffer, present only when the call's config needs one (XLA's buffer assignment placed an
// unused one in another call's output buffer: a needless write to memory two independent calls
// share), and the handler is marked command-buffer compatible so XLA may capture it in CUDA
// graphs.
#include "ffi.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "gemvx/launch.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace gemvx {
namespace {

bool to_dtype(ffi::DataType t, DType* out) {
  switch (t) {
    case ffi::DataType::F32: *out = DType::kFloat32; return true;
    case ffi::DataType::F16: *out = DType::kFloat16; return true;
    case ffi::DataType::BF16: *out = DType::kBFloat16; return true;
    default: return false;
  }
}

// Highest element index + 1 that a (groups, inner, len) view with these strides touches.
int64_t extent(int64_t groups, int64_t group_stride, int64_t inner, int64_t inner_stride, int64_t len) {
  if (groups == 0 || inner == 0 || len == 0) return 0;
  return (groups - 1) * group_stride + (inner - 1) * inner_stride + len;
}

// Attributes -> Problem, checked against the buffers. Pointers are filled in here too.
ffi::Error decode(ffi::AnyBuffer W, ffi::AnyBuffer x, ffi::AnyBuffer y_in, ffi::AnyBuffer y,
                  int32_t trans, int64_t M, int64_t K, int64_t groups, int64_t nvec, int64_t ldw,
                  int64_t w_group, int64_t x_vec, int64_t x_group, float alpha, float beta,
                  Problem* p) {
  DType dt;
  if (!to_dtype(W.element_type(), &dt))
    return ffi::Error::InvalidArgument("gemvx: W must be float32, float16 or bfloat16");
  if (x.element_type() != W.element_type() || y.element_type() != W.element_type())
    return ffi::Error::InvalidArgument("gemvx: W, x and y must share one dtype");
  if (beta != 0.0f && y_in.element_type() != W.element_type())
    return ffi::Error::InvalidArgument("gemvx: y_in must have the dtype of W");
  p->dtype = dt;
  p->trans = trans != 0;
  p->M = M;
  p->K = K;
  p->groups = groups;
  p->nvec = nvec;
  p->ldw = ldw;
  p->w_group = w_group;
  p->x_vec = x_vec;
  p->x_group = x_group;
  p->y_vec = p->y_in_vec = M;
  p->y_group = p->y_in_group = nvec * M;
  p->alpha = alpha;
  p->beta = beta;
  p->W = W.untyped_data();
  p->x = x.untyped_data();
  p->y = y.untyped_data();
  p->y_in = beta != 0.0f ? y_in.untyped_data() : nullptr;
  if (M < 0 || K < 0 || groups < 0 || nvec < 0)
    return ffi::Error::InvalidArgument("gemvx: negative size attribute");
  const int64_t rows = p->trans ? K : M, cols = p->trans ? M : K;
  if (int64_t(y.element_count()) != groups * nvec * M)
    return ffi::Error::InvalidArgument("gemvx: y has " + std::to_string(y.element_count()) +
                                       " elements, expected groups*nvec*M = " +
                                       std::to_string(groups * nvec * M));
  if (beta != 0.0f && int64_t(y_in.element_count()) != groups * nvec * M)
    return ffi::Error::InvalidArgument("gemvx: y_in does not match the result size");
  if (extent(groups, w_group, rows, ldw, cols) > int64_t(W.element_count()))
    return ffi::Error::InvalidArgument("gemvx: W is smaller than the sizes and strides address");
  if (extent(groups, x_group, nvec, x_vec, K) > int64_t(x.element_count()))
    return ffi::Error::InvalidArgument("gemvx: x is smaller than the sizes and strides address");
  const Status st = validate(*p);
  if (!st.ok()) return ffi::Error::InvalidArgument(std::string("gemvx: ") + status_message(st.code));
  return ffi::Error::Success();
}

// A failed launch or reference run as an FFI error.
ffi::Error status_error(const Status& st) {
  std::string msg = std::string("gemvx: ") + status_message(st.code);
  if (st.code == Code::kCudaError) msg += std::string(": ") + cudaGetErrorString(cudaError_t(st.cuda_error));
  return ffi::Error::Internal(msg);
}

// The optional split-K workspace: the result after y, if the call has one.
ffi::Error workspace(ffi::RemainingRets rest, void** ptr, std::size_t* bytes) {
  *ptr = nullptr;
  *bytes = 0;
  if (rest.size() == 0) return ffi::Error::Success();
  if (rest.size() > 1) return ffi::Error::InvalidArgument("gemvx: more than one workspace result");
  auto ws = rest.get<ffi::AnyBuffer>(0);
  if (ws.has_error()) return ws.error();
  *ptr = (*ws)->untyped_data();
  *bytes = (*ws)->size_bytes();
  return ffi::Error::Success();
}

// Runs a decoded call: the launcher on XLA's stream with the workspace result (CUDA), or the C++
// reference (CPU, which needs no workspace).
template <bool kCuda>
ffi::Error run(const Problem& p, cudaStream_t stream, ffi::RemainingRets ws, int32_t config,
               int32_t splits) {
  Status st;
  if constexpr (kCuda) {
    void* ws_ptr;
    std::size_t ws_bytes;
    ffi::Error err = workspace(ws, &ws_ptr, &ws_bytes);
    if (err.failure()) return err;
    st = launch(p, config, splits, ws_ptr, ws_bytes, stream);
  } else {
    (void)stream;
    (void)ws;
    (void)config;
    (void)splits;
    st = reference(p);
  }
  return st.ok() ? ffi::Error::Success() : status_error(st);
}

template <bool kCuda>
ffi::Error Gemv(cudaStream_t stream, ffi::AnyBuffer W, ffi::AnyBuffer x, ffi::AnyBuffer y_in,
                ffi::Result<ffi::AnyBuffer> y, ffi::RemainingRets ws, int32_t trans, int64_t M,
                int64_t K, int64_t groups, int64_t nvec, int64_t ldw, int64_t w_group,
                int64_t x_vec, int64_t x_group, float alpha, float beta, int32_t config,
                int32_t splits) {
  Problem p;
  ffi::Error err = decode(W, x, y_in, *y, trans, M, K, groups, nvec, ldw, w_group, x_vec, x_group,
                          alpha, beta, &p);
  if (err.failure()) return err;
  return run<kCuda>(p, stream, ws, config, splits);
}

#define GEMVX_DENSE_PARAMS                                                                         \
  ffi::AnyBuffer W, ffi::AnyBuffer x, ffi::AnyBuffer y_in, ffi::Result<ffi::AnyBuffer> y,           \
      ffi::RemainingRets ws, int32_t trans, int64_t M, int64_t K, int64_t groups, int64_t nvec,     \
      int64_t ldw, int64_t w_group, int64_t x_vec, int64_t x_group, float alpha, float beta,        \
      int32_t config, int32_t splits
#define GEMVX_DENSE_ARGS \
  W, x, y_in, y, ws, trans, M, K, groups, nvec, ldw, w_group, x_vec, x_group, alpha, beta, config, splits

ffi::Error GemvCuda(cudaStream_t stream, GEMVX_DENSE_PARAMS) {
  return Gemv<true>(stream, GEMVX_DENSE_ARGS);
}
ffi::Error GemvCpu(GEMVX_DENSE_PARAMS) { return Gemv<false>(nullptr, GEMVX_DENSE_ARGS); }
#undef GEMVX_DENSE_PARAMS
#undef GEMVX_DENSE_ARGS

// The attributes shared by both platforms, in the order of the handlers' parameters.
template <typename B>
auto bind_common(B binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()          // W: (groups, rows, cols) as addressed by ldw / w_group
      .template Arg<ffi::AnyBuffer>()          // x: (groups, nvec, K) as addressed by x_vec / x_group
      .template Arg<ffi::AnyBuffer>()          // y_in: (groups, nvec, M); read only when beta != 0
      .template Ret<ffi::AnyBuffer>()          // y: (groups, nvec, M), C-contiguous
      .RemainingRets()                          // split-K workspace (bytes), only if the config needs one
      .template Attr<int32_t>("trans")      // 0: W is (M, K); 1: W is stored (K, M)
      .template Attr<int64_t>("M")
      .template Attr<int64_t>("K")
      .template Attr<int64_t>("groups")     // independent matrices
      .template Attr<int64_t>("nvec")       // vectors per matrix
      .template Attr<int64_t>("ldw")        // row stride of the stored matrix (elements)
      .template Attr<int64_t>("w_group")    // matrix stride (elements, 0 = broadcast)
      .template Attr<int64_t>("x_vec")      // vector stride (elements)
      .template Attr<int64_t>("x_group")    // x group stride (elements, 0 = broadcast)
      .template Attr<float>("alpha")
      .template Attr<float>("beta")
      .template Attr<int32_t>("config")     // compiled config id (configs.h)
      .template Attr<int32_t>("splits");    // split-K count
}

// ----- weight-only quantised W (target gemvx_gemv_quant) -------------------------------------

// The attributes of a quantised call -> Problem, checked against the buffers.
struct QuantAttrs {
  int32_t bits, has_zeros;
  int64_t group_size, M, K, groups, nvec, ldw, w_group, lds, s_group, ldz, z_group, x_vec, x_group;
  float alpha, beta;
};

ffi::Error decode_quant(ffi::AnyBuffer W, ffi::AnyBuffer scales, ffi::AnyBuffer zeros,
                        ffi::AnyBuffer x, ffi::AnyBuffer y_in, ffi::AnyBuffer y,
                        const QuantAttrs& at, Problem* p) {
  using ffi::Error;
  DType dt;
  if (!to_dtype(x.element_type(), &dt) || dt == DType::kFloat32)
    return Error::InvalidArgument("gemvx: x must be float16 or bfloat16 with a quantised W");
  if (y.element_type() != x.element_type() || (at.beta != 0.0f && y_in.element_type() != x.element_type()))
    return Error::InvalidArgument("gemvx: y must have the dtype of x");
  const ffi::DataType want_w = at.bits == 8 ? ffi::DataType::S8 : ffi::DataType::U8;
  if ((at.bits != 4 && at.bits != 8) || W.element_type() != want_w)
    return Error::InvalidArgument("gemvx: packed W must be int8 (bits 8) or uint8 (bits 4)");
  if (!to_dtype(scales.element_type(), &p->scale_dtype))
    return Error::InvalidArgument("gemvx: scales must be float32, float16 or bfloat16");
  if (at.has_zeros && zeros.element_type() != ffi::DataType::U8)
    return Error::InvalidArgument("gemvx: zero points must be uint8");
  if (at.M < 0 || at.K < 0 || at.groups < 0 || at.nvec < 0)
    return Error::InvalidArgument("gemvx: negative size attribute");
  p->dtype = dt;
  p->wbits = at.bits;
  p->group_size = at.group_size;
  p->M = at.M;
  p->K = at.K;
  p->groups = at.groups;
  p->nvec = at.nvec;
  p->ldw = at.ldw;
  p->w_group = at.w_group;
  p->lds = at.lds;
  p->s_group = at.s_group;
  p->ldz = at.ldz;
  p->z_group = at.z_group;
  p->x_vec = at.x_vec;
  p->x_group = at.x_group;
  p->y_vec = p->y_in_vec = at.M;
  p->y_group = p->y_in_group = at.nvec * at.M;
  p->alpha = at.alpha;
  p->beta = at.beta;
  p->W = W.untyped_data();
  p->scales = scales.untyped_data();
  p->zeros = at.has_zeros ? static_cast<const uint8_t*>(zeros.untyped_data()) : nullptr;
  p->x = x.untyped_data();
  p->y = y.untyped_data();
  p->y_in = at.beta != 0.0f ? y_in.untyped_data() : nullptr;
  const int64_t out = at.groups * at.nvec * at.M;
  if (int64_t(y.element_count()) != out || (at.beta != 0.0f && int64_t(y_in.element_count()) != out))
    return Error::InvalidArgument("gemvx: y (or y_in) does not have groups*nvec*M elements");
  const int64_t ng = quant_groups(*p);
  if (extent(at.groups, at.w_group, at.M, at.ldw, quant_row_bytes(*p)) > int64_t(W.element_count()))
    return Error::InvalidArgument("gemvx: packed W is smaller than the sizes and strides address");
  if (extent(at.groups, at.s_group, at.M, at.lds, ng) > int64_t(scales.element_count()))
    return Error::InvalidArgument("gemvx: scales are smaller than the sizes and strides address");
  if (at.has_zeros && extent(at.groups, at.z_group, at.M, at.ldz, ng) > int64_t(zeros.element_count()))
    return Error::InvalidArgument("gemvx: zero points are smaller than the sizes and strides address");
  if (extent(at.groups, at.x_group, at.nvec, at.x_vec, at.K) > int64_t(x.element_count()))
    return Error::InvalidArgument("gemvx: x is smaller than the sizes and strides address");
  const Status st = validate(*p);
  if (!st.ok()) return Error::InvalidArgument(std::string("gemvx: ") + status_message(st.code));
  return Error::Success();
}

// One handler body for both platforms (run: the launcher or the reference).
template <bool kCuda>
ffi::Error GemvQuant(cudaStream_t stream, ffi::AnyBuffer W, ffi::AnyBuffer scales,
                     ffi::AnyBuffer zeros, ffi::AnyBuffer x, ffi::AnyBuffer y_in,
                     ffi::Result<ffi::AnyBuffer> y, ffi::RemainingRets ws, QuantAttrs at,
                     int32_t config, int32_t splits) {
  Problem p;
  ffi::Error err = decode_quant(W, scales, zeros, x, y_in, *y, at, &p);
  if (err.failure()) return err;
  return run<kCuda>(p, stream, ws, config, splits);
}

#define GEMVX_QUANT_PARAMS                                                                          \
  ffi::AnyBuffer W, ffi::AnyBuffer scales, ffi::AnyBuffer zeros, ffi::AnyBuffer x,                  \
      ffi::AnyBuffer y_in, ffi::Result<ffi::AnyBuffer> y, ffi::RemainingRets ws,                    \
      int32_t bits, int32_t has_zeros, int64_t group_size, int64_t M, int64_t K, int64_t groups,    \
      int64_t nvec, int64_t ldw, int64_t w_group, int64_t lds, int64_t s_group, int64_t ldz,        \
      int64_t z_group, int64_t x_vec, int64_t x_group, float alpha, float beta, int32_t config,     \
      int32_t splits
#define GEMVX_QUANT_ARGS                                                                            \
  W, scales, zeros, x, y_in, y, ws,                                                                 \
      QuantAttrs{bits, has_zeros, group_size, M, K, groups, nvec, ldw, w_group, lds, s_group, ldz,  \
                 z_group, x_vec, x_group, alpha, beta},                                             \
      config, splits

ffi::Error GemvQuantCuda(cudaStream_t stream, GEMVX_QUANT_PARAMS) {
  return GemvQuant<true>(stream, GEMVX_QUANT_ARGS);
}
ffi::Error GemvQuantCpu(GEMVX_QUANT_PARAMS) { return GemvQuant<false>(nullptr, GEMVX_QUANT_ARGS); }
#undef GEMVX_QUANT_PARAMS
#undef GEMVX_QUANT_ARGS

template <typename B>
auto bind_quant(B binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()        // packed W: int8 (groups, M, K) or uint8 (groups, M, ceil(K/2))
      .template Arg<ffi::AnyBuffer>()        // scales: (groups, M, ceil(K/group_size)) float32/16, bfloat16
      .template Arg<ffi::AnyBuffer>()        // zero points: uint8, the shape of the scales (unused without)
      .template Arg<ffi::AnyBuffer>()        // x: (groups, nvec, K) as addressed by x_vec / x_group
      .template Arg<ffi::AnyBuffer>()        // y_in: (groups, nvec, M); read only when beta != 0
      .template Ret<ffi::AnyBuffer>()        // y: (groups, nvec, M), C-contiguous, x's dtype
      .RemainingRets()                        // split-K workspace (bytes), only if the config needs one
      .template Attr<int32_t>("bits")        // 8 or 4
      .template Attr<int32_t>("has_zeros")   // 1: asymmetric int4 (zero points given)
      .template Attr<int64_t>("group_size")  // power of two >= 32, or 0 (per channel)
      .template Attr<int64_t>("M")
      .template Attr<int64_t>("K")
      .template Attr<int64_t>("groups")
      .template Attr<int64_t>("nvec")
      .template Attr<int64_t>("ldw")         // packed row stride (bytes)
      .template Attr<int64_t>("w_group")     // packed matrix stride (bytes, 0 = broadcast)
      .template Attr<int64_t>("lds")         // scale row stride (elements)
      .template Attr<int64_t>("s_group")
      .template Attr<int64_t>("ldz")         // zero-point row stride (elements)
      .template Attr<int64_t>("z_group")
      .template Attr<int64_t>("x_vec")
      .template Attr<int64_t>("x_group")
      .template Attr<float>("alpha")
      .template Attr<float>("beta")
      .template Attr<int32_t>("config")
      .template Attr<int32_t>("splits");
}

}  // namespace

XLA_FFI_DEFINE_HANDLER(kGemvCuda, GemvCuda,
                       bind_common(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
                       {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER(kGemvCpu, GemvCpu, bind_common(ffi::Ffi::Bind()));

void* ffi_handler_cuda() { return reinterpret_cast<void*>(kGemvCuda); }
void* ffi_handler_cpu() { return reinterpret_cast<void*>(kGemvCpu); }

#define GEMVX_STR2(x) #x
#define GEMVX_STR(x) GEMVX_STR2(x)
const char* ffi_api_version() { return GEMVX_STR(XLA_FFI_API_MAJOR) "." GEMVX_STR(XLA_FFI_API_MINOR); }

XLA_FFI_DEFINE_HANDLER(kGemvQuantCuda, GemvQuantCuda,
                       bind_quant(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
                       {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER(kGemvQuantCpu, GemvQuantCpu, bind_quant(ffi::Ffi::Bind()));

void* ffi_quant_handler_cuda() { return reinterpret_cast<void*>(kGemvQuantCuda); }
void* ffi_quant_handler_cpu() { return reinterpret_cast<void*>(kGemvQuantCpu); }

}  // namespace gemvx
