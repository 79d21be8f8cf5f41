// Parquet prep input: one string column (DocReaderOptions::text_field) of a
// .parquet file, one document per row, read row group by row group (memory:
// one row group of that column). Built only with the CMake option
// WIOLA_PARQUET (Apache Arrow's C++ libraries from the pyarrow wheel,
// docs/data.md); without it reading a Parquet file fails saying how to
// enable it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "data/text_input.h"

namespace wiola {

// Whether this build reads Parquet.
bool parquet_supported();

// As read_documents (data/text_input.h): rows in order, empty texts
// skipped; a null or invalid UTF-8 value is a malformed row
// ("file: row N: ..."), a file Arrow cannot read or without the column a
// malformed file.
void read_parquet_documents(const std::string& path, const DocReaderOptions& opt,
                            const std::function<void(std::string&&)>& on_doc,
                            const std::function<void(uint64_t)>& on_bytes,
                            const std::function<void(const std::string&)>& on_skip);

}  // namespace wiola
