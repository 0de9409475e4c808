#include "client/cli/tensor_files.h"

#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "client/cpp/npy.h"
#include "core/dtype.h"
#include "gtest/gtest.h"

namespace flce::cli {
namespace {

class TensorFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/flce_tensor_files_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
  }
  void TearDown() override {
    for (const std::string& path : written_) std::remove(path.c_str());
    rmdir(dir_.c_str());
  }
  std::string Write(const std::string& name, NpyType type, std::vector<int64_t> shape,
                    const void* data, size_t bytes) {
    const std::string path = dir_ + "/" + name;
    EXPECT_TRUE(WriteNpy(path, NpyArray{type, std::move(shape),
                                        std::string(static_cast<const char*>(data), bytes)})
                    .ok());
    written_.push_back(path);
    return path;
  }

  std::string dir_;
  std::vector<std::string> written_;
};

TEST_F(TensorFilesTest, KeepsTheFilesDtypeByDefault) {
  const float values[4] = {1.0f, -2.5f, 3.25f, 0.0f};
  const std::string path = Write("f.npy", NpyType::kF32, {2, 2}, values, sizeof(values));
  absl::StatusOr<WireTensor> tensor = ReadFloatTensor(path, "");
  ASSERT_TRUE(tensor.ok()) << tensor.status();
  EXPECT_EQ(tensor->dtype, v1::DTYPE_FP32);
  EXPECT_EQ(tensor->shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(tensor->bytes, std::string(reinterpret_cast<const char*>(values), sizeof(values)));
}

TEST_F(TensorFilesTest, ConvertsFp32ToBf16RoundingToNearestEven) {
  const float values[3] = {1.0f, 1.00390625f /* halfway: rounds to even, 1.0 */, -3.0f};
  const std::string path = Write("f.npy", NpyType::kF32, {3}, values, sizeof(values));
  absl::StatusOr<WireTensor> tensor = ReadFloatTensor(path, "bf16");
  ASSERT_TRUE(tensor.ok()) << tensor.status();
  EXPECT_EQ(tensor->dtype, v1::DTYPE_BF16);
  ASSERT_EQ(tensor->bytes.size(), 6u);
  uint16_t bits[3];
  std::memcpy(bits, tensor->bytes.data(), 6);
  EXPECT_EQ(bits[0], 0x3f80);
  EXPECT_EQ(bits[1], 0x3f80);
  EXPECT_EQ(bits[2], 0xc040);
}

TEST_F(TensorFilesTest, Uint16IsBf16OnlyWhenSaidSo) {
  const uint16_t bits[2] = {0x3f80, 0x4000};
  const std::string path = Write("b.npy", NpyType::kU16, {2}, bits, sizeof(bits));
  absl::StatusOr<WireTensor> without = ReadFloatTensor(path, "");
  EXPECT_EQ(without.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(without.status().message().find("--dtype bf16"), absl::string_view::npos);
  EXPECT_FALSE(ReadFloatTensor(path, "fp32").ok());
  absl::StatusOr<WireTensor> with = ReadFloatTensor(path, "bf16");
  ASSERT_TRUE(with.ok()) << with.status();
  EXPECT_EQ(with->dtype, v1::DTYPE_BF16);
  EXPECT_EQ(with->bytes, std::string(reinterpret_cast<const char*>(bits), sizeof(bits)));
}

TEST_F(TensorFilesTest, RejectsIntegerHidden) {
  const int32_t values[2] = {1, 2};
  const std::string path = Write("i.npy", NpyType::kI32, {2}, values, sizeof(values));
  EXPECT_EQ(ReadFloatTensor(path, "").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(TensorFilesTest, ReadsInt32AndInt64Targets) {
  const int64_t wide[3] = {5, -100, 31999};
  const int32_t narrow[3] = {5, -100, 31999};
  for (const std::string& path :
       {Write("t64.npy", NpyType::kI64, {3}, wide, sizeof(wide)),
        Write("t32.npy", NpyType::kI32, {1, 3}, narrow, sizeof(narrow))}) {
    absl::StatusOr<Targets> targets = ReadTargets(path);
    ASSERT_TRUE(targets.ok()) << targets.status();
    EXPECT_EQ(targets->values, (std::vector<int32_t>{5, -100, 31999}));
  }
}

TEST_F(TensorFilesTest, RejectsTargetsOutsideInt32AndFloatTargets) {
  const int64_t wide[2] = {1, int64_t{1} << 33};
  absl::StatusOr<Targets> targets =
      ReadTargets(Write("t.npy", NpyType::kI64, {2}, wide, sizeof(wide)));
  EXPECT_EQ(targets.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(targets.status().message().find("targets[1]"), absl::string_view::npos);
  const float f[1] = {1.0f};
  EXPECT_FALSE(ReadTargets(Write("f.npy", NpyType::kF32, {1}, f, sizeof(f))).ok());
}

TEST_F(TensorFilesTest, WritesBf16AsUint16) {
  const std::string path = dir_ + "/g.npy";
  written_.push_back(path);
  ASSERT_TRUE(WriteWireTensor(path, WireTensor{v1::DTYPE_BF16, {1, 2}, "abcd"}).ok());
  absl::StatusOr<NpyArray> back = ReadNpy(path);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->type, NpyType::kU16);
  EXPECT_EQ(back->data, "abcd");
}

}  // namespace
}  // namespace flce::cli
