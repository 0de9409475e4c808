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

  // Transport security. With `tls` (or any tls_* file given) the channel
  // speaks TLS: the server's certificate is checked against tls_ca_file (PEM;
  // empty = the system's roots), and tls_cert_file + tls_key_file (PEM) are
  // presented to a server that wants client certificates (mutual TLS).
  bool tls = false;
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  // The name checked against the server's certificate instead of the
  // target's host (e.g. when dialing an IP address the certificate lacks).
  std::string tls_server_name;
  // Sent as `authorization: Bearer <auth_token>` on every flce.v1 call
  // (empty = none). Without TLS it crosses the network in clear text.
  std::string auth_token;

  // How Compute moves hidden states and grad_input. kAuto: through shared
  // memory where the server offers it to this client (flce-server
  // --local-transports=shm, reached on its host: loopback or its Unix
  // socket, same boot id), else in messages; kGrpc: always in messages;
  // kShm: shared memory, or FAILED_PRECONDITION saying why not.
  enum class Transport { kAuto, kGrpc, kShm };
  Transport transport = Transport::kAuto;
  // When the server runs on this host and listens on a Unix-domain socket
  // (flce-server --unix-socket, GetServerInfo.unix_socket), the calls that
  // carry tensors in messages (Compute, UploadHead, FetchGrad, DownloadHead,
  // Embed, EmbedGrad) go through it once the same server instance answers
  // there; only for a channel Client::Connect made without TLS.
  bool unix_socket = true;
  // How many connections a Compute call's hidden uses when it goes in
  // messages: the call's own and connections - 1 ComputePiece streams (servers
  // 0.13+; others get the call's own); 1-9, for a channel Client::Connect made.
  int connections = 1;
  // A Compute call whose hidden would go in messages sends its rows and gets
  // grad_input as raw bytes on a TCP connection of its own instead (the data
  // plane: servers 0.18+ unless TLS or --data-port none, 0.16+ with
  // --data-port; a channel Client::Connect made to a TCP target). kAuto:
  // where the server offers it, messages from the first connection that
  // fails on (said on stderr); kOn: always, else an error; kOff: never.
  enum class DataPlane { kAuto, kOn, kOff };
  DataPlane data_plane = DataPlane::kAuto;

  bool uses_tls() const {
    return tls || !tls_ca_file.empty() || !tls_cert_file.empty() || !tls_key_file.empty() ||
           !tls_server_name.empty();
  }
};

}  // namespace flce

#endif  // FLCE_CLIENT_CPP_CLIENT_OPTIONS_H_
