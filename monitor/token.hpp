// The control endpoint's bearer token: 256 random bits as 64 hex digits, written to a file only its
// owner can read (mode 0600), or read from the file monitor.token_file names.
#pragma once
#include <string>

namespace mt::monitor {

std::string random_token();  // from /dev/urandom (std::random_device)
// Writes `token` + newline to `path` with mode 0600 (replacing any file there). Throws naming the path.
void write_token_file(const std::string& path, const std::string& token);
// The token in `path` (surrounding whitespace removed). Throws naming the path when unreadable or empty.
std::string read_token_file(const std::string& path);
// Compares in time independent of where the strings differ.
bool token_equal(const std::string& a, const std::string& b);

}  // namespace mt::monitor
