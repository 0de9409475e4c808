// A reader of the .safetensors format (8-byte little-endian header length,
// a JSON header naming each tensor's dtype, shape and byte range, then the
// data), enough to stream one tensor out of a file of any size.
//
// Usage:
//   FLCE_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(path));
//   FLCE_ASSIGN_OR_RETURN(const SafetensorsTensor* w, file.Find("lm_head.weight"));
//   file.Read(*w, offset, bytes, buffer);
#ifndef FLCE_SERVER_STORAGE_SAFETENSORS_H_
#define FLCE_SERVER_STORAGE_SAFETENSORS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/dtype.h"

namespace flce::server {

struct SafetensorsTensor {
  std::string name;
  std::string dtype;  // as in the file: "BF16", "F16", "F32", ...
  std::vector<int64_t> shape;
  int64_t begin = 0;  // byte range in the data section
  int64_t end = 0;
};

class SafetensorsFile {
 public:
  // INVALID_ARGUMENT for a malformed file, NOT_FOUND for a missing one.
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path);

  SafetensorsFile(SafetensorsFile&&) = default;
  SafetensorsFile& operator=(SafetensorsFile&&) = default;
  ~SafetensorsFile();

  // NOT_FOUND listing the tensors the file has.
  absl::StatusOr<const SafetensorsTensor*> Find(const std::string& name) const;
  // bytes at `offset` into the tensor's data.
  absl::Status Read(const SafetensorsTensor& tensor, int64_t offset, int64_t bytes,
                    void* out) const;
  // The header's __metadata__ (string values only).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::map<std::string, SafetensorsTensor>& tensors() const { return tensors_; }

 private:
  SafetensorsFile() = default;

  std::string path_;
  int fd_ = -1;
  int64_t data_start_ = 0;
  std::map<std::string, SafetensorsTensor> tensors_;
  std::map<std::string, std::string> metadata_;
  std::unique_ptr<int, void (*)(int*)> closer_{nullptr, nullptr};
};

// "BF16" / "F16" / "F32" to DType; INVALID_ARGUMENT for anything else.
absl::StatusOr<DType> DTypeFromSafetensors(const std::string& name);
const char* DTypeToSafetensors(DType dtype);

// One tensor of a file being written: `read` fills `count` elements from
// element `begin` on (the writer asks for pieces of at most 16 MiB).
struct TensorSource {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::function<absl::Status(int64_t begin, int64_t count, void* out)> read;
};

// Writes a .safetensors file so that a crash never leaves a partial file
// under `path`: into a temporary file beside it (mode 0600), fsync, rename,
// fsync of the directory. ALREADY_EXISTS when `path` exists and !overwrite;
// the temporary file is removed on any error. Returns the file's size.
absl::StatusOr<int64_t> WriteSafetensors(const std::string& path,
                                         const std::vector<TensorSource>& tensors,
                                         const std::map<std::string, std::string>& metadata,
                                         bool overwrite);

}  // namespace flce::server

#endif  // FLCE_SERVER_STORAGE_SAFETENSORS_H_
