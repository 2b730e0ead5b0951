// `--compress` values: parsing and the hook each names (kolo/parallel/compression.h).
#include <charconv>
#include <cmath>
#include <string>

#include "kolo/error.h"
#include "kolo/parallel/compression.h"

namespace kolo::parallel::compression {

CompressSpec parseCompressSpec(const std::string& spec, const std::string& what) {
  CompressSpec out;
  const size_t colon = spec.find(':');
  out.method = spec.substr(0, colon);
  const std::string arg = colon == std::string::npos ? "" : spec.substr(colon + 1);
  const char* usage = " (accepted: none, fp16, bf16, powersgd:RANK, topk:FRACTION)";
  if (out.method == "none" || out.method == "fp16" || out.method == "bf16") {
    KOLO_REQUIRE(colon == std::string::npos, what, " ", spec, ": ", out.method,
                 " takes no argument", usage);
    return out;
  }
  if (out.method == "powersgd") {
    int rank = 0;
    const auto [end, ec] = std::from_chars(arg.data(), arg.data() + arg.size(), rank);
    KOLO_REQUIRE(!arg.empty() && ec == std::errc() && end == arg.data() + arg.size() && rank >= 1,
                 what, " ", spec, ": RANK of powersgd:RANK must be an integer >= 1, got '", arg,
                 "'");
    out.rank = rank;
    return out;
  }
  if (out.method == "topk") {
    double fraction = 0.0;
    size_t used = 0;
    bool parsed = !arg.empty();
    try {
      if (parsed) fraction = std::stod(arg, &used);
    } catch (const std::exception&) {
      parsed = false;
    }
    KOLO_REQUIRE(parsed && used == arg.size() && std::isfinite(fraction) && fraction > 0.0 &&
                     fraction <= 1.0,
                 what, " ", spec, ": FRACTION of topk:FRACTION must be a number in (0, 1], got '",
                 arg, "'");
    out.fraction = fraction;
    return out;
  }
  KOLO_THROW(InvalidArgument, what, " ", spec, ": unknown compression '", out.method, "'", usage);
}

std::shared_ptr<CommHook> makeCommHook(const CompressSpec& spec, int64_t powerSgdStartStep) {
  if (spec.method == "none") return nullptr;
  if (spec.method == "fp16") return castHook(DType::F16);
  if (spec.method == "bf16") return castHook(DType::BF16);
  if (spec.method == "powersgd") {
    PowerSgdOptions options;
    options.rank = spec.rank;
    options.startStep = powerSgdStartStep;
    return powerSgdHook(options);
  }
  if (spec.method == "topk") return topKHook({.fraction = spec.fraction});
  KOLO_THROW(InvalidArgument, "unknown compression '", spec.method, "'");
}

}  // namespace kolo::parallel::compression
