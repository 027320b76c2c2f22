/* demo.c — the smallest specinfer program: a kgram target, the ngram drafter, greedy decoding.
 *   cc demo.c $(pkg-config --cflags --libs specinfer) -o demo && ./demo training.txt "prompt"  */
#include <stdio.h>
#include <string.h>

#include <specinfer.h>

static int print_text(void *user, const int32_t *tokens, size_t n, const char *text, size_t len) {
  (void)user;
  (void)tokens;
  (void)n;
  fwrite(text, 1, len, stdout);
  return 0; /* go on */
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s TRAINING_TEXT PROMPT\n", argv[0]);
    return 2;
  }
  specinfer_registry *reg = NULL;
  specinfer_target *target = NULL;
  specinfer_drafter *drafter = NULL;
  specinfer_session *session = NULL;
  char *err = NULL, config[4096];
  int rc = 1;

  if (specinfer_registry_create(NULL, &reg, &err) != SPECINFER_OK) goto done;
  snprintf(config, sizeof config, "path=%s,k=6", argv[1]);
  if (specinfer_target_open(reg, "kgram", config, &target, &err) != SPECINFER_OK) goto done;
  if (specinfer_drafter_open(reg, "ngram", "n_max=4", target, &drafter, &err) != SPECINFER_OK)
    goto done;
  if (specinfer_session_create(target, drafter, NULL, NULL, &session, &err) != SPECINFER_OK)
    goto done;
  if (specinfer_session_feed_text(session, argv[2], strlen(argv[2])) != SPECINFER_OK ||
      specinfer_session_generate(session, 200, print_text, NULL) != SPECINFER_OK) {
    fprintf(stderr, "error: %s\n", specinfer_session_errmsg(session));
    goto done;
  }
  specinfer_session_stats st;
  specinfer_session_stats_init(&st);
  specinfer_session_get_stats(session, &st);
  printf("\n%lld tokens, acceptance %.2f, %.2f tokens per target pass\n", (long long)st.n_generated,
         st.acceptance_rate, st.mean_accepted);
  rc = 0;
done:
  if (err) fprintf(stderr, "error: %s\n", err);
  specinfer_free(err);
  specinfer_session_destroy(session);
  specinfer_drafter_destroy(drafter);
  specinfer_target_destroy(target);
  specinfer_registry_destroy(reg);
  return rc;
}
