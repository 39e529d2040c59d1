// Parsing of the backend-choice environment variables (src/api/backend_choice.h):
// M3QKV_BACKEND and M3QKV_SELFTEST_ON_WARMUP. What the values do to the
// dispatch is tested per build configuration in api_dispatch_tests.h.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "api/backend_choice.h"

namespace {

TEST(BackendEnvParsing, ValuesAndTheirMeaning) {
  using m3qkv::api::parse_backend_env;
  EXPECT_FALSE(parse_backend_env(nullptr).set);
  EXPECT_FALSE(parse_backend_env("").set) << "an empty value means unset (as `M3QKV_BACKEND= cmd` in a shell)";
  EXPECT_TRUE(parse_backend_env("").valid);
  const struct {
    const char* text;
    m3qkv_backend_kind kind;
  } good[] = {{"auto", M3QKV_BACKEND_NONE},
              {"portable", M3QKV_BACKEND_PORTABLE},
              {"sm90", M3QKV_BACKEND_SM90},
              {"sm100", M3QKV_BACKEND_SM100}};
  for (const auto& g : good) {
    const auto e = parse_backend_env(g.text);
    EXPECT_TRUE(e.set && e.valid) << g.text;
    EXPECT_EQ(e.kind, g.kind) << g.text;
    EXPECT_STREQ(e.text, g.text);
  }
  for (const char* bad : {"Auto", "sm 90", "sm90a", "sm100f", "0", "none", " portable"}) {
    const auto e = parse_backend_env(bad);
    EXPECT_TRUE(e.set) << bad;
    EXPECT_FALSE(e.valid) << bad;
    EXPECT_EQ(e.kind, M3QKV_BACKEND_NONE) << bad;
    EXPECT_STREQ(e.text, bad);
  }
  const std::string longer(100, 'x');
  EXPECT_EQ(std::strlen(parse_backend_env(longer.c_str()).text), sizeof(m3qkv::api::BackendEnv::text) - 1);

  using m3qkv::api::parse_flag_env;
  EXPECT_FALSE(parse_flag_env(nullptr).on);
  EXPECT_TRUE(parse_flag_env(nullptr).valid);
  EXPECT_TRUE(parse_flag_env("1").on);
  EXPECT_FALSE(parse_flag_env("0").on);
  EXPECT_TRUE(parse_flag_env("0").valid);
  EXPECT_TRUE(parse_flag_env("").valid);
  for (const char* bad : {"yes", "true", "on", "2", " 1", "01"}) {
    EXPECT_FALSE(parse_flag_env(bad).valid) << bad;
    EXPECT_FALSE(parse_flag_env(bad).on) << bad;
  }
}

}  // namespace
