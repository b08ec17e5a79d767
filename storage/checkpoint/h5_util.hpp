// Thin RAII and error helpers over the HDF5 1.10 C API (numbered names: H5Dcreate2, H5Acreate2, ...).
// Internal to the checkpoint library.
#pragma once
#include <cstdint>
#include <string>
#include <utility>

#include <hdf5.h>

namespace mt::ckpt::h5 {

// Owns one hid_t and closes it with the matching H5*close.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)), closer_(o.closer_) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
      closer_ = o.closer_;
    }
    return *this;
  }
  ~Handle() { reset(); }
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset() {
    if (id_ >= 0 && closer_) closer_(id_);
    id_ = H5I_INVALID_HID;
  }
  // Closes now and reports whether closing (which flushes) succeeded.
  bool close() {
    const bool ok = id_ < 0 || !closer_ || closer_(id_) >= 0;
    id_ = H5I_INVALID_HID;
    return ok;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

// Silences HDF5's automatic error printing on this thread; errors become exceptions instead. The
// first call also turns off HDF5's clean-up at process exit: after a failed write (disk full) HDF5
// 1.10 cannot close the file, and its exit handler would then crash closing it a second time.
void quiet_errors();
// The innermost message of this thread's HDF5 error stack ("" when empty); clears the stack.
std::string last_error();

void set_attr(hid_t obj, const char* name, const std::string& value);
void set_attr(hid_t obj, const char* name, std::int64_t value);
void set_attr_u64(hid_t obj, const char* name, std::uint64_t value);
bool get_attr(hid_t obj, const char* name, std::string* value);
bool get_attr(hid_t obj, const char* name, std::int64_t* value);
bool get_attr_u64(hid_t obj, const char* name, std::uint64_t* value);

}  // namespace mt::ckpt::h5
