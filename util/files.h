// Small process and file helpers shared by the entry points.
#pragma once

#include <string>

namespace wiola {

// Writes `text` to path + ".tmp", then renames it to `path`, so a reader
// never sees a half-written file. Throws wiola::Error naming the path.
void write_text_atomic(const std::string& path, const std::string& text);

// Peak resident set size of this process, MiB.
double peak_rss_mib();

}  // namespace wiola
