// Value and Fields: what metrics records and log lines carry, written as JSON through
// nlohmann::json so numbers print exactly as JSON readers parse them back.
#include <nlohmann/json.hpp>

#include "kolo/observe.h"

namespace kolo::observe {

namespace {

nlohmann::ordered_json toJson(const Value& value) {
  return std::visit(
      [](const auto& v) -> nlohmann::ordered_json {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::monostate>) {
          return nullptr;
        } else if constexpr (std::is_same_v<T, Value::Array>) {
          nlohmann::ordered_json array = nlohmann::ordered_json::array();
          for (const Value& item : v) array.push_back(toJson(item));
          return array;
        } else if constexpr (std::is_same_v<T, Value::Object>) {
          nlohmann::ordered_json object = nlohmann::ordered_json::object();
          for (const auto& [key, item] : v) object[key] = toJson(item);
          return object;
        } else {
          return v;
        }
      },
      value.get());
}

}  // namespace

Value::Value(const Fields& record) : value_(Object(record.items())) {}

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

Fields& Fields::update(const Fields& other) {
  for (const auto& [key, value] : other.items_) set(key, value);
  return *this;
}

std::string Fields::json() const { return Value(*this).json(); }

}  // namespace kolo::observe
