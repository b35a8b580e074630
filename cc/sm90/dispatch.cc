// Entry points of the kernels (params.h): check the problem, find the named configuration in the
// generated table (kernel_table.h) and call its launcher for the dtype. Host code only.
#include <cmath>
#include <cstring>
#include <string>

#include "kernel_table.h"
#include "params.h"

namespace jfm {
namespace sm90 {
namespace {

#define JFM_FWD_CONFIG(name, d, bn, bm, cap) \
  {#name, d, bn, bm, cap != 0, &run_##name##_bf16, &run_##name##_fp16},
#define JFM_BWD_CONFIG(name, d, bn, bm, persistent, cap)
constexpr FwdConfigEntry kFwdConfigs[] = {
#include "instantiations/kernel_table.inc"
    {nullptr, 0, 0, 0, false, nullptr, nullptr}};
#undef JFM_FWD_CONFIG
#undef JFM_BWD_CONFIG

#define JFM_FWD_CONFIG(name, d, bn, bm, cap)
#define JFM_BWD_CONFIG(name, d, bn, bm, persistent, cap) \
  {#name, d, bn, bm, persistent != 0, cap != 0, &run_##name##_bf16, &run_##name##_fp16},
constexpr BwdConfigEntry kBwdConfigs[] = {
#include "instantiations/kernel_table.inc"
    {nullptr, 0, 0, 0, false, false, nullptr, nullptr}};
#undef JFM_FWD_CONFIG
#undef JFM_BWD_CONFIG

template <class Entry, size_t N>
const Entry* find(const Entry (&table)[N], const char* name, size_t len) {
  for (const Entry& e : table)
    if (e.name && std::strlen(e.name) == len && std::strncmp(e.name, name, len) == 0) return &e;
  return nullptr;
}

}  // namespace

const FwdConfigEntry* find_fwd_config(const char* name, size_t len) { return find(kFwdConfigs, name, len); }
const BwdConfigEntry* find_bwd_config(const char* name, size_t len) { return find(kBwdConfigs, name, len); }

const char* compiled_configs() {
  static const std::string names = [] {
    std::string s;
    for (const auto& e : kFwdConfigs)
      if (e.name) s += (s.empty() ? "" : ",") + std::string(e.name);
    for (const auto& e : kBwdConfigs)
      if (e.name) s += (s.empty() ? "" : ",") + std::string(e.name);
    return s;
  }();
  return names.c_str();
}

}  // namespace sm90

const char* compiled_configs() { return sm90::compiled_configs(); }

namespace {

// The checks every call shares (heads, head dim, soft cap), then the named config's launcher for
// the dtype.
template <class Entry, class Params>
cudaError_t run_config(const Entry* c, const Params& p, cudaStream_t stream, const char** err,
                       const char* not_compiled, const char* bad_heads, const char* bad_d) {
  if (p.K <= 0 || p.Hm <= 0 || p.N % p.K != 0 || p.N % p.Hm != 0) {
    if (err) *err = bad_heads;
    return cudaErrorInvalidValue;
  }
  if (c == nullptr || c->head_dim != p.d) {
    if (err) *err = c == nullptr ? not_compiled : bad_d;
    return cudaErrorInvalidValue;
  }
  // a NaN cap fails both tests: refused as well
  if (c->soft_cap ? !(p.softcap > 0.f && p.softcap < INFINITY) : p.softcap != 0.f) {
    if (err) *err = c->soft_cap ? "flashmask sm90: a soft-cap kernel config needs softcap > 0"
                                : "flashmask sm90: softcap != 0 needs a soft-cap kernel config";
    return cudaErrorInvalidValue;
  }
  return (p.dtype == DType::kBF16 ? c->bf16 : c->fp16)(p, stream, err);
}

}  // namespace

cudaError_t flashmask_fwd_sm90(const FwdParams& p, cudaStream_t stream, const char** err) {
  if (p.B == 0 || p.Sq == 0 || p.N == 0) return cudaSuccess;
  if (p.Sk <= 0) {
    if (err) *err = "flashmask sm90 forward: Sk must be >= 1";
    return cudaErrorInvalidValue;
  }
  return run_config(sm90::find_fwd_config(p.config, p.config_len), p, stream, err,
                    "flashmask sm90 forward: kernel config not compiled into this build "
                    "(see compiled_configs(); CMake option JAX_FLASHMASK_HEAD_DIMS)",
                    "flashmask sm90 forward: N must be a multiple of K and of Hm",
                    "flashmask sm90 forward: the kernel config's head dim differs from q's");
}

cudaError_t flashmask_bwd_sm90(const BwdParams& p, cudaStream_t stream, const char** err) {
  if (p.B == 0 || p.N == 0 || p.Sk == 0) return cudaSuccess;
  if (p.Sq == 0) {  // no queries: dK = dV = 0 (dQ is empty)
    const size_t bytes = (size_t)p.B * p.Sk * p.K * p.d * 2;
    cudaError_t e = cudaMemsetAsync(p.dk, 0, bytes, stream);
    if (e == cudaSuccess) e = cudaMemsetAsync(p.dv, 0, bytes, stream);
    return e;
  }
  if (p.Sk < 0 || p.Sq < 0) {
    if (err) *err = "flashmask sm90 backward: negative sequence length";
    return cudaErrorInvalidValue;
  }
  return run_config(sm90::find_bwd_config(p.config, p.config_len), p, stream, err,
                    "flashmask sm90 backward: kernel config not compiled into this build "
                    "(see compiled_configs(); CMake option JAX_FLASHMASK_HEAD_DIMS)",
                    "flashmask sm90 backward: N must be a multiple of K and of Hm",
                    "flashmask sm90 backward: the kernel config's head dim differs from q's");
}

}  // namespace jfm
