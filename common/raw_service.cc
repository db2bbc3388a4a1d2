#include "common/raw_service.h"

#include <vector>

namespace shoal {

std::string ByteBufferToString(const grpc::ByteBuffer& bytes) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!bytes.Dump(&slices).ok()) return out;
  out.reserve(bytes.Length());
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

grpc::ByteBuffer StringToByteBuffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

}  // namespace shoal
