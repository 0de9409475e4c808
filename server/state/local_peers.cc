#include "server/state/local_peers.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace flce::server {

bool IsUnixSocketPeer(const std::string& peer) {
  return absl::StartsWith(peer, "unix:") || absl::StartsWith(peer, "fd:");
}

bool IsLocalPeer(const std::string& peer) {
  return IsUnixSocketPeer(peer) || absl::StartsWith(peer, "ipv4:127.") ||
         absl::StartsWith(peer, "ipv6:[::1]:") || absl::StartsWith(peer, "ipv6:%5B::1%5D:");
}

void LocalPeers::Record(int fd, uid_t uid) {
  absl::MutexLock lock(&mu_);
  uid_by_fd_[fd] = uid;
}

PeerIdentity LocalPeers::Identify(const std::string& peer) const {
  PeerIdentity who;
  if (!IsLocalPeer(peer)) return who;
  absl::string_view rest = peer;
  if (absl::ConsumePrefix(&rest, "fd:")) {
    who.place = PeerIdentity::Place::kUnixSocket;
    int fd = -1;
    if (absl::SimpleAtoi(rest, &fd)) {
      absl::MutexLock lock(&mu_);
      auto it = uid_by_fd_.find(fd);
      if (it != uid_by_fd_.end()) who.uid = it->second;
    }
    return who;
  }
  who.place = IsUnixSocketPeer(peer) ? PeerIdentity::Place::kUnixSocket
                                     : PeerIdentity::Place::kLoopback;
  return who;
}

LocalOffer LocalPeers::OfferTo(const std::string& peer) const {
  LocalOffer offer;
  if (!rule_.shm && !rule_.cuda_ipc) {
    offer.refusal =
        "this server takes no regions (--local-transports=none, or a GPU-less engine asked for "
        "cuda_ipc alone)";
    offer.refusal_reason = "no_regions";
    return offer;
  }
  const PeerIdentity who = Identify(peer);
  if (who.place == PeerIdentity::Place::kRemote) {
    offer.refusal = absl::StrCat(
        "regions are for clients on the server's host (loopback or a Unix socket); this call "
        "comes from ",
        peer);
    offer.refusal_reason = "remote";
    return offer;
  }
  if (rule_.same_uid_only) {
    if (who.place != PeerIdentity::Place::kUnixSocket) {
      offer.refusal = absl::StrCat(
          "regions are for clients on the server's Unix socket running as its user (uid ",
          server_uid_, "); this call comes over TCP (", peer,
          "), which does not say who is calling: connect through GetServerInfo.unix_socket, or "
          "start the server with --local-transports=shm,cuda_ipc to offer them to every client "
          "on this host");
      offer.refusal_reason = "tcp";
      return offer;
    }
    if (!who.uid.has_value() || *who.uid != server_uid_) {
      offer.refusal = absl::StrCat(
          "regions are for clients running as the server's user (uid ", server_uid_,
          "); this call comes from ",
          who.uid.has_value() ? absl::StrCat("uid ", *who.uid) : std::string("an unknown uid"),
          " (start the server with --local-transports=shm,cuda_ipc to offer them to every client "
          "on this host)");
      offer.refusal_reason = "other_uid";
      return offer;
    }
  }
  offer.shm = rule_.shm;
  offer.cuda_ipc = rule_.cuda_ipc;
  return offer;
}

}  // namespace flce::server
