// The core's error type: specinfer::Error (a status code and a message), fail() and format(),
// from common/status_error.h, which the plugins share. Core code throws it; the extern "C" shims
// in lib/api catch it (and std::bad_alloc, and anything else) and turn it into a status code plus
// message.
#pragma once

#include "../../common/status_error.h"
