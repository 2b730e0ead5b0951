// The umbrella header compiles on its own and exposes every layer's entry points.
#include "kolo/kolo.h"

#include <gtest/gtest.h>

namespace kolo {
namespace {

TEST(Umbrella, ExposesEveryLayer) {
  Generator gen(0);
  auto model = nn::makeModel("mlp", gen);
  EXPECT_EQ(model->namedParameters().size(), 6u);
  auto comm = comm::initFromEnvironment();
  EXPECT_EQ(comm->size(), 1);
  EXPECT_EQ(comm->rank(), 0);
}

}  // namespace
}  // namespace kolo
