#include "storage/checkpoint/h5_util.hpp"

#include <stdexcept>
#include <vector>

namespace mt::ckpt::h5 {

void quiet_errors() {
  static const bool once = [] {
    H5dont_atexit();  // must precede the library's initialisation, which H5open does
    H5open();
    return true;
  }();
  (void)once;
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

namespace {
herr_t keep_message(unsigned n, const H5E_error2_t* err, void* out) {
  // The walk goes from the innermost frame outwards: the first one says what actually failed.
  if (n == 0 && err && err->desc) *static_cast<std::string*>(out) = err->desc;
  return 0;
}
}  // namespace

std::string last_error() {
  std::string msg;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, keep_message, &msg);
  H5Eclear2(H5E_DEFAULT);
  return msg;
}

namespace {
void write_attr(hid_t obj, const char* name, hid_t type, const void* value) {
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  if (H5Aexists(obj, name) > 0) H5Adelete(obj, name);
  Handle attr(H5Acreate2(obj, name, type, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!attr.valid() || H5Awrite(attr.get(), type, value) < 0)
    throw std::runtime_error(std::string("cannot write attribute ") + name);
}
Handle open_attr(hid_t obj, const char* name) {
  if (H5Aexists(obj, name) <= 0) return {};
  return Handle(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
}
}  // namespace

void set_attr(hid_t obj, const char* name, const std::string& value) {
  Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), H5T_VARIABLE);
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  const char* p = value.c_str();
  write_attr(obj, name, type.get(), &p);
}

void set_attr(hid_t obj, const char* name, std::int64_t value) { write_attr(obj, name, H5T_NATIVE_INT64, &value); }
void set_attr_u64(hid_t obj, const char* name, std::uint64_t value) {
  write_attr(obj, name, H5T_NATIVE_UINT64, &value);
}

bool get_attr(hid_t obj, const char* name, std::string* value) {
  Handle attr = open_attr(obj, name);
  if (!attr.valid()) return false;
  Handle ftype(H5Aget_type(attr.get()), H5Tclose);
  if (H5Tget_class(ftype.get()) != H5T_STRING) return false;
  Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  if (H5Tis_variable_str(ftype.get()) > 0) {
    H5Tset_size(type.get(), H5T_VARIABLE);
    H5Tset_cset(type.get(), H5T_CSET_UTF8);
    char* p = nullptr;
    if (H5Aread(attr.get(), type.get(), &p) < 0 || !p) return false;
    *value = p;
    H5free_memory(p);
    return true;
  }
  const std::size_t n = H5Tget_size(ftype.get());
  std::vector<char> buf(n + 1, 0);
  H5Tset_size(type.get(), n + 1);
  if (H5Aread(attr.get(), type.get(), buf.data()) < 0) return false;
  *value = buf.data();
  return true;
}

bool get_attr(hid_t obj, const char* name, std::int64_t* value) {
  Handle attr = open_attr(obj, name);
  return attr.valid() && H5Aread(attr.get(), H5T_NATIVE_INT64, value) >= 0;
}

bool get_attr_u64(hid_t obj, const char* name, std::uint64_t* value) {
  Handle attr = open_attr(obj, name);
  return attr.valid() && H5Aread(attr.get(), H5T_NATIVE_UINT64, value) >= 0;
}

}  // namespace mt::ckpt::h5
