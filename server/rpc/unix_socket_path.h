// Where flce-server listens on a Unix-domain socket when --unix-socket is left
// at "auto": flce-<pid>.sock in a directory only the server's user may enter
// ($XDG_RUNTIME_DIR/flce, /run/flce as root, else /tmp/flce-<uid>), so that
// no other tenant of the host can connect through it or put a file in its
// place. Trainers on the host then send their tensors through it without
// being configured (GetServerInfo.unix_socket names it to local callers).
#ifndef FLCE_SERVER_RPC_UNIX_SOCKET_PATH_H_
#define FLCE_SERVER_RPC_UNIX_SOCKET_PATH_H_

#include <sys/types.h>

#include <string>

#include "absl/status/statusor.h"

namespace flce::server {

// The socket path for "auto", after checking that the directory is private
// to this user and that a socket can be bound there; FAILED_PRECONDITION
// saying why not otherwise (the server then listens on TCP only).
absl::StatusOr<std::string> AutoUnixSocketPath();

// The same in `dir` for a process `pid` (tests). Both first remove the
// flce-<pid>.sock socket files in the directory that nobody listens on
// (servers killed without their shutdown).
absl::StatusOr<std::string> UnixSocketPathIn(const std::string& dir, pid_t pid);

// The file a bound socket made, to remove it at shutdown only if it is still
// this server's (another server given the same path may have replaced it).
struct SocketFile {
  std::string path;
  dev_t device = 0;
  ino_t inode = 0;
};
SocketFile RememberSocketFile(const std::string& path);
void RemoveSocketFile(const SocketFile& file);

}  // namespace flce::server

#endif  // FLCE_SERVER_RPC_UNIX_SOCKET_PATH_H_
