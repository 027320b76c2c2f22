// Reads prompt files with nlohmann-json, one line at a time so that errors name the line.
#include "prompts.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>

std::vector<std::string> read_prompts(const std::string &path, size_t limit) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path + ": " + std::strerror(errno));
  std::vector<std::string> prompts;
  std::string line;
  size_t line_no = 0;
  while ((limit == 0 || prompts.size() < limit) && std::getline(in, line)) {
    ++line_no;
    const std::string where = path + ":" + std::to_string(line_no) + ": ";
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception &e) {
      // e.what() is "[json.exception.parse_error.101] parse error at line 1, column 7: ...";
      // the line is the file's, named already. Not only parse errors: a number too large for a
      // double ("1e999") is an out_of_range error (found by tests/fuzz/fuzz_prompts.cpp).
      std::string what = e.what();
      const size_t at = what.find("] ");
      if (at != std::string::npos) what.erase(0, at + 2);
      const size_t line_1 = what.find("line 1, ");
      if (line_1 != std::string::npos) what.erase(line_1, 8);
      throw std::runtime_error(where + "not valid JSON: " + what);
    }
    if (!j.is_object()) throw std::runtime_error(where + "not a JSON object");
    const auto prompt = j.find("prompt");
    if (prompt == j.end() || !prompt->is_string())
      throw std::runtime_error(where + "no \"prompt\" string");
    prompts.push_back(prompt->get<std::string>());
  }
  if (in.bad()) throw std::runtime_error("cannot read " + path + ": " + std::strerror(errno));
  return prompts;
}
