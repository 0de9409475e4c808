#include "server/rpc/transport_security.h"

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/security/server_credentials.h"
#include "server/observe/log.h"

namespace flce::server {

absl::StatusOr<std::string> ReadPemFile(const std::string& path, absl::string_view flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::FailedPreconditionError(absl::StrCat("cannot read --", flag, "=", path));
  }
  std::stringstream text;
  text << in.rdbuf();
  if (text.str().empty()) {
    return absl::FailedPreconditionError(absl::StrCat("--", flag, "=", path, " is empty"));
  }
  return text.str();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFor(
    const ServerConfig& config) {
  if (config.tls_cert.empty() != config.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together: give both or neither");
  }
  if (config.tls_cert.empty()) {
    if (!config.tls_client_ca.empty()) {
      return absl::InvalidArgumentError(
          "--tls-client-ca (mutual TLS) needs the server's own --tls-cert and --tls-key");
    }
    return grpc::InsecureServerCredentials();
  }
  grpc::SslServerCredentialsOptions options;
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  absl::StatusOr<std::string> cert = ReadPemFile(config.tls_cert, "tls-cert");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPemFile(config.tls_key, "tls-key");
  if (!key.ok()) return key.status();
  pair.cert_chain = *std::move(cert);
  pair.private_key = *std::move(key);
  options.pem_key_cert_pairs.push_back(std::move(pair));
  if (!config.tls_client_ca.empty()) {
    absl::StatusOr<std::string> ca = ReadPemFile(config.tls_client_ca, "tls-client-ca");
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *std::move(ca);
    options.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  } else {
    options.client_certificate_request = GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE;
  }
  return grpc::SslServerCredentials(options);
}

bool IsLoopbackAddress(absl::string_view address) {
  absl::string_view host = address;
  if (size_t colon = host.rfind(':'); colon != absl::string_view::npos) {
    host = host.substr(0, colon);
  }
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]")) {
    host = host.substr(1, host.size() - 2);
  }
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

void LogSecurity(const ServerConfig& config, size_t tokens) {
  bool tls = !config.tls_cert.empty();
  LogInfo(tls ? (config.tls_client_ca.empty() ? "TLS on (server certificate)"
                                              : "TLS on, mutual (client certificates required)")
              : "TLS off: plaintext gRPC");
  if (config.auth_token_file.empty()) {
    LogInfo("auth off: every call is the anonymous tenant with admin rights");
    return;
  }
  LogInfo(absl::StrCat("auth on: ", tokens, " token(s) from ", config.auth_token_file));
  if (!tls && !IsLoopbackAddress(config.address)) {
    LogWarning(absl::StrCat("bearer tokens travel in clear text: listening on ", config.address,
                            " without TLS; add --tls-cert/--tls-key or keep the port on a "
                            "trusted network"));
  }
}

}  // namespace flce::server
