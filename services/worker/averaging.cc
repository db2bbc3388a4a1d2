#include "services/worker/averaging.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace shoal::worker {

void Averaging::PublishOuterState(uint64_t round) {
  const std::vector<float>& m = outer->momentum();
  encoded_store->SetState(
      round, std::make_shared<const std::string>(reinterpret_cast<const char*>(m.data()),
                                                 m.size() * sizeof(float)));
}

std::string Averaging::Describe(const shoal::v1::RunConfig& config) const {
  return absl::StrCat(config.topology().hierarchy() ? "hierarchical" : averager->name(), "/",
                      codec->name(), " by ", AggregationName(aggregation),
                      is_encoded() ? absl::StrCat(" encoded, outer optimizer ",
                                                  config.exchange().outer_optimizer().kind().empty()
                                                      ? "none"
                                                      : config.exchange().outer_optimizer().kind())
                                   : std::string(),
                      config.exchange().overlap() ? ", overlapped rounds" : "");
}

absl::StatusOr<std::unique_ptr<Averaging>> MakeAverager(const shoal::v1::RunConfig& config,
                                                        const AveragerDeps& deps) {
  auto a = std::make_unique<Averaging>();
  absl::StatusOr<OuterOptimizer> outer_kind =
      ParseOuterOptimizer(config.exchange().outer_optimizer().kind());
  if (!outer_kind.ok()) return outer_kind.status();
  absl::StatusOr<AggregationSpec> aggregation = ParseAggregation(config.exchange().aggregation());
  if (!aggregation.ok()) return aggregation.status();
  a->codec = deps.codec;
  a->aggregation = *aggregation;
  a->encoded_store = deps.encoded_store;
  OuterOptions oopts;
  oopts.kind = *outer_kind;
  oopts.lr = static_cast<float>(config.exchange().outer_optimizer().lr());
  oopts.momentum = static_cast<float>(config.exchange().outer_optimizer().momentum());
  a->outer = std::make_unique<OuterStep>(oopts, deps.elements);
  // What travels (exchanger.h): the round's change when the run has a codec
  // or an outer optimizer, else the model itself.
  const bool encoded = !a->codec->raw() || *outer_kind != OuterOptimizer::kNone;
  ExchangeParts parts;
  parts.codec = a->codec;
  parts.store = deps.encoded_store;
  parts.outer = a->outer.get();
  parts.base = deps.snapshot;
  if (encoded) {
    a->encoded = parts;
    a->PublishOuterState(0);
  }
  ExchangeOptions exchange = deps.exchange;
  exchange.aggregation = *aggregation;
  exchange.push_box = deps.push_box;
  // One pipeline for every plan: flat or hierarchical, any codec.
  a->averager = std::make_unique<Exchanger>(deps.peers, deps.state, exchange, parts);
  return a;
}

}  // namespace shoal::worker
