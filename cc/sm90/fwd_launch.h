// Declaration of the templated forward launcher (defined in fwd_kernel.cuh, explicitly
// instantiated one configuration per file under inst/ so they compile in parallel).
#pragma once
#include "params.h"

namespace jfm::sm90 {
// ExpSplit: softmax exponentials on the FMA pipe per 16 (variant 8; 0 = every other variant).
// PinWait: the PV-GEMM wait kept below the softmax exponentials (variant 9).
template <class Elem, int D, int Bn, int NWG, int Stages, bool Overlap, int ExpSplit = 0,
          bool PinWait = false>
cudaError_t launch_fwd(const FwdParams& p, cudaStream_t stream, const char** err);
}  // namespace jfm::sm90
