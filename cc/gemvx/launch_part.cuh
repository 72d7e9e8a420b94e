// The per-config operations of one part of the configs (detail::part_of), instantiated by
// launch_part.cu.in once per part: only that part's kernels are compiled in each translation unit.
#pragma once

#include "launch_impl.cuh"

namespace gemvx {
namespace detail {

// The family of a config, as a type tag.
template <typename Fam>
struct FamilyTag {
  using type = Fam;
};

// op(FamilyTag<family of id>{}) if id is a config of PART, and whether it was. The case of every
// config is written, but only PART's are compiled: `if constexpr` on a condition that depends on
// PART discards the others, and the family type is named through PART so a discarded case
// instantiates nothing.
template <int PART, typename Op>
bool part_call(int id, Op&& op) {
#define GEMVX_CASE(cid, fam, th, p1, p2, u, nv)                                        \
  case cid:                                                                            \
    if constexpr (part_of(cid) == PART) {                                              \
      using F = typename std::conditional<PART >= 0, fam<th, p1, p2, u, nv>, void>::type; \
      op(FamilyTag<F>{});                                                              \
      return true;                                                                     \
    } else {                                                                           \
      return false;                                                                    \
    }
  switch (id) {
    GEMVX_CONFIGS(GEMVX_CASE)
    default:
      return false;
  }
#undef GEMVX_CASE
}

template <int PART>
bool part_run(int id, const Problem& p, int splits, void* ws, std::size_t ws_size, cudaStream_t stream,
              Status* st) {
  return part_call<PART>(id, [&](auto f) { *st = run<typename decltype(f)::type>(p, splits, ws, ws_size, stream); });
}

template <int PART>
bool part_splits(int id, const Problem& p, int splits, int* out) {
  return part_call<PART>(id, [&](auto f) { *out = splits_for<typename decltype(f)::type>(p, splits); });
}

template <int PART>
bool part_paths(int id, const Problem& p, int splits, int* out) {
  return part_call<PART>(id, [&](auto f) { *out = paths_for<typename decltype(f)::type>(p, splits); });
}

}  // namespace detail
}  // namespace gemvx
