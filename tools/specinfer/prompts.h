// Prompt files: JSON lines, each an object with a "prompt" string (bench/prompts/*.jsonl, written
// by scripts/make-prompts.py); other keys are ignored and blank lines skipped.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

// The prompts of `path`, the first `limit` only if limit > 0. Throws std::runtime_error with
// "cannot read PATH: reason", or "PATH:LINE: what is wrong" for a line that is not valid JSON, not
// an object, or has no "prompt" string.
std::vector<std::string> read_prompts(const std::string &path, size_t limit = 0);
