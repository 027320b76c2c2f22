// Durations as the progress lines of long commands print them.
#pragma once

#include <string>

namespace cli {

// "m:ss", or "h:mm:ss" from an hour on; "--:--" for a negative or unknown (NaN) time.
std::string clock_text(double seconds);

}  // namespace cli
