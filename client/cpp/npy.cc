#include "client/cpp/npy.h"

#include <cctype>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"

namespace flce {
namespace {

constexpr absl::string_view kMagic = "\x93NUMPY";
constexpr absl::string_view kSupported = "'<f4', '<f2', '<u2', '<i4', '<i8', '|u1'";

struct Header {
  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
};

// A parser for the one Python literal NumPy writes as the header: a dict of
// 'descr' (a string), 'fortran_order' (True/False) and 'shape' (a tuple of
// non-negative ints). Anything else is rejected rather than guessed at.
class HeaderParser {
 public:
  explicit HeaderParser(absl::string_view text) : text_(text) {}

  absl::StatusOr<Header> Parse() {
    Header header;
    bool have_descr = false, have_order = false, have_shape = false;
    FLCE_RETURN_IF_ERROR(Expect('{'));
    while (true) {
      SkipSpace();
      if (Peek() == '}') break;
      FLCE_ASSIGN_OR_RETURN(std::string key, ParseString());
      FLCE_RETURN_IF_ERROR(Expect(':'));
      if (key == "descr") {
        SkipSpace();
        if (Peek() == '[') {
          return Error("structured dtypes are not supported; expected one of " +
                       std::string(kSupported));
        }
        FLCE_ASSIGN_OR_RETURN(header.descr, ParseString());
        have_descr = true;
      } else if (key == "fortran_order") {
        FLCE_ASSIGN_OR_RETURN(header.fortran_order, ParseBool());
        have_order = true;
      } else if (key == "shape") {
        FLCE_ASSIGN_OR_RETURN(header.shape, ParseShape());
        have_shape = true;
      } else {
        return Error(absl::StrCat("unexpected header key '", key, "'"));
      }
      SkipSpace();
      if (Peek() == ',') {
        ++pos_;
        continue;
      }
      SkipSpace();
      if (Peek() != '}') return Error("expected ',' or '}' in the header");
    }
    ++pos_;  // '}'
    SkipSpace();
    if (pos_ != text_.size()) return Error("trailing characters after the header dict");
    if (!have_descr || !have_order || !have_shape) {
      return Error("the header lacks one of 'descr', 'fortran_order', 'shape'");
    }
    return header;
  }

 private:
  absl::Status Error(const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat("malformed .npy header: ", what));
  }
  void SkipSpace() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  char Peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  absl::Status Expect(char c) {
    SkipSpace();
    if (Peek() != c) return Error(absl::StrCat("expected '", std::string(1, c), "'"));
    ++pos_;
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ParseString() {
    SkipSpace();
    const char quote = Peek();
    if (quote != '\'' && quote != '"') return Error("expected a quoted string");
    const size_t end = text_.find(quote, pos_ + 1);
    if (end == absl::string_view::npos) return Error("unterminated string");
    std::string value(text_.substr(pos_ + 1, end - pos_ - 1));
    pos_ = end + 1;
    return value;
  }
  absl::StatusOr<bool> ParseBool() {
    SkipSpace();
    if (text_.substr(pos_, 4) == "True") {
      pos_ += 4;
      return true;
    }
    if (text_.substr(pos_, 5) == "False") {
      pos_ += 5;
      return false;
    }
    return Error("fortran_order must be True or False");
  }
  absl::StatusOr<std::vector<int64_t>> ParseShape() {
    FLCE_RETURN_IF_ERROR(Expect('('));
    std::vector<int64_t> shape;
    while (true) {
      SkipSpace();
      if (Peek() == ')') break;
      if (!std::isdigit(static_cast<unsigned char>(Peek()))) {
        return Error("shape must be a tuple of non-negative integers");
      }
      int64_t dim = 0;
      while (std::isdigit(static_cast<unsigned char>(Peek()))) {
        if (dim > (std::numeric_limits<int64_t>::max() - 9) / 10) {
          return Error("shape dimension too large");
        }
        dim = dim * 10 + (text_[pos_++] - '0');
      }
      if (Peek() == 'L') ++pos_;  // Python 2 longs in files written long ago
      shape.push_back(dim);
      SkipSpace();
      if (Peek() == ',') {
        ++pos_;
      } else if (Peek() != ')') {
        return Error("expected ',' or ')' in shape");
      }
    }
    ++pos_;  // ')'
    return shape;
  }

  absl::string_view text_;
  size_t pos_ = 0;
};

absl::StatusOr<NpyType> TypeFromDescr(const std::string& descr) {
  for (NpyType type :
       {NpyType::kF32, NpyType::kF16, NpyType::kU16, NpyType::kI32, NpyType::kI64, NpyType::kU8}) {
    if (descr == NpyDescr(type)) return type;
  }
  if (!descr.empty() && descr[0] == '>') {
    return absl::InvalidArgumentError(absl::StrCat("big-endian .npy data ('", descr,
                                                   "') is not supported; save it little-endian ('<",
                                                   descr.substr(1), "')"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(".npy dtype '", descr, "' is not supported; expected one of ", kSupported));
}

absl::StatusOr<int64_t> CheckedElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t dim : shape) {
    if (dim < 0) return absl::InvalidArgumentError("negative dimension in shape");
    if (dim != 0 && n > std::numeric_limits<int64_t>::max() / 16 / dim) {
      return absl::InvalidArgumentError("shape has too many elements");
    }
    n *= dim;
  }
  return n;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  if (shape.size() == 1) return absl::StrCat("(", shape[0], ",)");
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

uint32_t ReadLe(absl::string_view bytes, int width) {
  uint32_t value = 0;
  for (int i = width - 1; i >= 0; --i) {
    value = (value << 8) | static_cast<unsigned char>(bytes[i]);
  }
  return value;
}

void AppendLe(std::string& out, uint32_t value, int width) {
  for (int i = 0; i < width; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

}  // namespace

const char* NpyDescr(NpyType type) {
  switch (type) {
    case NpyType::kF32:
      return "<f4";
    case NpyType::kF16:
      return "<f2";
    case NpyType::kU16:
      return "<u2";
    case NpyType::kI32:
      return "<i4";
    case NpyType::kI64:
      return "<i8";
    case NpyType::kU8:
      return "|u1";
  }
  return "?";
}

int64_t NpyItemSize(NpyType type) {
  switch (type) {
    case NpyType::kF32:
      return 4;
    case NpyType::kF16:
      return 2;
    case NpyType::kU16:
      return 2;
    case NpyType::kI32:
      return 4;
    case NpyType::kI64:
      return 8;
    case NpyType::kU8:
      return 1;
  }
  return 0;
}

int64_t NpyArray::NumElements() const {
  int64_t n = 1;
  for (int64_t dim : shape) n *= dim;
  return n;
}

absl::StatusOr<NpyArray> ParseNpy(absl::string_view bytes) {
  if (bytes.size() < 10 || bytes.substr(0, kMagic.size()) != kMagic) {
    return absl::InvalidArgumentError("not a .npy file (no \\x93NUMPY magic)");
  }
  const int major = static_cast<unsigned char>(bytes[6]);
  const int minor = static_cast<unsigned char>(bytes[7]);
  int len_width;
  if (major == 1) {
    len_width = 2;
  } else if (major == 2) {
    len_width = 4;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(".npy format version ", major, ".", minor,
                                                   " is not supported (1.0 and 2.0 are)"));
  }
  const size_t prefix = 8 + len_width;
  if (bytes.size() < prefix) return absl::InvalidArgumentError("truncated .npy header");
  const uint64_t header_len = ReadLe(bytes.substr(8), len_width);
  if (bytes.size() < prefix + header_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("truncated .npy header: it declares ", header_len, " bytes"));
  }
  FLCE_ASSIGN_OR_RETURN(Header header, HeaderParser(bytes.substr(prefix, header_len)).Parse());
  FLCE_ASSIGN_OR_RETURN(NpyType type, TypeFromDescr(header.descr));
  FLCE_ASSIGN_OR_RETURN(int64_t elements, CheckedElements(header.shape));
  if (header.fortran_order) {
    return absl::InvalidArgumentError(
        "Fortran-order .npy arrays are not supported; save a C-contiguous array "
        "(numpy.ascontiguousarray)");
  }
  const absl::string_view data = bytes.substr(prefix + header_len);
  const int64_t want = elements * NpyItemSize(type);
  if (static_cast<int64_t>(data.size()) != want) {
    return absl::InvalidArgumentError(absl::StrCat(".npy data is ", data.size(),
                                                   " bytes but shape ", ShapeText(header.shape),
                                                   " of '", header.descr, "' needs ", want));
  }
  NpyArray array;
  array.type = type;
  array.shape = std::move(header.shape);
  array.data.assign(data.data(), data.size());
  return array;
}

absl::StatusOr<std::string> SerializeNpy(const NpyArray& array) {
  FLCE_ASSIGN_OR_RETURN(int64_t elements, CheckedElements(array.shape));
  const int64_t want = elements * NpyItemSize(array.type);
  if (static_cast<int64_t>(array.data.size()) != want) {
    return absl::InvalidArgumentError(absl::StrCat("array data is ", array.data.size(),
                                                   " bytes but shape ", ShapeText(array.shape),
                                                   " needs ", want));
  }
  std::string dict =
      absl::StrCat("{'descr': '", NpyDescr(array.type),
                   "', 'fortran_order': False, 'shape': ", ShapeText(array.shape), ", }");
  // The data starts 64-byte aligned (NumPy's own rule); the header ends in '\n'.
  auto padded = [&](int len_width) {
    const size_t unpadded = kMagic.size() + 2 + len_width + dict.size() + 1;
    return dict.size() + 1 + (64 - unpadded % 64) % 64;
  };
  int major = 1, len_width = 2;
  if (padded(2) > 0xffff) {
    major = 2;
    len_width = 4;
  }
  const size_t header_len = padded(len_width);
  std::string out;
  out.reserve(kMagic.size() + 2 + len_width + header_len + array.data.size());
  out.append(kMagic.data(), kMagic.size());
  out.push_back(static_cast<char>(major));
  out.push_back(0);
  AppendLe(out, static_cast<uint32_t>(header_len), len_width);
  out.append(dict);
  out.append(header_len - dict.size() - 1, ' ');
  out.push_back('\n');
  out.append(array.data);
  return out;
}

absl::StatusOr<NpyArray> ReadNpy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("error reading ", path));
  absl::StatusOr<NpyArray> array = ParseNpy(buffer.str());
  if (!array.ok()) {
    return absl::Status(array.status().code(), absl::StrCat(path, ": ", array.status().message()));
  }
  return array;
}

absl::Status WriteNpy(const std::string& path, const NpyArray& array) {
  FLCE_ASSIGN_OR_RETURN(std::string bytes, SerializeNpy(array));
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot write ", path));
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat("error writing ", path));
  return absl::OkStatus();
}

}  // namespace flce
