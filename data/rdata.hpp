// Reads text out of R's data files without R: the demo corpus (Jane Austen's novels) ships in Debian's
// r-cran-janeaustenr as an R lazy-load database (Rdata.rdx index + Rdata.rdb blobs), each blob a zlib
// stream of R's XDR serialization. This is a small unserializer for the value types such files hold
// (vectors, lists, pairlists, symbols, strings, attributes, references).
#pragma once
#include <string>
#include <vector>

namespace mt::data {

struct RStringVariable {
  std::string name;
  std::vector<std::string> values;  // the character vector's elements (UTF-8; NA as "")
};

// Every character-vector variable of a lazy-load database `<stem>.rdx` + `<stem>.rdb`, in index order.
// Other variables (data frames, numbers) are skipped. DataError names the file and offset on bad input.
std::vector<RStringVariable> read_r_lazyload_strings(const std::string& stem);

// The character vector in an .rds file (gzip or zlib compressed, or plain XDR serialization).
RStringVariable read_rds_strings(const std::string& path);

// The six novels from janeaustenr's data, in the package's order (emma, mansfieldpark, northangerabbey,
// persuasion, prideprejudice, sensesensibility): one variable per novel, one element per line.
std::vector<RStringVariable> read_janeaustenr(const std::string& package_dir = "/usr/lib/R/site-library/janeaustenr");

// The novels as one text: every line followed by '\n', novels in package order. This is byte for byte
// the corpus/austen.txt of the project's shared test data.
std::string janeaustenr_text(const std::string& package_dir = "/usr/lib/R/site-library/janeaustenr");

}  // namespace mt::data
