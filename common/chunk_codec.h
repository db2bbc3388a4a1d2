// The tensor wire format moved to common/tensor_wire.h (one module for the
// chunk grid, encoding, checks and CRC cache). This header stays while the
// files that include it move to the new name.
#ifndef SHOAL_COMMON_CHUNK_CODEC_H_
#define SHOAL_COMMON_CHUNK_CODEC_H_

#include "common/tensor_wire.h"

#endif  // SHOAL_COMMON_CHUNK_CODEC_H_
