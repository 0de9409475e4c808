// The gRPC listener's security from the config: plaintext, TLS (--tls-cert,
// --tls-key) or mutual TLS (--tls-client-ca: clients must present a
// certificate that CA signed). And the start-up lines that say which, with a
// warning when bearer tokens would cross the network in clear text.
#ifndef FLCE_SERVER_RPC_TRANSPORT_SECURITY_H_
#define FLCE_SERVER_RPC_TRANSPORT_SECURITY_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/security/server_credentials.h"
#include "server/base/server_config.h"

namespace flce::server {

// INVALID_ARGUMENT for a half-given pair (cert without key, a client CA
// without a server cert), FAILED_PRECONDITION naming an unreadable file.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFor(
    const ServerConfig& config);

// True for 127.0.0.0/8, ::1 and localhost listen addresses ("host:port").
bool IsLoopbackAddress(absl::string_view address);

// "TLS: ..." and "auth: ..." at info; the clear-text warning when auth is on
// without TLS on a non-loopback address.
void LogSecurity(const ServerConfig& config, size_t tokens);

// A whole file's bytes; FAILED_PRECONDITION naming the flag and the path.
absl::StatusOr<std::string> ReadPemFile(const std::string& path, absl::string_view flag);

}  // namespace flce::server

#endif  // FLCE_SERVER_RPC_TRANSPORT_SECURITY_H_
