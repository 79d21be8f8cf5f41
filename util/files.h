// Small process and file helpers shared by the entry points.
#pragma once

#include <string>

namespace wiola {

// Writes `text` to path + ".tmp", then renames it to `path`, so a reader
// never sees a half-written file. Throws wiola::Error naming the path.
void write_text_atomic(const std::string& path, const std::string& text);

// Peak resident set size of this process, MiB.
double peak_rss_mib();
// A name a manifest may give to a file of its own folder: not empty, no
// '/', not "." or ".." (so it cannot point elsewhere).
bool is_plain_file_name(const std::string& name);

}  // namespace wiola
