// The data loader actor: serves micro-batches by (step, micro-batch) and prefetches the next one.
// Its only state is a one-batch cache; the position in the data lives in the BatchSource (storage), so
// a restarted loader serves exactly the same batches.
#include <map>
#include <memory>

#include "actors/actors.hpp"
#include "data/shard.hpp"

namespace mt::actors {
namespace {

struct loader_state {
  Context* ctx = nullptr;
  std::uint64_t epoch = 0;
  bool running = false;
  PeerHandles peers;
  std::uint64_t cached_g = ~std::uint64_t{0};
  std::shared_ptr<const data::Batch> cached;
  static constexpr const char* name = "loader";
};

std::shared_ptr<const data::Batch> read_batch(Context* ctx, std::uint64_t g) {
  auto b = std::make_shared<data::Batch>();
  try {
    ctx->data->get(g, *b);
  } catch (const data::DataError& e) {  // token ids are checked where they are read, not at start-up
    throw data::DataError(std::string(ctx->data == ctx->run_data ? "data.train_files" : "data.validation_files") +
                          ": " + e.what() + " (model.vocab_size = " + std::to_string(ctx->model->vocab_size) + ")");
  }
  const std::size_t n = static_cast<std::size_t>(ctx->plan.batch * ctx->plan.seq);
  if (b->inputs.size() != n || b->targets.size() != n)
    throw std::runtime_error("data loader: micro-batch " + std::to_string(g) + " has " +
                             std::to_string(b->inputs.size()) + " tokens, expected " + std::to_string(n));
  validate_tokens(*ctx->model, b->inputs.data(), n);
  validate_targets(*ctx->model, b->targets.data(), n);
  if (!b->positions.empty()) {  // data.packing = documents
    if (b->positions.size() != n)
      throw std::runtime_error("data loader: micro-batch " + std::to_string(g) + " has " +
                               std::to_string(b->positions.size()) + " positions, expected " + std::to_string(n));
    validate_positions(BatchRows{ctx->plan.batch, ctx->plan.seq, b->positions.data()});
  }
  return b;
}

loader_actor::behavior_type loader_fn(loader_actor::stateful_pointer<loader_state> self, Context* ctx,
                                      std::uint64_t epoch) {
  self->state.ctx = ctx;
  self->state.epoch = epoch;
  self->set_exception_handler(exception_to_error);
  return {
      [=](const BatchRequest& r) {
        const auto probe = probe_handler(self, monitor::ActorId::loader, "BatchRequest");
        auto& st = self->state;
        if (r.epoch != st.epoch || !st.running) return;
        fault_point(ctx->fault, Role::loader, r.step, r.micro_batch, -1, Phase::data);
        // Micro-batches per step over every device (an evaluation pass has its own count, on one device).
        const auto M = static_cast<std::uint64_t>(ctx->step_micro_batches());
        const std::uint64_t g = static_cast<std::uint64_t>(r.step) * M + static_cast<std::uint64_t>(r.micro_batch);
        std::shared_ptr<const data::Batch> b = (st.cached && st.cached_g == g) ? st.cached : read_batch(ctx, g);
        // Global micro-batch g runs on device g % N (its local index is g / N).
        self->send(st.peers.computes.at(static_cast<std::size_t>(r.micro_batch % ctx->devices)),
                   MicroBatch{st.epoch, r.step, r.micro_batch, b});
        ctx->monitor->board().probe(monitor::ActorId::loader).unit(r.step, r.micro_batch, -1, "data");
        // Prefetch the next micro-batch while compute works on this one (with several ranks, this
        // rank's next: the ones between are the other ranks').
        st.cached_g = g + static_cast<std::uint64_t>(ctx->ranks);
        st.cached = read_batch(ctx, st.cached_g);
      },
      [=](const Peers& p) {
        const auto probe = probe_handler(self, monitor::ActorId::loader, "Peers");
        self->state.peers.set(p);
      },
      [=](const Resume& r) {
        const auto probe = probe_handler(self, monitor::ActorId::loader, "Resume");
        self->state.epoch = r.epoch;
        self->state.running = true;
      },
      [=](reset_atom, std::uint64_t e) {
        const auto probe = probe_handler(self, monitor::ActorId::loader, "reset");
        self->state.epoch = e;
        self->state.running = false;
        self->state.cached.reset();
        return ack_atom::value;
      },
  };
}

}  // namespace

loader_actor spawn_loader(caf::actor_system& sys, Context* ctx, std::uint64_t epoch) {
  return sys.spawn<caf::detached>(loader_fn, ctx, epoch);
}

}  // namespace mt::actors
