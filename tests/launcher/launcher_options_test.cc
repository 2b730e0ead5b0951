// What the launcher library reads from kolo run's words without starting anything: the node
// range of --nnodes, and the ranks each node of a parameter-server job runs.
#include <gtest/gtest.h>

#include <string>

#include "kolo/error.h"
#include "launch/launcher.h"

namespace kolo::parallel {
namespace {

std::string refusal(const std::string& text, bool elastic) {
  LauncherOptions options;
  options.elastic = elastic;
  try {
    parseNodeRange(text, options);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(LauncherOptionsTest, NodesAreACountOrAnElasticRange) {
  LauncherOptions options;
  parseNodeRange("3", options);
  EXPECT_EQ(options.nnodes, 3);
  EXPECT_EQ(options.maxNodes, 0);
  options.elastic = true;
  parseNodeRange("2:4", options);
  EXPECT_EQ(options.nnodes, 2);
  EXPECT_EQ(options.maxNodes, 4);
  for (const char* bad : {"0", "x", "2:", ":3", "1.5", "2:y", "-1"})
    EXPECT_NE(refusal(bad, true).find(std::string("--nnodes ") + bad + " is not M or MIN:MAX"), std::string::npos)
        << bad;
  EXPECT_NE(refusal("1:2", false).find("--nnodes 1:2: MIN:MAX needs --elastic"), std::string::npos);
  EXPECT_NE(refusal("3:2", true).find("MAX at least MIN"), std::string::npos);
}

TEST(LauncherOptionsTest, AParameterServerJobsRanksSpreadOverTheNodesInBlocks) {
  // 2 servers, the chief and 4 workers over 3 nodes: blocks of 3, 2 and 2.
  EXPECT_EQ(psNodeRanks(7, 3, 0).first, 0);
  EXPECT_EQ(psNodeRanks(7, 3, 0).count, 3);
  EXPECT_EQ(psNodeRanks(7, 3, 1).first, 3);
  EXPECT_EQ(psNodeRanks(7, 3, 2).first, 5);
  EXPECT_EQ(psNodeRanks(7, 3, 2).count, 2);
}

}  // namespace
}  // namespace kolo::parallel
