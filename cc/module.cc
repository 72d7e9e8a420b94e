// nanobind module: the CuPy door's entry into the launcher, the CPU reference, the compiled config
// list and device/build information. Thin by design: no checks beyond what the core does, no
// heuristics. Pointers travel as integers; statuses travel back as (code, cuda_error) tuples.
#include <cuda_runtime.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <cstdint>
#include <string>

#include "gemvx/launch.h"
#ifdef GEMVX_WITH_JAX
#include "ffi.h"
#endif

namespace nb = nanobind;
using gemvx::Problem;
using gemvx::Status;

namespace {

#ifndef GEMVX_VERSION
#define GEMVX_VERSION "0.0.0"
#endif
#ifndef GEMVX_CUDA_ARCHS
#define GEMVX_CUDA_ARCHS ""
#endif
#ifndef GEMVX_JAXLIB_VERSION
#define GEMVX_JAXLIB_VERSION ""
#endif

std::tuple<int, int> to_tuple(Status s) { return {int(s.code), int(s.cuda_error)}; }

Problem with_operands(const Problem& plan, uintptr_t W, uintptr_t x, uintptr_t y, uintptr_t y_in,
                      float alpha, float beta) {
  Problem p = plan;
  p.W = reinterpret_cast<const void*>(W);
  p.x = reinterpret_cast<const void*>(x);
  p.y = reinterpret_cast<void*>(y);
  p.y_in = reinterpret_cast<const void*>(y_in);
  p.alpha = alpha;
  p.beta = beta;
  return p;
}

// A quantised plan with its per-call pointers: the packed W, its scales and zero points (0: none).
Problem with_quant_operands(const Problem& plan, uintptr_t W, uintptr_t scales, uintptr_t zeros,
                            uintptr_t x, uintptr_t y, uintptr_t y_in, float alpha, float beta) {
  Problem p = with_operands(plan, W, x, y, y_in, alpha, beta);
  p.scales = reinterpret_cast<const void*>(scales);
  p.zeros = reinterpret_cast<const uint8_t*>(zeros);
  return p;
}

}  // namespace

NB_MODULE(_ext, m) {
  m.doc() = "gemvx compiled core (kernels, launcher, CPU reference)";

  nb::class_<Problem>(m, "Problem")
                 .def(nb::init<>())
                 .def_prop_rw(
                     "dtype", [](const Problem& p) { return int(p.dtype); },
                     [](Problem& p, int v) { p.dtype = gemvx::DType(v); })
                 .def_rw("trans", &Problem::trans)
                 .def_rw("M", &Problem::M)
                 .def_rw("K", &Problem::K)
                 .def_rw("groups", &Problem::groups)
                 .def_rw("nvec", &Problem::nvec)
                 .def_rw("ldw", &Problem::ldw)
                 .def_rw("w_group", &Problem::w_group)
                 .def_rw("x_vec", &Problem::x_vec)
                 .def_rw("x_group", &Problem::x_group)
                 .def_rw("y_vec", &Problem::y_vec)
                 .def_rw("y_group", &Problem::y_group)
                 .def_rw("y_in_vec", &Problem::y_in_vec)
                 .def_rw("y_in_group", &Problem::y_in_group)
                 .def_rw("wbits", &Problem::wbits)
                 .def_rw("group_size", &Problem::group_size)
                 .def_prop_rw(
                     "scale_dtype", [](const Problem& p) { return int(p.scale_dtype); },
                     [](Problem& p, int v) { p.scale_dtype = gemvx::DType(v); })
                 .def_rw("lds", &Problem::lds)
                 .def_rw("s_group", &Problem::s_group)
                 .def_rw("ldz", &Problem::ldz)
                 .def_rw("z_group", &Problem::z_group);

  // The Problem is an immutable plan (shapes, strides): each call supplies its own pointers and
  // scalars, so one cached plan serves concurrent callers.
  m.def(
      "launch",
      [](const Problem& plan, uintptr_t W, uintptr_t x, uintptr_t y, uintptr_t y_in, float alpha,
         float beta, int config, int splits, uintptr_t ws, size_t ws_bytes, uintptr_t stream) {
        return to_tuple(gemvx::launch(with_operands(plan, W, x, y, y_in, alpha, beta), config,
                                      splits, reinterpret_cast<void*>(ws), ws_bytes,
                                      reinterpret_cast<void*>(stream)));
      },
      nb::arg("plan"), nb::arg("W"), nb::arg("x"), nb::arg("y"), nb::arg("y_in"),
      nb::arg("alpha"), nb::arg("beta"), nb::arg("config"), nb::arg("splits"),
      nb::arg("workspace"), nb::arg("workspace_bytes"), nb::arg("stream"),
      "Launch on a CUDA stream (device pointers). Returns (status code, cuda error).");
  m.def(
      "reference",
      [](const Problem& plan, uintptr_t W, uintptr_t x, uintptr_t y, uintptr_t y_in, float alpha,
         float beta) {
        return to_tuple(gemvx::reference(with_operands(plan, W, x, y, y_in, alpha, beta)));
      },
      nb::arg("plan"), nb::arg("W"), nb::arg("x"), nb::arg("y"), nb::arg("y_in"),
      nb::arg("alpha"), nb::arg("beta"),
      "Run the CPU reference (host pointers). Returns (status code, 0).");
  m.def(
      "launch_quant",
      [](const Problem& plan, uintptr_t W, uintptr_t scales, uintptr_t zeros, uintptr_t x,
         uintptr_t y, uintptr_t y_in, float alpha, float beta, int config, int splits,
         uintptr_t ws, size_t ws_bytes, uintptr_t stream) {
        return to_tuple(gemvx::launch(
            with_quant_operands(plan, W, scales, zeros, x, y, y_in, alpha, beta), config, splits,
            reinterpret_cast<void*>(ws), ws_bytes, reinterpret_cast<void*>(stream)));
      },
      nb::arg("plan"), nb::arg("W"), nb::arg("scales"), nb::arg("zeros"), nb::arg("x"),
      nb::arg("y"), nb::arg("y_in"), nb::arg("alpha"), nb::arg("beta"), nb::arg("config"),
      nb::arg("splits"), nb::arg("workspace"), nb::arg("workspace_bytes"), nb::arg("stream"),
      "Launch a quantised plan (packed W, scales, zero points or 0) on a CUDA stream.");
  m.def(
      "reference_quant",
      [](const Problem& plan, uintptr_t W, uintptr_t scales, uintptr_t zeros, uintptr_t x,
         uintptr_t y, uintptr_t y_in, float alpha, float beta) {
        return to_tuple(gemvx::reference(
            with_quant_operands(plan, W, scales, zeros, x, y, y_in, alpha, beta)));
      },
      nb::arg("plan"), nb::arg("W"), nb::arg("scales"), nb::arg("zeros"), nb::arg("x"),
      nb::arg("y"), nb::arg("y_in"), nb::arg("alpha"), nb::arg("beta"),
      "Run the CPU reference of a quantised plan (host pointers).");
  m.def("workspace_bytes", &gemvx::workspace_bytes, nb::arg("problem"), nb::arg("config"),
        nb::arg("splits"));
  m.def("effective_splits", &gemvx::effective_splits, nb::arg("problem"), nb::arg("config"),
        nb::arg("splits"));
  m.def(
      "uses_tma",
      [](const Problem& plan, uintptr_t W, uintptr_t scales, uintptr_t x, int config, int splits) {
        const Problem p = with_quant_operands(plan, W, scales, 0, x, 0, 0, 1.0f, 0.0f);
        return (gemvx::launch_paths(p, config, splits) & gemvx::kPathTma) != 0;
      },
      nb::arg("plan"), nb::arg("W"), nb::arg("scales"), nb::arg("x"), nb::arg("config"), nb::arg("splits"),
      "Whether launching this plan runs a TMA kernel (for tests): a quantised plan with a QuantTma "
      "config, or a dense plan with a TMA config of its layout (scales 0).");
  m.def(
      "dense_paths",
      [](const Problem& plan, uintptr_t W, uintptr_t x, int config, int splits) {
        return gemvx::launch_paths(with_operands(plan, W, x, 0, 0, 1.0f, 0.0f), config, splits);
      },
      nb::arg("plan"), nb::arg("W"), nb::arg("x"), nb::arg("config"), nb::arg("splits"),
      "The paths a launch of this dense plan takes (for tests): PATH_PREFETCH, it prefetches its "
      "first W into L2 before waiting; PATH_LEAN, it runs with the lean argument block.");
  m.attr("PATH_PREFETCH") = gemvx::kPathPrefetch;
  m.attr("PATH_LEAN") = gemvx::kPathLean;
  m.def("status_message", [](int code) { return std::string(gemvx::status_message(gemvx::Code(code))); });
  m.def("cuda_error_string", [](int err) {
    return std::string(cudaGetErrorName(cudaError_t(err))) + ": " +
           cudaGetErrorString(cudaError_t(err));
  });

  m.def("configs", []() {
    nb::list out;
    int n = 0;
    const gemvx::ConfigInfo* list = gemvx::config_list(&n);
    for (int i = 0; i < n; ++i) {
      nb::dict d;
      d["id"] = list[i].id;
      d["layout"] = list[i].trans ? "T" : "N";
      d["pipelined"] = list[i].pipelined;
      d["tensor_cores"] = list[i].tensor_cores;
      d["threads"] = list[i].threads;
      d["p1"] = list[i].p1;
      d["p2"] = list[i].p2;
      d["unroll"] = list[i].unroll;
      d["max_vectors"] = list[i].max_vectors;
      d["quant"] = list[i].quant;
      d["family"] = std::string(list[i].family);
      out.append(d);
    }
    return out;
  });

  m.def("device_count", []() {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      cudaGetLastError();
      n = 0;
    }
    return std::make_tuple(n, int(e));
  });
  m.def("current_device", []() {
    int d = -1;
    cudaError_t e = cudaGetDevice(&d);
    return std::make_tuple(d, int(e));
  });
  m.def(
      "device_properties",
      [](int dev) {
        cudaDeviceProp prop{};
        cudaError_t e = cudaGetDeviceProperties(&prop, dev);
        nb::dict d;
        if (e == cudaSuccess) {
          d["name"] = std::string(prop.name);
          d["major"] = prop.major;
          d["minor"] = prop.minor;
          d["sm_count"] = prop.multiProcessorCount;
          d["l2_bytes"] = prop.l2CacheSize;
          d["memory_bytes"] = prop.totalGlobalMem;
        }
        return std::make_tuple(int(e), d);
      },
      nb::arg("device"));

  // XLA FFI handlers for jax.ffi.register_ffi_target (empty without JAX at build time).
  m.def("ffi_handlers", []() {
    nb::dict d;
#ifdef GEMVX_WITH_JAX
    d["CUDA"] = nb::capsule(gemvx::ffi_handler_cuda());
    d["cpu"] = nb::capsule(gemvx::ffi_handler_cpu());
#endif
    return d;
  });
  m.def("ffi_quant_handlers", []() {
    nb::dict d;
#ifdef GEMVX_WITH_JAX
    d["CUDA"] = nb::capsule(gemvx::ffi_quant_handler_cuda());
    d["cpu"] = nb::capsule(gemvx::ffi_quant_handler_cpu());
#endif
    return d;
  });

  m.def("build_info", []() {
    nb::dict d;
    d["jaxlib"] = GEMVX_JAXLIB_VERSION;
#ifdef GEMVX_WITH_JAX
    d["xla_ffi_api"] = gemvx::ffi_api_version();
#else
    d["xla_ffi_api"] = "";
#endif
    d["version"] = GEMVX_VERSION;
    d["cuda_runtime"] = CUDART_VERSION;
    d["cuda_architectures"] = GEMVX_CUDA_ARCHS;
    return d;
  });
}
