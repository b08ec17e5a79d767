// A host buffer a copy engine writes or reads (layer boundaries, gradient landing buffers), registered
// with a backend for as long as this object lives: on CUDA, cudaHostRegister at its exact size, so its
// copies are asynchronous DMA instead of staged through pageable memory (which blocks the calling
// thread and serialises offload with compute); on the CPU backend nothing. Declare it after the buffer
// and the backend it names, so it unregisters before either goes.
#pragma once
#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>

#include "device/backend.hpp"

namespace mt {

class HostRegistration {
 public:
  HostRegistration() = default;
  // `what` names the buffer in the error when the backend refuses it.
  HostRegistration(Backend& backend, void* data, std::size_t bytes, const std::string& what)
      : backend_(&backend), data_(data), bytes_(bytes) {
    if (!data || bytes == 0) {
      backend_ = nullptr;
      return;
    }
    try {
      backend.register_host(data, bytes);
    } catch (const std::exception& e) {
      throw std::runtime_error("pinning " + what + " (" + std::to_string(bytes) + " bytes) for the " + backend.name() +
                               " backend's copies failed: " + e.what());
    }
  }
  ~HostRegistration() {
    if (!backend_) return;
    try {
      backend_->unregister_host(data_, bytes_);
    } catch (...) {  // a destructor must not throw; the backend unregisters what is left when it goes
    }
  }
  HostRegistration(HostRegistration&& o) noexcept
      : backend_(std::exchange(o.backend_, nullptr)), data_(o.data_), bytes_(o.bytes_) {}
  HostRegistration& operator=(HostRegistration&& o) noexcept {
    if (this != &o) {
      HostRegistration gone(std::move(*this));
      backend_ = std::exchange(o.backend_, nullptr), data_ = o.data_, bytes_ = o.bytes_;
    }
    return *this;
  }
  HostRegistration(const HostRegistration&) = delete;
  HostRegistration& operator=(const HostRegistration&) = delete;
  std::size_t bytes() const { return backend_ ? bytes_ : 0; }

 private:
  Backend* backend_ = nullptr;
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace mt
