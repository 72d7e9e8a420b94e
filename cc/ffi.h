// The XLA FFI handlers of the JAX door (cc/ffi.cc), as opaque pointers for PyCapsules.
#pragma once

namespace gemvx {
void* ffi_handler_cuda();
void* ffi_handler_cpu();
// The XLA FFI API version ("major.minor") of the headers the handlers were compiled against:
// the version they report to XLA, which accepts it only up to its own.
const char* ffi_api_version();

void* ffi_quant_handler_cuda();  // target gemvx_gemv_quant (weight-only quantised W)
void* ffi_quant_handler_cpu();
}  // namespace gemvx
