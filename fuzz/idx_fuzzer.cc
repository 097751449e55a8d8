// Fuzzes the IDX reader of common/data/dataset.h through parseIdx, the in-memory entry point
// loadIdx runs once it has read the files: an images file and a labels file, each plain or
// gzip-compressed. Beyond "no crash", it checks what parseIdx promises of a data set it returns
// (a non-empty image shape, exactly size() x rows x cols pixels, labels below num_classes, at
// most `limit` samples), that failures are CORRUPT or RESOURCE_EXHAUSTED, and that a file
// gzip-compressed here reads exactly as the plain file does.
//
// Input layout: byte 0 control (bit 0: gzip the images here, bit 1: gzip the labels here, bit 2:
// apply a limit), byte 1 the limit, bytes 2-5 the images file's length (little endian, modulo
// the bytes left + 1), the images file, then the labels file (the rest). Seeds hold gzip files
// too, so the inflating path also sees damaged streams.

#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/data/dataset.h"
#include "fuzz/fuzz_input.h"

namespace fedfleet::data {
namespace {

// A gzip file holding `plain`. Level 1, a 512-byte window and the smallest memory level: the
// harness should spend its time in the reader, not in deflate's setup.
std::string gzip(std::string_view plain) {
  z_stream z{};
  FUZZ_CHECK(deflateInit2(&z, 1, Z_DEFLATED, 9 + 16, 1, Z_DEFAULT_STRATEGY) == Z_OK,
             "deflateInit2");
  std::string out(deflateBound(&z, plain.size()), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(plain.data()));
  z.avail_in = static_cast<uInt>(plain.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  FUZZ_CHECK(deflate(&z, Z_FINISH) == Z_STREAM_END, "deflate");
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

bool looksGzip(std::string_view bytes) {
  return bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0x1f &&
         static_cast<unsigned char>(bytes[1]) == 0x8b;
}

void checkResult(const Result<Dataset>& ds, size_t limit) {
  if (!ds.isOk()) {
    FUZZ_CHECK(ds.status().code() == StatusCode::kCorrupt ||
                   ds.status().code() == StatusCode::kResourceExhausted,
               ds.status().toString().c_str());
    return;
  }
  FUZZ_CHECK(ds->size() > 0, "a data set without samples");
  FUZZ_CHECK(limit == 0 || ds->size() <= limit, "more samples than the limit");
  FUZZ_CHECK(ds->rows > 0 && ds->cols > 0 && !ds->hasFeatures(), "not an image data set");
  FUZZ_CHECK(ds->images.size() == ds->size() * ds->imageBytes(), "pixel count");
  FUZZ_CHECK(checkSampleStorage(*ds).isOk(), "checkSampleStorage");
  for (uint8_t l : ds->labels) FUZZ_CHECK(l < ds->num_classes, "label above num_classes");
}

bool sameDataset(const Result<Dataset>& a, const Result<Dataset>& b) {
  if (a.isOk() != b.isOk()) return false;
  if (!a.isOk()) return a.status().code() == b.status().code();
  return a->rows == b->rows && a->cols == b->cols && a->num_classes == b->num_classes &&
         a->images == b->images && a->labels == b->labels;
}

}  // namespace
}  // namespace fedfleet::data

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using fedfleet::Result;
  using namespace fedfleet::data;
  fedfleet::fuzz::FuzzInput in(data, size);
  const uint8_t control = in.u8();
  const uint8_t limit_byte = in.u8();
  const size_t limit = (control & 4) ? limit_byte : 0;
  const uint32_t images_len = in.u32();
  const std::string_view images = in.take(images_len % (in.left() + 1));
  const std::string_view labels = in.rest();

  const Result<Dataset> plain = parseIdx(images, labels, limit);
  checkResult(plain, limit);
  if ((control & 3) == 0) return 0;

  // The same files gzip-compressed here must read as they did plain (unless a "plain" file
  // already started with the gzip magic, and so was inflated).
  const std::string images_gz = (control & 1) ? gzip(images) : std::string(images);
  const std::string labels_gz = (control & 2) ? gzip(labels) : std::string(labels);
  const Result<Dataset> packed = parseIdx(images_gz, labels_gz, limit, "images.gz", "labels.gz");
  checkResult(packed, limit);
  if (!looksGzip(images) && !looksGzip(labels)) {
    FUZZ_CHECK(sameDataset(plain, packed), "a gzip file reads differently from the plain one");
  }
  return 0;
}
