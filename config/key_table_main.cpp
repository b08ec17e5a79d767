// megatrain-key-table: prints config/README.md's key table (markdown, from config/keys.cpp), or with
// --update FILE rewrites the part of FILE between its key-table markers.
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "config/keys.hpp"

int main(int argc, char** argv) {
  if (argc == 1) {
    std::cout << mt::key_table_markdown();
    return 0;
  }
  if (argc != 3 || std::string(argv[1]) != "--update") {
    std::cerr << "usage: " << argv[0] << " [--update config/README.md]\n";
    return 2;
  }
  std::ifstream in(argv[2]);
  if (!in) {
    std::cerr << argv[0] << ": cannot read " << argv[2] << "\n";
    return 1;
  }
  std::ostringstream text;
  text << in.rdbuf();
  const std::string updated = mt::with_key_table(text.str());
  if (updated == text.str() && text.str().find("<!-- key table") == std::string::npos) {
    std::cerr << argv[0] << ": " << argv[2] << " has no key-table markers\n";
    return 1;
  }
  std::ofstream(argv[2]) << updated;
  return 0;
}
