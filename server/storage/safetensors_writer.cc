// WriteSafetensors (safetensors.h): the format's writer, crash-safe.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"
#include "server/storage/safetensors.h"

namespace flce::server {
namespace {

constexpr int64_t kPieceBytes = int64_t{16} << 20;

absl::Status Errno(const std::string& what, int err) {
  std::string why = absl::StrCat(what, ": ", std::strerror(err));
  return err == ENOSPC || err == EDQUOT ? absl::ResourceExhaustedError(why)
                                        : absl::InternalError(why);
}

absl::Status WriteAll(int fd, const char* data, int64_t bytes, const std::string& path) {
  while (bytes > 0) {
    const ssize_t n = write(fd, data, static_cast<size_t>(bytes));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno(absl::StrCat("write ", path), errno);
    }
    data += n;
    bytes -= n;
  }
  return absl::OkStatus();
}

std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash == 0 ? 1 : slash);
}

// Removes the temporary file unless released (the rename took it).
class TempFile {
 public:
  explicit TempFile(std::string path) : path_(std::move(path)) {}
  ~TempFile() {
    if (fd_ >= 0) close(fd_);
    if (!path_.empty()) unlink(path_.c_str());
  }
  const std::string& path() const { return path_; }
  int fd() const { return fd_; }
  void set_fd(int fd) { fd_ = fd; }
  absl::Status Close() {
    const int fd = fd_;
    fd_ = -1;
    if (close(fd) != 0) return Errno(absl::StrCat("close ", path_), errno);
    return absl::OkStatus();
  }
  void Release() { path_.clear(); }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace

const char* DTypeToSafetensors(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kF32:
      return "F32";
  }
  return "F32";
}

absl::StatusOr<int64_t> WriteSafetensors(const std::string& path,
                                         const std::vector<TensorSource>& tensors,
                                         const std::map<std::string, std::string>& metadata,
                                         bool overwrite) {
  if (!overwrite && access(path.c_str(), F_OK) == 0) {
    return absl::AlreadyExistsError(absl::StrCat(path, " exists: set overwrite to replace it"));
  }
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  int64_t offset = 0;
  for (const TensorSource& t : tensors) {
    int64_t elements = 1;
    for (int64_t d : t.shape) elements *= d;
    const int64_t bytes = elements * DTypeSize(t.dtype);
    header[t.name] = {{"dtype", DTypeToSafetensors(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  // The data section starts 8-byte aligned, as the format's writers do.
  text.append((8 - text.size() % 8) % 8, ' ');

  std::random_device random;
  TempFile temp(absl::StrFormat("%s/.%s.tmp-%08x%08x", DirectoryOf(path),
                                path.substr(path.rfind('/') + 1), random(), random()));
  temp.set_fd(open(temp.path().c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (temp.fd() < 0) return Errno(absl::StrCat("create ", temp.path()), errno);
  char length[8];
  uint64_t header_len = text.size();
  for (int i = 0; i < 8; ++i) length[i] = static_cast<char>((header_len >> (8 * i)) & 0xff);
  FLCE_RETURN_IF_ERROR(WriteAll(temp.fd(), length, 8, temp.path()));
  FLCE_RETURN_IF_ERROR(WriteAll(temp.fd(), text.data(), text.size(), temp.path()));
  std::string piece;
  for (const TensorSource& t : tensors) {
    int64_t elements = 1;
    for (int64_t d : t.shape) elements *= d;
    const int64_t size = DTypeSize(t.dtype);
    const int64_t per_piece = std::max<int64_t>(1, kPieceBytes / size);
    for (int64_t begin = 0; begin < elements; begin += per_piece) {
      const int64_t count = std::min(per_piece, elements - begin);
      piece.resize(count * size);
      FLCE_RETURN_IF_ERROR(t.read(begin, count, piece.data()));
      FLCE_RETURN_IF_ERROR(WriteAll(temp.fd(), piece.data(), piece.size(), temp.path()));
    }
  }
  if (fsync(temp.fd()) != 0) return Errno(absl::StrCat("fsync ", temp.path()), errno);
  FLCE_RETURN_IF_ERROR(temp.Close());
  if (rename(temp.path().c_str(), path.c_str()) != 0) {
    return Errno(absl::StrCat("rename to ", path), errno);
  }
  temp.Release();
  // The rename itself reaches the disk only with its directory.
  const std::string dir = DirectoryOf(path);
  const int dir_fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return Errno(absl::StrCat("open ", dir), errno);
  const int synced = fsync(dir_fd);
  const int err = errno;
  close(dir_fd);
  if (synced != 0) return Errno(absl::StrCat("fsync ", dir), err);
  return static_cast<int64_t>(8 + text.size() + offset);
}

}  // namespace flce::server
