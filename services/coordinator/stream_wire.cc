#include "services/coordinator/stream_wire.h"

#include <google/protobuf/io/coded_stream.h>
#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/proto_buffer_writer.h>

#include "common/logging.h"

namespace shoal::coordinator {
namespace {

using google::protobuf::io::CodedOutputStream;

// Wire types and tags (field number << 3 | wire type 2 = length-delimited)
// of the fields written by hand: RelayDown.directives (1),
// RelayedDirective.message (1) and RelayedDirective.worker_ids (2).
constexpr uint8_t kRelayDownDirectivesTag = (1 << 3) | 2;
constexpr uint8_t kDirectiveMessageTag = (1 << 3) | 2;
constexpr uint8_t kDirectiveWorkerIdTag = (2 << 3) | 2;
static_assert(shoal::v1::RelayDown::kDirectivesFieldNumber == 1);
static_assert(shoal::v1::RelayedDirective::kMessageFieldNumber == 1);
static_assert(shoal::v1::RelayedDirective::kWorkerIdsFieldNumber == 2);

void AppendVarint(uint64_t value, std::string* out) {
  uint8_t buf[10];
  uint8_t* end = CodedOutputStream::WriteVarint64ToArray(value, buf);
  out->append(reinterpret_cast<const char*>(buf), end - buf);
}

}  // namespace

grpc::ByteBuffer SerializeMessage(const google::protobuf::MessageLite& msg) {
  grpc::ByteBuffer bytes;
  bool own = false;
  grpc::Status s = grpc::GenericSerialize<grpc::ProtoBufferWriter, google::protobuf::MessageLite>(
      msg, &bytes, &own);
  if (!s.ok()) SHOAL_LOG(ERROR) << "cannot serialize a message: " << s.error_message();
  return bytes;
}

bool ParseMessage(grpc::ByteBuffer* bytes, google::protobuf::MessageLite* msg) {
  return grpc::GenericDeserialize<grpc::ProtoBufferReader, google::protobuf::MessageLite>(bytes,
                                                                                          msg)
      .ok();
}

void RelayDownBuilder::AddDirective(const grpc::ByteBuffer* message, const std::string& worker_id) {
  auto latest = latest_entry_.find(message);
  auto [member, first] = member_entry_.try_emplace(worker_id, 0);
  size_t index;
  // The message's latest entry serves when the member got nothing in it or
  // after it (else the member would see this message before an earlier one).
  if (latest != latest_entry_.end() && (first || member->second < latest->second)) {
    index = latest->second;
  } else {
    index = entries_.size();
    entries_.push_back({message, {}});
    latest_entry_[message] = index;
  }
  entries_[index].ids.push_back(&member->first);
  member->second = index;
}

grpc::ByteBuffer RelayDownBuilder::Build() const {
  std::vector<grpc::Slice> slices;
  for (const Entry& e : entries_) {
    std::string ids;
    for (const std::string* id : e.ids) {
      ids.push_back(static_cast<char>(kDirectiveWorkerIdTag));
      AppendVarint(id->size(), &ids);
      ids.append(*id);
    }
    const size_t message_size = e.message->Length();
    const size_t entry_size =
        1 + CodedOutputStream::VarintSize64(message_size) + message_size + ids.size();
    std::string head;
    head.push_back(static_cast<char>(kRelayDownDirectivesTag));
    AppendVarint(entry_size, &head);
    head.push_back(static_cast<char>(kDirectiveMessageTag));
    AppendVarint(message_size, &head);
    slices.emplace_back(head);
    std::vector<grpc::Slice> message;
    if (message_size > 0) {
      (void)e.message->Dump(&message);
      for (grpc::Slice& s : message) slices.push_back(std::move(s));
    }
    slices.emplace_back(ids);
  }
  if (rest_.results_size() > 0 || rest_.ended_size() > 0) {
    slices.emplace_back(rest_.SerializeAsString());
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

}  // namespace shoal::coordinator
