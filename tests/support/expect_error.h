// Asserts that a call throws a given exception type whose message contains a phrase.
#pragma once

#include <gtest/gtest.h>

#include <string>

namespace fsdp::testing {

template <typename Exception, typename Fn>
void expect_error_containing(Fn fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "expected an exception containing '" << needle << "'";
  } catch (const Exception& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message: " << e.what() << "\nexpected to contain: " << needle;
  }
}

}  // namespace fsdp::testing
