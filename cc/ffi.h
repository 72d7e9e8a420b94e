// The XLA FFI handlers of the JAX door (cc/ffi.cc), as opaque pointers for PyCapsules.
#pragma once

namespace gemvx {
void* ffi_handler_cuda();
void* ffi_handler_cpu();
void* ffi_quant_handler_cuda();  // target gemvx_gemv_quant (weight-only quantised W)
void* ffi_quant_handler_cpu();
}  // namespace gemvx
