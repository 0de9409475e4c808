#include "client/cli/progress.h"

#include <sstream>

#include "gtest/gtest.h"

namespace flce::cli {
namespace {

TEST(ProgressTest, DisabledWritesNothing) {
  std::ostringstream err;
  {
    Progress progress(false, err, "upload");
    progress.Update(5, 10);
    progress.Update(10, 10);
  }
  EXPECT_EQ(err.str(), "");
}

TEST(ProgressTest, EnabledRedrawsOneLineAndEndsIt) {
  std::ostringstream err;
  {
    Progress progress(true, err, "upload h1");
    progress.Update(0, 4 << 20);
    progress.Update(4 << 20, 4 << 20);  // the last update always draws
  }
  const std::string text = err.str();
  EXPECT_EQ(text.front(), '\r');
  EXPECT_NE(text.find("upload h1: 100.0% (4.0 / 4.0 MiB"), std::string::npos) << text;
  EXPECT_EQ(text.back(), '\n');
  EXPECT_EQ(text.find('\n'), text.size() - 1) << "one line, redrawn in place";
}

TEST(ProgressTest, CountsStepsWithoutSizes) {
  std::ostringstream err;
  {
    Progress progress(true, err, "bench");
    progress.Update(3, 3, "steps");
  }
  EXPECT_NE(err.str().find("bench: 3 / 3 steps"), std::string::npos) << err.str();
}

}  // namespace
}  // namespace flce::cli
