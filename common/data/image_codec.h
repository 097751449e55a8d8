// Image files in memory -> pixels: PNG through libpng's simplified API, JPEG through libjpeg
// (libjpeg-turbo), both as Debian ships them; and the resampling that brings every image of a
// folder to one size (common/data/image_folder.h).
//
// Colour is converted as torchvision's default loader (PIL) converts it: an alpha channel is
// dropped, grey is repeated into R, G and B, and RGB becomes grey as ITU-R 601 luma
// (0.299 R + 0.587 G + 0.114 B, PIL's fixed-point rounding); a colour JPEG decoded to grey is its
// Y plane. Neither library may longjmp over a C++ object: libpng's simplified API keeps its
// setjmp inside libpng, and the libjpeg calls run in plain-C frames under their own setjmp.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace fedfleet::data {

// Pixels of one image: rows x cols x channels bytes, row-major, channels interleaved.
struct Image {
  uint32_t rows = 0, cols = 0, channels = 0;
  std::vector<uint8_t> pixels;
};

// The largest side decodeImage takes: a bigger header is refused before anything is allocated.
inline constexpr uint32_t kMaxImageSide = 16384;

// Decodes a PNG or a JPEG (told apart by their signatures, whatever the file is called) into
// `out` with `channels` (1: grey, 3: RGB) channels, reusing out.pixels' memory. `name` (the
// file) opens every message. Failures: kCorrupt for bytes that are neither, or a damaged,
// truncated or otherwise undecodable image (the library's reason in the message; a JPEG that
// libjpeg would only warn about counts as damaged); kInvalidArgument for a side above
// kMaxImageSide or channels not 1 or 3. Never throws or aborts, whatever the bytes.
Status decodeImage(std::string_view bytes, uint32_t channels, const std::string& name, Image& out);

// Resamples `src` to rows x cols (both > 0) into `dst` (same channels) with a triangle
// (bilinear) filter whose support widens with the reduction, as PIL's Image.resize(BILINEAR)
// does: enlarging interpolates between the two nearest pixels, reducing averages the source
// pixels each output pixel covers (2x2 -> 1x1 is the mean of the four). Pixel centres sit at
// half-integers. Results are rounded to the nearest byte.
void resizeImage(const Image& src, uint32_t rows, uint32_t cols, Image& dst);

}  // namespace fedfleet::data
