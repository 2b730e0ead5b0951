// The error crossEntropy raises for a label outside its classes, with the label and the
// class count as values, so that train::fit can name the dataset index it came from (a
// user's dataset broke its contract) instead of a row of a kernel's input.
#pragma once

#include <cstdint>
#include <string>

#include "kolo/error.h"

namespace kolo::detail {

/// A class label outside [0, classes): an InvalidArgument, as before, with its values.
class LabelOutOfRange : public InvalidArgument {
 public:
  LabelOutOfRange(const std::string& what, int64_t label, int64_t classes)
      : InvalidArgument(what), label_(label), classes_(classes) {}
  int64_t label() const { return label_; }
  int64_t classes() const { return classes_; }

 private:
  int64_t label_, classes_;
};

}  // namespace kolo::detail
