// SHA-256 over byte ranges (OpenSSL), printed as lowercase hex. Model hashes
// and content addresses use it.
#ifndef SHOAL_COMMON_SHA256_H_
#define SHOAL_COMMON_SHA256_H_

#include <cstddef>
#include <memory>
#include <string>

namespace shoal {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Update(const void* data, size_t size);
  // Returns the hex digest; the object must not be updated afterwards.
  std::string HexDigest();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

std::string Sha256Hex(const void* data, size_t size);

}  // namespace shoal

#endif  // SHOAL_COMMON_SHA256_H_
