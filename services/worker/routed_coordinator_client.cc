#include "services/worker/routed_coordinator_client.h"

#include <algorithm>
#include <random>
#include <utility>

#include "absl/time/clock.h"
#include "common/logging.h"

namespace shoal::worker {

namespace {

CoordinatorClientOptions RelayOptions(CoordinatorClientOptions o,
                                      const MemberCredentialHolder* credential,
                                      absl::Duration window) {
  o.retry_window = std::min(o.retry_window, window);
  o.credential = credential;
  return o;
}

// A relayed call the direct path may still serve: the relay is gone or
// not (any longer) this member's route at the coordinator.
bool TryDirect(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsPermissionDenied(s);
}

}  // namespace

RoutedCoordinatorClient::RoutedCoordinatorClient(CoordinatorClientOptions direct,
                                                 const MemberCredentialHolder* credential,
                                                 absl::Duration relay_retry_window)
    : relay_options_(RelayOptions(direct, credential, relay_retry_window)),
      direct_(std::move(direct)),
      session_base_(std::mt19937_64(std::random_device{}())() >> 2) {
  router_ = std::thread([this] { Router(); });
}

RoutedCoordinatorClient::~RoutedCoordinatorClient() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  router_.join();
  CloseSession();
}

void RoutedCoordinatorClient::Post(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  tasks_.push_back(std::move(task));
}

void RoutedCoordinatorClient::Router() {
  for (;;) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !tasks_.empty(); };
      if (deferred_address_.empty()) {
        mu_.Await(absl::Condition(&ready));
      } else {
        mu_.AwaitWithDeadline(absl::Condition(&ready), failed_at_ + kRelayCooldown);
      }
      if (stop_) return;
      if (!tasks_.empty()) {
        task = std::move(tasks_.front());
        tasks_.pop_front();
      } else if (!deferred_address_.empty() &&
                 relay_options_.clock->Now() - failed_at_ >= kRelayCooldown) {
        // The cooldown is over: the put-off UseRelay now.
        task = [this, id = std::move(deferred_id_), address = std::move(deferred_address_)] {
          MoveTo(id, address);
        };
        deferred_id_.clear();
        deferred_address_.clear();
      } else {
        continue;
      }
    }
    task();
  }
}

void RoutedCoordinatorClient::UseRelay(const std::string& relay_id, const std::string& address) {
  Post([this, relay_id, address] { MoveTo(relay_id, address); });
}

std::string RoutedCoordinatorClient::relay() const {
  absl::MutexLock lock(&mu_);
  return relayed_ ? relay_id_ : "";
}

uint64_t RoutedCoordinatorClient::fall_backs() const {
  absl::MutexLock lock(&mu_);
  return fall_backs_;
}

absl::Status RoutedCoordinatorClient::OpenOn(GrpcCoordinatorClient* client, uint64_t gen) {
  shoal::v1::Hello hello;
  absl::Duration heartbeat;
  MessageHandler on_message;
  HeartbeatFiller fill;
  const bool direct = client == &direct_;
  {
    absl::MutexLock lock(&mu_);
    hello.set_worker_id(worker_id_);
    hello.set_session(session_base_ + gen);
    for (const Taken& t : taken_) {
      auto* resume = hello.add_resume();
      resume->set_session(session_base_ + t.gen);
      resume->set_received(t.received);
    }
    heartbeat = heartbeat_;
    on_message = on_message_;
    fill = fill_;
    // Before the open: its end may be reported before OpenSession returns.
    if (direct) {
      direct_gen_ = gen;
    } else {
      taken_.push_back({gen, 0});
      if (taken_.size() > kMaxResumes) taken_.pop_front();
    }
  }
  if (!direct) {
    // Counted while current; dropped once replaced (resent on the new one).
    on_message = [this, gen,
                  deliver = std::move(on_message)](const shoal::v1::CoordinatorMessage& message) {
      {
        absl::MutexLock lock(&mu_);
        if (gen != gen_) return;
        for (Taken& t : taken_) {
          if (t.gen == gen) ++t.received;
        }
      }
      deliver(message);
    };
  }
  absl::Status s = client->OpenSessionWith(
      hello, heartbeat, on_message, [this, gen](const absl::Status& s) { Closed(gen, s); }, fill);
  if (!s.ok() && direct) {
    absl::MutexLock lock(&mu_);
    if (direct_gen_ == gen) direct_gen_ = 0;
  }
  return s;
}

void RoutedCoordinatorClient::Closed(uint64_t gen, const absl::Status& status) {
  ClosedHandler report;
  {
    absl::MutexLock lock(&mu_);
    if (gen == direct_gen_) direct_gen_ = 0;
    if (gen != gen_) return;  // a session a route change replaced
    if (relayed_ && wanted_) {
      tasks_.push_back([this, gen, status] { FallBack(gen, status); });
      return;
    }
    report = on_closed_;
  }
  if (report) report(status);
}

void RoutedCoordinatorClient::FallBack(uint64_t gen, const absl::Status& why) {
  uint64_t next = 0;
  std::string relay_id;
  {
    absl::MutexLock lock(&mu_);
    if (gen != gen_ || !wanted_) return;
    relayed_ = false;
    failed_address_ = relay_address_;
    failed_at_ = relay_options_.clock->Now();
    relay_id = relay_id_;
    ++fall_backs_;
    // Tried again when the cooldown is over, unless a UseRelay moves the
    // route meanwhile (the coordinator may never send this one again: a
    // kept direct session brings no route).
    deferred_id_ = relay_id_;
    deferred_address_ = relay_address_;
    if (direct_gen_ != 0) {
      // The direct session is still open: the relayed Hello never
      // superseded it (or its ABORTED is on its way, and its end is then
      // reported like any broken session's). Keep it.
      gen_ = direct_gen_;
      SHOAL_LOG(WARNING) << "session through relay " << relay_id << " ended (" << why
                         << "); the direct session is still open, keeping it";
      return;
    }
    next = ++gen_;
  }
  SHOAL_LOG(WARNING) << "session through relay " << relay_id << " ended (" << why
                     << "); going back to the coordinator directly";
  absl::Status s = OpenOn(&direct_, next);
  if (s.ok()) return;
  ClosedHandler report;
  {
    absl::MutexLock lock(&mu_);
    if (next != gen_) return;
    report = on_closed_;
  }
  // The worker re-opens its session as after any broken session.
  if (report) report(s);
}

void RoutedCoordinatorClient::MoveTo(const std::string& relay_id, const std::string& address) {
  std::vector<std::shared_ptr<GrpcCoordinatorClient>> dropped;
  uint64_t next = 0;
  std::shared_ptr<GrpcCoordinatorClient> fresh;
  {
    absl::MutexLock lock(&mu_);
    dropped.swap(retired_);
    deferred_id_.clear();  // a newer UseRelay replaces a put-off one
    deferred_address_.clear();
    if (address.empty()) {
      relay_id_.clear();
      relay_address_.clear();
      if (!relayed_) return;
      relayed_ = false;
      if (relay_ != nullptr) retired_.push_back(std::move(relay_));
      if (!wanted_) return;
      next = ++gen_;
    } else {
      if (relayed_ && address == relay_address_) return;
      if (address == failed_address_ && relay_options_.clock->Now() - failed_at_ < kRelayCooldown) {
        SHOAL_VLOG(1) << "relay " << relay_id << " at " << address
                      << " failed recently; staying direct until the cooldown is over";
        deferred_id_ = relay_id;
        deferred_address_ = address;
        return;
      }
    }
  }
  dropped.clear();  // outside mu_: their destructors join reader threads
  if (address.empty()) {
    SHOAL_LOG(INFO) << "the coordinator asks for a direct session; leaving the relay";
    // The direct Hello supersedes the relayed session at the coordinator.
    absl::Status s = OpenOn(&direct_, next);
    if (!s.ok()) FallBack(next, s);
    return;
  }
  CoordinatorClientOptions options = relay_options_;
  options.address = address;
  fresh = std::make_shared<GrpcCoordinatorClient>(options);
  {
    absl::MutexLock lock(&mu_);
    if (relay_ != nullptr) retired_.push_back(std::move(relay_));
    relay_ = fresh;
    relay_id_ = relay_id;
    relay_address_ = address;
    relayed_ = true;
    if (!wanted_) return;  // the next OpenSession goes through it
    next = ++gen_;
  }
  SHOAL_LOG(INFO) << "opening the session through relay " << relay_id << " at " << address;
  // The relayed Hello supersedes the direct session at the coordinator,
  // which ends it (ABORTED, an old generation: not reported).
  absl::Status s = OpenOn(fresh.get(), next);
  if (!s.ok()) FallBack(next, s);
}

absl::Status RoutedCoordinatorClient::Routed(
    const std::function<absl::Status(CoordinatorClient*)>& call) {
  std::shared_ptr<GrpcCoordinatorClient> relay;
  {
    absl::MutexLock lock(&mu_);
    if (relayed_) relay = relay_;
  }
  if (relay != nullptr) {
    absl::Status s = call(relay.get());
    if (!TryDirect(s)) return s;
    SHOAL_VLOG(1) << "relayed call refused (" << s << "); calling the coordinator directly";
  }
  return call(&direct_);
}

absl::StatusOr<shoal::v1::JoinResponse> RoutedCoordinatorClient::Join(
    const shoal::v1::JoinRequest& request) {
  return direct_.Join(request);  // a worker joins before it knows a relay
}

absl::StatusOr<uint64_t> RoutedCoordinatorClient::JoinRound(const std::string& worker_id,
                                                            uint64_t round,
                                                            uint64_t carried_round) {
  uint64_t admitted = 0;
  absl::Status s = Routed([&](CoordinatorClient* c) {
    absl::StatusOr<uint64_t> r = c->JoinRound(worker_id, round, carried_round);
    if (!r.ok()) return r.status();
    admitted = *r;
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return admitted;
}

absl::Status RoutedCoordinatorClient::ReportReady(const shoal::v1::ReportReadyRequest& request) {
  return Routed([&](CoordinatorClient* c) { return c->ReportReady(request); });
}

absl::Status RoutedCoordinatorClient::ConnectionsReady(
    const shoal::v1::ConnectionsReadyRequest& request) {
  return Routed([&](CoordinatorClient* c) { return c->ConnectionsReady(request); });
}

absl::Status RoutedCoordinatorClient::ReportAudit(const shoal::v1::ReportAuditRequest& request) {
  return Routed([&](CoordinatorClient* c) { return c->ReportAudit(request); });
}

absl::Status RoutedCoordinatorClient::ReportCheckpoint(
    const shoal::v1::ReportCheckpointRequest& request) {
  return Routed([&](CoordinatorClient* c) { return c->ReportCheckpoint(request); });
}

absl::Status RoutedCoordinatorClient::ReportRoundDone(
    const shoal::v1::ReportRoundDoneRequest& request) {
  return Routed([&](CoordinatorClient* c) { return c->ReportRoundDone(request); });
}

absl::Status RoutedCoordinatorClient::Leave(const std::string& worker_id,
                                            const std::string& reason) {
  return Routed([&](CoordinatorClient* c) { return c->Leave(worker_id, reason); });
}

absl::Status RoutedCoordinatorClient::OpenSession(const std::string& worker_id,
                                                  absl::Duration heartbeat,
                                                  MessageHandler on_message,
                                                  ClosedHandler on_closed, HeartbeatFiller fill) {
  // The old sessions end first and their ends are reported as they were
  // without a relay.
  CloseSession();
  std::shared_ptr<GrpcCoordinatorClient> relay;
  uint64_t gen = 0;
  {
    absl::MutexLock lock(&mu_);
    worker_id_ = worker_id;
    heartbeat_ = heartbeat;
    on_message_ = std::move(on_message);
    on_closed_ = std::move(on_closed);
    fill_ = std::move(fill);
    wanted_ = true;
    gen = ++gen_;
    if (relayed_) relay = relay_;
  }
  if (relay != nullptr) {
    absl::Status s = OpenOn(relay.get(), gen);
    if (s.ok()) return s;
    absl::MutexLock lock(&mu_);
    relayed_ = false;
    failed_address_ = relay_address_;
    failed_at_ = relay_options_.clock->Now();
  }
  return OpenOn(&direct_, gen);
}

void RoutedCoordinatorClient::CloseSession() {
  std::shared_ptr<GrpcCoordinatorClient> relay;
  std::vector<std::shared_ptr<GrpcCoordinatorClient>> retired;
  {
    absl::MutexLock lock(&mu_);
    wanted_ = false;
    relay = relay_;
    retired.swap(retired_);
  }
  direct_.CloseSession();
  if (relay != nullptr) relay->CloseSession();
}

bool RoutedCoordinatorClient::SendHeartbeatNow(absl::Duration timeout) {
  std::shared_ptr<GrpcCoordinatorClient> relay;
  {
    absl::MutexLock lock(&mu_);
    if (relayed_) relay = relay_;
  }
  // A session that moves meanwhile sends its own heartbeats at once (Hello
  // and its first period): only the current one is asked.
  return relay != nullptr ? relay->SendHeartbeatNow(timeout) : direct_.SendHeartbeatNow(timeout);
}

}  // namespace shoal::worker
