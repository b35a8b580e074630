// Declaration of the templated forward launcher (defined in fwd_kernel.cuh, explicitly
// instantiated one configuration per file under inst/ so they compile in parallel).
#pragma once
#include "params.h"

namespace jfm::sm90 {
// GroupScan: the two-level key-block walk (variants 7, 11); MaskBits: the partial blocks' element
// mask as bit words built by producer warps (variants 10, 11); Paired: pairs of query tiles per
// claim, the second walked backwards (variants 14, 15). false / false / false: every other variant.
template <class Elem, int D, int Bn, int NWG, int Stages, bool Overlap, bool GroupScan = false,
          bool MaskBits = false, bool Paired = false>
cudaError_t launch_fwd(const FwdParams& p, cudaStream_t stream, const char** err);
}  // namespace jfm::sm90
