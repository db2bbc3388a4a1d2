// An in-memory etcd for unit tests: one revision counter, keys with
// create/mod revisions, leases that expire on a FakeClock, transactions with
// equality comparisons, and a switch that makes every call UNAVAILABLE (etcd
// lost). Thread-safe (one mutex).
#ifndef SHOAL_TESTS_UNIT_FAKE_ETCD_H_
#define SHOAL_TESTS_UNIT_FAKE_ETCD_H_

#include <map>

#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/etcd_client.h"

namespace shoal::testing {

// Counts the call, fails it while etcd is "down", expires due leases.
#define RETURN_IF_DOWN()                                           \
  do {                                                             \
    ++calls_;                                                      \
    if (down_) return absl::UnavailableError("fake etcd is down"); \
    ExpireLeases();                                                \
  } while (0)

class FakeEtcd : public EtcdClient {
 public:
  explicit FakeEtcd(const Clock* clock) : clock_(clock) {}

  // While down, every call fails with UNAVAILABLE and leases do not expire
  // (etcd extends every lease when it gets a leader back).
  void SetDown(bool down) {
    absl::MutexLock lock(&mu_);
    if (down_ && !down) {
      for (auto& [id, l] : leases_) l.expires = clock_->Now() + l.ttl;
    }
    down_ = down;
  }
  // Expires the lease now (as etcd would after its TTL).
  void ExpireLease(int64_t lease) {
    absl::MutexLock lock(&mu_);
    DropLease(lease);
  }
  // Writes a key outside any transaction (another client).
  void PutRaw(const std::string& key, const std::string& value) {
    absl::MutexLock lock(&mu_);
    Write(key, value, 0);
  }
  // The next transaction is applied but its caller is told the deadline
  // passed (a member that commits after the client gave up).
  void ApplyNextTxnButTimeOut() {
    absl::MutexLock lock(&mu_);
    time_out_next_txn_ = true;
  }
  int calls() const {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  // Calls that etcd puts through raft (an entry in every member's log):
  // transactions holding a put, whether or not their comparisons held, and
  // deletes.
  int proposals() const {
    absl::MutexLock lock(&mu_);
    return proposals_;
  }

  absl::StatusOr<std::optional<EtcdKeyValue>> Get(const std::string& key) override {
    absl::MutexLock lock(&mu_);
    RETURN_IF_DOWN();
    auto it = kv_.find(key);
    if (it == kv_.end()) return std::optional<EtcdKeyValue>();
    EtcdKeyValue kv = it->second;
    kv.read_revision = revision_;
    return std::optional<EtcdKeyValue>(kv);
  }

  // One store, so a local read is the linearizable one.
  absl::StatusOr<std::optional<EtcdKeyValue>> GetLocal(const std::string& key) override {
    return Get(key);
  }

  absl::StatusOr<EtcdTxnResult> Txn(const std::vector<EtcdCompare>& compares,
                                    const std::vector<EtcdPut>& puts,
                                    const std::vector<std::string>& get_on_failure) override {
    absl::MutexLock lock(&mu_);
    RETURN_IF_DOWN();
    if (!puts.empty()) ++proposals_;
    EtcdTxnResult r;
    r.succeeded = true;
    for (const EtcdCompare& c : compares) r.succeeded &= Holds(c);
    if (r.succeeded) {
      for (const EtcdPut& p : puts) {
        if (p.lease != 0 && !leases_.count(p.lease)) {
          return absl::NotFoundError("etcdserver: requested lease not found");
        }
      }
      ++revision_;
      for (const EtcdPut& p : puts) Write(p.key, p.value, p.lease, /*bump=*/false);
    } else {
      for (const std::string& k : get_on_failure) {
        auto it = kv_.find(k);
        if (it != kv_.end()) {
          r.current.push_back(it->second);
          r.current.back().read_revision = revision_;
        }
      }
    }
    r.revision = revision_;
    if (time_out_next_txn_) {
      time_out_next_txn_ = false;
      return absl::DeadlineExceededError("fake etcd: deadline exceeded (applied anyway)");
    }
    return r;
  }

  absl::StatusOr<bool> Delete(const std::string& key, std::optional<EtcdCompare> compare) override {
    absl::MutexLock lock(&mu_);
    RETURN_IF_DOWN();
    ++proposals_;
    if (compare.has_value() && !Holds(*compare)) return false;
    if (kv_.erase(key) == 0) return false;
    ++revision_;
    return true;
  }

  // No history and no waiting (the clock is the test's): the key is gone,
  // or was written again after `after_revision` (so it was deleted in
  // between: the leader key is never rewritten in place), or it is not.
  absl::StatusOr<bool> AwaitDelete(const std::string& key, int64_t after_revision,
                                   absl::Duration /*timeout*/) override {
    absl::MutexLock lock(&mu_);
    RETURN_IF_DOWN();
    auto it = kv_.find(key);
    return it == kv_.end() || it->second.mod_revision > after_revision;
  }

  absl::StatusOr<int64_t> GrantLease(absl::Duration ttl) override {
    absl::MutexLock lock(&mu_);
    RETURN_IF_DOWN();
    const int64_t id = next_lease_++;
    leases_[id] = {ttl, clock_->Now() + ttl};
    return id;
  }

  absl::StatusOr<absl::Duration> KeepAlive(int64_t lease) override {
    absl::MutexLock lock(&mu_);
    RETURN_IF_DOWN();
    auto it = leases_.find(lease);
    if (it == leases_.end()) return absl::NotFoundError("lease expired");
    it->second.expires = clock_->Now() + it->second.ttl;
    return it->second.ttl;
  }

  absl::Status RevokeLease(int64_t lease) override {
    absl::MutexLock lock(&mu_);
    RETURN_IF_DOWN();
    DropLease(lease);
    return absl::OkStatus();
  }

 private:
  struct Lease {
    absl::Duration ttl;
    absl::Time expires;
  };

  bool Holds(const EtcdCompare& c) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = kv_.find(c.key);
    switch (c.target) {
      case EtcdCompare::Target::kCreateRevision:
        return (it == kv_.end() ? 0 : it->second.create_revision) == c.revision;
      case EtcdCompare::Target::kModRevision:
        return (it == kv_.end() ? 0 : it->second.mod_revision) == c.revision;
      case EtcdCompare::Target::kValue:
        return it != kv_.end() && it->second.value == c.value;
    }
    return false;
  }
  void Write(const std::string& key, const std::string& value, int64_t lease, bool bump = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (bump) ++revision_;
    EtcdKeyValue& kv = kv_[key];
    if (kv.create_revision == 0) kv.create_revision = revision_;
    kv.key = key;
    kv.value = value;
    kv.mod_revision = revision_;
    kv.lease = lease;
  }
  void DropLease(int64_t lease) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    leases_.erase(lease);
    for (auto it = kv_.begin(); it != kv_.end();) {
      if (it->second.lease == lease) {
        it = kv_.erase(it);
        ++revision_;
      } else {
        ++it;
      }
    }
  }
  void ExpireLeases() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const absl::Time now = clock_->Now();
    std::vector<int64_t> dead;
    for (const auto& [id, l] : leases_) {
      if (l.expires <= now) dead.push_back(id);
    }
    for (int64_t id : dead) DropLease(id);
  }

  const Clock* const clock_;
  mutable absl::Mutex mu_;
  bool down_ ABSL_GUARDED_BY(mu_) = false;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  int proposals_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t revision_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t next_lease_ ABSL_GUARDED_BY(mu_) = 100;
  bool time_out_next_txn_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, EtcdKeyValue> kv_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, Lease> leases_ ABSL_GUARDED_BY(mu_);
#undef RETURN_IF_DOWN
};

}  // namespace shoal::testing

#endif  // SHOAL_TESTS_UNIT_FAKE_ETCD_H_
