#include "cli/json_writer.h"

#include <gtest/gtest.h>

#include <string>

namespace siphon::cli {
namespace {

TEST(JsonString, PlainAsciiIsQuoted) { EXPECT_EQ(jsonString("hello world"), "\"hello world\""); }

TEST(JsonString, EmptyString) { EXPECT_EQ(jsonString(""), "\"\""); }

TEST(JsonString, QuoteAndBackslashAreEscaped) {
  EXPECT_EQ(jsonString(R"(say "hi" C:\dir)"), R"("say \"hi\" C:\\dir")");
}

TEST(JsonString, SlashIsNotEscaped) { EXPECT_EQ(jsonString("a/b"), "\"a/b\""); }

TEST(JsonString, ShortEscapesForCommonControls) {
  EXPECT_EQ(jsonString("a\nb\tc\rd\be\ff"), R"("a\nb\tc\rd\be\ff")");
}

TEST(JsonString, OtherControlCharsAsUnicodeEscapes) {
  EXPECT_EQ(jsonString(std::string("\x01\x1f", 2)), R"("\u0001\u001f")");
  EXPECT_EQ(jsonString("\x1b[31m"), R"("\u001b[31m")");
  EXPECT_EQ(jsonString("\x7f"), R"("\u007f")");
}

TEST(JsonString, NulByteIsEscapedNotTruncated) {
  EXPECT_EQ(jsonString(std::string("a\0b", 3)), R"("a\u0000b")");
}

TEST(JsonString, Utf8PassesThrough) {
  // 2-, 3- and 4-byte sequences: é, €, 😀.
  const std::string s = "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80";
  EXPECT_EQ(jsonString(s), "\"" + s + "\"");
  // U+2028 is legal in JSON strings and passes through too.
  EXPECT_EQ(jsonString("\xE2\x80\xA8"), "\"\xE2\x80\xA8\"");
}

TEST(JsonString, InvalidUtf8BecomesReplacementCharacter) {
  const std::string kFffd = "\xEF\xBF\xBD";
  EXPECT_EQ(jsonString("a\xFF"
                       "b"),
            "\"a" + kFffd + "b\"");                                            // never valid
  EXPECT_EQ(jsonString("\x80"), "\"" + kFffd + "\"");                          // lone continuation
  EXPECT_EQ(jsonString("\xC0\xAF"), "\"" + kFffd + kFffd + "\"");              // overlong '/'
  EXPECT_EQ(jsonString("\xED\xA0\x80"), "\"" + kFffd + kFffd + kFffd + "\"");  // surrogate
  EXPECT_EQ(jsonString("\xF4\x90\x80\x80"),
            "\"" + kFffd + kFffd + kFffd + kFffd + "\"");            // above U+10FFFF
  EXPECT_EQ(jsonString("x\xE2\x82"), "\"x" + kFffd + kFffd + "\"");  // truncated at the end
}

TEST(JsonWriter, EmptyObject) {
  JsonWriter w;
  w.beginObject().endObject();
  EXPECT_EQ(w.take(), "{}\n");
}

TEST(JsonWriter, NestedDocumentIsIndented) {
  JsonWriter w;
  w.beginObject();
  w.key("name").value("x\"y");
  w.key("n").value(int64_t{-3});
  w.key("big").value(uint64_t{18446744073709551615ull});
  w.key("ok").value(true);
  w.key("inner").beginObject().key("a").value(uint32_t{1}).endObject();
  w.key("list").beginArray().value("p").value("q").endArray();
  w.key("none").beginArray().endArray();
  w.endObject();
  EXPECT_EQ(w.take(),
            "{\n"
            "  \"name\": \"x\\\"y\",\n"
            "  \"n\": -3,\n"
            "  \"big\": 18446744073709551615,\n"
            "  \"ok\": true,\n"
            "  \"inner\": {\n"
            "    \"a\": 1\n"
            "  },\n"
            "  \"list\": [\n"
            "    \"p\",\n"
            "    \"q\"\n"
            "  ],\n"
            "  \"none\": []\n"
            "}\n");
}

TEST(JsonWriter, KeysAreEscapedToo) {
  JsonWriter w;
  w.beginObject().key("a\nb").value("v").endObject();
  EXPECT_EQ(w.take(), "{\n  \"a\\nb\": \"v\"\n}\n");
}

TEST(JsonWriterDeathTest, ValueWithoutKeyAborts) {
  EXPECT_DEATH(
      {
        JsonWriter w;
        w.beginObject().value("v");
      },
      "without key");
}

TEST(JsonWriterDeathTest, TakeBeforeCloseAborts) {
  EXPECT_DEATH(
      {
        JsonWriter w;
        w.beginObject();
        (void)w.take();
      },
      "before the document is complete");
}

}  // namespace
}  // namespace siphon::cli
