/* The chat-template renderer (src/lib.rs): MiniJinja set up as Hugging Face transformers sets up
 * Jinja2 for chat templates. A static library built by cargo; thread-safe (no shared state). */
#ifndef SPECINFER_CHAT_TEMPLATE_H
#define SPECINFER_CHAT_TEMPLATE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Renders the Jinja template `tmpl` (UTF-8, tmpl_len bytes) with the variables of the JSON object
 * `context_json`. Returns 0 and the text in *out, or an error code and its message in *out:
 * 1 the template does not parse, 2 rendering failed (raise_exception() included), 3 the context
 * is not a JSON object in UTF-8, 4 an internal failure. *out is NUL-terminated (*out_len bytes
 * before the NUL; NULL only when out of memory); free it with specinfer_chat_template_free. */
int specinfer_chat_template_render(const char *tmpl, size_t tmpl_len, const char *context_json,
                                   size_t context_len, char **out, size_t *out_len);
void specinfer_chat_template_free(char *text);

#ifdef __cplusplus
}
#endif

#endif
