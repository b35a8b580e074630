// Declaration of the templated forward launcher (defined in fwd_kernel.cuh, explicitly
// instantiated one configuration per file under inst/ so they compile in parallel).
#pragma once
#include "params.h"

namespace jfm::sm90 {
// GroupScan: the two-level key-block walk (variant 7; false = every other variant).
// Paired: pairs of query tiles per claim, the second walked backwards (variant 14).
template <class Elem, int D, int Bn, int NWG, int Stages, bool Overlap, bool GroupScan = false,
          bool Paired = false>
cudaError_t launch_fwd(const FwdParams& p, cudaStream_t stream, const char** err);
}  // namespace jfm::sm90
