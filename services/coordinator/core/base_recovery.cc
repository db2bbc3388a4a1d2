// DecideBaseUnavailable and the list of checkpoints to go back to.
#include "services/coordinator/core/base_recovery.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace shoal::coordinator {

BaseUnavailableDecision DecideBaseUnavailable(const BaseUnavailableInput& in,
                                              absl::Span<const shoal::v1::CheckpointRef> known) {
  BaseUnavailableDecision d;
  const std::string cannot = absl::StrCat("worker ", in.worker_id, " cannot load round ",
                                          in.base_round, "'s model (", in.why, ")");
  const bool checkpoint_of_base = !in.checkpoint_id.empty() && in.checkpoint_round == in.base_round;
  if (in.base_held || in.base_round == 0) {
    // Round 0's model comes from the seed; every member builds it.
    d.reason = absl::StrCat(cannot, "; it catches up from a holder at the next round");
    return d;
  }
  if (checkpoint_of_base && !in.checkpoint_damaged) {
    // The store may be restarting: the next round reads it again.
    d.reason = absl::StrCat(cannot, "; it reads checkpoint ", in.checkpoint_id,
                            " again at the next round");
    return d;
  }
  const std::string lost =
      checkpoint_of_base
          ? absl::StrCat("checkpoint ", in.checkpoint_id, " is damaged (", in.why, ")")
          : absl::StrCat("no checkpoint is of round ", in.base_round, " (", in.why, ")");
  const std::string damaged = in.checkpoint_damaged ? in.checkpoint_id : std::string();
  const shoal::v1::CheckpointRef* best = nullptr;
  for (const shoal::v1::CheckpointRef& ref : known) {
    if (ref.round() > in.base_round || ref.round() == 0 || ref.model_hash().empty()) continue;
    if (!damaged.empty() && ref.id() == damaged) continue;
    if (best == nullptr || ref.round() > best->round()) best = &ref;
  }
  const std::string head = absl::StrCat("round ", in.round, ": no member holds round ",
                                        in.base_round, "'s model and ", lost);
  if (best != nullptr) {
    d.action = BaseUnavailableDecision::Action::kGoBack;
    d.to = *best;
    d.reason = absl::StrCat(head, "; the run went back to checkpoint ", best->id(), " of round ",
                            best->round(), " and trains rounds ", best->round() + 1, "-",
                            in.base_round, " again");
    return d;
  }
  d.action = BaseUnavailableDecision::Action::kStop;
  d.reason = absl::StrCat(
      head,
      ", and the run knows no older intact checkpoint: it stops rather than train another "
      "model under its round numbers. ",
      damaged.empty()
          ? "Start the workers that hold it, or start a new run"
          : absl::StrCat("Restore checkpoint ", damaged,
                         " in the store (shoalctl checkpoints list shows its damage) and restart "
                         "the coordinator, or start a new run"));
  return d;
}

void RememberCheckpoint(const shoal::v1::CheckpointRef& ref,
                        std::vector<shoal::v1::CheckpointRef>* known) {
  known->erase(
      std::remove_if(known->begin(), known->end(),
                     [&](const shoal::v1::CheckpointRef& k) { return k.id() == ref.id(); }),
      known->end());
  known->insert(known->begin(), ref);
  if (known->size() > kKnownCheckpoints) known->resize(kKnownCheckpoints);
}

void ForgetAfter(const shoal::v1::CheckpointRef& to, const std::string& damaged_id,
                 std::vector<shoal::v1::CheckpointRef>* known) {
  known->erase(std::remove_if(known->begin(), known->end(),
                              [&](const shoal::v1::CheckpointRef& k) {
                                return k.round() > to.round() ||
                                       (!damaged_id.empty() && k.id() == damaged_id);
                              }),
               known->end());
}

}  // namespace shoal::coordinator
