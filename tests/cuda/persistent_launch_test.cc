// The launch shape shared by the persistent Hopper kernels: whole clusters,
// no more CTAs than units of work or than the SMs hold, and the launch
// attributes each kernel asks for. Host logic, runs everywhere.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "gtest/gtest.h"
#include "kernels/cuda/base/sm90_support.h"

namespace flce::test {
namespace {

using cuda::sm90::PersistentLaunch;
using cuda::sm90::SmCount;

bool HasAttribute(const cudaLaunchConfig_t& c, cudaLaunchAttributeID id) {
  for (unsigned i = 0; i < c.numAttrs; ++i) {
    if (c.attrs[i].id == id) return true;
  }
  return false;
}

TEST(PersistentLaunchTest, WholeClustersNoMoreThanUnitsOrSms) {
  const int64_t sms = std::max(SmCount(), 1);
  for (int cluster : {1, 2}) {
    for (int64_t units : {int64_t{1}, int64_t{3}, int64_t{65}, int64_t{100000}}) {
      SCOPED_TRACE(::testing::Message() << "cluster " << cluster << " units " << units);
      PersistentLaunch launch(units, cluster, 384, 200 * 1024, nullptr);
      const cudaLaunchConfig_t& c = *launch.config();
      const int64_t grid = c.gridDim.x;
      EXPECT_EQ(grid % cluster, 0);
      EXPECT_GE(grid, cluster);
      EXPECT_LE(grid, units * cluster);
      EXPECT_LE(grid, std::max<int64_t>(sms / cluster, 1) * cluster);
      if (units >= sms) EXPECT_EQ(grid, std::max<int64_t>(sms / cluster, 1) * cluster);
      EXPECT_EQ(c.blockDim.x, 384u);
      EXPECT_EQ(c.dynamicSmemBytes, size_t{200 * 1024});
      EXPECT_EQ(HasAttribute(c, cudaLaunchAttributeClusterDimension), cluster > 1);
      EXPECT_FALSE(HasAttribute(c, cudaLaunchAttributeProgrammaticStreamSerialization));
    }
  }
}

TEST(PersistentLaunchTest, BesideThePreviousKernelKeepsTheCluster) {
  PersistentLaunch launch(1000, 2, 384, 1024, nullptr);
  launch.StartBesidePrevious();
  const cudaLaunchConfig_t& c = *launch.config();
  ASSERT_EQ(c.numAttrs, 2u);
  EXPECT_TRUE(HasAttribute(c, cudaLaunchAttributeClusterDimension));
  EXPECT_TRUE(HasAttribute(c, cudaLaunchAttributeProgrammaticStreamSerialization));
  for (unsigned i = 0; i < c.numAttrs; ++i) {
    if (c.attrs[i].id == cudaLaunchAttributeClusterDimension) {
      EXPECT_EQ(c.attrs[i].val.clusterDim.x, 2u);
      EXPECT_EQ(c.attrs[i].val.clusterDim.y, 1u);
    }
  }
}

}  // namespace
}  // namespace flce::test
