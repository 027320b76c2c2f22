// Parses a coupler spec string: KIND[:ARG[:ARG]].
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "coupling/step_coupler.h"
#include "util/error.h"

namespace specinfer {

namespace {

double parse_number(const std::string &spec, const std::string &text) {
  if (text.empty()) fail(SPECINFER_ERR_CONFIG, "coupler '%s': empty parameter", spec.c_str());
  errno = 0;
  char *end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (errno != 0 || end != text.c_str() + text.size() || !std::isfinite(v))
    fail(SPECINFER_ERR_CONFIG, "coupler '%s': '%s' is not a finite number", spec.c_str(),
         text.c_str());
  return v;
}

}  // namespace

std::unique_ptr<Coupler> make_coupler(const std::string &spec) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (;;) {
    size_t colon = spec.find(':', start);
    parts.push_back(
        spec.substr(start, colon == std::string::npos ? std::string::npos : colon - start));
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  const std::string &kind = parts[0];
  const size_t n_args = parts.size() - 1;
  auto no_args = [&]() {
    if (n_args)
      fail(SPECINFER_ERR_CONFIG, "coupler '%s': '%s' takes no parameter", spec.c_str(),
           kind.c_str());
  };
  if (kind == "greedy") {
    no_args();
    return make_greedy_coupler();
  }
  if (kind == "rejection") {
    no_args();
    return make_rejection_coupler(1.0);
  }
  if (kind == "lenient") {
    if (n_args > 1)
      fail(SPECINFER_ERR_CONFIG, "coupler '%s': lenient takes one parameter", spec.c_str());
    double l = n_args ? parse_number(spec, parts[1]) : 0.5;
    return make_rejection_coupler(l);
  }
  if (kind == "gumbel") {
    no_args();
    return make_gumbel_coupler();
  }
  if (kind == "minhash") {
    no_args();
    return make_minhash_coupler();
  }
  if (kind == "typical") {
    if (n_args > 2)
      fail(SPECINFER_ERR_CONFIG, "coupler '%s': typical takes at most two parameters",
           spec.c_str());
    double eps = n_args >= 1 ? parse_number(spec, parts[1]) : 0.09;
    double delta = n_args >= 2 ? parse_number(spec, parts[2]) : 0.3;
    return make_typical_coupler(eps, delta);
  }
  fail(SPECINFER_ERR_CONFIG,
       "coupler '%s': unknown kind '%s' (expected greedy, rejection, lenient:L, gumbel, minhash or "
       "typical[:EPS[:DELTA]])",
       spec.c_str(), kind.c_str());
}

}  // namespace specinfer
