#include "services/worker/model_syncer.h"

#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/sha256.h"

namespace shoal::worker {

absl::Status ModelSyncer::Sync(uint64_t round, const std::string& expected_hash,
                               const std::vector<std::string>& holders,
                               const std::vector<uint64_t>& layer_offsets, float* dst,
                               uint64_t total, const std::string& self_id, SyncProgress* progress) {
  if (holders.empty()) {
    return absl::UnavailableError(absl::StrCat("no peer holds the model of round ", round));
  }
  // Pieces: the layers, big ones split.
  std::vector<uint64_t> bounds = layer_offsets;
  bounds.push_back(total);
  std::vector<std::pair<uint64_t, uint64_t>> pieces;
  for (size_t i = 0; i + 1 < bounds.size(); ++i) {
    for (uint64_t b = bounds[i]; b < bounds[i + 1]; b += options_.max_piece_elements) {
      pieces.emplace_back(b, std::min(bounds[i + 1], b + options_.max_piece_elements));
    }
  }
  progress->syncing = true;
  progress->bytes_total = total * sizeof(float);
  absl::Status last;
  for (int attempt = 1; attempt <= options_.attempts; ++attempt) {
    progress->bytes_done = 0;
    last = SyncOnce(round, holders, pieces, dst, self_id, progress);
    if (!last.ok()) break;
    const std::string hash = Sha256Hex(dst, total * sizeof(float));
    if (hash == expected_hash) {
      progress->syncing = false;
      return absl::OkStatus();
    }
    last = absl::DataLossError(absl::StrCat("model of round ", round,
                                            " pulled from peers has hash ", hash.substr(0, 12),
                                            ", expected ", expected_hash.substr(0, 12)));
    SHOAL_LOG(WARNING) << last.message() << "; pulling again (attempt " << attempt << ")";
  }
  progress->syncing = false;
  return last;
}

absl::Status ModelSyncer::SyncOnce(uint64_t round, const std::vector<std::string>& holders,
                                   const std::vector<std::pair<uint64_t, uint64_t>>& pieces,
                                   float* dst, const std::string& self_id, SyncProgress* progress) {
  std::mutex mu;
  std::condition_variable cv;
  size_t in_flight = 0;
  std::deque<size_t> queue;
  for (size_t i = 0; i < pieces.size(); ++i) queue.push_back(i);
  size_t remaining = pieces.size();
  std::vector<int> failures(holders.size(), 0);
  absl::Status last_error;
  progress->sources = holders.size();

  auto run = [&](size_t h) {
    while (true) {
      size_t piece;
      {
        // Wait while others' pieces are in flight: a failed one comes back.
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return !queue.empty() || in_flight == 0 || failures[h] >= 2; });
        if (queue.empty() || failures[h] >= 2) {
          cv.notify_all();
          return;
        }
        piece = queue.front();
        queue.pop_front();
        ++in_flight;
      }
      const auto [begin, end] = pieces[piece];
      shoal::v1::ReadSliceRequest request;
      request.set_round(round);
      request.set_begin(begin);
      request.set_end(end);
      request.set_kind(shoal::v1::SNAPSHOT);
      request.set_reader_id(self_id);
      uint64_t got = 0;
      absl::Status s =
          peers_->ReadSlice(holders[h], request, options_.piece_timeout, [&](const ChunkView& c) {
            std::memcpy(dst + c.begin, c.data, c.count * sizeof(float));
            got += c.count * sizeof(float);
            progress->bytes_done += c.count * sizeof(float);
            return true;
          });
      std::lock_guard<std::mutex> lock(mu);
      --in_flight;
      cv.notify_all();
      if (s.ok()) {
        --remaining;
        continue;
      }
      progress->bytes_done -= got;
      queue.push_back(piece);  // another holder (or this one) takes it again
      last_error = s;
      if (++failures[h] >= 2) {
        SHOAL_LOG(WARNING) << "dropping sync source " << holders[h] << ": " << s.message();
        progress->sources--;
      }
    }
  };
  std::vector<std::thread> threads;
  for (size_t h = 0; h < holders.size(); ++h) {
    for (int k = 0; k < options_.per_peer; ++k) threads.emplace_back(run, h);
  }
  for (auto& t : threads) t.join();
  if (remaining > 0) {
    return absl::UnavailableError(
        absl::StrCat("no peer could serve the model of round ", round, ": ", last_error.message()));
  }
  return absl::OkStatus();
}

}  // namespace shoal::worker
