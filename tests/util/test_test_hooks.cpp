// The test hooks' one reader (util/test_hooks.h): fields, numbers, words, and
// errors that name the hook, its value and its format.
#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <string>

#include "tests/util/error_of.h"
#include "util/error.h"
#include "util/test_hooks.h"

namespace wiola {
namespace {

struct Env {
  explicit Env(const char* value) { setenv("WIOLA_FAULT", value, 1); }
  ~Env() { unsetenv("WIOLA_FAULT"); }
};

using test::error_of;

TEST(TestHooks, TableHasEveryHookOnceInOrder) {
  std::set<std::string> names;
  int i = 0;
  for (const TestHookSpec& s : test_hooks()) {
    EXPECT_EQ(int(s.hook), i++);
    EXPECT_EQ(std::string(s.env).rfind("WIOLA_", 0), 0u) << s.env;
    EXPECT_TRUE(names.insert(s.env).second) << s.env;
    EXPECT_NE(std::string(s.format), "");
    EXPECT_NE(std::string(s.effect), "");
    EXPECT_NE(std::string(s.reader), "");
  }
  EXPECT_EQ(&test_hook_spec(Hook::Blas), &test_hooks()[size_t(Hook::Blas)]);
}

TEST(TestHooks, UnsetAndEmptyAreOff) {
  unsetenv("WIOLA_FAULT");
  EXPECT_FALSE(TestHook(Hook::Fault).set());
  Env e("");
  EXPECT_FALSE(TestHook(Hook::Fault).set());
}

TEST(TestHooks, FieldsNumbersAndWords) {
  Env e("stall:3:-12");
  const TestHook h(Hook::Fault);
  ASSERT_TRUE(h.set());
  EXPECT_EQ(h.fields(3, 3), 3u);
  EXPECT_EQ(h.word(0, {"fail", "stall"}), "stall");
  EXPECT_EQ(h.integer(1, 0), 3);
  EXPECT_EQ(h.integer(2, INT64_MIN), -12);
  EXPECT_EQ(h.number(1, 0.0), 3.0);
  EXPECT_EQ(h.value(), "stall:3:-12");
}

TEST(TestHooks, ErrorsNameTheHookItsValueAndFormat) {
  {
    Env e("explode:1:3");
    const TestHook h(Hook::Fault);
    EXPECT_EQ(error_of([&] { h.word(0, {"fail", "stall"}); }),
              "WIOLA_FAULT='explode:1:3': 'explode' is not one of fail, stall (expected KIND:RANK:STEP)");
  }
  {
    Env e("fail:1");
    const TestHook h(Hook::Fault);
    EXPECT_EQ(error_of([&] { h.fields(3, 3); }),
              "WIOLA_FAULT='fail:1': 2 fields separated by ':' (expected KIND:RANK:STEP)");
    EXPECT_NE(error_of([&] { h.field(2); }).find("no field 3"), std::string::npos);
  }
  {
    Env e("fail:x1:3:");
    const TestHook h(Hook::Fault);
    EXPECT_EQ(h.fields(4, 4), 4u);  // a trailing ':' is an empty last field
    EXPECT_NE(error_of([&] { h.integer(1, 0); }).find("'x1' is not a whole number"), std::string::npos);
    EXPECT_NE(error_of([&] { h.integer(3, 0); }).find("'' is not a whole number"), std::string::npos);
    EXPECT_NE(error_of([&] { h.integer(2, 5, 9); }).find("'3' is out of range (5 to 9)"), std::string::npos);
    EXPECT_NE(error_of([&] { h.number(1, 0.0); }).find("'x1' is not a number"), std::string::npos);
  }
}

}  // namespace
}  // namespace wiola
