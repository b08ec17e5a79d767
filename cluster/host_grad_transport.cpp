#include "cluster/host_grad_transport.hpp"

#include <stdexcept>

namespace mt::cluster {

namespace {

class HostArrivals final : public GradTransport::Arrivals {
 public:
  HostArrivals(std::vector<std::unique_ptr<World::PendingRecv>> pending, std::vector<const float*> data)
      : pending_(std::move(pending)), data_(std::move(data)) {}
  const float* wait(int rank) override {
    World::PendingRecv* p = pending_.at(static_cast<std::size_t>(rank)).get();
    if (p == nullptr) throw std::logic_error("HostGradTransport: no receive from rank " + std::to_string(rank));
    p->wait();
    return data_[static_cast<std::size_t>(rank)];
  }

 private:
  std::vector<std::unique_ptr<World::PendingRecv>> pending_;
  std::vector<const float*> data_;
};

}  // namespace

void HostGradTransport::send(int owner, const RoundGradient& mine, std::size_t n, const std::string& what) {
  if (mine.host == nullptr && n > 0) throw std::logic_error("HostGradTransport: the gradient has no host copy");
  world_.send(Channel::grads, owner, mine.host, n * sizeof(float), what);
}

std::unique_ptr<GradTransport::Arrivals> HostGradTransport::receive(std::size_t n, const std::string& what) {
  if (n > max_floats_)
    throw std::logic_error("HostGradTransport: " + std::to_string(n) + " floats exceed the largest stage's " +
                           std::to_string(max_floats_));
  const auto R = static_cast<std::size_t>(world_.size());
  buffers_.resize(R);
  std::vector<std::unique_ptr<World::PendingRecv>> pending(R);
  std::vector<const float*> data(R, nullptr);
  for (std::size_t r = 0; r < R; ++r) {
    if (static_cast<int>(r) == world_.rank()) continue;
    if (!buffers_[r]) buffers_[r] = make_aligned_floats(max_floats_);
    pending[r] = world_.start_recv(Channel::grads, static_cast<int>(r), buffers_[r].get(), n * sizeof(float), what);
    data[r] = buffers_[r].get();
  }
  return std::make_unique<HostArrivals>(std::move(pending), std::move(data));
}

}  // namespace mt::cluster
