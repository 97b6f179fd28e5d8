#include "nanoddp/comm/store.h"

#include <utility>

namespace nanoddp::comm {

void Store::set(const std::string& key, const std::string& value) {
  set(key, std::span(reinterpret_cast<const std::uint8_t*>(value.data()), value.size()));
}

std::string Store::get_string(const std::string& key) {
  const Bytes value = get(key);
  return std::string(value.begin(), value.end());
}

std::vector<std::optional<Bytes>> Store::try_get_many(const std::vector<std::string>& keys) {
  std::vector<std::optional<Bytes>> values;
  values.reserve(keys.size());
  for (const auto& k : keys) {
    values.push_back(check({k}) ? std::optional<Bytes>(get(k)) : std::nullopt);
  }
  return values;
}

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> store)
    : prefix_(std::move(prefix)), store_(std::move(store)) {}

void PrefixStore::set(const std::string& k, std::span<const std::uint8_t> value) {
  store_->set(key(k), value);
}

Bytes PrefixStore::get(const std::string& k) {
  return store_->get(key(k));
}

std::int64_t PrefixStore::add(const std::string& k, std::int64_t delta) {
  return store_->add(key(k), delta);
}

void PrefixStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::vector<std::string> prefixed;
  prefixed.reserve(keys.size());
  for (const auto& k : keys) prefixed.push_back(key(k));
  store_->wait(prefixed, timeout);
}

bool PrefixStore::check(const std::vector<std::string>& keys) {
  std::vector<std::string> prefixed;
  prefixed.reserve(keys.size());
  for (const auto& k : keys) prefixed.push_back(key(k));
  return store_->check(prefixed);
}

Bytes PrefixStore::compare_set(const std::string& k, std::span<const std::uint8_t> expected,
                               std::span<const std::uint8_t> desired) {
  return store_->compare_set(key(k), expected, desired);
}

bool PrefixStore::remove(const std::string& k) {
  return store_->remove(key(k));
}

std::vector<std::optional<Bytes>> PrefixStore::try_get_many(const std::vector<std::string>& keys) {
  std::vector<std::string> prefixed;
  prefixed.reserve(keys.size());
  for (const auto& k : keys) prefixed.push_back(key(k));
  return store_->try_get_many(prefixed);
}

}  // namespace nanoddp::comm
