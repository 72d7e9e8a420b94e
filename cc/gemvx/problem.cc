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

Status validate(const Problem& p) {
  const Status bad{Code::kInvalidArgument, 0};
  if (int(p.dtype) < 0 || int(p.dtype) >= kNumDTypes) return bad;
  if (p.M < 0 || p.K < 0 || p.groups < 0 || p.nvec < 0) return bad;
  if (p.ldw < 0 || p.w_group < 0 || p.x_vec < 0 || p.x_group < 0 || p.y_vec < 0 ||
      p.y_group < 0 || p.y_in_vec < 0 || p.y_in_group < 0)
    return bad;
  if (p.M == 0 || p.groups == 0 || p.nvec == 0) return {};  // empty output: nothing is touched
  if (p.y == nullptr) return bad;
  if (p.beta != 0.0f && p.y_in == nullptr) return bad;
  if (p.K == 0) return {};
  if (p.W == nullptr || p.x == nullptr) return bad;
  const int64_t stored_rows = p.trans ? p.K : p.M;
  const int64_t row_len = p.trans ? p.M : p.K;
  if (stored_rows > 1 && p.ldw < row_len) return bad;
  return {};
}

}  // namespace gemvx
