#pragma once
#include "xla/ffi/api/c_api.h"
// Defined in fwd_handler.cc.
extern "C" XLA_FFI_Error* JfmFlashmaskFwdSm90(XLA_FFI_CallFrame* call_frame);
// Defined in bwd_handler.cc.
extern "C" XLA_FFI_Error* JfmFlashmaskBwdSm90(XLA_FFI_CallFrame* call_frame);
