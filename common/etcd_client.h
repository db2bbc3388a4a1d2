// A small client of etcd's v3 API (KV and Lease) behind an interface, so that
// the coordinator's replica logic is tested with a fake (tests/unit/
// fake_etcd.h) and runs against real etcd members. No gRPC type appears here:
// GrpcEtcdClient (etcd_client.cc) speaks etcd's gRPC API through stubs
// generated at build time from Debian's golang-etcd-server-dev .proto files.
//
// Every call has a deadline (EtcdClientOptions::call_timeout). Failures keep
// etcd's status code; an unreachable cluster is UNAVAILABLE or
// DEADLINE_EXCEEDED, and the caller decides (the coordinator stops starting
// rounds, it never guesses).
#ifndef SHOAL_COMMON_ETCD_CLIENT_H_
#define SHOAL_COMMON_ETCD_CLIENT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace shoal {

// One key as etcd stores it.
struct EtcdKeyValue {
  std::string key;
  std::string value;
  // Revision of the transaction that created the key (etcd: create_revision);
  // a key deleted and created again gets a new one.
  int64_t create_revision = 0;
  // Revision of its last write (etcd: mod_revision).
  int64_t mod_revision = 0;
  // Lease the key is attached to (0 = none).
  int64_t lease = 0;
  // The store's revision when it was read (etcd: the response header's):
  // nothing changed the key between mod_revision and this one. A watch
  // from here misses nothing, and it is recent enough not to have been
  // compacted away, unlike mod_revision.
  int64_t read_revision = 0;
};

// An equality test of a transaction (etcd's Compare with result EQUAL).
struct EtcdCompare {
  enum class Target { kCreateRevision, kModRevision, kValue };
  std::string key;
  Target target = Target::kModRevision;
  // For kCreateRevision / kModRevision; 0 = "the key does not exist".
  int64_t revision = 0;
  // For kValue.
  std::string value;

  static EtcdCompare Absent(std::string key) {
    return {std::move(key), Target::kCreateRevision, 0, {}};
  }
  static EtcdCompare CreatedAt(std::string key, int64_t revision) {
    return {std::move(key), Target::kCreateRevision, revision, {}};
  }
  static EtcdCompare ModifiedAt(std::string key, int64_t revision) {
    return {std::move(key), Target::kModRevision, revision, {}};
  }
};

// A write of a transaction's success branch.
struct EtcdPut {
  std::string key;
  std::string value;
  int64_t lease = 0;  // 0 = not attached to a lease
};

struct EtcdTxnResult {
  // True when every comparison held and the puts were applied.
  bool succeeded = false;
  // The store's revision after the transaction (the puts' mod_revision when
  // it succeeded).
  int64_t revision = 0;
  // When it failed: the keys named in `get_on_failure`, as they are now
  // (absent keys are left out).
  std::vector<EtcdKeyValue> current;
};

// Thread-safe (both implementations).
class EtcdClient {
 public:
  virtual ~EtcdClient() = default;

  // The key, or nullopt when it does not exist.
  virtual absl::StatusOr<std::optional<EtcdKeyValue>> Get(const std::string& key) = 0;
  // The key as the member answering has applied it (etcd: a serializable
  // read): no consensus round, so it is cheap to repeat often, but it may
  // lag the cluster, and a member cut off from the others still answers.
  // For hints that a linearizable call confirms, never for decisions.
  virtual absl::StatusOr<std::optional<EtcdKeyValue>> GetLocal(const std::string& key) = 0;
  // Atomically: if every comparison holds, apply `puts`; otherwise read
  // `get_on_failure`.
  virtual absl::StatusOr<EtcdTxnResult> Txn(const std::vector<EtcdCompare>& compares,
                                            const std::vector<EtcdPut>& puts,
                                            const std::vector<std::string>& get_on_failure) = 0;
  // Deletes the key if it exists and `compare` (when given) holds.
  virtual absl::StatusOr<bool> Delete(const std::string& key,
                                      std::optional<EtcdCompare> compare) = 0;

  // Waits (an etcd watch) until `key` is deleted at a revision after
  // `after_revision`, or `timeout` passes: true when it was, false when the
  // timeout passed first. An error when the member cannot be reached or has
  // no raft leader, and FAILED_PRECONDITION when etcd compacted the history
  // after `after_revision` (read the key again). One stream, under
  // `timeout`.
  virtual absl::StatusOr<bool> AwaitDelete(const std::string& key, int64_t after_revision,
                                           absl::Duration timeout) = 0;

  // A new lease of `ttl` (whole seconds, at least 1); returns its id.
  virtual absl::StatusOr<int64_t> GrantLease(absl::Duration ttl) = 0;
  // Renews the lease once; returns the TTL etcd granted. NOT_FOUND when the
  // lease has expired or was revoked.
  virtual absl::StatusOr<absl::Duration> KeepAlive(int64_t lease) = 0;
  // Revokes the lease (its keys are deleted).
  virtual absl::Status RevokeLease(int64_t lease) = 0;
};

struct EtcdClientOptions {
  // "host:port" of each member; calls go to one member and move to the next
  // one when it is unreachable.
  std::vector<std::string> endpoints;
  // Deadline of every call.
  absl::Duration call_timeout = absl::Seconds(1);
};

// Parses "host:port[,host:port...]" (--etcd); INVALID_ARGUMENT names the
// offending entry.
absl::StatusOr<std::vector<std::string>> ParseEndpoints(const std::string& list,
                                                        const std::string& flag);

// The real client over gRPC (etcd_client.cc).
absl::StatusOr<std::unique_ptr<EtcdClient>> MakeGrpcEtcdClient(EtcdClientOptions options);

}  // namespace shoal

#endif  // SHOAL_COMMON_ETCD_CLIENT_H_
