#include "monitor/token.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>

namespace mt::monitor {

std::string random_token() {
  std::random_device rd("/dev/urandom");
  static const char hex[] = "0123456789abcdef";
  std::string t;
  for (int i = 0; i < 8; ++i) {  // 8 x 32 bits
    std::uint32_t v = rd();
    for (int k = 0; k < 8; ++k) {
      t += hex[v & 15u];
      v >>= 4;
    }
  }
  return t;
}

void write_token_file(const std::string& path, const std::string& token) {
  ::unlink(path.c_str());  // a file left by an earlier run may have other permissions
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) throw std::runtime_error("cannot write the monitor token " + path + ": " + std::strerror(errno));
  const std::string line = token + "\n";
  const bool ok = ::fchmod(fd, 0600) == 0 && ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  const int err = errno;
  ::close(fd);
  if (!ok) throw std::runtime_error("cannot write the monitor token " + path + ": " + std::strerror(err));
}

std::string read_token_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("monitor.token_file: cannot read '" + path + "'");
  std::ostringstream text;
  text << in.rdbuf();
  std::string t = text.str();
  const auto b = t.find_first_not_of(" \t\r\n");
  const auto e = t.find_last_not_of(" \t\r\n");
  if (b == std::string::npos) throw std::runtime_error("monitor.token_file: '" + path + "' is empty");
  t = t.substr(b, e - b + 1);
  for (char c : t)
    if (c <= ' ' || c == 127)
      throw std::runtime_error("monitor.token_file: '" + path +
                               "' holds whitespace or control characters inside the token");
  return t;
}

bool token_equal(const std::string& a, const std::string& b) {
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  const std::size_t n = a.size() < b.size() ? a.size() : b.size();
  for (std::size_t i = 0; i < b.size(); ++i) diff |= static_cast<unsigned char>(i < n ? a[i] ^ b[i] : b[i]);
  return diff == 0;
}

}  // namespace mt::monitor
