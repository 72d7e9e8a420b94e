// THE list of compiled kernel configs. It drives template instantiation and dispatch in
// launch.cu and the list exported to Python (module.cc); tables name these ids.
//
// Adding a config means adding one line here. Ids are stable: never renumber an id that a shipped
// table uses; append new ones.
//
// Families:
//   RowMajor   (layout N, W is (M, K) row-major): P1 = threads per row (lanes that split K and
//              meet in a shuffle/shared-memory reduction), P2 = rows per thread.
//   RowMajorPipelined: the same, with the next step's loads issued before the current step's
//              math (more registers, loads always ahead); wins on many fp32 and small shapes.
//              With several vectors (NV > 1) only W's loads run ahead; x's chunks are read in the
//              math, and a warp's lanes meet in a reduce-scatter (kernels/gemv_rowmajor.cuh).
//   RowMajorPrefetch, RowMajorPipelinedPrefetch: RowMajor and RowMajorPipelined (the same
//              kernels), whose blocks resident from the start ask L2 for their first rows of W
//              before they wait on the previous kernel (programmatic dependent launch): for the
//              table to take where that pays (kernels/common.cuh, rowmajor_start).
//   RowMajorLean, RowMajorPipelinedLean: RowMajor and RowMajorPipelined (the same kernels), which
//              run a plain GEMV (one vector, one matrix, no split, K a whole number of 16-byte
//              chunks) with the lean argument block (kernels/common.cuh, LeanArgs: one constant-bank
//              line, 32-bit indices): for the table to take where that pays (small W). A lane's
//              last chunks (fewer than UNROLL) are loaded together. Config 85's geometry has no
//              RowMajor twin: its other calls run its own full-block kernel.
//   RowMajorMma: several vectors on tensor cores (fp16/bf16; fp32 as three tf32 mma per product,
//              to fp32 accuracy: kernels/gemv_mma.cuh). P1 = 4 x the warps that split K (the other
//              warps take more rows), P2 = 8-row tiles per warp, NV = 16.
//              Unaligned operands run the RowMajor kernel with the same rows and lanes.
//   RowMajorMmaPipelined: RowMajorMma with the next step's W loads issued before this step's
//              x loads and mma (two register sets in turn).
//   Transposed (layout T, W stored (K, M) row-major): P1 = threads along M (each owns 16 bytes of
//              consecutive outputs), P2 = 1; THREADS / P1 threads split K inside the block.
//   TransposedPipelined: Transposed with the next step's rows loaded before the current step's
//              math, as RowMajorPipelined. With several vectors (NV a multiple of 4) x is staged
//              in shared memory and the blocks keep to 64 registers a thread (128 for 16-bit W),
//              so that 1024 threads (512) fit an SM (kernels/gemv_transposed.cuh).
//   TransposedMma: several vectors on tensor cores (fp16/bf16; fp32 as three tf32 mma per
//              product: kernels/gemv_mma_t.cuh). P1 = 16-byte column chunks per block as in
//              Transposed, P2 = 32-column tiles per warp (P1 / (4 P2) warps along M, fp32:
//              P1 / (8 P2); the other warps split K), NV = 16.
//              Unaligned operands run the Transposed kernel with the same columns.
//   TransposedMmaPipelined: TransposedMma with software-pipelined W loads, as above.
//   RowMajorTile: 16 vectors on tensor cores with W and x staged in shared memory by cp.async
//              (kernels/gemv_tile.cuh): P1 = rows per block, P2 = 16-byte chunks of K per stage,
//              UNROLL = stages (STAGES - 1 in flight), NV = 16; fp32 as three tf32 mma per product.
//   TransposedTile: the same for layout T (kernels/gemv_tile_t.cuh): P1 = 16-byte column chunks
//              per block, P2 = 8-row groups of W per stage, UNROLL = stages, NV = 16; fp32 as three
//              tf32 mma per product.
//   TransposedTma: TransposedTile on Hopper with W and x streamed by the TMA unit's bulk copies
//              (kernels/gemv_tma.cuh): THREADS - 32 consumer threads and a producer warp, P1 =
//              16-byte column chunks per block (whole boxes of 128-byte rows), P2 = 8 (64 rows of W
//              per stage), UNROLL = stages, NV = 16; fp32 as three tf32 mma per product. Other GPUs
//              and operands the copies cannot take run the Transposed kernel with THREADS - 32
//              threads and the same columns.
//   TransposedTmaLoop: TransposedTma with a grid of the blocks that fit at once, each taking every
//              gridDim.x-th column tile: its producer streams the next tile while its consumers
//              store the last (many short tiles: short K, small blocks).
//   RowMajorTma, RowMajorTmaLoop: the same for layout N (kernels/gemv_tma.cuh, gemv_tma_n): P1 =
//              rows per block (at most 256), P2 = 16-byte chunks of K per stage (whole 128-byte
//              boxes), UNROLL = stages, NV = 16; fragments as RowMajorTile's. Other GPUs and
//              operands the copies cannot take run the RowMajor kernel with THREADS - 32 threads,
//              4 lanes a row and the same rows.
//   Quant      (layout N, weight-only quantised W: int8, or int4 packed two per byte along K;
//              tensor-core mma.m16n8k16 with fp32 accumulation): P1 = lanes that walk a row, four
//              per warp (P1 / 4 warps split K for the same 16 rows), P2 = 16-row tiles per warp,
//              UNROLL = 16-byte chunks of packed W per lane and row per step (two steps in
//              flight: the next step loads during this one's math), NV = 8 or 16
//              vectors per pass over W (one mma n-tile per 8). Compiled for int4 and int8 W with
//              float16 and bfloat16 x (scale dtype and zero points are run-time arguments). Quant
//              ids start at 100 so the dense families can keep appending below them.
//   QuantTma   (layout N, quantised W on Hopper: kernels/gemv_quant_tma.cuh): W streamed into
//              shared memory by TMA, a producer warp and THREADS / 32 - 1 consumer warps; P1 =
//              bytes of each row per stage, P2 = stages per consumer warp, UNROLL = consumer
//              warps sharing a 16-row tile (each takes every UNROLL-th stage of its rows), NV = 8.
//              Persistent grid. int8 and int4 with one scale per row or per group of at least
//              64 bytes of a row (int8 g >= 64, int4 g >= 128), rows of whole 8 bytes, aligned
//              operands; other quantised calls run Quant config 103's kernel.
// UNROLL = independent 16-byte loads per thread in flight (per row); NV = vectors handled per
// block (1 = plain GEMV; >1 = multi-vector: W is read once for up to NV vectors).
// Every config is compiled for float32, float16 and bfloat16 (Quant: see above), with a
// 16-byte-vector body and a scalar variant for operands that are not 16-byte aligned.
#pragma once

//        id  family      THREADS  P1  P2  UNROLL  NV
#define GEMVX_CONFIGS(X)                      \
  X(0, RowMajor, 128, 4, 2, 2, 1)             \
  X(1, RowMajor, 128, 8, 1, 4, 1)             \
  X(2, RowMajor, 256, 8, 2, 2, 1)             \
  X(3, RowMajor, 256, 16, 1, 4, 1)            \
  X(4, RowMajor, 256, 32, 1, 4, 1)            \
  X(8, RowMajor, 256, 64, 1, 4, 1)            \
  X(9, RowMajor, 256, 128, 1, 4, 1)           \
  X(10, RowMajor, 256, 256, 1, 8, 1)          \
  X(11, RowMajor, 128, 16, 1, 2, 4)           \
  X(12, RowMajor, 256, 32, 1, 2, 4)           \
  X(13, RowMajor, 256, 32, 1, 1, 16)          \
  X(15, RowMajor, 64, 32, 1, 4, 1)            \
  X(16, RowMajor, 64, 64, 1, 4, 1)            \
  X(18, RowMajor, 128, 128, 1, 4, 1)          \
  X(20, Transposed, 256, 32, 1, 4, 1)         \
  X(22, Transposed, 128, 32, 1, 8, 1)         \
  X(24, Transposed, 512, 32, 1, 4, 1)         \
  X(25, Transposed, 256, 32, 1, 2, 4)         \
  X(26, Transposed, 256, 32, 1, 1, 16)        \
  X(27, Transposed, 512, 16, 1, 4, 1)         \
  X(28, Transposed, 256, 8, 1, 4, 1)          \
  X(30, RowMajorPipelined, 256, 32, 1, 4, 1)  \
  X(31, RowMajorPipelined, 256, 32, 2, 4, 1)  \
  X(32, RowMajorPipelined, 64, 32, 1, 4, 1)   \
  X(33, RowMajorPipelined, 64, 64, 1, 4, 1)   \
  X(34, RowMajorPipelined, 128, 32, 1, 8, 1)  \
  X(35, RowMajorPipelined, 128, 128, 1, 4, 1) \
  X(36, RowMajorPipelined, 256, 256, 1, 8, 1) \
  X(37, RowMajorPipelined, 128, 8, 1, 4, 1)   \
  X(38, RowMajorPipelined, 256, 64, 1, 4, 1)  \
  X(39, RowMajorPipelined, 512, 512, 1, 4, 1) \
  X(40, RowMajorMma, 256, 32, 1, 2, 16)       \
  X(44, RowMajorMma, 512, 64, 1, 2, 16)       \
  X(45, RowMajorMma, 256, 32, 2, 4, 16)       \
  X(48, RowMajorMma, 256, 4, 1, 4, 16)        \
  X(52, TransposedMma, 256, 16, 1, 4, 16)     \
  X(54, TransposedMma, 128, 8, 1, 4, 16)      \
  X(58, RowMajorMmaPipelined, 128, 4, 1, 4, 16) \
  X(59, RowMajorLean, 256, 64, 1, 4, 1)       \
  X(60, RowMajorLean, 256, 128, 1, 4, 1)      \
  X(61, RowMajorMmaPipelined, 256, 16, 1, 2, 16) \
  X(62, RowMajorLean, 128, 128, 1, 4, 1)      \
  X(63, RowMajorPipelinedLean, 128, 32, 1, 2, 1) \
  X(64, RowMajorPipelinedLean, 256, 32, 1, 4, 1) \
  X(66, RowMajorPipelinedLean, 256, 32, 2, 4, 1) \
  X(67, RowMajorPipelinedLean, 64, 32, 1, 4, 1) \
  X(68, RowMajorPipelinedLean, 64, 64, 1, 4, 1) \
  X(69, RowMajorPipelinedLean, 128, 32, 1, 8, 1) \
  X(70, RowMajorPipelinedLean, 128, 128, 1, 4, 1) \
  X(71, RowMajorPipelinedLean, 256, 64, 1, 4, 1) \
  X(72, RowMajorTile, 128, 64, 16, 4, 16) \
  X(73, RowMajorTile, 256, 128, 16, 3, 16) \
  X(74, RowMajorTile, 128, 64, 32, 3, 16) \
  X(75, TransposedTile, 128, 16, 8, 4, 16) \
  X(76, TransposedTile, 128, 32, 8, 3, 16) \
  X(78, TransposedTile, 256, 32, 4, 6, 16) \
  X(81, RowMajorPrefetch, 64, 32, 1, 4, 1) \
  X(83, RowMajorPrefetch, 128, 128, 1, 4, 1) \
  X(84, RowMajorPipelinedPrefetch, 128, 128, 1, 4, 1) \
  X(85, RowMajorLean, 256, 256, 1, 2, 1)      \
  X(86, RowMajorPipelined, 128, 32, 1, 2, 1)  \
  X(87, TransposedPipelined, 256, 8, 1, 4, 1) \
  X(88, TransposedPipelined, 512, 16, 1, 4, 1) \
  X(89, TransposedPipelined, 512, 32, 1, 4, 1) \
  X(90, TransposedPipelined, 256, 32, 1, 4, 1) \
  X(91, TransposedPipelined, 1024, 8, 1, 4, 1) \
  X(92, TransposedPipelined, 512, 8, 1, 4, 1) \
  X(93, TransposedTma, 288, 32, 8, 4, 16)    \
  X(94, TransposedTma, 288, 64, 8, 3, 16)    \
  X(95, TransposedTma, 160, 16, 8, 6, 16)    \
  X(96, TransposedTma, 288, 32, 8, 6, 16)    \
  X(97, TransposedTma, 160, 16, 8, 4, 16)    \
  X(98, TransposedTile, 512, 64, 4, 3, 16) \
  X(99, TransposedMmaPipelined, 128, 16, 1, 2, 16) \
  X(100, Quant, 128, 4, 1, 2, 8)              \
  X(102, Quant, 128, 4, 2, 2, 8)              \
  X(103, Quant, 128, 16, 1, 2, 8)             \
  X(104, Quant, 256, 32, 1, 2, 8)             \
  X(105, Quant, 128, 4, 1, 2, 16)             \
  X(106, Quant, 128, 16, 1, 2, 16)            \
  X(107, Quant, 128, 4, 1, 1, 8)              \
  X(108, Quant, 128, 16, 1, 1, 8)             \
  X(109, Quant, 256, 8, 1, 2, 8)              \
  X(110, Quant, 64, 4, 1, 2, 8)               \
  X(111, QuantTma, 160, 512, 2, 1, 8)         \
  X(112, QuantTma, 160, 512, 4, 1, 8)         \
  X(113, QuantTma, 288, 512, 2, 1, 8)         \
  X(115, QuantTma, 544, 256, 2, 1, 8)         \
  X(116, QuantTma, 416, 256, 2, 1, 8)         \
  X(117, QuantTma, 160, 512, 2, 2, 8)         \
  X(118, QuantTma, 288, 512, 2, 2, 8)         \
  X(119, QuantTma, 544, 256, 2, 4, 8)         \
  X(120, QuantTma, 416, 256, 2, 4, 8)         \
  X(121, QuantTma, 544, 256, 2, 2, 8)         \
  X(122, QuantTma, 288, 256, 4, 4, 8)         \
  X(123, TransposedTmaLoop, 160, 16, 8, 4, 16) \
  X(124, TransposedTmaLoop, 288, 32, 8, 4, 16) \
  X(125, RowMajorTma, 288, 128, 16, 4, 16)     \
  X(126, RowMajorTmaLoop, 160, 64, 16, 4, 16) \
  X(139, TransposedTma, 160, 8, 8, 4, 16)    \
  X(140, RowMajorPipelined, 256, 32, 4, 1, 4) \
  X(141, RowMajorPipelined, 256, 32, 2, 2, 4) \
  X(142, TransposedPipelined, 256, 32, 1, 4, 4) \
  X(143, TransposedPipelined, 256, 16, 1, 4, 4) \
  X(144, RowMajorTile, 128, 64, 16, 2, 16) \
  X(145, TransposedPipelined, 512, 4, 1, 4, 1)
