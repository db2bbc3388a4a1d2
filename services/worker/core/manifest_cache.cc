#include "services/worker/core/manifest_cache.h"

#include "absl/strings/str_cat.h"
#include "common/sha256.h"

namespace shoal::worker {

absl::Status CheckLayers(const std::vector<LayerSpan>& layers, uint64_t total) {
  if (layers.empty()) return absl::InvalidArgumentError("no layers");
  uint64_t next = 0;
  for (const LayerSpan& l : layers) {
    if (l.name.empty()) return absl::InvalidArgumentError("a layer has no name");
    if (l.offset != next || l.elements == 0) {
      return absl::InvalidArgumentError(absl::StrCat("layer '", l.name, "' is [", l.offset, ", +",
                                                     l.elements, "), expected it to start at ",
                                                     next, " and not be empty"));
    }
    // next <= total here, so this cannot wrap (sizes near 2^64 must not).
    if (l.elements > total - next) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer '", l.name, "' ends past element ", total));
    }
    next += l.elements;
  }
  if (next != total) {
    return absl::InvalidArgumentError(
        absl::StrCat("the layers cover ", next, " elements, the model has ", total));
  }
  return absl::OkStatus();
}

absl::Status CheckManifest(const shoal::v1::ModelManifest& m, uint64_t round,
                           const std::string& hash, uint64_t total) {
  if (m.round() != round) {
    return absl::FailedPreconditionError(absl::StrCat("describes round ", m.round()));
  }
  if (m.model_hash() != hash) {
    return absl::FailedPreconditionError(absl::StrCat(
        "holds a model with hash ", m.model_hash().substr(0, 12), ", not ", hash.substr(0, 12)));
  }
  if (m.total_elements() != total) {
    return absl::InvalidArgumentError(
        absl::StrCat("describes ", m.total_elements(), " elements, this model has ", total));
  }
  if (m.piece_elements() == 0) return absl::InvalidArgumentError("piece_elements is 0");
  uint64_t next = 0;
  for (const auto& l : m.layers()) {
    if (l.offset() != next || l.elements() == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer '", l.name(), "' does not follow the previous one"));
    }
    // next <= total here, so neither this check nor the sum below can wrap.
    if (l.elements() > total - next) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer '", l.name(), "' ends past element ", total));
    }
    const uint64_t pieces =
        l.elements() / m.piece_elements() + (l.elements() % m.piece_elements() != 0 ? 1 : 0);
    const uint64_t digests = pieces > 1 ? pieces : 0;
    if (static_cast<uint64_t>(l.piece_sha256_size()) != digests || l.sha256().empty()) {
      return absl::InvalidArgumentError(absl::StrCat("layer '", l.name(), "' has ",
                                                     l.piece_sha256_size(),
                                                     " piece digests, expected ", digests));
    }
    next += l.elements();
  }
  if (next != total) {
    return absl::InvalidArgumentError(absl::StrCat("the layers cover ", next, " elements"));
  }
  return absl::OkStatus();
}

shoal::v1::ModelManifest ComputeModelManifest(const float* data, uint64_t total,
                                              const std::vector<LayerSpan>& layers,
                                              uint64_t piece_elements, uint64_t round,
                                              const std::string& model_hash) {
  shoal::v1::ModelManifest m;
  m.set_round(round);
  m.set_piece_elements(piece_elements);
  m.set_total_elements(total);
  // One pass over memory: the whole-model hash (when not known) is fed with
  // the same bytes as the layer and piece hashes.
  std::optional<Sha256> whole;
  if (model_hash.empty()) whole.emplace();
  for (const LayerSpan& l : layers) {
    auto* d = m.add_layers();
    d->set_name(l.name);
    d->set_offset(l.offset);
    d->set_elements(l.elements);
    Sha256 layer;
    const bool pieces = l.elements > piece_elements;
    for (uint64_t b = 0; b < l.elements; b += piece_elements) {
      const uint64_t count = std::min(piece_elements, l.elements - b);
      const float* p = data + l.offset + b;
      const size_t bytes = count * sizeof(float);
      layer.Update(p, bytes);
      if (whole) whole->Update(p, bytes);
      if (pieces) d->add_piece_sha256(Sha256Hex(p, bytes));
    }
    d->set_sha256(layer.HexDigest());
  }
  m.set_model_hash(whole ? whole->HexDigest() : model_hash);
  return m;
}

absl::Status ManifestCache::SetLayers(std::vector<LayerSpan> layers, uint64_t total) {
  absl::Status s = CheckLayers(layers, total);
  if (!s.ok()) return s;
  layers_ = std::move(layers);
  ++layout_version_;
  manifest_.reset();  // describe the new table from now on
  return absl::OkStatus();
}

std::vector<LayerSpan> ManifestCache::layers(uint64_t total) const {
  if (!layers_.empty()) return layers_;
  return {LayerSpan{"all", 0, total}};
}

void ManifestCache::SetDigestPieceElements(uint64_t elements) {
  digest_piece_elements_ = std::max<uint64_t>(1, elements);
  ++layout_version_;
  manifest_.reset();
}

ManifestCache::Lookup ManifestCache::Begin(uint64_t generation, uint64_t total,
                                           ManifestCallback* done, shoal::v1::ModelManifest* hit,
                                           Job* job) {
  if (manifest_.has_value() && generation_ == generation) {
    *hit = *manifest_;
    return Lookup::kHit;
  }
  if (computing_ == generation) {
    waiters_.emplace_back(generation, std::move(*done));
    return Lookup::kJoined;
  }
  computing_ = generation;
  job->generation = generation;
  job->layout = layout_version_;
  job->layers = layers(total);
  job->piece_elements = digest_piece_elements_;
  return Lookup::kCompute;
}

std::vector<ManifestCallback> ManifestCache::Finish(const Job& job,
                                                    const shoal::v1::ModelManifest& manifest,
                                                    bool current) {
  if (computing_ == job.generation) computing_.reset();
  std::vector<ManifestCallback> waiters;
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (it->first == job.generation) {
      waiters.push_back(std::move(it->second));
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
  if (current && job.layout == layout_version_) {
    manifest_ = manifest;
    generation_ = job.generation;
  }
  return waiters;
}

}  // namespace shoal::worker
