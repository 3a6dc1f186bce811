// QuoteForMessage / EscapeForMessage: text from a file in an error message stays on one
// line and cannot drive the terminal, while UTF-8 text stays readable.
#include "pipesched/base/strings.h"

#include <limits>
#include <string>

#include "gtest/gtest.h"

namespace pipesched {
namespace {

TEST(QuoteForMessageTest, EscapesWhatCouldBreakTheLineOrTheTerminal) {
  EXPECT_EQ(QuoteForMessage("0B0\r1F0"), "\"0B0\\r1F0\"");
  EXPECT_EQ(QuoteForMessage("a\"b\\c\td\n"), "\"a\\\"b\\\\c\\td\\n\"");
  EXPECT_EQ(QuoteForMessage(std::string("x\0y", 3)), "\"x\\x00y\"");
  EXPECT_EQ(QuoteForMessage("\x7f"), "\"\\x7f\"");
  EXPECT_EQ(EscapeForMessage("a\"b"), "a\"b");
}

TEST(QuoteForMessageTest, HighBytesPassOnlyAsWellFormedUtf8WithoutC1Controls) {
  // UTF-8 text stays readable: e, a CJK character, an emoji.
  EXPECT_EQ(QuoteForMessage("caf\xc3\xa9 \xe4\xb8\xad \xf0\x9f\x99\x82"),
            "\"caf\xc3\xa9 \xe4\xb8\xad \xf0\x9f\x99\x82\"");
  // A lone 0x9B is an 8-bit CSI to some terminals; binary junk; U+009B in UTF-8.
  EXPECT_EQ(QuoteForMessage("a\x9b[2Jb"), "\"a\\x9b[2Jb\"");
  EXPECT_EQ(QuoteForMessage("\xff\xfe"), "\"\\xff\\xfe\"");
  EXPECT_EQ(QuoteForMessage("\xc2\x9b"), "\"\\xc2\\x9b\"");
  // Overlong and surrogate encodings, and a sequence cut short, are not UTF-8.
  EXPECT_EQ(QuoteForMessage("\xc0\xaf"), "\"\\xc0\\xaf\"");
  EXPECT_EQ(QuoteForMessage("\xed\xa0\x80"), "\"\\xed\\xa0\\x80\"");
  EXPECT_EQ(QuoteForMessage("\xe4\xb8"), "\"\\xe4\\xb8\"");
  // What prints as a blank or as nothing is escaped, so that the message shows it: a
  // no-break space, a zero-width space, a byte-order mark; an ordinary space is not.
  EXPECT_EQ(QuoteForMessage("\xc2\xa0"
                            "0F1"),
            "\"\\xc2\\xa00F1\"");
  EXPECT_EQ(QuoteForMessage("a\xe2\x80\x8b"
                            "b"),
            "\"a\\xe2\\x80\\x8bb\"");
  EXPECT_EQ(QuoteForMessage("\xef\xbb\xbf"
                            "x"),
            "\"\\xef\\xbb\\xbfx\"");
  EXPECT_EQ(QuoteForMessage("a b"), "\"a b\"");
  // Cut at the limit inside a character: the partial bytes are escaped, then "...".
  EXPECT_EQ(QuoteForMessage("ab\xe4\xb8\xad", 3), "\"ab\\xe4...\"");
}

// What a terminal could take as a command: C0, DEL and C1 (raw or encoded); UTF-8 text
// and other bytes that are not UTF-8 (a Latin-1 file name) are not.
TEST(FindControlByteTest, FindsC0DelAndC1Only) {
  EXPECT_EQ(FindControlByte("1f1b,zb-h1"), std::string_view::npos);
  EXPECT_EQ(FindControlByte("a\nb"), 1u);
  EXPECT_EQ(FindControlByte("ab\x7f"), 2u);
  EXPECT_EQ(FindControlByte("a\x9b[2J"), 1u);       // a raw 8-bit CSI
  EXPECT_EQ(FindControlByte("ok\xc2\x9b[2J"), 2u);  // U+009B in UTF-8
  EXPECT_EQ(FindControlByte("caf\xc3\xa9 \xe4\xb8\xad"), std::string_view::npos);
  EXPECT_EQ(FindControlByte("\xe9t\xe9.csv"), std::string_view::npos);  // Latin-1 "ete"
  EXPECT_EQ(FindControlByte("\xc2\xa0x"), std::string_view::npos);      // a no-break space
}

// As many digits as read back to the same double: what a message quotes of a user's number.
TEST(ShortestNumberTest, ReadsBackAsTheSameDouble) {
  EXPECT_EQ(ShortestNumber(2), "2");
  EXPECT_EQ(ShortestNumber(0.1), "0.1");
  EXPECT_EQ(ShortestNumber(65536.001), "65536.001");
  EXPECT_EQ(ShortestNumber(1.0000001e15), "1.0000001e+15");
  EXPECT_EQ(ShortestNumber(-1), "-1");
  EXPECT_EQ(ShortestNumber(std::numeric_limits<double>::infinity()), "inf");
}

}  // namespace
}  // namespace pipesched
