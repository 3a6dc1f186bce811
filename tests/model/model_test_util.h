// Helpers for the model tests: random inputs and the llm.c-style comparison that prints
// the first mismatches and the max error.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace pipesched::model::testing {

inline std::vector<float> RandomFloats(std::size_t n, std::uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

inline std::vector<std::int32_t> RandomLabels(std::size_t n, int classes, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(0, classes - 1);
  std::vector<std::int32_t> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

inline std::vector<float> Poisoned(std::size_t n) {
  return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN());
}

// |got - want| <= atol + rtol * |want| everywhere (NaN fails); prints up to 5 mismatches
// and the max absolute error.
template <typename T>
::testing::AssertionResult AllClose(const std::string& what, const std::vector<float>& got,
                                    const std::vector<T>& want, double atol, double rtol) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure()
           << what << ": size " << got.size() << " != " << want.size();
  }
  double max_err = 0.0;
  int bad = 0;
  std::string report;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double r = static_cast<double>(want[i]);
    const double err = std::fabs(static_cast<double>(got[i]) - r);
    if (!(err <= atol + rtol * std::fabs(r))) {
      if (bad < 5) {
        report += "\n  [" + std::to_string(i) + "] got " + std::to_string(got[i]) + " want " +
                  std::to_string(r);
      }
      ++bad;
    }
    if (std::isnan(err) || err > max_err) max_err = std::isnan(err) ? INFINITY : err;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": " << bad << " of " << got.size() << " mismatch (atol " << atol << ", rtol "
         << rtol << "), max error " << max_err << report;
}

}  // namespace pipesched::model::testing
