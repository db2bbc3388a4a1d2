#include "services/worker/averaging.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "services/worker/hierarchical_averager.h"

namespace shoal::worker {

void Averaging::PublishOuterState(uint64_t round) {
  const std::vector<float>& m = outer->momentum();
  encoded_store->SetState(
      round, std::make_shared<const std::string>(reinterpret_cast<const char*>(m.data()),
                                                 m.size() * sizeof(float)));
}

std::string Averaging::Describe(const shoal::v1::RunConfig& config) const {
  return absl::StrCat(
      averager->name(), "/", codec->name(), " by ", AggregationName(aggregation),
      is_encoded()
          ? absl::StrCat(" encoded, outer optimizer ",
                         config.outer_optimizer().empty() ? "none" : config.outer_optimizer())
          : std::string());
}

absl::StatusOr<std::unique_ptr<Averaging>> MakeAverager(const shoal::v1::RunConfig& config,
                                                        const AveragerDeps& deps) {
  auto a = std::make_unique<Averaging>();
  absl::StatusOr<std::unique_ptr<Codec>> codec = MakeCodec(config.codec());
  if (!codec.ok()) return codec.status();
  absl::StatusOr<OuterOptimizer> outer_kind = ParseOuterOptimizer(config.outer_optimizer());
  if (!outer_kind.ok()) return outer_kind.status();
  absl::StatusOr<AggregationSpec> aggregation = ParseAggregation(config.aggregation());
  if (!aggregation.ok()) return aggregation.status();
  a->codec = std::move(*codec);
  a->aggregation = *aggregation;
  a->encoded_store = deps.encoded_store;
  const uint64_t n = deps.elements;
  OuterOptions oopts;
  oopts.kind = *outer_kind;
  oopts.lr = static_cast<float>(config.outer_lr());
  oopts.momentum = static_cast<float>(config.outer_momentum());
  a->outer = std::make_unique<OuterStep>(oopts, n);
  const bool encoded = !a->codec->raw() || *outer_kind != OuterOptimizer::kNone;
  if (encoded) {
    a->encoded.store = deps.encoded_store;
    a->encoded.outer = a->outer.get();
    a->encoded.base = deps.snapshot;
    a->PublishOuterState(0);
  }
  ExchangeOptions exchange = deps.exchange;
  exchange.aggregation = *aggregation;
  // Pushes from behind NAT: at most the current and the next round's, each
  // at most the whole model (8 bytes an element for encodings).
  deps.push_box->SetMaxBytes(2 * 8 * n + (uint64_t{16} << 20));
  exchange.push_box = deps.push_box;
  a->averager = std::make_unique<Exchanger>(deps.peers, deps.state, exchange, a->codec.get(),
                                            encoded ? &a->encoded : nullptr);
  if (config.hierarchy() && !encoded) {
    // Plans with RoundPlan.hierarchy run its stages; the others stay flat.
    // (The coordinator refuses the hierarchy with the encoded exchange.)
    a->flat = std::move(a->averager);
    a->averager = std::make_unique<HierarchicalAverager>(deps.peers, deps.state, deps.encoded_store,
                                                         exchange, a->flat.get());
  }
  return a;
}

}  // namespace shoal::worker
