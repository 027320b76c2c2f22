// `specinfer sketch-eval --model PATH ...`: the inner-product sketch experiment on real query and
// key vectors, captured from the attention layers of a GGUF model while it reads a text.
#pragma once

// argv[0] is "sketch-eval"; returns the process exit code (0 ok, 1 failure, 2 usage error).
int sketch_eval_real(int argc, char **argv);
void sketch_eval_real_usage(const char *indent);
