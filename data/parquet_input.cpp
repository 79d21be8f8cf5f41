#include "data/parquet_input.h"

#include "util/error.h"

#if WIOLA_HAVE_PARQUET
#include <arrow/api.h>
#include <arrow/io/file.h>
#include <parquet/arrow/reader.h>
#include <parquet/file_reader.h>

#include <filesystem>

#include "data/byte_level.h"
#endif

namespace wiola {

#if WIOLA_HAVE_PARQUET

namespace {

// One Parquet file's text column, row group by row group.
class ParquetDocuments {
 public:
  ParquetDocuments(const std::string& path, const DocReaderOptions& opt, const std::function<void(std::string&&)>& on_doc,
                   const std::function<void(const std::string&)>& on_skip)
      : path_(path), opt_(opt), on_doc_(on_doc), on_skip_(on_skip) {}

  // Opens the file; the number of row groups.
  int open() {
    auto file = arrow::io::ReadableFile::Open(path_);
    if (!file.ok()) fail(path_, ": cannot open: ", file.status().ToString());
    const arrow::Status st = parquet::arrow::OpenFile(*file, arrow::default_memory_pool(), &reader_);
    if (!st.ok()) malformed(path_, ": not a readable Parquet file (", st.ToString(), ")");
    column_ = reader_->parquet_reader()->metadata()->schema()->ColumnIndex(opt_.text_field);
    if (column_ < 0) malformed(path_, ": no column \"", opt_.text_field, "\"");
    return reader_->num_row_groups();
  }

  void read_row_group(int g) {
    std::shared_ptr<arrow::Table> table;
    const arrow::Status st = reader_->ReadRowGroup(g, {column_}, &table);
    if (!st.ok()) malformed(path_, ": row group ", g, ": cannot read (", st.ToString(), ")");
    for (const std::shared_ptr<arrow::Array>& chunk : table->column(0)->chunks()) {
      if (chunk->type_id() == arrow::Type::STRING) rows(static_cast<const arrow::StringArray&>(*chunk));
      else if (chunk->type_id() == arrow::Type::LARGE_STRING) rows(static_cast<const arrow::LargeStringArray&>(*chunk));
      else malformed(path_, ": column \"", opt_.text_field, "\" is ", chunk->type()->ToString(), ", not a string column");
    }
  }

 private:
  template <class A>
  void rows(const A& a) {
    for (int64_t i = 0; i < a.length(); ++i) {
      ++row_;
      try {
        std::string text = row_text(a, i);
        if (!text.empty()) on_doc_(std::move(text));
      } catch (const MalformedInput& e) {
        skip_malformed(e, opt_, on_skip_, "; skipped the row");
      }
    }
  }
  template <class A>
  std::string row_text(const A& a, int64_t i) const {
    if (a.IsNull(i)) malformed(path_, ": row ", row_, ": \"", opt_.text_field, "\" is null");
    const std::string_view v = a.GetView(i);
    size_t bad = 0;
    if (!valid_utf8(v, &bad)) malformed(path_, ": row ", row_, ": invalid UTF-8 (byte ", bad + 1, " of the value)");
    return std::string(v);
  }

  const std::string& path_;
  const DocReaderOptions& opt_;
  const std::function<void(std::string&&)>& on_doc_;
  const std::function<void(const std::string&)>& on_skip_;
  std::unique_ptr<parquet::arrow::FileReader> reader_;
  int column_ = -1;
  uint64_t row_ = 0;  // 1-based number of the row being read
};

}  // namespace

bool parquet_supported() { return true; }

void read_parquet_documents(const std::string& path, const DocReaderOptions& opt,
                            const std::function<void(std::string&&)>& on_doc,
                            const std::function<void(uint64_t)>& on_bytes,
                            const std::function<void(const std::string&)>& on_skip) {
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec) fail(path, ": cannot read: ", ec.message());
  uint64_t reported = 0;
  try {
    ParquetDocuments docs(path, opt, on_doc, on_skip);
    const int groups = docs.open();
    for (int g = 0; g < groups; ++g) {
      docs.read_row_group(g);
      const uint64_t done = size * uint64_t(g + 1) / uint64_t(groups);  // progress: the file's share read
      on_bytes(done - reported);
      reported = done;
    }
  } catch (const MalformedInput& e) {
    skip_malformed(e, opt, on_skip, "; skipped the rest of the file");
  }
  on_bytes(size - reported);
}

#else  // built without Arrow

bool parquet_supported() { return false; }

void read_parquet_documents(const std::string& path, const DocReaderOptions&,
                            const std::function<void(std::string&&)>&, const std::function<void(uint64_t)>&,
                            const std::function<void(const std::string&)>&) {
  fail(path, ": this wiola was built without Parquet input; install Apache Arrow's C++ libraries with "
             "`pip install 'pyarrow<18'` and reconfigure with -DWIOLA_PARQUET=ON (docs/data.md)");
}

#endif

}  // namespace wiola
