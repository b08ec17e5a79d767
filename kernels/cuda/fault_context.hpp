// Where a CUDA failure happened, for its message: the stage operation running, the op of the seam and
// the last kernel it launched, and the step, micro-batch and layer the caller said it was computing.
// One per thread (the thread that enqueues a stage's work is the one whose calls see its faults); the
// backend sets the stage part around each stage operation, CudaOps the op and kernel parts. Plain C++
// (no CUDA headers), so its formatting is tested on machines without a GPU.
#pragma once
#include <cstdint>
#include <string>

namespace mt::cuda {

struct FaultContext {
  const char* stage = nullptr;   // the Backend stage operation (layer_forward, ...); null between them
  const char* op = nullptr;      // the op of the seam called last within it
  const char* kernel = nullptr;  // the kernel (or library call) launched last within it
  std::int64_t step = -1, micro_batch = -1, layer = -1;  // -1: not known / not a layer
  int device = -1;
};

// This thread's context (every field static strings or numbers: cheap to set per op).
inline FaultContext& fault_context() {
  thread_local FaultContext c;
  return c;
}

// " (in layer_backward of layer 3, step 12, micro-batch 1, on GPU 0; op attention_backward, last kernel
// attn_dq_kernel)"; an op called outside a stage operation (the op test) " (op ..., last kernel ...)";
// "" when nothing is known. Asynchronous faults surface at a later call than the kernel that caused it:
// run with CUDA_LAUNCH_BLOCKING=1 to make the last kernel the culprit.
inline std::string describe_fault(const FaultContext& c) {
  if (!c.stage) {
    if (!c.op && !c.kernel) return "";
    std::string s = c.op ? std::string(" (op ") + c.op : std::string(" (");
    if (c.kernel) s += std::string(c.op ? ", " : "") + "last kernel " + c.kernel;
    return s + ")";
  }
  std::string s = std::string(" (in ") + c.stage;
  if (c.layer >= 0) s += " of layer " + std::to_string(c.layer);
  if (c.step >= 0) s += ", step " + std::to_string(c.step);
  if (c.micro_batch >= 0) s += ", micro-batch " + std::to_string(c.micro_batch);
  if (c.device >= 0) s += ", on GPU " + std::to_string(c.device);
  if (c.op) s += std::string("; op ") + c.op;
  if (c.kernel) s += std::string(c.op ? ", " : "; ") + "last kernel " + c.kernel;
  return s + ")";
}

// Sets the op part for the duration of an op: the stage part stays, the kernel part starts afresh.
inline void note_op(const char* op) {
  FaultContext& c = fault_context();
  c.op = op;
  c.kernel = nullptr;
}
inline void note_kernel(const char* kernel) { fault_context().kernel = kernel; }

}  // namespace mt::cuda
