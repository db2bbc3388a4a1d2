#include "common/crc32c.h"

#include <array>
#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace shoal {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    table[i] = c;
  }
  return table;
}

// The CRC register without the initial and final inversion ("raw"): the
// public functions invert around these.
uint32_t RawPortable(uint32_t crc, const uint8_t* p, size_t n) {
  static const std::array<uint32_t, 256> table = MakeTable();
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t RawSse42(uint32_t c, const uint8_t* p, size_t n) {
  uint64_t crc = c;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    crc = _mm_crc32_u64(crc, v);
    p += 8;
    n -= 8;
  }
  uint32_t r = static_cast<uint32_t>(crc);
  while (n > 0) {
    r = _mm_crc32_u8(r, *p++);
    --n;
  }
  return r;
}

// The CRC register is linear over GF(2): running it over `len` zero bytes
// multiplies it by a fixed 32x32 bit matrix. Tabulated per byte of the
// register (4 x 256 entries), applying it costs four lookups.
class ZeroShift {
 public:
  explicit ZeroShift(size_t len) {
    const std::vector<uint8_t> zeros(len, 0);
    uint32_t column[32];
    for (int i = 0; i < 32; ++i) column[i] = RawSse42(1u << i, zeros.data(), len);
    for (int k = 0; k < 4; ++k) {
      for (uint32_t b = 0; b < 256; ++b) {
        uint32_t v = 0;
        for (int j = 0; j < 8; ++j) {
          if ((b >> j) & 1) v ^= column[8 * k + j];
        }
        table_[k][b] = v;
      }
    }
  }
  uint32_t operator()(uint32_t c) const {
    return table_[0][c & 0xFF] ^ table_[1][(c >> 8) & 0xFF] ^ table_[2][(c >> 16) & 0xFF] ^
           table_[3][c >> 24];
  }

 private:
  uint32_t table_[4][256];
};

// Runs three lanes of `lane` bytes each over consecutive blocks of
// 3 * lane bytes: lane 0 continues from `crc`, lanes 1 and 2 start from 0,
// and the three are merged as crc(a b c) = shift2(crc(a)) ^ shift1(crc(b))
// ^ crc(c), where shiftN appends N * lane zero bytes.
template <size_t kLane>
__attribute__((target("sse4.2"))) uint32_t RawThreeLanes(uint32_t crc, const uint8_t** data,
                                                         size_t* size, const ZeroShift& shift1,
                                                         const ZeroShift& shift2) {
  const uint8_t* p = *data;
  size_t n = *size;
  while (n >= 3 * kLane) {
    uint64_t c0 = crc, c1 = 0, c2 = 0;
    for (size_t i = 0; i < kLane; i += 8) {
      uint64_t a, b, c;
      std::memcpy(&a, p + i, 8);
      std::memcpy(&b, p + kLane + i, 8);
      std::memcpy(&c, p + 2 * kLane + i, 8);
      c0 = _mm_crc32_u64(c0, a);
      c1 = _mm_crc32_u64(c1, b);
      c2 = _mm_crc32_u64(c2, c);
    }
    crc = shift2(static_cast<uint32_t>(c0)) ^ shift1(static_cast<uint32_t>(c1)) ^
          static_cast<uint32_t>(c2);
    p += 3 * kLane;
    n -= 3 * kLane;
  }
  *data = p;
  *size = n;
  return crc;
}

// Long lanes for the bulk of a chunk; short lanes so that what is left
// (and the 16-64 KiB pieces a receiver gets from gRPC) still runs on three
// lanes. Below 3 KiB a single lane.
constexpr size_t kLongLane = 8192;
constexpr size_t kShortLane = 1024;

struct Shifts {
  ZeroShift long1{kLongLane}, long2{2 * kLongLane};
  ZeroShift short1{kShortLane}, short2{2 * kShortLane};
};

__attribute__((target("sse4.2"))) uint32_t RawSse42ThreeLanes(uint32_t crc, const uint8_t* p,
                                                              size_t n) {
  if (n >= 3 * kShortLane) {
    static const Shifts* shifts = new Shifts();  // built once, never freed
    crc = RawThreeLanes<kLongLane>(crc, &p, &n, shifts->long1, shifts->long2);
    crc = RawThreeLanes<kShortLane>(crc, &p, &n, shifts->short1, shifts->short2);
  }
  return RawSse42(crc, p, n);
}
#endif

}  // namespace

namespace crc32c_internal {

uint32_t ExtendPortable(uint32_t crc, const void* data, size_t size) {
  return ~RawPortable(~crc, static_cast<const uint8_t*>(data), size);
}

bool HasSse42() {
#if defined(__x86_64__)
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
#else
  return false;
#endif
}

uint32_t ExtendSse42OneLane(uint32_t crc, const void* data, size_t size) {
#if defined(__x86_64__)
  return ~RawSse42(~crc, static_cast<const uint8_t*>(data), size);
#else
  return ExtendPortable(crc, data, size);
#endif
}

uint32_t ExtendSse42ThreeLanes(uint32_t crc, const void* data, size_t size) {
#if defined(__x86_64__)
  return ~RawSse42ThreeLanes(~crc, static_cast<const uint8_t*>(data), size);
#else
  return ExtendPortable(crc, data, size);
#endif
}

}  // namespace crc32c_internal

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size) {
  if (crc32c_internal::HasSse42()) return crc32c_internal::ExtendSse42ThreeLanes(crc, data, size);
  return crc32c_internal::ExtendPortable(crc, data, size);
}

uint32_t Crc32c(const void* data, size_t size) { return Crc32cExtend(0, data, size); }

}  // namespace shoal
