// Bearer-token authentication and the tenant a call acts for.
//
// --auth-token-file holds one token per line: `token tenant [admin]`; `#`
// starts a comment, blank lines are skipped. Without a file every call is the
// anonymous tenant "" with admin rights (a single-user server). The table is
// swapped whole on Reload() (SIGHUP), so a call sees the old or the new one.
// Tokens never leave this file: no log line, status message or metric holds one.
//
// Usage:
//   FLCE_ASSIGN_OR_RETURN(auto auth,
//   Authenticator::Create("/secrets/flce-tokens"));
//   FLCE_ASSIGN_OR_RETURN(Principal who,
//   auth->Authenticate(call->client_metadata()));
#ifndef FLCE_SERVER_STATE_AUTH_H_
#define FLCE_SERVER_STATE_AUTH_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/support/string_ref.h"

namespace flce::server {

// Who a call acts for. tenant "" is the anonymous tenant of a server without
// auth; admin may replace and unload shared heads, and its heads are shared.
struct Principal {
  std::string tenant;
  bool admin = false;
};

struct TokenEntry {
  std::string token;
  Principal principal;
};

// Parses the token file's text. INVALID_ARGUMENT names the line (never the
// token) of a malformed entry or a token given twice.
absl::StatusOr<std::vector<TokenEntry>> ParseTokenFile(absl::string_view text,
                                                       absl::string_view path);

// a == b in time that depends only on the lengths, not on where they differ.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

class Authenticator {
 public:
  // path "" = auth off (every call is the anonymous admin).
  static absl::StatusOr<std::unique_ptr<Authenticator>> Create(const std::string& path);

  bool enabled() const { return !path_.empty(); }
  size_t token_count() const;
  // Rereads the file; on error the old table stays. Returns the token count.
  absl::StatusOr<size_t> Reload();

  // The principal of a call from its metadata: `authorization: Bearer <token>`.
  // UNAUTHENTICATED without the header or with an unknown token.
  absl::StatusOr<Principal> Authenticate(
      const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const;

 private:
  explicit Authenticator(std::string path) : path_(std::move(path)) {}

  const std::string path_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const std::vector<TokenEntry>> tokens_ ABSL_GUARDED_BY(mu_);
};

}  // namespace flce::server

#endif  // FLCE_SERVER_STATE_AUTH_H_
