// NCCL's error text for the files built with NCCL (nccl_reduce.cu, nccl_rank_transport.cpp): the error
// and NCCL's last message, often the actual cause (a topology, memory or peer problem).
#pragma once
#include <nccl.h>

#include <string>

namespace mt::cuda {

inline std::string nccl_error_text(ncclResult_t r, ncclComm_t comm = nullptr) {
  const char* last = ncclGetLastError(comm);
  return std::string(ncclGetErrorString(r)) + (last && *last ? std::string(" (") + last + ")" : std::string());
}

}  // namespace mt::cuda
