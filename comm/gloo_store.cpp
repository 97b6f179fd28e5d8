#include "nanoddp/comm/gloo_store.h"

#include <cstdint>
#include <span>
#include <utility>

namespace nanoddp::comm {

GlooStore::GlooStore(std::shared_ptr<comm::Store> store, std::chrono::milliseconds key_timeout,
                     std::function<void()> watch)
    : store_(std::move(store)), key_timeout_(key_timeout), watch_(std::move(watch)) {}

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  // Gloo's values are opaque bytes (serialized socket addresses); only the pointer type differs.
  store_->set(key, std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(data.data()),
                                                 data.size()));
}

std::vector<char> GlooStore::get(const std::string& key) {
  const Bytes value = store_->get(key);
  return std::vector<char>(value.begin(), value.end());
}

void GlooStore::wait(const std::vector<std::string>& keys) {
  wait_watching(*store_, keys, store_->timeout(), watch_);
}

void GlooStore::wait(const std::vector<std::string>& keys,
                     const std::chrono::milliseconds& timeout) {
  wait_watching(*store_, keys, key_timeout_.count() > 0 ? key_timeout_ : timeout, watch_);
}

}  // namespace nanoddp::comm
