// Helpers shared by the round_engine*.cc files (not part of the engine's API).
#ifndef SHOAL_SERVICES_COORDINATOR_CORE_ROUND_ENGINE_INTERNAL_H_
#define SHOAL_SERVICES_COORDINATOR_CORE_ROUND_ENGINE_INTERNAL_H_

#include <algorithm>
#include <cctype>
#include <memory>
#include <string>
#include <utility>

#include "services/coordinator/core/round_engine.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::coordinator::internal {

inline SharedMessage Share(shoal::v1::CoordinatorMessage msg) {
  return std::make_shared<const shoal::v1::CoordinatorMessage>(std::move(msg));
}

inline bool IsHexSha256(const std::string& s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return std::isxdigit(static_cast<unsigned char>(c)) &&
                  !std::isupper(static_cast<unsigned char>(c));
         });
}

}  // namespace shoal::coordinator::internal

namespace shoal::coordinator {

// Defined here because several round_engine*.cc files instantiate it.
template <typename F>
void RoundEngine::UpdateFlags(Member& m, F&& update) {
  const bool counted = IsParticipant(m.id);
  if (counted) CountFlags(m, -1);
  update(m);
  if (counted) CountFlags(m, +1);
}

}  // namespace shoal::coordinator

#endif  // SHOAL_SERVICES_COORDINATOR_CORE_ROUND_ENGINE_INTERNAL_H_
