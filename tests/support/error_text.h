// The message a call throws, for tests that check what an error says.
#pragma once

#include <string>

#include "kolo/error.h"

namespace kolo::testing {

/// The what() of the kolo::Error (or subclass E) that `fn` throws; "(no error)" when it
/// returns. Any other exception propagates and fails the test.
template <class E = Error, class Fn>
std::string errorOf(Fn&& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace kolo::testing
