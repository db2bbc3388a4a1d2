// Renders RunStatus for people (a table, progress lines, a summary line) and
// for programs (JSON). Pure functions; no I/O.
#ifndef SHOAL_TOOLS_SHOALCTL_STATUS_FORMAT_H_
#define SHOAL_TOOLS_SHOALCTL_STATUS_FORMAT_H_

#include <string>

#include "absl/strings/string_view.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::ctl {

// `s` as a JSON string literal, quotes included.
std::string JsonQuote(absl::string_view s);
// Phase name without prefix, e.g. "TRAINING".
std::string PhaseName(shoal::v1::Phase phase);
// `shoalctl status` (-o table): titled sections; the workers table lists
// the members and the workers that finished the run, and folds those that
// left, were lost or evicted into one "departed" line with their reasons.
// `wide` (-o wide) lists every worker as a row instead.
std::string FormatStatusTable(const shoal::v1::RunStatus& status, bool wide = false);
// The zone tree (docs/SUPERNODES.md), indented by depth: per zone its
// workers, supernode, standby, why and since when; then each active
// active worker's zone, role and measurements. No tree for a flat run
// (every worker in the root zone), and nothing at all until an active
// worker measured something. Part of FormatStatusTable.
std::string FormatZoneTree(const shoal::v1::RunStatus& status);
std::string FormatStatusJson(const shoal::v1::RunStatus& status);
// One line per completed round, e.g. "round 3/20 ... test_accuracy=0.8312".
std::string FormatRoundLine(const shoal::v1::RoundSummary& round, uint64_t total_rounds);
// True when every worker that reported the last completed round holds the
// agreed hash (and at least one did). Workers that left after reporting it
// count; evicted ones do not.
bool HashesAgree(const shoal::v1::RunStatus& status);
// `watch -o json`: one JSON object per line, each with an "event": a
// completed round (the RoundSummary's fields, proto names), the finished
// run (rounds, test_accuracy, elapsed_seconds, hashes_agree, model_hash).
std::string FormatRoundJsonLine(const shoal::v1::RoundSummary& round, uint64_t total_rounds);
std::string FormatFinishedJsonLine(const shoal::v1::RunStatus& status, double elapsed_seconds);
// The run's closing line; contains "test_accuracy=<value>".
std::string FormatSummaryLine(const shoal::v1::RunStatus& status, double elapsed_seconds);
// Gossip mode (docs/GOSSIP.md): whether the run gossips, its consensus
// distance, and a one-line progress report (steps, accuracy, fetches per
// worker) for `watch`.
bool IsGossip(const shoal::v1::RunStatus& status);
std::string FormatConsensus(const shoal::v1::RunStatus& status);
std::string FormatGossipLine(const shoal::v1::RunStatus& status);

}  // namespace shoal::ctl

#endif  // SHOAL_TOOLS_SHOALCTL_STATUS_FORMAT_H_
