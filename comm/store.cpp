#include "nanoddp/comm/store.h"

#include <algorithm>
#include <thread>
#include <utility>

#include <fmt/format.h>

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

void wait_watching(Store& store, const std::vector<std::string>& keys,
                   std::chrono::milliseconds timeout, const std::function<void()>& watch) {
  if (!watch) {
    store.wait(keys, timeout);
    return;
  }
  // Looks that start quick and slow down to 0.1 s: the keys are usually there at once, and a
  // long wait costs the store one request per look, not a blocked connection.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    if (store.check(keys)) return;
    watch();
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) break;
    std::this_thread::sleep_for(
        std::min<std::chrono::steady_clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, std::chrono::milliseconds(100));
  }
  std::string names;
  for (const auto& k : keys) names += (names.empty() ? "" : ", ") + k;
  throw StoreError(fmt::format(
      "store wait timed out after {:.1f} s: {} still missing (did every rank reach this point? "
      "if it is only slow, raise NANODDP_TIMEOUT_S)",
      std::chrono::duration<double>(timeout).count(), names));
}

}  // namespace nanoddp::comm
