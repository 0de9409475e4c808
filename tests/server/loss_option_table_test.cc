// core's table of loss options against the wire's message: every field of
// flce.v1.LossOptions has its row, an unset field keeps core's default, and
// the ranges refuse what lies outside them, naming the option.
#include <cmath>
#include <limits>
#include <set>
#include <string>

#include "core/compute_options.h"
#include "core/loss_option_checks.h"
#include "flce/v1/convert.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flce {
namespace {

using ::testing::HasSubstr;

TEST(LossOptionTableTest, EveryWireFieldHasARowAndEveryRowAFloatField) {
  const google::protobuf::Descriptor* wire = v1::LossOptions::descriptor();
  std::set<std::string> rows;
  for (const LossOptionField& field : kLossOptionFields) {
    EXPECT_TRUE(rows.insert(field.name).second) << field.name << " has two rows";
    const google::protobuf::FieldDescriptor* fd = wire->FindFieldByName(field.name);
    ASSERT_NE(fd, nullptr) << field.name << " is not a field of flce.v1.LossOptions";
    EXPECT_EQ(fd->cpp_type(), google::protobuf::FieldDescriptor::CPPTYPE_FLOAT) << field.name;
  }
  for (int i = 0; i < wire->field_count(); ++i) {
    EXPECT_EQ(rows.count(wire->field(i)->name()), 1u)
        << "flce.v1.LossOptions." << wire->field(i)->name() << " has no row in kLossOptionFields";
  }
  // Each member of the struct once (a row pointing at another's member would
  // leave one option unread).
  for (const LossOptionField& a : kLossOptionFields) {
    for (const LossOptionField& b : kLossOptionFields) {
      if (&a != &b) EXPECT_NE(a.member, b.member) << a.name << " and " << b.name;
    }
  }
}

TEST(LossOptionTableTest, UnsetFieldsKeepCoresDefaultsAndSetOnesArrive) {
  absl::StatusOr<LossOptions> none = LossOptionsFromProto(v1::LossOptions());
  ASSERT_TRUE(none.ok()) << none.status();
  const LossOptions defaults;
  for (const LossOptionField& field : kLossOptionFields) {
    EXPECT_EQ((*none).*field.member, defaults.*field.member) << field.name;
  }
  EXPECT_EQ(none->temperature, 1.0f);  // an optional field left unset is not 0
  EXPECT_EQ(none->grad_scale, 1.0f);

  v1::LossOptions wire;
  float value = 0.25f;
  for (const LossOptionField& field : kLossOptionFields) {
    ASSERT_TRUE(SetLossOption(field, value, &wire).ok()) << field.name;
    value += 0.125f;
  }
  EXPECT_EQ(wire.label_smoothing(), 0.25f);
  EXPECT_EQ(wire.grad_scale(), 0.75f);
  absl::StatusOr<LossOptions> got = LossOptionsFromProto(wire);
  ASSERT_TRUE(got.ok()) << got.status();
  value = 0.25f;
  for (const LossOptionField& field : kLossOptionFields) {
    EXPECT_EQ((*got).*field.member, value) << field.name;
    value += 0.125f;
  }
}

TEST(LossOptionTableTest, EachRangeAcceptsItsEndsAndRefusesBeyondThemNamingTheOption) {
  EXPECT_TRUE(CheckLossOptions(LossOptions()).ok());
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const LossOptionField& field : kLossOptionFields) {
    for (float accepted : {field.lo, field.hi}) {
      LossOptions o;
      o.*field.member = accepted;
      EXPECT_TRUE(CheckLossOptions(o).ok()) << field.name << " = " << accepted;
    }
    for (float refused : {std::nextafter(field.lo, -inf), std::nextafter(field.hi, inf), nan, inf,
                          -inf}) {
      if (field.zero_is_off && refused == 0.0f) continue;
      LossOptions o;
      o.*field.member = refused;
      absl::Status s = CheckLossOptions(o);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field.name << " = " << refused;
      EXPECT_THAT(std::string(s.message()),
                  HasSubstr(std::string("options.") + field.name + " = "));
    }
    LossOptions zero;
    zero.*field.member = 0.0f;
    const bool zero_in_range = field.lo <= 0.0f && 0.0f <= field.hi;
    EXPECT_EQ(CheckLossOptions(zero).ok(), field.zero_is_off || zero_in_range) << field.name;
  }
  LossOptions capped;
  capped.softcap = 1e-4f;  // below the cap's range, and not 0
  EXPECT_THAT(std::string(CheckLossOptions(capped).message()),
              HasSubstr("options.softcap = 0.0001 is outside [0.001, 1e+06] or 0 (off)"));
}

// The kinds the CUDA plans choose by: a logit transform takes the plain-logits
// GEMM away, a row term the row-scaled backward; the z-loss and grad_scale
// leave both.
TEST(LossOptionTableTest, KindsSayWhichFastPathsServeACall) {
  LossOptions o;
  EXPECT_TRUE(PlainLogits(o));
  EXPECT_TRUE(DlogitsScalePerRow(o));
  o.z_loss_scale = 1e-3f;
  o.grad_scale = 0.5f;
  EXPECT_TRUE(PlainLogits(o));
  EXPECT_TRUE(DlogitsScalePerRow(o));
  EXPECT_EQ(FirstOptionOfKindOn(o, LossOptionKind::kRowScale)->name, std::string("z_loss_scale"));
  EXPECT_EQ(FirstOptionOfKindOn(o, LossOptionKind::kRowTerm), nullptr);
  for (float LossOptions::*transform : {&LossOptions::softcap, &LossOptions::temperature}) {
    LossOptions t;
    t.*transform = 2.0f;
    EXPECT_FALSE(PlainLogits(t));
    EXPECT_FALSE(DlogitsScalePerRow(t));
  }
  LossOptions smoothed;
  smoothed.label_smoothing = 0.1f;
  EXPECT_TRUE(PlainLogits(smoothed));
  EXPECT_FALSE(DlogitsScalePerRow(smoothed));
  // Every row has a kind the plans know (a new kind would need their choice).
  for (const LossOptionField& field : kLossOptionFields) {
    EXPECT_TRUE(field.kind == LossOptionKind::kLogitTransform ||
                field.kind == LossOptionKind::kGradientScale ||
                field.kind == LossOptionKind::kRowScale || field.kind == LossOptionKind::kRowTerm)
        << field.name;
  }
}

}  // namespace
}  // namespace flce
