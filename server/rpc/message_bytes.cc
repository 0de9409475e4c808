#include "server/rpc/message_bytes.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "grpcpp/impl/codegen/proto_utils.h"

namespace flce::server {

absl::Status ParseRequestBytes(grpc::ByteBuffer* bytes, google::protobuf::Message* out) {
  const size_t size = bytes->Length();
  if (grpc::SerializationTraits<google::protobuf::Message>::Deserialize(bytes, out).ok()) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("a request message of ", size,
                                                 " bytes does not parse as ",
                                                 out->GetDescriptor()->full_name(),
                                                 ": nothing landed"));
}

absl::Status SerializeMessageBytes(const google::protobuf::Message& message,
                                   grpc::ByteBuffer* out) {
  out->Clear();
  bool own_buffer = false;
  if (grpc::SerializationTraits<google::protobuf::Message>::Serialize(message, out, &own_buffer)
          .ok()) {
    return absl::OkStatus();
  }
  return absl::InternalError(
      absl::StrCat("a ", message.GetDescriptor()->full_name(), " did not serialize"));
}

}  // namespace flce::server
