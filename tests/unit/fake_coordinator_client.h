// A CoordinatorClient that records every request and answers what the test
// set, for unit tests of the worker's protocol. Not thread-safe.
#ifndef SHOAL_TESTS_UNIT_FAKE_COORDINATOR_CLIENT_H_
#define SHOAL_TESTS_UNIT_FAKE_COORDINATOR_CLIENT_H_

#include <string>
#include <vector>

#include "services/worker/coordinator_client.h"

namespace shoal::worker {

class FakeCoordinatorClient : public CoordinatorClient {
 public:
  // Answers.
  shoal::v1::JoinResponse join_response;
  absl::Status join_status;
  absl::Status ready_status;
  // Requests, oldest first.
  std::vector<shoal::v1::JoinRequest> joins;
  std::vector<uint64_t> join_rounds;
  std::vector<shoal::v1::ReportReadyRequest> ready;
  std::vector<shoal::v1::ConnectionsReadyRequest> connections_ready;
  std::vector<shoal::v1::ReportRoundDoneRequest> done;
  std::vector<shoal::v1::ReportCheckpointRequest> checkpoints;
  std::vector<shoal::v1::ReportAuditRequest> audits;
  std::vector<std::string> leaves;
  std::vector<uint64_t> carried_rounds;
  int sessions_opened = 0;
  int sessions_closed = 0;

  absl::StatusOr<shoal::v1::JoinResponse> Join(const shoal::v1::JoinRequest& request) override {
    joins.push_back(request);
    if (!join_status.ok()) return join_status;
    return join_response;
  }
  absl::StatusOr<uint64_t> JoinRound(const std::string&, uint64_t round,
                                     uint64_t carried_round = 0) override {
    join_rounds.push_back(round);
    carried_rounds.push_back(carried_round);
    return round;
  }
  absl::Status ReportReady(const shoal::v1::ReportReadyRequest& request) override {
    ready.push_back(request);
    return ready_status;
  }
  absl::Status ConnectionsReady(const shoal::v1::ConnectionsReadyRequest& request) override {
    connections_ready.push_back(request);
    return absl::OkStatus();
  }
  absl::Status ReportCheckpoint(const shoal::v1::ReportCheckpointRequest& request) override {
    checkpoints.push_back(request);
    return absl::OkStatus();
  }
  absl::Status ReportAudit(const shoal::v1::ReportAuditRequest& request) override {
    audits.push_back(request);
    return absl::OkStatus();
  }
  absl::Status ReportRoundDone(const shoal::v1::ReportRoundDoneRequest& request) override {
    done.push_back(request);
    return absl::OkStatus();
  }
  absl::Status Leave(const std::string&, const std::string& reason) override {
    leaves.push_back(reason);
    return absl::OkStatus();
  }
  absl::Status OpenSession(const std::string&, absl::Duration, MessageHandler, ClosedHandler,
                           HeartbeatFiller) override {
    ++sessions_opened;
    return absl::OkStatus();
  }
  void CloseSession() override { ++sessions_closed; }
  bool SendHeartbeatNow(absl::Duration) override {
    ++heartbeats_sent_now;
    return true;
  }
  int heartbeats_sent_now = 0;
};

}  // namespace shoal::worker

#endif  // SHOAL_TESTS_UNIT_FAKE_COORDINATOR_CLIENT_H_
