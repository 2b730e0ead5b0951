// parseByteSize, the one parser of sizes a user types (`--memory-limit`, `kolo bench`'s
// sweeps): whole and decimal numbers, binary suffixes in any case, refusals that name the text.
#include <gtest/gtest.h>

#include "kolo/byte_size.h"
#include "kolo/error.h"

namespace kolo {
namespace {

TEST(ByteSize, ParsesWholeNumbersWithBinarySuffixes) {
  EXPECT_EQ(parseByteSize("4096"), 4096u);
  EXPECT_EQ(parseByteSize("0"), 0u);
  EXPECT_EQ(parseByteSize("4K"), 4096u);
  EXPECT_EQ(parseByteSize("4k"), 4096u);
  EXPECT_EQ(parseByteSize("1M"), 1048576u);
  EXPECT_EQ(parseByteSize("64MiB"), 64u << 20);
  EXPECT_EQ(parseByteSize("2G"), size_t{2} << 30);
  EXPECT_EQ(parseByteSize("16KB"), 16384u);
  EXPECT_EQ(parseByteSize("100B"), 100u);
}

TEST(ByteSize, ParsesDecimalsRoundedDownToWholeBytes) {
  EXPECT_EQ(parseByteSize("1.5G"), size_t{3} << 29);
  EXPECT_EQ(parseByteSize("0.5K"), 512u);
  EXPECT_EQ(parseByteSize("1.0001K"), 1024u);
}

TEST(ByteSize, RefusesWhatIsNotASizeNamingTheText) {
  for (const char* text : {"", "K", "4X", "12Q", "lots", "-1M", "+4K", "1.K", ".5K", "4 K", "4IB", "4KBB"}) {
    try {
      parseByteSize(text);
      ADD_FAILURE() << "accepted '" << text << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("size '") + text + "' is not accepted"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_THROW(parseByteSize("99999999999999999999999"), InvalidArgument);
  EXPECT_THROW(parseByteSize("99999999999999G"), InvalidArgument);
}

}  // namespace
}  // namespace kolo
