// A value rebuilt only when its source changed: the entry is good while the
// source's version is the one it was built from and it is younger than
// max_age (the age bounds what a version does not capture, such as the
// passing of time). Plain C++; not thread-safe (the owner locks).
#ifndef SHOAL_SERVICES_COORDINATOR_CORE_VERSIONED_CACHE_H_
#define SHOAL_SERVICES_COORDINATOR_CORE_VERSIONED_CACHE_H_

#include <cstdint>
#include <optional>
#include <utility>

#include "absl/time/time.h"

namespace shoal::coordinator {

template <typename T>
class VersionedCache {
 public:
  explicit VersionedCache(absl::Duration max_age) : max_age_(max_age) {}

  // The value built from `version`, if there is one no older than max_age
  // at `now`.
  const T* Get(uint64_t version, absl::Time now) const {
    if (!value_.has_value() || version != version_) return nullptr;
    if (now - built_at_ > max_age_ || now < built_at_) return nullptr;
    return &*value_;
  }

  // Stores the value built from `version` at `now`; returns it.
  const T& Put(uint64_t version, absl::Time now, T value) {
    value_ = std::move(value);
    version_ = version;
    built_at_ = now;
    return *value_;
  }

 private:
  const absl::Duration max_age_;
  std::optional<T> value_;
  uint64_t version_ = 0;
  absl::Time built_at_;
};

}  // namespace shoal::coordinator

#endif  // SHOAL_SERVICES_COORDINATOR_CORE_VERSIONED_CACHE_H_
