// ImageFolder against images written by PIL (PNG and JPEG, RGB and grey, decoded by the same
// Debian libraries PIL reads them with): pixels value by value, classes in sorted order;
// augmentations that are a shift and flip of the image, the same for a seed, epoch and sample
// whatever the batch; and the refusals (a missing class folder, a truncated image, an image
// of another size, no class folder).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "files_support.h"
#include "kolo/data_files.h"
#include "kolo/image_folder.h"
#include "support/error_text.h"

namespace kolo::data {
namespace {

using kolo::testing::errorOf;
using testing::runPython;
using testing::ScratchDir;
using ::testing::HasSubstr;

bool havePil() {
  static const bool have = std::system("/usr/bin/python3 -c 'import PIL, numpy' >/dev/null 2>&1") == 0;
  return have;
}

// root/{bird,cat}/*.png and a JPEG, 7x5 RGB, and expected.npy: every image's pixels as PIL
// decodes them, in ImageFolder's order (class, then file name).
const char* kMakeImages = R"(
from PIL import Image
import os
rng = np.random.default_rng(1)
expected = []
for cls, count in (('cat', 3), ('bird', 2)):
    os.makedirs('root/' + cls, exist_ok=True)
    for i in range(count):
        a = rng.integers(0, 256, (5, 7, 3), dtype=np.uint8)
        Image.fromarray(a).save('root/%s/%d.png' % (cls, i))
    open('root/%s/notes.txt' % cls, 'w').write('not an image')
Image.fromarray(rng.integers(0, 256, (5, 7, 3), dtype=np.uint8)).save('root/cat/9.JPG', quality=90)
for cls in ('bird', 'cat'):
    for name in sorted(f for f in os.listdir('root/' + cls) if not f.endswith('.txt')):
        expected.append(np.asarray(Image.open('root/%s/%s' % (cls, name)).convert('RGB')))
np.save('expected.npy', np.stack(expected))
os.makedirs('grey/a'); os.makedirs('grey/b')
Image.fromarray(rng.integers(0, 256, (6, 6), dtype=np.uint8)).save('grey/a/0.png')
Image.fromarray(rng.integers(0, 256, (6, 6), dtype=np.uint8)).save('grey/b/0.png')
os.makedirs('test/cat')
Image.fromarray(rng.integers(0, 256, (5, 7, 3), dtype=np.uint8)).save('test/cat/0.png')
os.makedirs('odd/a')
Image.fromarray(rng.integers(0, 256, (5, 7, 3), dtype=np.uint8)).save('odd/a/0.png')
Image.fromarray(rng.integers(0, 256, (6, 7, 3), dtype=np.uint8)).save('odd/a/1.png')
data = open('root/cat/0.png', 'rb').read()
os.makedirs('cut/a')
open('cut/a/0.png', 'wb').write(data)
open('cut/a/1.png', 'wb').write(data[:len(data) // 2])
)";

TEST(ImageFolder, PixelsMatchPilInClassOrder) {
  if (!havePil()) GTEST_SKIP() << "python3-pil or python3-numpy missing";
  ScratchDir dir;
  ASSERT_NO_FATAL_FAILURE(runPython(dir.path(), kMakeImages));
  const ImageFolder images(dir / "root");
  EXPECT_EQ(images.classNames(), (std::vector<std::string>{"bird", "cat"}));
  ASSERT_EQ(images.size(), 6);
  EXPECT_EQ(images.channels(), 3);
  EXPECT_EQ(images.height(), 5);
  EXPECT_EQ(images.width(), 7);
  const NpyArray expected = loadNpy(dir / "expected.npy");
  ASSERT_EQ(expected.shape(), (std::vector<int64_t>{6, 5, 7, 3}));
  std::vector<float> pixels(size_t(expected.numel()));
  expected.copyF32(0, expected.numel(), pixels.data());
  const Batch batch = images.gather({0, 1, 2, 3, 4, 5});
  EXPECT_EQ(batch.inputs.shape(), (Shape{6, 3, 5, 7}));
  for (int64_t i = 0; i < 6; ++i) {
    EXPECT_EQ(batch.labels.data<int64_t>()[i], i < 2 ? 0 : 1);
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t y = 0; y < 5; ++y)
        for (int64_t x = 0; x < 7; ++x)
          ASSERT_EQ(batch.inputs.data<float>()[((i * 3 + c) * 5 + y) * 7 + x],
                    pixels[size_t(((i * 5 + y) * 7 + x) * 3 + c)] / 255.0f)
              << images.file(i) << " channel " << c << " at " << y << "," << x;
  }
  // Per-channel statistics of pixel / 255, from PIL's pixels.
  const ChannelStatistics statistics = channelStatistics(images);
  ASSERT_EQ(statistics.mean.size(), 3u);
  for (size_t c = 0; c < 3; ++c) {
    double sum = 0, squares = 0;
    for (size_t v = c; v < pixels.size(); v += 3) {
      sum += pixels[v] / 255.0;
      squares += (pixels[v] / 255.0) * (pixels[v] / 255.0);
    }
    const double n = double(pixels.size() / 3), mean = sum / n;
    EXPECT_NEAR(statistics.mean[c], mean, 1e-6) << "channel " << c;
    EXPECT_NEAR(statistics.stddev[c], std::sqrt(squares / n - mean * mean), 1e-6) << "channel " << c;
  }
  // Two of six images, evenly spaced: images 0 and 3.
  double firstAndFourth = 0;
  for (const size_t image : {0u, 3u})
    for (size_t v = 0; v < 35; ++v) firstAndFourth += pixels[image * 105 + v * 3] / 255.0;
  EXPECT_NEAR(channelStatistics(images, 2).mean[0], firstAndFourth / 70, 1e-6);

  // What a dataset path names.
  EXPECT_EQ(dataPathKind(dir / "root"), DataPathKind::ImageFolder);
  EXPECT_EQ(dataPathKind(dir / "expected.npy"), DataPathKind::NumPy);
  EXPECT_EQ(dataPathKind(dir / "table.csv"), DataPathKind::Table);
  EXPECT_EQ(dataPathKind(dir / "a.npz," + (dir / "b.npz")), DataPathKind::Shards);
  EXPECT_EQ(dataPathKind(dir / "root/*/0.png"), DataPathKind::Shards);
  EXPECT_EQ(dataPathKind(dir / "missing"), DataPathKind::FashionMnist);
  EXPECT_THAT(errorOf([&] { dataPathKind(dir / "root/cat/notes.txt"); }),
              HasSubstr("root/cat/notes.txt: expected a .csv or .tsv table"));

  const ImageFolder grey(dir / "grey");
  EXPECT_EQ(grey.channels(), 1);
  const ImageFolder resized(dir / "grey", {.height = 3, .width = 4, .channels = 3});
  EXPECT_EQ(resized.gather({1}).inputs.shape(), (Shape{1, 3, 3, 4}));
}

TEST(ImageFolder, AugmentationsAreAShiftAndFlipDrawnFromSeedEpochAndSample) {
  if (!havePil()) GTEST_SKIP() << "python3-pil or python3-numpy missing";
  ScratchDir dir;
  ASSERT_NO_FATAL_FAILURE(runPython(dir.path(), kMakeImages));
  const ImageFolder plain(dir / "root");
  const ImageFolder augmented(dir / "root", {.augment = true, .cropPadding = 2, .seed = 9, .threads = 3});
  const Batch original = plain.gather({0, 1, 2, 3, 4, 5});
  const Batch epoch0 = augmented.gatherForEpoch({0, 1, 2, 3, 4, 5}, 0);
  // Each augmented image is the original shifted by (dy, dx) in [-2, 2] (zeros coming in) and
  // maybe flipped: find the one that matches exactly.
  int changed = 0;
  for (int64_t i = 0; i < 6; ++i) {
    const float* a = epoch0.inputs.data<float>() + i * 105;
    const float* o = original.inputs.data<float>() + i * 105;
    bool found = false;
    for (int dy = -2; dy <= 2 && !found; ++dy)
      for (int dx = -2; dx <= 2 && !found; ++dx)
        for (int flip = 0; flip < 2 && !found; ++flip) {
          bool same = true;
          for (int c = 0; c < 3 && same; ++c)
            for (int y = 0; y < 5 && same; ++y)
              for (int x = 0; x < 7 && same; ++x) {
                const int sy = y + dy, sx = (flip ? 6 - x : x) + dx;
                const float v = sy >= 0 && sy < 5 && sx >= 0 && sx < 7 ? o[(c * 5 + sy) * 7 + sx] : 0.0f;
                same = a[(c * 5 + y) * 7 + x] == v;
              }
          found = same;
          if (same && (dy || dx || flip)) ++changed;
        }
    EXPECT_TRUE(found) << "image " << i << " is not a shifted or flipped copy";
  }
  EXPECT_GT(changed, 0) << "no image was augmented";
  // The same sample in another batch (and thread) of the same epoch: the same pixels; another
  // epoch: other draws; without an epoch (evaluation): none.
  const Batch again = augmented.gatherForEpoch({4}, 0);
  EXPECT_TRUE(std::equal(again.inputs.data<float>(), again.inputs.data<float>() + 105, epoch0.inputs.data<float>() + 4 * 105));
  bool differs = false;
  const Batch epoch1 = augmented.gatherForEpoch({0, 1, 2, 3, 4, 5}, 1);
  for (int64_t k = 0; k < 6 * 105; ++k) differs |= epoch1.inputs.data<float>()[k] != epoch0.inputs.data<float>()[k];
  EXPECT_TRUE(differs);
  const Batch evaluation = augmented.gather({0, 1, 2, 3, 4, 5});
  EXPECT_TRUE(std::equal(evaluation.inputs.data<float>(), evaluation.inputs.data<float>() + 6 * 105,
                         original.inputs.data<float>()));
}

TEST(ImageFolder, RefusalsNameTheFolderOrFile) {
  if (!havePil()) GTEST_SKIP() << "python3-pil or python3-numpy missing";
  ScratchDir dir;
  ASSERT_NO_FATAL_FAILURE(runPython(dir.path(), kMakeImages));
  EXPECT_THAT(errorOf<FileError>([&] { ImageFolder(dir / "test", {.classNames = {"bird", "cat"}}); }),
              HasSubstr("image folder " + dir / "test" + " has no folder for class 'bird' (" + dir / "test/bird" +
                        " is missing)"));
  const ImageFolder cut(dir / "cut");
  EXPECT_THAT(errorOf<FormatError>([&] { cut.gather({1}); }), HasSubstr(dir / "cut/a/1.png" + ": cannot decode PNG"));
  const ImageFolder odd(dir / "odd");
  EXPECT_THAT(errorOf<FormatError>([&] { odd.gather({0, 1}); }),
              HasSubstr(dir / "odd/a/1.png" + ": an image of 7x6, the folder's first"));
  std::filesystem::create_directories(dir / "empty/none");
  EXPECT_THAT(errorOf<FileError>([&] { ImageFolder(dir / "empty"); }), HasSubstr("holds no .png or .jpg image"));
  EXPECT_THAT(errorOf<FileError>([&] { ImageFolder(dir / "empty/none"); }), HasSubstr("holds no class folder"));
  std::ofstream(dir / "x.png") << "GIF89a......";
  EXPECT_THAT(errorOf<FormatError>([&] {
                const std::string bytes = "GIF89a......";
                decodeImage(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), 0, "x.gif");
              }),
              HasSubstr("x.gif: not a PNG or JPEG image"));
}

}  // namespace
}  // namespace kolo::data
