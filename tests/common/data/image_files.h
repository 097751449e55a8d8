// Writing the PNG and JPEG files the image-folder tests read: through libpng's simplified API
// and libjpeg, the libraries the reader decodes with (a test that links these needs PNG::PNG
// and JPEG::JPEG, see tests/CMakeLists.txt).
#pragma once

#include <cstddef>
#include <cstdio>
// clang-format off
#include <jpeglib.h>
// clang-format on
#include <png.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace fedfleet::data::testing {

// rows x cols pixels of `channels` (1 grey, 2 grey + alpha, 3 RGB, 4 RGBA) interleaved bytes.
inline bool writePng(const std::string& path, uint32_t rows, uint32_t cols, uint32_t channels,
                     const std::vector<uint8_t>& pixels) {
  static constexpr png_uint_32 kFormats[] = {PNG_FORMAT_GRAY, PNG_FORMAT_GA, PNG_FORMAT_RGB,
                                             PNG_FORMAT_RGBA};
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  image.width = cols;
  image.height = rows;
  image.format = kFormats[channels - 1];
  return png_image_write_to_file(&image, path.c_str(), 0, pixels.data(), 0, nullptr) != 0;
}

// A baseline JPEG of quality `quality`, from 1 (grey) or 3 (RGB) channels. libjpeg's default
// error handler exits the process: these inputs are always valid.
inline bool writeJpeg(const std::string& path, uint32_t rows, uint32_t cols, uint32_t channels,
                      const std::vector<uint8_t>& pixels, int quality = 100) {
  FILE* file = std::fopen(path.c_str(), "wb");
  if (!file) return false;
  jpeg_compress_struct cinfo;
  jpeg_error_mgr errors;
  cinfo.err = jpeg_std_error(&errors);
  jpeg_create_compress(&cinfo);
  jpeg_stdio_dest(&cinfo, file);
  cinfo.image_width = cols;
  cinfo.image_height = rows;
  cinfo.input_components = static_cast<int>(channels);
  cinfo.in_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(pixels.data()) +
                   static_cast<size_t>(cinfo.next_scanline) * cols * channels;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  return std::fclose(file) == 0;
}

// rows x cols pixels all of `colour` (its size is the channel count).
inline std::vector<uint8_t> solid(uint32_t rows, uint32_t cols, std::vector<uint8_t> colour) {
  std::vector<uint8_t> out;
  out.reserve(static_cast<size_t>(rows) * cols * colour.size());
  for (size_t i = 0; i < static_cast<size_t>(rows) * cols; ++i) {
    out.insert(out.end(), colour.begin(), colour.end());
  }
  return out;
}

}  // namespace fedfleet::data::testing
