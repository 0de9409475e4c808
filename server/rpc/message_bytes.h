// Protobuf messages to and from the bytes gRPC carries, for the RPCs that take
// their messages raw (Compute and EmbedGrad; rpc/flce_service.h says why).
//
// Usage:
//   v1::ComputeRequest request;
//   absl::Status parsed = ParseRequestBytes(&bytes, &request);  // consumes `bytes`
//   FLCE_RETURN_IF_ERROR(SerializeMessageBytes(response, &wire));
#ifndef FLCE_SERVER_RPC_MESSAGE_BYTES_H_
#define FLCE_SERVER_RPC_MESSAGE_BYTES_H_

#include "absl/status/status.h"
#include "google/protobuf/message.h"
#include "grpcpp/support/byte_buffer.h"

namespace flce::server {

// INVALID_ARGUMENT naming the size and the message type when `bytes` do not
// parse: a request message that does not parse fails its call.
absl::Status ParseRequestBytes(grpc::ByteBuffer* bytes, google::protobuf::Message* out);

// `message` into `out` (whatever it held is dropped); INTERNAL when it does
// not serialize.
absl::Status SerializeMessageBytes(const google::protobuf::Message& message,
                                   grpc::ByteBuffer* out);

}  // namespace flce::server

#endif  // FLCE_SERVER_RPC_MESSAGE_BYTES_H_
