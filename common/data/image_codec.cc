#include "common/data/image_codec.h"

// libjpeg's header needs size_t and FILE declared before it.
#include <cstddef>
#include <cstdio>
// clang-format off
#include <jpeglib.h>
// clang-format on
#include <png.h>

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstring>

namespace fedfleet::data {
namespace {

Status checkSides(uint32_t rows, uint32_t cols, const std::string& name) {
  if (rows == 0 || cols == 0) return corrupt(name + ": the image has no pixels");
  if (rows > kMaxImageSide || cols > kMaxImageSide) {
    return invalidArgument(name + ": the image is " + std::to_string(cols) + "x" +
                           std::to_string(rows) + " pixels, more than the " +
                           std::to_string(kMaxImageSide) + " a side this reader takes");
  }
  return Status::ok();
}

void shape(Image& out, uint32_t rows, uint32_t cols, uint32_t channels) {
  out.rows = rows;
  out.cols = cols;
  out.channels = channels;
  out.pixels.resize(static_cast<size_t>(rows) * cols * channels);
}

// ITU-R 601 luma with PIL's rounding (its L24 macro): the weights add up to 65536.
uint8_t luma(const uint8_t* rgb) {
  return static_cast<uint8_t>((rgb[0] * 19595u + rgb[1] * 38470u + rgb[2] * 7471u + 0x8000u) >> 16);
}

// n pixels of `from` channels (1 grey, 2 grey + alpha, 3 RGB, 4 RGBA) -> `to` channels (1, 3).
void convertPixels(const uint8_t* src, size_t n, uint32_t from, uint8_t* dst, uint32_t to) {
  const bool colour = from >= 3;
  for (size_t i = 0; i < n; ++i, src += from) {
    if (to == 1) {
      dst[i] = colour ? luma(src) : src[0];
    } else {
      uint8_t* d = dst + 3 * i;
      d[0] = src[0];
      d[1] = colour ? src[1] : src[0];
      d[2] = colour ? src[2] : src[0];
    }
  }
}

Status decodePng(std::string_view bytes, uint32_t channels, const std::string& name, Image& out) {
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  // Frees libpng's state on every return (a second free after libpng freed it is a no-op).
  struct Release {
    png_image* image;
    ~Release() { png_image_free(image); }
  } release{&image};
  if (!png_image_begin_read_from_memory(&image, bytes.data(), bytes.size())) {
    return corrupt(name + ": not a readable PNG image (libpng: " + image.message + ")");
  }
  FEDFLEET_RETURN_IF_ERROR(checkSides(image.height, image.width, name));
  const bool colour = (image.format & PNG_FORMAT_FLAG_COLOR) != 0;
  const bool alpha = (image.format & PNG_FORMAT_FLAG_ALPHA) != 0;
  // The file's own layout (a palette expanded), alpha kept so that it can be dropped as PIL
  // drops it rather than composited.
  image.format = (colour ? PNG_FORMAT_RGB : PNG_FORMAT_GRAY) | (alpha ? PNG_FORMAT_FLAG_ALPHA : 0);
  const uint32_t from = PNG_IMAGE_SAMPLE_CHANNELS(image.format);
  shape(out, image.height, image.width, channels);
  std::vector<uint8_t> decoded;
  if (from != channels) decoded.resize(static_cast<size_t>(image.height) * image.width * from);
  uint8_t* into = from == channels ? out.pixels.data() : decoded.data();
  if (!png_image_finish_read(&image, /*background=*/nullptr, into, /*row_stride=*/0,
                             /*colormap=*/nullptr)) {
    return corrupt(name + ": damaged or truncated PNG image (libpng: " + image.message + ")");
  }
  if (from != channels) {
    convertPixels(decoded.data(), static_cast<size_t>(out.rows) * out.cols, from, out.pixels.data(),
                  channels);
  }
  return Status::ok();
}

// libjpeg reports a fatal error through error_exit, which must not return: it longjmps back to
// the setjmp of the plain-C phase below that made the call. A warning (corrupt data libjpeg
// would paper over with made-up pixels, a file that ends early) is kept and fails the decode
// once libjpeg has returned.
struct JpegErrors {
  jpeg_error_mgr mgr;  // first: libjpeg hands back cinfo->err, a pointer to it
  std::jmp_buf jump;
  bool warned = false;
  char message[JMSG_LENGTH_MAX] = {};
};

void jpegErrorExit(j_common_ptr cinfo) {
  auto* errors = reinterpret_cast<JpegErrors*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, errors->message);
  std::longjmp(errors->jump, 1);
}

void jpegEmitMessage(j_common_ptr cinfo, int level) {
  auto* errors = reinterpret_cast<JpegErrors*>(cinfo->err);
  if (level < 0 && !errors->warned) {  // level >= 0: trace messages
    errors->warned = true;
    (*cinfo->err->format_message)(cinfo, errors->message);
  }
}

// The two phases that call into libjpeg, each under its own setjmp. Between a setjmp and a
// longjmp back to it only plain C data live in these frames, so nothing is skipped that
// would need destroying. Each returns false after a fatal libjpeg error.
bool jpegStart(jpeg_decompress_struct* cinfo, JpegErrors* errors, const uint8_t* data, size_t size,
               J_COLOR_SPACE space) {
  if (setjmp(errors->jump)) return false;
  jpeg_create_decompress(cinfo);
  jpeg_mem_src(cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(cinfo, TRUE);
  cinfo->out_color_space = space;
  jpeg_start_decompress(cinfo);
  return true;
}

bool jpegFinish(jpeg_decompress_struct* cinfo, JpegErrors* errors, uint8_t* pixels, size_t stride) {
  if (setjmp(errors->jump)) return false;
  while (cinfo->output_scanline < cinfo->output_height) {
    JSAMPROW row = pixels + cinfo->output_scanline * stride;
    jpeg_read_scanlines(cinfo, &row, 1);
  }
  jpeg_finish_decompress(cinfo);
  return true;
}

Status decodeJpeg(std::string_view bytes, uint32_t channels, const std::string& name, Image& out) {
  jpeg_decompress_struct cinfo;
  std::memset(&cinfo, 0, sizeof cinfo);
  JpegErrors errors;
  cinfo.err = jpeg_std_error(&errors.mgr);
  errors.mgr.error_exit = jpegErrorExit;
  errors.mgr.emit_message = jpegEmitMessage;
  // jpeg_destroy_decompress is safe after a failure anywhere, and on a struct never created.
  struct Release {
    jpeg_decompress_struct* cinfo;
    ~Release() { jpeg_destroy_decompress(cinfo); }
  } release{&cinfo};
  auto failed = [&](const char* what) {
    return corrupt(name + ": " + what + " JPEG image (libjpeg: " + errors.message + ")");
  };
  if (!jpegStart(&cinfo, &errors, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                 channels == 1 ? JCS_GRAYSCALE : JCS_RGB)) {
    return failed("not a readable");
  }
  FEDFLEET_RETURN_IF_ERROR(checkSides(cinfo.output_height, cinfo.output_width, name));
  if (static_cast<uint32_t>(cinfo.output_components) != channels) {
    return corrupt(name + ": the JPEG decoder gave " + std::to_string(cinfo.output_components) +
                   " channels, not " + std::to_string(channels));
  }
  shape(out, cinfo.output_height, cinfo.output_width, channels);
  if (!jpegFinish(&cinfo, &errors, out.pixels.data(), static_cast<size_t>(out.cols) * channels)) {
    return failed("damaged");
  }
  if (errors.warned) return failed("damaged or truncated");
  return Status::ok();
}

// One axis of the resampling: output pixel i is the sum over k < count[i] of
// weights[i * stride + k] times input pixel first[i] + k.
struct Taps {
  std::vector<uint32_t> first, count;
  std::vector<float> weights;
  size_t stride = 0;
};

// PIL's precompute_coeffs for its bilinear (triangle) filter.
Taps tapsFor(uint32_t in, uint32_t out) {
  const double scale = static_cast<double>(in) / out;
  const double filter_scale = std::max(scale, 1.0);
  const double support = filter_scale;  // the triangle's support is 1, widened on reduction
  Taps taps;
  taps.stride = static_cast<size_t>(std::ceil(support)) * 2 + 1;
  taps.first.resize(out);
  taps.count.resize(out);
  taps.weights.assign(out * taps.stride, 0.0f);
  for (uint32_t i = 0; i < out; ++i) {
    const double centre = (i + 0.5) * scale;
    const auto lo = static_cast<uint32_t>(std::max(centre - support + 0.5, 0.0));
    const auto hi = std::min(static_cast<uint32_t>(centre + support + 0.5), in);
    float* w = &taps.weights[i * taps.stride];
    double sum = 0;
    uint32_t n = 0;
    for (uint32_t p = lo; p < hi && n < taps.stride; ++p, ++n) {
      const double d = std::abs((p + 0.5 - centre) / filter_scale);
      w[n] = static_cast<float>(d < 1 ? 1 - d : 0);
      sum += w[n];
    }
    for (uint32_t k = 0; k < n && sum > 0; ++k) w[k] = static_cast<float>(w[k] / sum);
    taps.first[i] = lo;
    taps.count[i] = n;
  }
  return taps;
}

}  // namespace

Status decodeImage(std::string_view bytes, uint32_t channels, const std::string& name, Image& out) {
  static constexpr unsigned char kPng[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  static constexpr unsigned char kJpeg[] = {0xff, 0xd8, 0xff};
  if (channels != 1 && channels != 3) {
    return invalidArgument(name + ": images are decoded to 1 or 3 channels, not " +
                           std::to_string(channels));
  }
  auto startsWith = [&](const unsigned char* magic, size_t n) {
    return bytes.size() >= n && std::memcmp(bytes.data(), magic, n) == 0;
  };
  if (startsWith(kPng, sizeof kPng)) return decodePng(bytes, channels, name, out);
  if (startsWith(kJpeg, sizeof kJpeg)) return decodeJpeg(bytes, channels, name, out);
  return corrupt(name + ": neither a PNG nor a JPEG image (" +
                 (bytes.empty() ? std::string("an empty file") : "no PNG or JPEG signature") + ")");
}

void resizeImage(const Image& src, uint32_t rows, uint32_t cols, Image& dst) {
  const uint32_t c = src.channels;
  shape(dst, rows, cols, c);
  const Taps across = tapsFor(src.cols, cols), down = tapsFor(src.rows, rows);
  // Across each source row into `wide` (src.rows x cols), then down each column.
  std::vector<float> wide(static_cast<size_t>(src.rows) * cols * c);
  for (uint32_t y = 0; y < src.rows; ++y) {
    const uint8_t* in = src.pixels.data() + static_cast<size_t>(y) * src.cols * c;
    float* o = wide.data() + static_cast<size_t>(y) * cols * c;
    for (uint32_t x = 0; x < cols; ++x) {
      const float* w = &across.weights[x * across.stride];
      for (uint32_t ch = 0; ch < c; ++ch) {
        float v = 0;
        for (uint32_t k = 0; k < across.count[x]; ++k) {
          v += w[k] * in[(across.first[x] + k) * c + ch];
        }
        o[x * c + ch] = v;
      }
    }
  }
  const size_t row_len = static_cast<size_t>(cols) * c;
  for (uint32_t y = 0; y < rows; ++y) {
    const float* w = &down.weights[y * down.stride];
    uint8_t* o = dst.pixels.data() + y * row_len;
    for (size_t j = 0; j < row_len; ++j) {
      float v = 0;
      for (uint32_t k = 0; k < down.count[y]; ++k) {
        v += w[k] * wide[(down.first[y] + k) * row_len + j];
      }
      o[j] = static_cast<uint8_t>(std::lround(std::clamp(v, 0.0f, 255.0f)));
    }
  }
}

}  // namespace fedfleet::data
