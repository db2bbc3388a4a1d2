#include "services/worker/core/gossip_board.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace shoal::worker {

std::shared_ptr<const GossipCopy> GossipBoard::Publish(const float* params, uint64_t n,
                                                       double clock, double loss) {
  std::shared_ptr<GossipCopy> buffer;
  {
    absl::MutexLock lock(&mu_);
    // A buffer only the board holds (no reader, no caller) and that is not
    // the current copy can be rewritten; while it is written its
    // publication is 0, so Find() never hands it out.
    for (auto& c : copies_) {
      if (c != current_ && c.use_count() == 1) {
        buffer = c;
        break;
      }
    }
    if (buffer == nullptr) {
      if (copies_.size() >= kMaxCopies) {
        ++skipped_;
        return nullptr;
      }
      copies_.push_back(std::make_shared<GossipCopy>());
      buffer = copies_.back();
    }
    buffer->publication = 0;
  }
  buffer->params.resize(n);
  if (n > 0) std::memcpy(buffer->params.data(), params, n * sizeof(float));
  buffer->encoded = nullptr;
  if (codec_ != nullptr && !codec_->raw()) {
    buffer->encoded = std::make_shared<const std::string>(codec_->EncodeSlice(params, n, 0));
  }
  buffer->clock = clock;
  buffer->loss = loss;
  absl::MutexLock lock(&mu_);
  buffer->publication = next_publication_++;
  current_ = buffer;
  return buffer;
}

std::shared_ptr<const GossipCopy> GossipBoard::Current() const {
  absl::MutexLock lock(&mu_);
  return current_;
}

absl::StatusOr<std::shared_ptr<const GossipCopy>> GossipBoard::Find(uint64_t publication) const {
  absl::MutexLock lock(&mu_);
  if (current_ == nullptr) return absl::NotFoundError("this worker has published no model yet");
  for (const auto& c : copies_) {
    if (c->publication == publication && publication != 0) return c;
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "publication ", publication, " was replaced (current: ", current_->publication, ")"));
}

uint64_t GossipBoard::skipped() const {
  absl::MutexLock lock(&mu_);
  return skipped_;
}

}  // namespace shoal::worker
