#include "util/json_reader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

namespace gpuprof {
namespace {

using Type = JsonReader::Type;
using ::testing::HasSubstr;

// Whether the reader takes `text` as one whole JSON value.
bool Accepts(const std::string& text) {
  JsonReader r(text);
  return r.Skip() && r.End();
}

std::string Str(const std::string& json_text) {
  JsonReader r(json_text);
  std::string out;
  EXPECT_TRUE(r.String(&out)) << r.error();
  EXPECT_TRUE(r.End()) << r.error();
  return out;
}

TEST(JsonReaderTest, WalksNestedObjectsAndArraysInOrder) {
  // GIVEN an object holding a string, a list of numbers, a nested object and literals
  JsonReader r(R"( {"name": "a", "xs": [1, -2.5, 3e2], "in": {"ok": true, "no": null}, "e": []} )");
  ASSERT_TRUE(r.EnterObject());
  std::string key, name;
  std::vector<double> xs;
  bool ok = false;
  bool saw_null = false;
  size_t empty_items = 0;
  // WHEN it is walked with the reader
  while (r.NextKey(&key)) {
    if (key == "name") {
      ASSERT_TRUE(r.String(&name));
    } else if (key == "xs") {
      ASSERT_TRUE(r.EnterArray());
      while (r.NextItem()) {
        JsonReader::Number n;
        ASSERT_TRUE(r.Num(&n));
        xs.push_back(n.real);
      }
    } else if (key == "in") {
      ASSERT_TRUE(r.EnterObject());
      while (r.NextKey(&key)) {
        Type t{};
        ASSERT_TRUE(r.Peek(&t));
        if (t == Type::kBool) {
          ASSERT_TRUE(r.Bool(&ok));
        } else {
          ASSERT_EQ(t, Type::kNull);
          ASSERT_TRUE(r.Null());
          saw_null = true;
        }
      }
    } else {
      ASSERT_TRUE(r.EnterArray());
      while (r.NextItem()) ++empty_items;
    }
  }
  // THEN every value is read, and nothing is left but whitespace
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_TRUE(r.End());
  EXPECT_EQ(name, "a");
  EXPECT_EQ(xs, (std::vector<double>{1, -2.5, 300}));
  EXPECT_TRUE(ok);
  EXPECT_TRUE(saw_null);
  EXPECT_EQ(empty_items, 0u);
}

TEST(JsonReaderTest, NumbersKeepIntegersExactAndSayWhenTheyDoNotFitInt64) {
  struct Case {
    const char* text;
    bool integral, in_range;
    int64_t integer;
    double real;
  };
  const int64_t max = std::numeric_limits<int64_t>::max();
  const int64_t min = std::numeric_limits<int64_t>::min();
  for (const Case& c : std::vector<Case>{
           {"0", true, true, 0, 0},
           {"-0", true, true, 0, 0},
           {"9223372036854775807", true, true, max, 9223372036854775807.0},
           {"-9223372036854775808", true, true, min, -9223372036854775808.0},
           {"9223372036854775808", true, false, 0, 9223372036854775808.0},
           {"123456789012345678901234567890", true, false, 0, 1.2345678901234568e29},
           {"1.5", false, false, 0, 1.5},
           {"1.0", false, false, 0, 1.0},
           {"-2E-3", false, false, 0, -0.002},
           {"1e+2", false, false, 0, 100},
           {"1e-999", false, false, 0, 0},  // an underflow rounds, as strtod does
       }) {
    SCOPED_TRACE(c.text);
    JsonReader r(c.text);
    JsonReader::Number n;
    ASSERT_TRUE(r.Num(&n)) << r.error();
    EXPECT_TRUE(r.End());
    EXPECT_EQ(n.integral, c.integral);
    EXPECT_EQ(n.in_range, c.in_range);
    if (c.in_range) {
      EXPECT_EQ(n.integer, c.integer);
    }
    EXPECT_DOUBLE_EQ(n.real, c.real);
  }
}

TEST(JsonReaderTest, NumbersOutsideTheGrammarOrTheRangeOfADoubleAreRefused) {
  for (const char* text : {"-", "1.", ".5", "1e", "1e+", "+1", "01", "0x10", "1.5.2", "NaN",
                           "Infinity", "-Infinity", "1e999", "-1e400", "--1"}) {
    SCOPED_TRACE(text);
    EXPECT_FALSE(Accepts(text));
    JsonReader r(text);
    r.Skip();
    r.End();
    EXPECT_THAT(r.error(), HasSubstr("not valid JSON: "));
  }
  JsonReader r("[1, 1e999]");
  EXPECT_FALSE(r.Skip());
  EXPECT_EQ(r.error(), "not valid JSON: number out of range at byte 4");
}

TEST(JsonReaderTest, StringsDecodeEveryEscapeAndSurrogatePairsToUtf8) {
  EXPECT_EQ(Str(R"("a\"b\\c\/d\b\f\n\r\t")"), "a\"b\\c/d\b\f\n\r\t");
  EXPECT_EQ(Str(R"("\u0041\u00e9\u20AC")"), "A\xC3\xA9\xE2\x82\xAC");
  EXPECT_EQ(Str(R"("\ud83d\ude00")"), "\xF0\x9F\x98\x80");
  EXPECT_EQ(Str("\"caf\xC3\xA9 \xF0\x9F\x98\x80\""), "caf\xC3\xA9 \xF0\x9F\x98\x80");
  EXPECT_EQ(Str(R"("a\u0000b")"), std::string("a\0b", 3));
  EXPECT_EQ(Str(R"("")"), "");
}

TEST(JsonReaderTest, StringsRefuseBadEscapesControlCharactersAndInvalidUtf8) {
  for (const std::string& text : {
           std::string(R"("\x")"),
           std::string(R"("\u12")"),
           std::string(R"("\u12G4")"),
           std::string(R"("\ud83d")"),
           std::string(R"("\ud83dx")"),
           std::string(R"("\ud83d\u0041")"),
           std::string(R"("\ude00")"),
           std::string("\"a\nb\""),
           std::string("\"a\tb\""),
           std::string("\"a\0b\"", 5),
           std::string("\"\xC0\x80\""),          // overlong NUL
           std::string("\"\xE0\x80\xAF\""),      // overlong '/'
           std::string("\"\xED\xA0\x80\""),      // a surrogate in UTF-8
           std::string("\"\xF4\x90\x80\x80\""),  // past U+10FFFF
           std::string("\"\xC3\x28\""),          // a lead byte without its continuation
           std::string("\"\x80\""),              // a continuation byte alone
           std::string("\"\xFF\""),
           std::string("\"abc"),
           std::string("\"ab\\"),
       }) {
    SCOPED_TRACE(text);
    EXPECT_FALSE(Accepts(text));
  }
}

TEST(JsonReaderTest, SyntaxErrorsNameWhatAndWhereAndStopTheReader) {
  JsonReader r(R"({"a": 1 "b": 2})");
  ASSERT_TRUE(r.EnterObject());
  std::string key;
  ASSERT_TRUE(r.NextKey(&key));
  JsonReader::Number n;
  ASSERT_TRUE(r.Num(&n));
  EXPECT_FALSE(r.NextKey(&key));
  EXPECT_EQ(r.error(), "not valid JSON: expected ',' or '}' at byte 8");
  // The first error stays; every later call fails
  EXPECT_FALSE(r.Num(&n));
  EXPECT_FALSE(r.Skip());
  EXPECT_EQ(r.error(), "not valid JSON: expected ',' or '}' at byte 8");

  // A byte order mark before the value is passed over; anywhere else it is not JSON
  EXPECT_TRUE(Accepts("\xEF\xBB\xBF{\"a\": 1}"));
  EXPECT_FALSE(Accepts(" \xEF\xBB\xBF{}"));
  EXPECT_FALSE(Accepts("{}\xEF\xBB\xBF"));
  for (const char* text : {"", "   ", "{", "[", "[1,]", "{\"a\":1,}", "{\"a\" 1}", "{1: 2}",
                           "[1 2]", "tru", "nul", "falsy", "{} {}", "[]]", "x"}) {
    SCOPED_TRACE(text);
    EXPECT_FALSE(Accepts(text));
  }
}

TEST(JsonReaderTest, NestingIsBoundedWhenEnteredButSkipReadsAnyDepth) {
  const std::string deep = std::string(20000, '[') + std::string(20000, ']');
  EXPECT_TRUE(Accepts(deep));
  EXPECT_FALSE(Accepts(std::string(20000, '[')));
  JsonReader r(deep, /*max_depth=*/3);
  ASSERT_TRUE(r.EnterArray());
  ASSERT_TRUE(r.NextItem());
  ASSERT_TRUE(r.EnterArray());
  ASSERT_TRUE(r.NextItem());
  ASSERT_TRUE(r.EnterArray());
  ASSERT_TRUE(r.NextItem());
  EXPECT_FALSE(r.EnterArray());
  EXPECT_THAT(r.error(), HasSubstr("nested too deeply"));
}

TEST(JsonReaderTest, SkipReturnsTheRawTextOfAValue) {
  JsonReader r(R"({"skip": {"a": [1, {"b": "}"}], "c": null}, "next": 7})");
  ASSERT_TRUE(r.EnterObject());
  std::string key;
  ASSERT_TRUE(r.NextKey(&key));
  std::string_view raw;
  ASSERT_TRUE(r.Skip(&raw));
  EXPECT_EQ(raw, R"({"a": [1, {"b": "}"}], "c": null})");
  ASSERT_TRUE(r.NextKey(&key));
  EXPECT_EQ(key, "next");
  JsonReader::Number n;
  ASSERT_TRUE(r.Num(&n));
  EXPECT_EQ(n.integer, 7);
  EXPECT_FALSE(r.NextKey(&key));
  EXPECT_TRUE(r.ok());
  EXPECT_TRUE(r.End());
}

// Differential: on documents and random damage to them, the reader accepts exactly what
// nlohmann-json accepts (the decoder it replaces on the ingest path).
TEST(JsonReaderTest, AcceptsExactlyWhatNlohmannJsonAcceptsOnDamagedDocuments) {
  const std::vector<std::string> seeds = {
      R"({"batch_id": "b-1", "rows": {"gpu_samples": {"columns": ["ts_ns", "util_pct"],)"
      R"( "rows": [[0, 87.5], [10000000, null], [20000000, -1.25e-3]]}}})",
      R"({"rows": {"steps": [{"step": 0, "start_ns": 0, "end_ns": 5, "wait_source": "x\u00e9"}]},)"
      R"( "insights": [{"ordinal": 0, "ok": true, "detail": "a\"b\\c \ud83d\ude00"}]})",
      R"([1, -0, 0.5, 1e10, "\/", [], {}, [[[]]], false, null, "caf)"
      "\xC3\xA9\"]",
  };
  const std::string alphabet = "{}[]:,\"\\-+.eE0123456789 tfnul\xC3\xA9\xED\xA0\x80\xEF\xBB\xBF";
  std::mt19937 rng(20261207);
  size_t checked = 0, accepted = 0;
  for (const std::string& seed : seeds) {
    ASSERT_TRUE(Accepts(seed)) << seed;
    for (int i = 0; i < 4000; ++i) {
      std::string text = seed;
      const int edits = 1 + static_cast<int>(rng() % 3);
      for (int e = 0; e < edits && !text.empty(); ++e) {
        const size_t at = rng() % text.size();
        switch (rng() % 4) {
          case 0:
            text[at] = alphabet[rng() % alphabet.size()];
            break;
          case 1:
            text.erase(at, 1);
            break;
          case 2:
            text.insert(at, 1, alphabet[rng() % alphabet.size()]);
            break;
          default:
            text.resize(at);
        }
      }
      const bool theirs = nlohmann::json::accept(text);
      SCOPED_TRACE(text);
      EXPECT_EQ(Accepts(text), theirs);
      ++checked;
      accepted += theirs ? 1 : 0;
    }
  }
  // Both outcomes were exercised
  EXPECT_GT(accepted, checked / 50);
  EXPECT_LT(accepted, checked - checked / 50);
}

}  // namespace
}  // namespace gpuprof
