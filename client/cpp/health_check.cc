#include "client/cpp/health_check.h"

#include <grpcpp/client_context.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/byte_buffer.h>

#include <chrono>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "client/cpp/grpc_status.h"

namespace flce {
namespace {

constexpr char kCheckMethod[] = "/grpc.health.v1.Health/Check";

void AppendVarint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

bool ReadVarint(absl::string_view bytes, size_t& pos, uint64_t& value) {
  value = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (pos >= bytes.size()) return false;
    const uint8_t byte = static_cast<uint8_t>(bytes[pos++]);
    value |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) return true;
  }
  return false;
}

}  // namespace

const char* HealthStatusName(HealthStatus status) {
  switch (status) {
    case HealthStatus::kUnknown:
      return "UNKNOWN";
    case HealthStatus::kServing:
      return "SERVING";
    case HealthStatus::kNotServing:
      return "NOT_SERVING";
    case HealthStatus::kServiceUnknown:
      return "SERVICE_UNKNOWN";
  }
  return "UNKNOWN";
}

std::string EncodeHealthCheckRequest(absl::string_view service) {
  std::string out;
  if (service.empty()) return out;                 // proto3 omits a default string
  out.push_back(static_cast<char>((1 << 3) | 2));  // field 1, length-delimited
  AppendVarint(out, service.size());
  out.append(service.data(), service.size());
  return out;
}

absl::StatusOr<HealthStatus> DecodeHealthCheckResponse(absl::string_view bytes) {
  HealthStatus status = HealthStatus::kUnknown;
  size_t pos = 0;
  const auto malformed = [] {
    return absl::InvalidArgumentError("malformed grpc.health.v1.HealthCheckResponse");
  };
  while (pos < bytes.size()) {
    uint64_t tag;
    if (!ReadVarint(bytes, pos, tag)) return malformed();
    const uint64_t field = tag >> 3;
    const int wire_type = static_cast<int>(tag & 7);
    uint64_t value;
    switch (wire_type) {
      case 0:  // varint
        if (!ReadVarint(bytes, pos, value)) return malformed();
        if (field == 1) {
          status = value <= 3 ? static_cast<HealthStatus>(value) : HealthStatus::kUnknown;
        }
        break;
      case 1:  // fixed64
        if (bytes.size() - pos < 8) return malformed();
        pos += 8;
        break;
      case 2:  // length-delimited
        if (!ReadVarint(bytes, pos, value) || bytes.size() - pos < value) return malformed();
        pos += value;
        break;
      case 5:  // fixed32
        if (bytes.size() - pos < 4) return malformed();
        pos += 4;
        break;
      default:
        return malformed();
    }
  }
  return status;
}

absl::StatusOr<HealthStatus> CheckHealth(const std::shared_ptr<grpc::Channel>& channel,
                                         absl::string_view service, absl::Duration timeout) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  if (timeout != absl::InfiniteDuration()) {
    context.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
  }
  const std::string encoded = EncodeHealthCheckRequest(service);
  grpc::Slice slice(encoded);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::Status call_status;
  absl::Notification done;
  stub.UnaryCall(&context, kCheckMethod, grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   call_status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  if (!call_status.ok()) return FromGrpcStatus(call_status);
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) {
    return absl::InternalError("cannot read the health check response");
  }
  std::string bytes;
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return DecodeHealthCheckResponse(bytes);
}

}  // namespace flce
