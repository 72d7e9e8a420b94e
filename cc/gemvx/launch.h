// The one launcher: (Problem, config id, split count, workspace, stream) -> kernel(s).
// Never throws, aborts, exits or prints; every failure is a Status.
#pragma once

#include <cstddef>
#include <cstdint>

#include "problem.h"

namespace gemvx {

// One compiled config, as listed in configs.h.
struct ConfigInfo {
  int id;
  bool trans;       // false: RowMajor families (layout N); true: Transposed family (layout T)
  bool pipelined;   // loads software-pipelined one step ahead (RowMajorPipelined)
  bool tensor_cores;  // 16-bit types on tensor cores (RowMajorMma)
  int threads;
  int p1;           // RowMajor: threads per row; Transposed: threads along M
  int p2;           // RowMajor: rows per thread; Transposed: 1
  int unroll;
  int max_vectors;  // NV
  bool quant;       // Quant family: weight-only quantised W (Problem::wbits != 0) only
  const char* family;  // family name in configs.h
};

// The compiled configs in list order; *count receives their number.
const ConfigInfo* config_list(int* count);
const ConfigInfo* find_config(int id);

// Splits the launcher will really use for this problem (<= requested; 1 means no split-K).
int effective_splits(const Problem& p, int config, int splits);

// The paths a launch of this problem with this config takes on the current device, for tests:
// kPathTma: a QuantTma, TransposedTma(Loop) or RowMajorTma(Loop) config runs its TMA kernel
// (kernels/gemv_quant_tma.cuh, kernels/gemv_tma.cuh), not its fallback;
// kPathPrefetch: the kernel asks L2 for its first W before it waits on the previous kernel
// (kernels/common.cuh, Args::prefetch_blocks);
// kPathLean: a RowMajorLean or RowMajorPipelinedLean config runs its kernel with the lean argument
// block (kernels/common.cuh, LeanArgs).
constexpr int kPathTma = 1, kPathPrefetch = 2, kPathLean = 4;
int launch_paths(const Problem& p, int config, int splits);

// Workspace bytes the launch needs (0 when it does not split K).
std::size_t workspace_bytes(const Problem& p, int config, int splits);

// Runs y = alpha * op(W) x + beta * y_in on `stream` (a cudaStream_t; 0 is the legacy stream).
// `splits` > 1 asks for split-K (needs workspace_bytes() of device memory in `workspace`).
Status launch(const Problem& p, int config, int splits, void* workspace,
              std::size_t workspace_size, void* stream);

// CPU reference of the same Problem (host pointers), double accumulation.
Status reference(const Problem& p);

}  // namespace gemvx
