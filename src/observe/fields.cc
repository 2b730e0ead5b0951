// Value and Fields: what metrics records and log lines carry, written as JSON through
// nlohmann::json so numbers print exactly as JSON readers parse them back.
#include <nlohmann/json.hpp>

#include "kolo/observe.h"

namespace kolo::observe {

namespace {

nlohmann::ordered_json toJson(const Value& value) {
  return std::visit(
      [](const auto& v) -> nlohmann::ordered_json {
        if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::monostate>) {
          return nullptr;
        } else {
          return v;
        }
      },
      value.get());
}

}  // namespace

std::string Value::json() const { return toJson(*this).dump(); }

std::string Value::text() const {
  if (const auto* text = std::get_if<std::string>(&value_)) return *text;
  return json();
}

Fields::Fields(std::initializer_list<std::pair<std::string, Value>> items) {
  for (const auto& [key, value] : items) set(key, value);
}

Fields& Fields::set(const std::string& key, Value value) {
  for (auto& item : items_) {
    if (item.first == key) {
      item.second = std::move(value);
      return *this;
    }
  }
  items_.emplace_back(key, std::move(value));
  return *this;
}

std::string Fields::json() const {
  nlohmann::ordered_json object = nlohmann::ordered_json::object();
  for (const auto& [key, value] : items_) object[key] = toJson(value);
  return object.dump();
}

}  // namespace kolo::observe
