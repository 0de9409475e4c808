// How a flce::Client reaches its server. A plain struct with defaults, filled
// from flags by the program that owns it.
#ifndef FLCE_CLIENT_CPP_CLIENT_OPTIONS_H_
#define FLCE_CLIENT_CPP_CLIENT_OPTIONS_H_

#include <cstdint>
#include <string>

#include "absl/time/time.h"

namespace flce {

struct ClientOptions {
  std::string target = "127.0.0.1:50051";  // host:port, or any gRPC target URI
  // The largest message the client sends or accepts. Keep it at or below the
  // server's --max-message-mb: chunks are cut to fit it.
  int64_t max_message_bytes = int64_t{64} << 20;
  // Payload of one upload or hidden chunk. 256 KiB - 4 MiB chunks already
  // saturate one loopback connection (~1 GB/s); bigger ones only add latency.
  int64_t chunk_bytes = int64_t{4} << 20;
  // Deadline of every call, counted from its start; InfiniteDuration = none.
  absl::Duration timeout = absl::Minutes(5);
  // Transport security and per-call credentials (TLS roots, client
  // certificates, a bearer token) are added here by a later version; the
  // channel is insecure until then.
};

}  // namespace flce

#endif  // FLCE_CLIENT_CPP_CLIENT_OPTIONS_H_
