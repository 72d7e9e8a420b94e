// XLA FFI handlers for the JAX door (typed FFI, api_version 1): one handler per platform. Each
// decodes the buffers and attributes into the core Problem, re-checks them against the buffers
// (an inconsistent call returns an FFI error, never touches memory out of bounds), and runs the
// same launcher as the CuPy door (CUDA) or the C++ reference (CPU).
//
// The CUDA handler allocates nothing and never synchronises: split-K scratch comes in as a second
// result buffer, and the handler is marked command-buffer compatible so XLA may capture it in
// CUDA graphs.
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

ffi::Error GemvCuda(cudaStream_t stream, ffi::AnyBuffer W, ffi::AnyBuffer x, ffi::AnyBuffer y_in,
                    ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::AnyBuffer> ws, int32_t trans,
                    int64_t M, int64_t K, int64_t groups, int64_t nvec, int64_t ldw,
                    int64_t w_group, int64_t x_vec, int64_t x_group, float alpha, float beta,
                    int32_t config, int32_t splits) {
  Problem p;
  ffi::Error err = decode(W, x, y_in, *y, trans, M, K, groups, nvec, ldw, w_group, x_vec, x_group,
                          alpha, beta, &p);
  if (err.failure()) return err;
  const Status st = launch(p, config, splits, ws->untyped_data(), ws->size_bytes(), stream);
  if (!st.ok()) {
    std::string msg = std::string("gemvx: ") + status_message(st.code);
    if (st.code == Code::kCudaError) msg += std::string(": ") + cudaGetErrorString(cudaError_t(st.cuda_error));
    return ffi::Error::Internal(msg);
  }
  return ffi::Error::Success();
}

ffi::Error GemvCpu(ffi::AnyBuffer W, ffi::AnyBuffer x, ffi::AnyBuffer y_in,
                   ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::AnyBuffer> ws, int32_t trans,
                   int64_t M, int64_t K, int64_t groups, int64_t nvec, int64_t ldw, int64_t w_group,
                   int64_t x_vec, int64_t x_group, float alpha, float beta, int32_t config,
                   int32_t splits) {
  (void)ws;
  (void)config;
  (void)splits;
  Problem p;
  ffi::Error err = decode(W, x, y_in, *y, trans, M, K, groups, nvec, ldw, w_group, x_vec, x_group,
                          alpha, beta, &p);
  if (err.failure()) return err;
  const Status st = reference(p);
  if (!st.ok()) return ffi::Error::Internal(std::string("gemvx: ") + status_message(st.code));
  return ffi::Error::Success();
}

// The attributes shared by both platforms, in the order of the handlers' parameters.
template <typename B>
auto bind_common(B binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()          // W: (groups, rows, cols) as addressed by ldw / w_group
      .template Arg<ffi::AnyBuffer>()          // x: (groups, nvec, K) as addressed by x_vec / x_group
      .template Arg<ffi::AnyBuffer>()          // y_in: (groups, nvec, M); read only when beta != 0
      .template Ret<ffi::AnyBuffer>()          // y: (groups, nvec, M), C-contiguous
      .template Ret<ffi::AnyBuffer>()          // split-K workspace (bytes; unused on the CPU)
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

}  // namespace gemvx
