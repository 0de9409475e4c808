#include "server/storage/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace flce::server {
namespace {

// A header larger than this is not a head file (the format's own limit).
constexpr int64_t kMaxHeaderBytes = int64_t{100} << 20;

int64_t DTypeBytes(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL" || dtype == "F8_E4M3" ||
      dtype == "F8_E5M2") {
    return 1;
  }
  return 0;
}

absl::Status PreadAll(int fd, int64_t offset, int64_t bytes, void* out, const std::string& path) {
  char* dst = static_cast<char*>(out);
  while (bytes > 0) {
    ssize_t n = pread(fd, dst, static_cast<size_t>(bytes), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::DataLossError(absl::StrCat(
          path, ": short read at byte ", offset,
          n < 0 ? absl::StrCat(": ", std::strerror(errno)) : std::string(" (end of file)")));
    }
    dst += n;
    offset += n;
    bytes -= n;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DType> DTypeFromSafetensors(const std::string& name) {
  if (name == "BF16") return DType::kBF16;
  if (name == "F16") return DType::kF16;
  if (name == "F32") return DType::kF32;
  return absl::InvalidArgumentError(
      absl::StrCat("tensor dtype ", name, " is not one of BF16, F16, F32"));
}

SafetensorsFile::~SafetensorsFile() = default;

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    std::string why = absl::StrCat(path, ": ", std::strerror(err));
    if (err == ENOENT) return absl::NotFoundError(why);
    if (err == EACCES) return absl::PermissionDeniedError(why);
    return absl::UnavailableError(why);
  }
  SafetensorsFile file;
  file.path_ = path;
  file.fd_ = fd;
  file.closer_ = std::unique_ptr<int, void (*)(int*)>(new int(fd), [](int* p) {
    close(*p);
    delete p;
  });
  struct stat st;
  if (fstat(fd, &st) != 0) {
    return absl::UnavailableError(absl::StrCat(path, ": ", std::strerror(errno)));
  }
  int64_t size = st.st_size;
  uint8_t len_bytes[8];
  if (size < 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is not a .safetensors file (", size, " bytes)"));
  }
  absl::Status read = PreadAll(fd, 0, 8, len_bytes, path);
  if (!read.ok()) return read;
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len == 0 || header_len > static_cast<uint64_t>(kMaxHeaderBytes) ||
      static_cast<int64_t>(header_len) > size - 8) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header length ", header_len,
                                                   " does not fit the file's ", size, " bytes"));
  }
  std::string header(header_len, '\0');
  read = PreadAll(fd, 8, static_cast<int64_t>(header_len), header.data(), path);
  if (!read.ok()) return read;
  file.data_start_ = 8 + static_cast<int64_t>(header_len);
  int64_t data_bytes = size - file.data_start_;

  nlohmann::json json = nlohmann::json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header is not a JSON object"));
  }
  for (auto it = json.begin(); it != json.end(); ++it) {
    if (it.key() == "__metadata__") {
      // Strings only, as the format says; anything else is not ours to read.
      if (it.value().is_object()) {
        for (auto m = it.value().begin(); m != it.value().end(); ++m) {
          if (m.value().is_string()) file.metadata_[m.key()] = m.value().get<std::string>();
        }
      }
      continue;
    }
    const nlohmann::json& t = it.value();
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor \"", it.key(), "\": ", why));
    };
    if (!t.is_object() || !t.contains("dtype") || !t["dtype"].is_string() || !t.contains("shape") ||
        !t["shape"].is_array() || !t.contains("data_offsets") || !t["data_offsets"].is_array() ||
        t["data_offsets"].size() != 2) {
      return bad("needs dtype, shape and data_offsets [begin, end]");
    }
    SafetensorsTensor tensor;
    tensor.name = it.key();
    tensor.dtype = t["dtype"].get<std::string>();
    int64_t elements = 1;
    for (const auto& d : t["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) return bad("shape is not integers");
      tensor.shape.push_back(d.get<int64_t>());
      // A header may claim any shape: a product that wraps could match the
      // data's byte count by accident.
      if (__builtin_mul_overflow(elements, tensor.shape.back(), &elements)) {
        return bad("shape's element count does not fit in 64 bits");
      }
    }
    if (!t["data_offsets"][0].is_number_integer() || !t["data_offsets"][1].is_number_integer()) {
      return bad("data_offsets are not integers");
    }
    tensor.begin = t["data_offsets"][0].get<int64_t>();
    tensor.end = t["data_offsets"][1].get<int64_t>();
    if (tensor.begin < 0 || tensor.end < tensor.begin || tensor.end > data_bytes) {
      return bad(absl::StrCat("data_offsets [", tensor.begin, ", ", tensor.end,
                              ") are outside the data's ", data_bytes, " bytes"));
    }
    int64_t elem = DTypeBytes(tensor.dtype);
    int64_t shape_bytes = 0;
    if (elem != 0 && __builtin_mul_overflow(elements, elem, &shape_bytes)) {
      return bad("shape's byte count does not fit in 64 bits");
    }
    if (elem != 0 && shape_bytes != tensor.end - tensor.begin) {
      return bad(absl::StrCat("shape holds ", shape_bytes, " bytes, data_offsets ",
                              tensor.end - tensor.begin));
    }
    file.tensors_[tensor.name] = std::move(tensor);
  }
  return file;
}

absl::StatusOr<const SafetensorsTensor*> SafetensorsFile::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it != tensors_.end()) return &it->second;
  std::vector<std::string> names;
  for (const auto& [n, t] : tensors_) names.push_back(n);
  return absl::NotFoundError(absl::StrCat("tensor \"", name, "\" is not in ", path_,
                                          " (tensors: ", absl::StrJoin(names, ", "), ")"));
}

absl::Status SafetensorsFile::Read(const SafetensorsTensor& tensor, int64_t offset, int64_t bytes,
                                   void* out) const {
  if (offset < 0 || bytes < 0 || offset + bytes > tensor.end - tensor.begin) {
    return absl::OutOfRangeError(absl::StrCat("read past tensor \"", tensor.name, "\""));
  }
  return PreadAll(fd_, data_start_ + tensor.begin + offset, bytes, out, path_);
}

}  // namespace flce::server
