// Who may hand tensors over in regions (shared memory, CUDA IPC) instead of
// messages. The kernel says who a client on the server's own Unix socket is:
// the server accepts those connections itself and records each one's uid
// (SO_PEERCRED) before gRPC serves it; such a peer reaches gRPC as "fd:N".
// Every other peer is known only by its address.
#ifndef FLCE_SERVER_STATE_LOCAL_PEERS_H_
#define FLCE_SERVER_STATE_LOCAL_PEERS_H_

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>

#include "absl/synchronization/mutex.h"

namespace flce::server {

struct PeerIdentity {
  enum class Place {
    kRemote,      // another host (or an address this server cannot place)
    kLoopback,    // TCP on 127.0.0.0/8 or ::1: this host, any user
    kUnixSocket,  // a Unix-domain socket: this host (or a container sharing it)
  };
  Place place = Place::kRemote;
  std::optional<uid_t> uid;  // known for the connections the server accepted itself
};

// The regions a peer may register, or why it may register none.
struct LocalOffer {
  bool shm = false;
  bool cuda_ipc = false;
  std::string refusal;         // when neither: why, for the status message
  std::string refusal_reason;  // and as flce_region_refusals_total's reason label
  bool any() const { return shm || cuda_ipc; }
};

// --local-transports: which kinds exist and who gets them.
struct LocalTransportRule {
  bool shm = false;
  bool cuda_ipc = false;
  // true: only clients on the server's Unix socket whose uid is the server's;
  // false: every client on this host (loopback TCP or a Unix socket, any uid).
  bool same_uid_only = false;
};

class LocalPeers {
 public:
  LocalPeers(LocalTransportRule rule, uid_t server_uid) : rule_(rule), server_uid_(server_uid) {}

  // A connection the server accepted on its Unix socket, before gRPC serves
  // it. A later connection given the same descriptor replaces the entry: the
  // earlier one's calls have all ended by then (gRPC closes a connection's
  // descriptor only when nothing uses it).
  void Record(int fd, uid_t uid);
  PeerIdentity Identify(const std::string& peer) const;

  // What the caller at gRPC peer string `peer` may register.
  LocalOffer OfferTo(const std::string& peer) const;
  const LocalTransportRule& rule() const { return rule_; }

 private:
  const LocalTransportRule rule_;
  const uid_t server_uid_;
  mutable absl::Mutex mu_;
  std::map<int, uid_t> uid_by_fd_ ABSL_GUARDED_BY(mu_);
};

// Whether a gRPC peer string ("ipv4:127.0.0.1:5000", "ipv6:[::1]:5000",
// "unix:/run/flce.sock", "fd:12") is on this host: loopback or a Unix socket.
bool IsLocalPeer(const std::string& peer);
// Whether it came through a Unix-domain socket ("unix:..." or "fd:N").
bool IsUnixSocketPeer(const std::string& peer);

}  // namespace flce::server

#endif  // FLCE_SERVER_STATE_LOCAL_PEERS_H_
