// Running the `specinfer` command from a test: its exit status and what it printed.
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

struct CliResult {
  int status = -1;  // exit status; -1 when it did not exit normally
  std::string out, err;
};

// A whole file's bytes ("" when it cannot be read).
inline std::string read_all(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// s as one word for /bin/sh.
inline std::string quote(const std::string &s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs `cli args...` with stdout and stderr caught in files under dir.
inline CliResult run_cli(const std::string &cli, const std::string &dir,
                         const std::vector<std::string> &args) {
  const std::string out = dir + "/stdout", err = dir + "/stderr";
  std::string cmd = quote(cli);
  for (const std::string &a : args) cmd.append(" ").append(quote(a));
  cmd.append(" >").append(quote(out)).append(" 2>").append(quote(err));
  const int st = std::system(cmd.c_str());
  CliResult r;
  r.status = st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.out = read_all(out);
  r.err = read_all(err);
  return r;
}
