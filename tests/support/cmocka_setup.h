/* Every test includes cmocka through this header, last among its includes and in a block of its
 * own: cmocka.h needs <setjmp.h>, <stdarg.h> and <stddef.h> before it, has C linkage, and its
 * macros (fail, skip, ...) clash with names in the C++ standard headers. */
#ifndef SPECINFER_TEST_CMOCKA_SETUP_H
#define SPECINFER_TEST_CMOCKA_SETUP_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
#include <cmocka.h>
#ifdef __cplusplus
}
#endif

#endif
