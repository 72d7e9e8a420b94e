#include "problem.h"

namespace gemvx {

const char* status_message(Code code) {
  switch (code) {
    case Code::kOk: return "ok";
    case Code::kInvalidArgument: return "invalid problem description";
    case Code::kInvalidConfig: return "config id is not compiled or does not fit this layout";
    case Code::kWorkspaceTooSmall: return "split-K workspace missing or too small";
    case Code::kNoDevice: return "no CUDA GPU is available (no driver or no device)";
    case Code::kCudaError: return "CUDA error";
    case Code::kUnsupported: return "problem size exceeds what the kernels can address";
  }
  return "unknown status";
}

namespace {

// The quantisation fields of a problem with K > 0 and a non-empty result.
Status validate_quant(const Problem& p) {
  const Status bad{Code::kInvalidArgument, 0};
  if (int(p.scale_dtype) < 0 || int(p.scale_dtype) >= kNumDTypes) return bad;
  const int64_t g = p.group_size;
  if (g != 0 && (g < 32 || (g & (g - 1)) != 0)) return bad;
  if (p.zeros != nullptr && p.wbits != 4) return bad;
  if (p.scales == nullptr) return bad;
  if (p.lds < 0 || p.s_group < 0 || p.ldz < 0 || p.z_group < 0) return bad;
  if (p.M > 1 && (p.ldw < quant_row_bytes(p) || p.lds < quant_groups(p))) return bad;
  if (p.zeros != nullptr && p.M > 1 && p.ldz < quant_groups(p)) return bad;
  return {};
}

}  // namespace

Status validate(const Problem& p) {
  const Status bad{Code::kInvalidArgument, 0};
  if (int(p.dtype) < 0 || int(p.dtype) >= kNumDTypes) return bad;
  if (p.wbits != 0 && p.wbits != 4 && p.wbits != 8) return bad;
  if (p.wbits != 0 && (p.dtype == DType::kFloat32 || p.trans)) return bad;  // x f16/bf16, layout N
  if (p.M < 0 || p.K < 0 || p.groups < 0 || p.nvec < 0) return bad;
  if (p.ldw < 0 || p.w_group < 0 || p.x_vec < 0 || p.x_group < 0 || p.y_vec < 0 ||
      p.y_group < 0 || p.y_in_vec < 0 || p.y_in_group < 0)
    return bad;
  if (p.M == 0 || p.groups == 0 || p.nvec == 0) return {};  // empty output: nothing is touched
  if (p.y == nullptr) return bad;
  if (p.beta != 0.0f && p.y_in == nullptr) return bad;
  if (p.K == 0) return {};
  if (p.W == nullptr || p.x == nullptr) return bad;
  if (p.wbits != 0) return validate_quant(p);
  const int64_t stored_rows = p.trans ? p.K : p.M;
  const int64_t row_len = p.trans ? p.M : p.K;
  if (stored_rows > 1 && p.ldw < row_len) return bad;
  return {};
}

}  // namespace gemvx
