// The stop strings of `specinfer serve` (tools/specinfer/serve_stop.h): the text ends right before
// the earliest stop string whatever pieces it arrives in, and nothing of a stop string is released
// before it is known not to be one.
#include "serve_stop.h"

#include <string>
#include <vector>

#include "support/cmocka_setup.h"

using serve::StopMatcher;

namespace {

// Feeds `pieces` and returns everything released, flush included.
std::string run(std::vector<std::string> stops, const std::vector<std::string> &pieces,
                bool *stopped = nullptr) {
  StopMatcher m(std::move(stops));
  std::string out;
  for (const std::string &p : pieces) out += m.push(p);
  out += m.flush();
  if (stopped) *stopped = m.stopped();
  return out;
}

// Every way of cutting `text` into two or three pieces gives the same result as one piece.
void check_all_splits(const std::vector<std::string> &stops, const std::string &text,
                      const std::string &expected, bool expect_stop) {
  bool stopped = false;
  assert_string_equal(run(stops, {text}, &stopped).c_str(), expected.c_str());
  assert_int_equal(stopped, expect_stop);
  for (size_t i = 0; i <= text.size(); ++i)
    for (size_t j = i; j <= text.size(); ++j) {
      const std::vector<std::string> pieces = {text.substr(0, i), text.substr(i, j - i),
                                               text.substr(j)};
      assert_string_equal(run(stops, pieces, &stopped).c_str(), expected.c_str());
      assert_int_equal(stopped, expect_stop);
    }
}

void test_no_stops(void **) {
  check_all_splits({}, "hello world", "hello world", false);
  check_all_splits({""}, "hello world", "hello world", false);  // "" is no stop string
}

void test_cut_before_stop(void **) {
  check_all_splits({"\n\n"}, "def f():\n    pass\n\nprint(1)", "def f():\n    pass", true);
  check_all_splits({"world"}, "hello world and more", "hello ", true);
  check_all_splits({"hello"}, "hello", "", true);
}

void test_earliest_stop_wins(void **) {
  check_all_splits({"more", "world"}, "hello world and more", "hello ", true);
  check_all_splits({"lo w", "hello"}, "hello world", "", true);
}

void test_overlapping_prefixes(void **) {
  // The text's "aa" could begin "aab" twice over; only the second one does.
  check_all_splits({"aab"}, "xaaab", "xa", true);
  check_all_splits({"abab"}, "abaabab", "aba", true);
  // A tail that looked like a stop string's start but was not is released in the end.
  check_all_splits({"abc"}, "xxab", "xxab", false);
}

void test_held_back_until_known(void **) {
  StopMatcher m({"</s>"});
  assert_string_equal(m.push("text<").c_str(), "text");  // "<" may begin the stop string
  assert_string_equal(m.push("/").c_str(), "");
  assert_string_equal(m.push("x").c_str(), "</x");  // it did not
  assert_string_equal(m.push("</s>tail").c_str(), "");
  assert_true(m.stopped());
  assert_string_equal(m.push("later").c_str(), "");  // after the stop, nothing
  assert_string_equal(m.flush().c_str(), "");
}

void test_utf8_kept_whole(void **) {
  // A stop string starting with a multi-byte character: text before it is released whole.
  check_all_splits({"ü!"}, "grüße ü!", "grüße ", true);
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_no_stops),
      cmocka_unit_test(test_cut_before_stop),
      cmocka_unit_test(test_earliest_stop_wins),
      cmocka_unit_test(test_overlapping_prefixes),
      cmocka_unit_test(test_held_back_until_known),
      cmocka_unit_test(test_utf8_kept_whole),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
