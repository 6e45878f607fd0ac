#pragma once
// Reading the reference-case files of tests/data (tokenizer_cases.txt, spm_tokenizer_cases.txt): one record
// per line, TAB-separated fields, text escaped by the generators as \\ \t \n \r and \xHH per byte.
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <doctest/doctest.h>

#include "kvfuse/core/types.hpp"

namespace kvfuse_test {

// The bytes an escaped text field stands for.
inline std::string unescape(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\') {
      out += s[i];
      continue;
    }
    REQUIRE(i + 1 < s.size());
    const char c = s[++i];
    if (c == 'n') {
      out += '\n';
    } else if (c == 't') {
      out += '\t';
    } else if (c == 'r') {
      out += '\r';
    } else if (c == '\\') {
      out += '\\';
    } else {
      REQUIRE(c == 'x');
      REQUIRE(i + 2 < s.size());
      out += static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    }
  }
  return out;
}

inline std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> fields;
  std::size_t begin = 0;
  while (true) {
    const std::size_t tab = line.find('\t', begin);
    fields.push_back(line.substr(begin, tab == std::string::npos ? std::string::npos : tab - begin));
    if (tab == std::string::npos) return fields;
    begin = tab + 1;
  }
}

// A space-separated list of decimal token ids.
inline std::vector<kvfuse::token_id> parse_ids(const std::string& s) {
  std::vector<kvfuse::token_id> ids;
  std::istringstream in(s);
  kvfuse::token_id id = 0;
  while (in >> id) ids.push_back(id);
  return ids;
}

}  // namespace kvfuse_test
