// CRC-32C (Castagnoli) of a byte range: SSE4.2 instructions where the CPU
// has them, a table otherwise. Used for every tensor chunk on the wire.
#ifndef SHOAL_COMMON_CRC32C_H_
#define SHOAL_COMMON_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace shoal {

uint32_t Crc32c(const void* data, size_t size);

}  // namespace shoal

#endif  // SHOAL_COMMON_CRC32C_H_
