// AnomalyDetector: module hooks that look for NaN and infinity in forward outputs and in
// gradients, keep the first finding of a step, and (over a communicator) make every rank
// report the same finding, so that a job stops with one message naming rank, step and module.
#include <cxxabi.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <typeinfo>

#include "kolo/error.h"
#include "kolo/numerics.h"

namespace kolo::observe {
namespace {

// "kolo::nn::Linear" -> "Linear".
std::string className(const nn::Module& module) {
  const char* mangled = typeid(module).name();
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = status == 0 && demangled ? demangled : mangled;
  std::free(demangled);
  const size_t colon = name.rfind("::");
  return colon == std::string::npos ? name : name.substr(colon + 2);
}

// Whether any element's exponent bits are all ones (NaN or infinity): integer operations
// that the compiler vectorises, unlike a floating-point test, so the common all-finite case
// costs one pass at memory speed.
template <class T, class Bits>
bool anyNonFinite(const T* data, int64_t n) {
  constexpr Bits kExponent = sizeof(T) == 4 ? Bits(0x7F800000u) : Bits(0x7FF0000000000000ull);
  Bits found = 0;
  for (int64_t i = 0; i < n; ++i) {
    Bits bits;
    std::memcpy(&bits, data + i, sizeof bits);
    found |= static_cast<Bits>((bits & kExponent) == kExponent);
  }
  return found != 0;
}

template <class T>
void countElements(const Tensor& values, NonFinite& out) {
  const Tensor dense = values.contiguous();
  const T* data = dense.data<T>();
  const int64_t n = dense.numel();
  using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  if (!anyNonFinite<T, Bits>(data, n)) return;
  for (int64_t i = 0; i < n; ++i) {
    const double v = static_cast<double>(data[i]);
    if (std::isfinite(v)) continue;
    if (std::isnan(v)) ++out.nan; else ++out.inf;
    if (out.first < 0) out.first = i;
  }
}

const char* phaseWords(AnomalyPhase phase) {
  switch (phase) {
    case AnomalyPhase::ForwardOutput: return "the forward output";
    case AnomalyPhase::OutputGradient: return "the gradient of the output";
    case AnomalyPhase::ParameterGradient: return "the gradient of parameter";
  }
  return "?";
}

// One finding as the int64 record that agree() all-gathers.
enum Field { kFound, kStep, kModule, kPhase, kParameter, kNan, kInf, kFirst, kFields };

}  // namespace

NonFinite countNonFinite(const Tensor& values) {
  NonFinite out;
  if (!values.defined() || values.numel() == 0) return out;
  switch (values.dtype()) {
    case DType::F32: countElements<float>(values, out); break;
    case DType::F64: countElements<double>(values, out); break;
    case DType::F16:
    case DType::BF16: countElements<float>(values.to(DType::F32), out); break;
    default: break;  // integers are always finite
  }
  return out;
}

std::string Anomaly::describe() const {
  std::string where = phaseWords(phase);
  if (phase == AnomalyPhase::ParameterGradient) {
    where += " '" + parameter + "'";
  } else {
    where += module.empty() ? " of the model" : " of module '" + module + "'";
    if (!moduleType.empty()) where += " (" + moduleType + ")";
  }
  return detail::concat("rank ", rank, ", step ", step, ": ", where, " holds ", nanCount,
                        " NaN and ", infCount, " infinite value(s) (the first at element ",
                        firstIndex, ")");
}

AnomalyDetector::AnomalyDetector(nn::Module& model, AnomalyOptions options)
    : options_(options), modules_(model.namedModules()) {
  for (size_t i = 0; i < modules_.size(); ++i) {
    nn::Module* module = modules_[i].second;
    forwardHooks_.emplace_back(
        module, module->addForwardHook([this, i](nn::Module&, const Tensor& output) {
          inspect(output, i, AnomalyPhase::ForwardOutput, "");
        }));
    gradHooks_.emplace_back(
        module, module->addOutputGradHook([this, i](nn::Module&, const Tensor& grad) {
          inspect(grad, i, AnomalyPhase::OutputGradient, "");
        }));
  }
  if (options_.parameterGradients) {
    for (auto& [name, parameter] : model.namedParameters()) {
      const size_t index = parameterNames_.size();
      parameterNames_.push_back(name);
      // The owning module: the longest module name that prefixes the parameter's.
      size_t owner = 0;
      for (size_t i = 1; i < modules_.size(); ++i) {
        const std::string& prefix = modules_[i].first;
        if (name.compare(0, prefix.size() + 1, prefix + ".") == 0 &&
            prefix.size() > modules_[owner].first.size())
          owner = i;
      }
      Tensor handle = parameter;
      parameterHooks_.emplace_back(handle, handle.addGradReadyHook([this, index, owner](Tensor& grad) {
        inspect(grad, owner, AnomalyPhase::ParameterGradient, parameterNames_[index]);
      }));
    }
  }
}

AnomalyDetector::~AnomalyDetector() {
  for (auto& [module, id] : forwardHooks_) module->removeForwardHook(id);
  for (auto& [module, id] : gradHooks_) module->removeOutputGradHook(id);
  for (auto& [parameter, id] : parameterHooks_) parameter.removeGradReadyHook(id);
}

void AnomalyDetector::beginStep(int64_t step) {
  step_ = step;
  found_.reset();
}

void AnomalyDetector::injectNan(int64_t step, const std::string& module, AnomalyPhase phase) {
  KOLO_REQUIRE(phase != AnomalyPhase::ParameterGradient,
               "a NaN can be injected into a module's output or its gradient, not a parameter's");
  std::vector<std::string> names;
  for (size_t i = 0; i < modules_.size(); ++i) {
    if (modules_[i].first == module) {
      injectStep_ = step;
      injectModule_ = i;
      injectPhase_ = phase;
      return;
    }
    if (!modules_[i].first.empty()) names.push_back("'" + modules_[i].first + "'");
  }
  std::string list;
  for (const std::string& name : names) list += (list.empty() ? "" : ", ") + name;
  KOLO_THROW(InvalidArgument, "the model has no module named '", module, "'; its modules are ",
             list);
}

void AnomalyDetector::inspect(const Tensor& values, size_t moduleIndex, AnomalyPhase phase,
                              const std::string& parameter) {
  if (step_ == injectStep_ && moduleIndex == injectModule_ && phase == injectPhase_ &&
      values.defined() && values.numel() > 0 && values.isContiguous() &&
      values.dtype() == DType::F32) {
    Tensor target = values;  // shares the storage: the NaN flows on as a real one would
    target.data<float>()[0] = std::nanf("");
  }
  if (found_) return;
  const NonFinite counts = countNonFinite(values);
  if (counts.first < 0) return;
  Anomaly anomaly;
  anomaly.step = step_;
  anomaly.rank = options_.rank;
  anomaly.phase = phase;
  anomaly.module = modules_[moduleIndex].first;
  anomaly.moduleType = className(*modules_[moduleIndex].second);
  anomaly.parameter = parameter;
  anomaly.nanCount = counts.nan;
  anomaly.infCount = counts.inf;
  anomaly.firstIndex = counts.first;
  found_ = std::move(anomaly);
}

void AnomalyDetector::throwIfFound() const {
  if (found_) KOLO_THROW(DivergedError, "non-finite values: ", found_->describe());
}

void AnomalyDetector::agree(comm::Communicator& comm) const {
  int64_t mine[kFields] = {};
  if (found_) {
    mine[kFound] = 1;
    mine[kStep] = found_->step;
    for (size_t i = 0; i < modules_.size(); ++i)
      if (modules_[i].first == found_->module) mine[kModule] = static_cast<int64_t>(i);
    mine[kPhase] = static_cast<int64_t>(found_->phase);
    const auto it = std::find(parameterNames_.begin(), parameterNames_.end(), found_->parameter);
    mine[kParameter] = it == parameterNames_.end() ? -1 : it - parameterNames_.begin();
    mine[kNan] = found_->nanCount;
    mine[kInf] = found_->infCount;
    mine[kFirst] = found_->firstIndex;
  }
  const int size = comm.size();
  std::vector<int64_t> all(static_cast<size_t>(kFields) * size);
  comm.allgather(mine, all.data(), kFields, DType::I64);
  int first = -1;
  std::vector<int> others;
  for (int r = 0; r < size; ++r) {
    if (all[static_cast<size_t>(r) * kFields + kFound] == 0) continue;
    if (first < 0) first = r; else others.push_back(r);
  }
  if (first < 0) return;
  const int64_t* record = &all[static_cast<size_t>(first) * kFields];
  Anomaly anomaly;
  anomaly.rank = first;
  anomaly.step = record[kStep];
  const size_t module = static_cast<size_t>(std::clamp<int64_t>(
      record[kModule], 0, static_cast<int64_t>(modules_.size()) - 1));
  anomaly.module = modules_[module].first;
  anomaly.moduleType = className(*modules_[module].second);
  anomaly.phase = static_cast<AnomalyPhase>(std::clamp<int64_t>(record[kPhase], 0, 2));
  if (record[kParameter] >= 0 && record[kParameter] < static_cast<int64_t>(parameterNames_.size()))
    anomaly.parameter = parameterNames_[static_cast<size_t>(record[kParameter])];
  anomaly.nanCount = record[kNan];
  anomaly.infCount = record[kInf];
  anomaly.firstIndex = record[kFirst];
  std::string also;
  for (int r : others) also += (also.empty() ? "" : ", ") + std::to_string(r);
  KOLO_THROW(DivergedError, "non-finite values: ", anomaly.describe(),
             others.empty() ? std::string("; no other rank found any in this step")
                            : "; also found on rank(s) " + also);
}

}  // namespace kolo::observe
