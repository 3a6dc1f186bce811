// Test helpers for absl::Status / StatusOr (Debian's Abseil ships no matchers).
#pragma once

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipesched::testing {

inline const absl::Status& GetStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

// EXPECT_THAT(f(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("stages")))
MATCHER_P2(StatusIs, code, message_matcher, "") {
  const absl::Status& s = ::pipesched::testing::GetStatus(arg);
  *result_listener << "status is " << s;
  return s.code() == code &&
         ::testing::ExplainMatchResult(message_matcher, std::string(s.message()), result_listener);
}

MATCHER(IsOk, "") {
  const absl::Status& s = ::pipesched::testing::GetStatus(arg);
  *result_listener << "status is " << s;
  return s.ok();
}

}  // namespace pipesched::testing

#define PS_EXPECT_OK(expr) EXPECT_THAT((expr), ::pipesched::testing::IsOk())
#define PS_ASSERT_OK(expr) ASSERT_THAT((expr), ::pipesched::testing::IsOk())

// PS_ASSERT_OK_AND_ASSIGN(auto x, MakeX());
#define PS_ASSERT_OK_AND_ASSIGN(lhs, expr) \
  PS_ASSERT_OK_AND_ASSIGN_IMPL_(PS_TEST_CONCAT_(ps_test_so_, __LINE__), lhs, expr)
#define PS_TEST_CONCAT_INNER_(a, b) a##b
#define PS_TEST_CONCAT_(a, b) PS_TEST_CONCAT_INNER_(a, b)
#define PS_ASSERT_OK_AND_ASSIGN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  ASSERT_TRUE(tmp.ok()) << tmp.status();              \
  lhs = std::move(tmp).value()
