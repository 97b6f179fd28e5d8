#include "nanoddp/comm/gloo_store.h"

#include <cstdint>
#include <span>

namespace nanoddp::comm {

GlooStore::GlooStore(std::shared_ptr<comm::Store> store, std::chrono::milliseconds key_timeout)
    : store_(std::move(store)), key_timeout_(key_timeout) {}

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
  store_->wait(keys);
}

void GlooStore::wait(const std::vector<std::string>& keys,
                     const std::chrono::milliseconds& timeout) {
  store_->wait(keys, key_timeout_.count() > 0 ? key_timeout_ : timeout);
}

}  // namespace nanoddp::comm
