#include "server/rpc/unix_socket_path.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "absl/algorithm/container.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace flce::server {
namespace {

std::string PrivateDirectory() {
  const char* runtime = getenv("XDG_RUNTIME_DIR");
  if (runtime != nullptr && runtime[0] == '/') return absl::StrCat(runtime, "/flce");
  if (geteuid() == 0) return "/run/flce";
  return absl::StrCat("/tmp/flce-", geteuid());
}

absl::Status Refuse(const std::string& why) {
  return absl::FailedPreconditionError(absl::StrCat("no Unix socket: ", why));
}

// Binding a throwaway socket at `path` tells whether the server's own bind
// will work (a filesystem without sockets, a path too long for sun_path)
// before gRPC, which fails the whole start when one of its ports does not bind.
absl::Status TryBind(const std::string& path) {
  sockaddr_un address{};
  if (path.size() >= sizeof(address.sun_path)) {
    return Refuse(absl::StrCat(path, " is longer than a socket path may be (",
                               sizeof(address.sun_path) - 1, " bytes)"));
  }
  address.sun_family = AF_UNIX;
  memcpy(address.sun_path, path.c_str(), path.size() + 1);
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  if (fd < 0) return Refuse(absl::StrCat("socket(AF_UNIX): ", strerror(errno)));
  unlink(path.c_str());  // a file a previous process of this pid left
  const int bound = bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address));
  const int bind_errno = errno;
  close(fd);
  unlink(path.c_str());
  if (bound != 0) return Refuse(absl::StrCat("cannot bind ", path, ": ", strerror(bind_errno)));
  return absl::OkStatus();
}

// Whether something accepts connections at `path` (a live server's socket);
// a socket file nobody listens on refuses them.
bool SomeoneListens(const std::string& path) {
  sockaddr_un address{};
  if (path.size() >= sizeof(address.sun_path)) return true;  // not ours to judge
  address.sun_family = AF_UNIX;
  memcpy(address.sun_path, path.c_str(), path.size() + 1);
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return true;
  const bool refused =
      connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0 &&
      errno == ECONNREFUSED;
  close(fd);
  return !refused;
}

// A server killed without its shutdown (SIGKILL, a crash) leaves its
// flce-<pid>.sock behind. In the private directory, the socket files of that
// name that nobody listens on are removed; by a connection attempt rather
// than by the pid, since a server of another pid namespace may share the
// directory.
void RemoveStaleSockets(const std::string& dir) {
  DIR* listing = opendir(dir.c_str());
  if (listing == nullptr) return;
  while (const dirent* entry = readdir(listing)) {
    absl::string_view name = entry->d_name;
    if (!absl::ConsumePrefix(&name, "flce-") || !absl::ConsumeSuffix(&name, ".sock") ||
        name.empty() || !absl::c_all_of(name, absl::ascii_isdigit)) {
      continue;
    }
    const std::string path = absl::StrCat(dir, "/", entry->d_name);
    struct stat st;
    if (lstat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode) || st.st_uid != geteuid()) {
      continue;
    }
    if (!SomeoneListens(path)) unlink(path.c_str());
  }
  closedir(listing);
}

}  // namespace

absl::StatusOr<std::string> UnixSocketPathIn(const std::string& dir, pid_t pid) {
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return Refuse(absl::StrCat("cannot create ", dir, ": ", strerror(errno)));
  }
  struct stat st;
  if (lstat(dir.c_str(), &st) != 0) {
    return Refuse(absl::StrCat("cannot stat ", dir, ": ", strerror(errno)));
  }
  if (!S_ISDIR(st.st_mode)) return Refuse(absl::StrCat(dir, " is not a directory"));
  if (st.st_uid != geteuid() || (st.st_mode & 022) != 0) {
    return Refuse(absl::StrFormat(
        "%s is not private to this user (owner uid %d, mode %04o; expected uid %d, no write "
        "access for group or others); give --unix-socket=PATH or --unix-socket=none",
        dir, st.st_uid, st.st_mode & 07777, geteuid()));
  }
  RemoveStaleSockets(dir);
  const std::string path = absl::StrCat(dir, "/flce-", pid, ".sock");
  absl::Status bindable = TryBind(path);
  if (!bindable.ok()) return bindable;
  return path;
}

absl::StatusOr<std::string> AutoUnixSocketPath() {
  return UnixSocketPathIn(PrivateDirectory(), getpid());
}

SocketFile RememberSocketFile(const std::string& path) {
  SocketFile file;
  struct stat st;
  if (path.empty() || lstat(path.c_str(), &st) != 0) return file;
  file.path = path;
  file.device = st.st_dev;
  file.inode = st.st_ino;
  return file;
}

void RemoveSocketFile(const SocketFile& file) {
  struct stat st;
  if (file.path.empty() || lstat(file.path.c_str(), &st) != 0) return;
  if (st.st_dev == file.device && st.st_ino == file.inode) unlink(file.path.c_str());
}

}  // namespace flce::server
