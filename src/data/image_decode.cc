// decodeImage: PNG through libpng's simplified API and JPEG through libjpeg-turbo, whose
// error exits are turned into a return here (a longjmp back into this file) and then into a
// FormatError, so that no corrupt file can end the process.
#include <png.h>
// jpeglib.h needs FILE and size_t declared first.
#include <csetjmp>
#include <cstdio>
#include <cstring>

#include <jpeglib.h>

#include "kolo/error.h"
#include "kolo/image_folder.h"

namespace kolo::data {
namespace {

constexpr uint64_t kMaxPixels = uint64_t(1) << 28;

DecodedImage decodePng(const uint8_t* data, size_t size, int64_t channels, const std::string& source) {
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&image, data, size))
    KOLO_THROW(FormatError, source, ": cannot decode PNG (", image.message, ")");
  if (uint64_t(image.width) * image.height > kMaxPixels) {
    png_image_free(&image);
    KOLO_THROW(FormatError, source, ": PNG of ", image.width, "x", image.height, " pixels is implausibly large");
  }
  const bool grey = channels == 1 || (channels == 0 && (image.format & PNG_FORMAT_FLAG_COLOR) == 0);
  image.format = grey ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  // The pixels are deflated: a file cannot hold more than deflate's 1032:1 of its bytes (so
  // a small file claiming a huge image is refused before the buffer is allocated).
  if (uint64_t(image.width) * image.height > uint64_t(size) * 1032 + 4096) {
    png_image_free(&image);
    KOLO_THROW(FormatError, source, ": PNG of ", size, " bytes claims ", image.width, "x", image.height,
               " pixels, more than its compressed data can hold (truncated or corrupt)");
  }
  DecodedImage out;
  out.channels = grey ? 1 : 3;
  out.height = image.height;
  out.width = image.width;
  out.pixels.resize(PNG_IMAGE_SIZE(image));
  // A transparent image is composed over black (no background given).
  if (!png_image_finish_read(&image, nullptr, out.pixels.data(), 0, nullptr))
    KOLO_THROW(FormatError, source, ": cannot decode PNG (", image.message, ")");
  return out;
}

struct JpegError {
  jpeg_error_mgr manager;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void jpegErrorExit(j_common_ptr info) {
  JpegError* error = reinterpret_cast<JpegError*>(info->err);
  (*info->err->format_message)(info, error->message);
  std::longjmp(error->jump, 1);
}

// Between setjmp and the longjmp back only C objects live (no destructor is skipped): the
// pixels go into a buffer the caller owns.
bool decodeJpegInto(const uint8_t* data, size_t size, int64_t channels, DecodedImage& out, JpegError& error) {
  jpeg_decompress_struct info;
  info.err = jpeg_std_error(&error.manager);
  error.manager.error_exit = jpegErrorExit;
  error.message[0] = 0;
  if (setjmp(error.jump)) {
    jpeg_destroy_decompress(&info);
    return false;
  }
  jpeg_create_decompress(&info);
  jpeg_mem_src(&info, data, static_cast<unsigned long>(size));
  jpeg_read_header(&info, TRUE);
  const bool grey = channels == 1 || (channels == 0 && info.num_components == 1);
  info.out_color_space = grey ? JCS_GRAYSCALE : JCS_RGB;
  if (uint64_t(info.image_width) * info.image_height > kMaxPixels) {
    std::snprintf(error.message, sizeof error.message, "%ux%u pixels is implausibly large", info.image_width,
                  info.image_height);
    jpeg_destroy_decompress(&info);
    return false;
  }
  jpeg_start_decompress(&info);
  out.channels = info.output_components;
  out.height = info.output_height;
  out.width = info.output_width;
  out.pixels.resize(size_t(out.channels * out.height * out.width));
  const size_t stride = size_t(out.channels * out.width);
  while (info.output_scanline < info.output_height) {
    JSAMPROW row = out.pixels.data() + info.output_scanline * stride;
    jpeg_read_scanlines(&info, &row, 1);
  }
  jpeg_finish_decompress(&info);
  jpeg_destroy_decompress(&info);
  // libjpeg fills a truncated image's missing rows with grey and warns: refused here.
  if (error.manager.num_warnings > 0) {
    std::snprintf(error.message, sizeof error.message, "truncated or corrupt data");
    return false;
  }
  return true;
}

}  // namespace

DecodedImage decodeImage(const uint8_t* data, size_t size, int64_t channels, const std::string& source) {
  KOLO_REQUIRE(channels == 0 || channels == 1 || channels == 3, source, ": images convert to 1 or 3 channels, not ",
               channels);
  static const uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (size >= 8 && std::memcmp(data, kPng, 8) == 0) return decodePng(data, size, channels, source);
  if (size >= 3 && data[0] == 0xff && data[1] == 0xd8 && data[2] == 0xff) {
    DecodedImage out;
    JpegError error;
    if (!decodeJpegInto(data, size, channels, out, error))
      KOLO_THROW(FormatError, source, ": cannot decode JPEG (", error.message, ")");
    return out;
  }
  KOLO_THROW(FormatError, source, ": not a PNG or JPEG image (", size < 8 ? "too short" : "unknown signature", ")");
}

}  // namespace kolo::data
