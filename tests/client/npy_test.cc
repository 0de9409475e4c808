#include "client/cpp/npy.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace flce {
namespace {

std::string Bytes(const void* data, size_t n) {
  return std::string(static_cast<const char*>(data), n);
}

// A header exactly as numpy.save writes it, spelled out by hand: magic,
// version 1.0, little-endian length, the dict, spaces, '\n', data 64-aligned.
std::string NumpyHeader(const std::string& dict, int major = 1) {
  const int len_width = major == 1 ? 2 : 4;
  const size_t unpadded = 6 + 2 + len_width + dict.size() + 1;
  const size_t header_len = dict.size() + 1 + (64 - unpadded % 64) % 64;
  std::string out = "\x93NUMPY";
  out.push_back(static_cast<char>(major));
  out.push_back(0);
  for (int i = 0; i < len_width; ++i)
    out.push_back(static_cast<char>((header_len >> (8 * i)) & 0xff));
  out += dict;
  out.append(header_len - dict.size() - 1, ' ');
  out += '\n';
  return out;
}

TEST(NpyTest, SerializesExactlyLikeNumpy) {
  const float values[6] = {0, 1, 2, 3, 4, 5};
  absl::StatusOr<std::string> bytes =
      SerializeNpy(NpyArray{NpyType::kF32, {2, 3}, Bytes(values, sizeof(values))});
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  // numpy.save(f, np.arange(6, dtype='<f4').reshape(2, 3)), byte for byte.
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  std::string expected = "\x93NUMPY\x01";
  expected.push_back('\0');
  expected += "v";  // header length 118 = 0x76, then 0x00
  expected.push_back('\0');
  expected += dict + std::string(58, ' ') + "\n" + Bytes(values, sizeof(values));
  EXPECT_EQ(*bytes, expected);
  EXPECT_EQ((bytes->size() - sizeof(values)) % 64, 0u);
}

TEST(NpyTest, RoundTripsEveryTypeAndShape) {
  struct Case {
    NpyType type;
    std::vector<int64_t> shape;
  };
  const Case cases[] = {{NpyType::kF32, {3, 5}},    {NpyType::kF16, {7}},
                        {NpyType::kU16, {2, 3, 4}}, {NpyType::kI32, {1}},
                        {NpyType::kI64, {4, 1}},    {NpyType::kU8, {9}},
                        {NpyType::kF32, {}},        {NpyType::kF32, {0, 4}}};
  for (const Case& c : cases) {
    NpyArray array{c.type, c.shape, {}};
    const int64_t n = array.NumElements() * NpyItemSize(c.type);
    for (int64_t i = 0; i < n; ++i) array.data.push_back(static_cast<char>(i * 37 + 11));
    absl::StatusOr<std::string> bytes = SerializeNpy(array);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    absl::StatusOr<NpyArray> back = ParseNpy(*bytes);
    ASSERT_TRUE(back.ok()) << NpyDescr(c.type) << ": " << back.status();
    EXPECT_EQ(back->type, c.type);
    EXPECT_EQ(back->shape, c.shape);
    EXPECT_EQ(back->data, array.data) << NpyDescr(c.type);
  }
}

TEST(NpyTest, ReadsVersion2AndDoubleQuotesAndPython2Longs) {
  const int64_t values[2] = {-7, 1LL << 40};
  const std::string file =
      NumpyHeader("{\"descr\": \"<i8\", \"shape\": (2L,), \"fortran_order\": False}", 2) +
      Bytes(values, sizeof(values));
  absl::StatusOr<NpyArray> array = ParseNpy(file);
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(array->type, NpyType::kI64);
  EXPECT_EQ(array->shape, std::vector<int64_t>{2});
  int64_t back[2];
  std::memcpy(back, array->data.data(), sizeof(back));
  EXPECT_EQ(back[0], -7);
  EXPECT_EQ(back[1], 1LL << 40);
}

TEST(NpyTest, WritesAndReadsFiles) {
  char dir_template[] = "/tmp/flce_npy_test_XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string path = std::string(dir_template) + "/a.npy";
  const int32_t values[3] = {1, -100, 31999};
  ASSERT_TRUE(WriteNpy(path, NpyArray{NpyType::kI32, {3}, Bytes(values, sizeof(values))}).ok());
  absl::StatusOr<NpyArray> back = ReadNpy(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->data, Bytes(values, sizeof(values)));
  std::remove(path.c_str());
  rmdir(dir_template);

  absl::StatusOr<NpyArray> missing = ReadNpy(std::string(dir_template) + "/none.npy");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

TEST(NpyTest, SerializeRejectsDataThatDoesNotMatchTheShape) {
  absl::StatusOr<std::string> bytes = SerializeNpy(NpyArray{NpyType::kF32, {2, 2}, "abc"});
  EXPECT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument);
}

struct Malformed {
  const char* name;
  std::string bytes;
  const char* message_part;  // the error must say what is wrong
};

// Names the case in test listings instead of dumping the struct's bytes.
void PrintTo(const Malformed& malformed, std::ostream* os) { *os << malformed.name; }

class NpyMalformedTest : public ::testing::TestWithParam<Malformed> {};

TEST_P(NpyMalformedTest, IsInvalidArgumentNamingTheProblem) {
  absl::StatusOr<NpyArray> array = ParseNpy(GetParam().bytes);
  ASSERT_FALSE(array.ok()) << GetParam().name;
  EXPECT_EQ(array.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(array.status().message().find(GetParam().message_part), absl::string_view::npos)
      << array.status();
}

const std::string kFour(16, '\0');  // data of a (2, 2) '<f4' array

INSTANTIATE_TEST_SUITE_P(
    Files, NpyMalformedTest,
    ::testing::Values(
        Malformed{"magic", "NUMPY\x01\x00\x10\x00{}", "magic"}, Malformed{"empty", "", "magic"},
        Malformed{
            "version3",
            NumpyHeader("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }", 3) + kFour,
            "version 3"},
        Malformed{"truncated header",
                  NumpyHeader("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }")
                      .substr(0, 40),
                  "truncated"},
        Malformed{"fortran",
                  NumpyHeader("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }") + kFour,
                  "Fortran"},
        Malformed{
            "big endian",
            NumpyHeader("{'descr': '>f4', 'fortran_order': False, 'shape': (2, 2), }") + kFour,
            "big-endian"},
        Malformed{
            "float64",
            NumpyHeader("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 1), }") + kFour,
            "'<f8' is not supported"},
        Malformed{"structured",
                  NumpyHeader("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), "
                              "}") +
                      kFour,
                  "structured"},
        Malformed{"short data",
                  NumpyHeader("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }") +
                      kFour.substr(4),
                  "needs 16"},
        Malformed{"long data",
                  NumpyHeader("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }") +
                      kFour + "x",
                  "needs 16"},
        Malformed{"missing shape", NumpyHeader("{'descr': '<f4', 'fortran_order': False, }"),
                  "lacks"},
        Malformed{"negative dim",
                  NumpyHeader("{'descr': '<f4', 'fortran_order': False, 'shape': (-2, 2), }"),
                  "non-negative"},
        Malformed{"extra key",
                  NumpyHeader("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}"),
                  "unexpected header key"}),
    [](const ::testing::TestParamInfo<Malformed>& info) {
      std::string name = info.param.name;
      for (char& c : name) {
        if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
      }
      return name;
    });

}  // namespace
}  // namespace flce
