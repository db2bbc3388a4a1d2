// The bytes of the coordinator's raw streams (Session, Relay): protobuf
// messages to and from grpc::ByteBuffer as the typed API would make them,
// and RelayDown messages assembled around directives serialized once.
//
// Why by hand: a directive broadcast to N workers is serialized once and its
// reference-counted slices are shared by every direct session; a relay's
// RelayDown must carry the same bytes (RelayedDirective.message) without
// serializing the message again per relay. Protobuf's wire format lets a
// message field be written as its length and the bytes of the embedded
// message, which is what RelayDownBuilder does; everything else of a
// RelayDown is serialized by protobuf and appended (concatenated messages
// merge). This file is the only place that knows it.
#ifndef SHOAL_SERVICES_COORDINATOR_STREAM_WIRE_H_
#define SHOAL_SERVICES_COORDINATOR_STREAM_WIRE_H_

#include <google/protobuf/message_lite.h>
#include <grpcpp/support/byte_buffer.h>

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "shoal/v1/coordinator.pb.h"

namespace shoal::coordinator {

// The same bytes the typed API would produce (one slice below 1 MiB).
grpc::ByteBuffer SerializeMessage(const google::protobuf::MessageLite& msg);
// Parses `bytes` (left empty) as the typed API would; false when malformed.
bool ParseMessage(grpc::ByteBuffer* bytes, google::protobuf::MessageLite* msg);

// One RelayDown for one relay. Directives are grouped by message: the
// recipients of one message become one RelayedDirective with all their ids,
// so a broadcast to 100 members of a relay is one entry. Each member still
// gets its messages in the order they were added (a message added for a
// member after a later entry of that member opens a new entry), and a relay
// applies the entries in order. Not thread-safe.
class RelayDownBuilder {
 public:
  // `message` is a serialized CoordinatorMessage; it must outlive Build(),
  // and the same message must come as the same pointer.
  void AddDirective(const grpc::ByteBuffer* message, const std::string& worker_id);
  // Call results and ended sessions (appended after the directives).
  shoal::v1::RelayDown& rest() { return rest_; }

  bool empty() const {
    return entries_.empty() && rest_.results_size() == 0 && rest_.ended_size() == 0;
  }
  size_t directive_entries() const { return entries_.size(); }
  // The RelayDown's bytes; directive bytes are shared, not copied.
  grpc::ByteBuffer Build() const;

 private:
  struct Entry {
    const grpc::ByteBuffer* message;
    std::vector<const std::string*> ids;  // point into ids_
  };
  std::vector<Entry> entries_;
  // The latest entry of each message, and the latest entry each member got
  // (a node map: entries point at its keys).
  absl::flat_hash_map<const grpc::ByteBuffer*, size_t> latest_entry_;
  absl::node_hash_map<std::string, size_t> member_entry_;
  shoal::v1::RelayDown rest_;
};

}  // namespace shoal::coordinator

#endif  // SHOAL_SERVICES_COORDINATOR_STREAM_WIRE_H_
