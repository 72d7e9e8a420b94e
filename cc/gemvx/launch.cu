// Problem + config id + stream -> the instantiated kernel. The config list in configs.h is expanded
// into the instantiations (launch_part.cuh, in kLaunchParts translation units) and the dispatch
// below, so the two cannot drift.
#include <utility>

#include "launch_impl.cuh"

namespace gemvx {

using namespace detail;

namespace {

// f(std::integral_constant<int, part>{}) for the part of a config id.
template <typename F, std::size_t... P>
auto on_part_impl(int id, F&& f, std::index_sequence<P...>) {
  using R = decltype(f(std::integral_constant<int, 0>{}));
  R r{};
  ((part_of(id) == int(P) ? (void)(r = f(std::integral_constant<int, int(P)>{})) : (void)0), ...);
  return r;
}
template <typename F>
auto on_part(int id, F&& f) {
  return on_part_impl(id, std::forward<F>(f), std::make_index_sequence<kLaunchParts>{});
}

}  // namespace

const ConfigInfo* config_list(int* count) {
  *count = kNumConfigs;
  return kConfigs;
}

const ConfigInfo* find_config(int id) {
  for (const ConfigInfo& c : kConfigs)
    if (c.id == id) return &c;
  return nullptr;
}

int effective_splits(const Problem& p, int config, int splits) {
  if (p.K == 0) return 0;
  int s = 1;
  on_part(config, [&](auto part) { return part_splits<decltype(part)::value>(config, p, splits, &s); });
  return s;
}

int launch_paths(const Problem& p, int config, int splits) {
  if (p.M <= 0 || p.K <= 0 || p.groups <= 0 || p.nvec <= 0 || p.W == nullptr) return 0;
  int t = 0;
  on_part(config, [&](auto part) { return part_paths<decltype(part)::value>(config, p, splits, &t); });
  return t;
}

std::size_t workspace_bytes(const Problem& p, int config, int splits) {
  const int s = effective_splits(p, config, splits);
  if (s <= 1) return 0;
  return std::size_t(s) * std::size_t(p.groups) * std::size_t(p.nvec) * std::size_t(p.M) *
         sizeof(float);
}

Status launch(const Problem& p, int config, int splits, void* ws, std::size_t ws_size,
              void* stream_ptr) {
  Status st = validate(p);
  if (!st.ok()) return st;
  const ConfigInfo* info = find_config(config);
  if (info == nullptr || info->trans != p.trans || info->quant != (p.wbits != 0))
    return {Code::kInvalidConfig, 0};
  if (p.M == 0 || p.groups == 0 || p.nvec == 0) return {};  // empty result: nothing to launch
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  if (p.K == 0) {
    // y = beta * y_in (zero when beta == 0): the finish kernel with no splits to add.
    Args a = make_args(p);
    a.splits = 0;
    cudaGetLastError();
    switch (p.dtype) {
      case DType::kFloat32: return launch_finish<float>(a, stream);
      case DType::kFloat16: return launch_finish<__half>(a, stream);
      case DType::kBFloat16: return launch_finish<__nv_bfloat16>(a, stream);
    }
    return {Code::kInvalidArgument, 0};
  }
  Status r{Code::kInvalidConfig, 0};
  on_part(config, [&](auto part) {
    return part_run<decltype(part)::value>(config, p, splits, ws, ws_size, stream, &r);
  });
  return r;
}

}  // namespace gemvx
