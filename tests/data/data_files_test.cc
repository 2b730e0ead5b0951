// The file readers against files made by Python's csv module and NumPy: CSV/TSV tables value
// by value (string and integer labels, quoting), .npy arrays of every supported dtype and
// .npz archives (stored and deflated), token files against a text's bytes; and the refusals
// of each (a bad row named by file:line, a wrong dtype, a truncated file), the standardiser
// and the split helpers.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "files_support.h"
#include "kolo/byte_corpus.h"
#include "kolo/data_files.h"
#include "support/error_text.h"

namespace kolo::data {
namespace {

using kolo::testing::errorOf;
using testing::readRaw;
using testing::runPython;
using testing::ScratchDir;
using ::testing::HasSubstr;

void writeText(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

TEST(Csv, MatchesPythonsCsvWriterValueByValue) {
  KOLO_SKIP_WITHOUT_NUMPY();
  ScratchDir dir;
  // String labels (classes in sorted order), a quoted header name, CRLF line ends (the csv
  // module's default) and float32 values written as their shortest text.
  ASSERT_NO_FATAL_FAILURE(runPython(dir.path(), R"(
import csv
rng = np.random.default_rng(3)
x = (rng.standard_normal((37, 5)) * 10.0 ** rng.integers(-3, 4, (37, 5))).astype(np.float32)
names = np.array(['dog', 'cat', 'bird'])
y = rng.integers(0, 3, 37)
with open('t.csv', 'w', newline='') as f:
    w = csv.writer(f)
    w.writerow(['f0', 'f 1', 'kind', 'f,3', 'f4', 'f5'])
    for row, label in zip(x, y):
        r = [str(v) for v in row]
        w.writerow(r[:2] + [names[label]] + r[2:])
x.tofile('x.f32')
np.searchsorted(np.sort(names), names[y]).astype(np.int64).tofile('y.i64')
)"));
  const CsvTable table = readCsv(dir / "t.csv", {.labelColumn = "kind"});
  EXPECT_EQ(table.featureNames, (std::vector<std::string>{"f0", "f 1", "f,3", "f4", "f5"}));
  EXPECT_EQ(table.classNames, (std::vector<std::string>{"bird", "cat", "dog"}));
  EXPECT_EQ(table.classes, 3);
  ASSERT_EQ(table.inputs.shape(), (Shape{37, 5}));
  const std::vector<float> x = readRaw<float>(dir / "x.f32");
  const std::vector<int64_t> y = readRaw<int64_t>(dir / "y.i64");
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(table.inputs.data<float>()[i], x[i]) << "element " << i;
  for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(table.labels.data<int64_t>()[i], y[i]) << "row " << i;
}

TEST(Csv, TsvWithIntegerLabelsAndTheTrainingClassesForATestSplit) {
  KOLO_SKIP_WITHOUT_NUMPY();
  ScratchDir dir;
  ASSERT_NO_FATAL_FAILURE(runPython(dir.path(), R"(
rng = np.random.default_rng(5)
x = rng.standard_normal((20, 3)).astype(np.float32)
y = rng.integers(0, 7, 20)
with open('t.tsv', 'w') as f:
    f.write('label\ta\tb\tc\n')
    for row, label in zip(x, y):
        f.write('%d\t%s\n' % (label, '\t'.join(str(v) for v in row)))
    f.write('\n')
x.tofile('x.f32')
y.astype(np.int64).tofile('y.i64')
)"));
  const CsvTable table = readCsv(dir / "t.tsv");
  EXPECT_TRUE(table.classNames.empty());
  const std::vector<float> x = readRaw<float>(dir / "x.f32");
  const std::vector<int64_t> y = readRaw<int64_t>(dir / "y.i64");
  EXPECT_EQ(table.classes, *std::max_element(y.begin(), y.end()) + 1);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(table.inputs.data<float>()[i], x[i]);
  for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(table.labels.data<int64_t>()[i], y[i]);

  // A test split maps its string labels by the training split's classes, whatever it holds.
  writeText(dir / "test.csv", "x,label\n1,dog\n2,ant\n");
  const CsvTable test = readCsv(dir / "test.csv", {.classNames = {"ant", "bee", "dog"}});
  EXPECT_EQ(test.labels.data<int64_t>()[0], 2);
  EXPECT_EQ(test.labels.data<int64_t>()[1], 0);
  EXPECT_EQ(test.classes, 3);
}

TEST(Csv, RefusalsNameTheFileLineAndColumn) {
  ScratchDir dir;
  const std::string bad = dir / "bad.csv";
  writeText(bad, "a,b,label\n1,2,0\n3,4,1,5\n");
  EXPECT_THAT(errorOf<FormatError>([&] { readCsv(bad); }), HasSubstr(bad + ":3: 4 fields, the header has 3"));
  writeText(bad, "a,b,label\n1,2,0\n\n1,x,1\n");
  EXPECT_THAT(errorOf<FormatError>([&] { readCsv(bad); }), HasSubstr(bad + ":4: column 'b': 'x' is not a finite number"));
  writeText(bad, "a,b,label\r\n1,,0\r\n");
  EXPECT_THAT(errorOf<FormatError>([&] { readCsv(bad); }), HasSubstr(bad + ":2: column 'b' is missing a value"));
  writeText(bad, "a,b,label\n1,nan,0\n");
  EXPECT_THAT(errorOf<FormatError>([&] { readCsv(bad); }), HasSubstr(bad + ":2: column 'b': 'nan' is not a finite"));
  writeText(bad, "a,b,label\n1,2,\n");
  EXPECT_THAT(errorOf<FormatError>([&] { readCsv(bad); }), HasSubstr(bad + ":2: the label ('label') is missing"));
  writeText(bad, "a,b,class\n1,2,0\n");
  EXPECT_THAT(errorOf<FormatError>([&] { readCsv(bad); }),
              HasSubstr("no column named 'label' for the labels; the header holds: a, b, class"));
  writeText(bad, "a,label\n1,\"dog\n");
  EXPECT_THAT(errorOf<FormatError>([&] { readCsv(bad); }), HasSubstr(bad + ":2: a quoted field has no closing quote"));
  writeText(bad, "a,label\n");
  EXPECT_THAT(errorOf<FormatError>([&] { readCsv(bad); }), HasSubstr("followed by no row"));
  writeText(bad, "a,label\n1,cow\n");
  EXPECT_THAT(errorOf<FormatError>([&] { readCsv(bad, {.classNames = {"ant", "dog"}}); }),
              HasSubstr(bad + ":2: label 'cow' is not one of the 2 classes"));
  EXPECT_THAT(errorOf<FileError>([&] { readCsv(dir / "none.csv"); }), HasSubstr("none.csv"));
}

TEST(Npy, EveryDtypeMatchesNumpyValueByValue) {
  KOLO_SKIP_WITHOUT_NUMPY();
  ScratchDir dir;
  // Element i of each array is i * 0.5 - 7 (or i % 250 for uint8, i - 7 for integers).
  ASSERT_NO_FATAL_FAILURE(runPython(dir.path(), R"(
i = np.arange(60).reshape(5, 3, 4)
np.save('f4.npy', (i * 0.5 - 7).astype(np.float32))
np.save('f8.npy', (i * 0.5 - 7).astype(np.float64))
np.save('u1.npy', (i % 250).astype(np.uint8))
np.save('i4.npy', (i - 7).astype(np.int32))
np.save('i8.npy', (i - 7).astype(np.int64))
np.save('labels.npy', np.array([3, 0, 2, 1, 4], dtype=np.int64))
np.save('flabels.npy', np.array([3, 0, 2, 1, 4], dtype=np.float32))
np.savez('both.npz', x=(i * 0.5 - 7).astype(np.float32), y=np.array([3, 0, 2, 1, 4], dtype=np.uint8))
np.savez_compressed('packed.npz', images=(i % 250).astype(np.uint8), labels=np.array([3, 0, 2, 1, 4]))
)"));
  for (const std::string name : {"f4", "f8", "u1", "i4", "i8"}) {
    SCOPED_TRACE(name);
    const NpyDataset dataset(loadNpy(dir / (name + ".npy")), loadNpy(dir / "labels.npy"));
    ASSERT_EQ(dataset.size(), 5);
    EXPECT_EQ(dataset.classes(), 5);
    EXPECT_EQ(dataset.sampleShape(), (Shape{3, 4}));
    const Batch batch = dataset.gather({4, 1});
    ASSERT_EQ(batch.inputs.shape(), (Shape{2, 3, 4}));
    for (int64_t k = 0; k < 24; ++k) {
      const int64_t i = (k < 12 ? 48 : 12) + k % 12;
      const float expected = name == "u1" ? float(i % 250) : name[0] == 'i' ? float(i - 7) : float(i * 0.5 - 7);
      ASSERT_EQ(batch.inputs.data<float>()[k], expected) << "element " << k;
    }
    EXPECT_EQ(batch.labels.data<int64_t>()[0], 4);
    EXPECT_EQ(batch.labels.data<int64_t>()[1], 0);
  }
  const NpyDataset whole(loadNpy(dir / "f4.npy"), loadNpy(dir / "flabels.npy"));
  EXPECT_EQ(whole.gather({0}).labels.data<int64_t>()[0], 3);
  for (const std::string archive : {"both.npz", "packed.npz"}) {
    SCOPED_TRACE(archive);
    const std::shared_ptr<NpyDataset> dataset = loadNpyDataset(dir / archive);
    const Batch batch = dataset->gather({2});
    EXPECT_EQ(batch.labels.data<int64_t>()[0], 2);
    EXPECT_EQ(batch.inputs.data<float>()[5], archive == "both.npz" ? float(29 * 0.5 - 7) : float(29));
  }
}

TEST(Npy, RefusalsNameTheArrayAndWhatIsWrong) {
  KOLO_SKIP_WITHOUT_NUMPY();
  ScratchDir dir;
  ASSERT_NO_FATAL_FAILURE(runPython(dir.path(), R"(
np.save('c8.npy', np.zeros((2, 2), dtype=np.complex64))
np.save('big.npy', np.zeros((2, 2), dtype='>f4'))
np.save('f2.npy', np.zeros((2, 2), dtype=np.float16))
np.save('fortran.npy', np.asfortranarray(np.zeros((2, 3), dtype=np.float32)))
np.save('x.npy', np.zeros((4, 3), dtype=np.float32))
np.save('y3.npy', np.zeros(3, dtype=np.int64))
np.save('yneg.npy', np.array([0, 1, -1, 2]))
np.save('yfrac.npy', np.array([0, 1, 0.5, 2]))
np.savez('other.npz', a=np.zeros(2), b=np.zeros(2))
with open('x.npy', 'rb') as f: data = f.read()
with open('cut.npy', 'wb') as f: f.write(data[:-5])
with open('both.npz', 'wb') as f: pass
np.savez('full.npz', x=np.zeros((4, 3), dtype=np.float32), y=np.zeros(4, dtype=np.int64))
with open('full.npz', 'rb') as f: data = f.read()
with open('cut.npz', 'wb') as f: f.write(data[:100])
)"));
  EXPECT_THAT(errorOf<FormatError>([&] { loadNpy(dir / "c8.npy"); }), HasSubstr("NumPy dtype '<c8' is not supported"));
  EXPECT_THAT(errorOf<FormatError>([&] { loadNpy(dir / "big.npy"); }), HasSubstr("NumPy dtype '>f4' is not supported"));
  EXPECT_THAT(errorOf<FormatError>([&] { loadNpy(dir / "f2.npy"); }), HasSubstr("NumPy dtype '<f2' is not supported"));
  EXPECT_THAT(errorOf<FormatError>([&] { loadNpy(dir / "fortran.npy"); }), HasSubstr("Fortran order"));
  EXPECT_THAT(errorOf<FormatError>([&] { loadNpy(dir / "cut.npy"); }),
              HasSubstr(dir / "cut.npy" + ": truncated .npy data: shape [4, 3] of <f4 needs 48 bytes, the file holds 43"));
  EXPECT_THAT(errorOf<FormatError>([&] { NpyDataset(loadNpy(dir / "x.npy"), loadNpy(dir / "y3.npy")); }),
              HasSubstr("x.npy holds 4 samples but " + dir / "y3.npy holds 3 labels"));
  EXPECT_THAT(errorOf<FormatError>([&] { NpyDataset(loadNpy(dir / "x.npy"), loadNpy(dir / "yneg.npy")); }),
              HasSubstr("yneg.npy: label 2 is -1"));
  EXPECT_THAT(errorOf<FormatError>([&] { NpyDataset(loadNpy(dir / "x.npy"), loadNpy(dir / "yfrac.npy")); }),
              HasSubstr("yfrac.npy: element 2 is 0.5, not a whole number"));
  EXPECT_THAT(errorOf<FormatError>([&] { loadNpyDataset(dir / "other.npz"); }), HasSubstr("holds the arrays [a, b]"));
  EXPECT_THAT(errorOf<FormatError>([&] { loadNpyDataset(dir / "both.npz"); }), HasSubstr("not an .npz (zip) archive"));
  EXPECT_THAT(errorOf<FormatError>([&] { loadNpz(dir / "cut.npz"); }), HasSubstr("cut.npz"));
  EXPECT_THAT(errorOf<FormatError>([&] { loadNpy(dir / "other.npz"); }), HasSubstr("not a NumPy .npy file"));
}

TEST(TokenFile, U16TokensOfATextsBytesGiveTheTextsWindows) {
  KOLO_SKIP_WITHOUT_NUMPY();
  ScratchDir dir;
  ASSERT_NO_FATAL_FAILURE(runPython(dir.path(), R"(
text = bytes((i * 7 + i // 13) % 256 for i in range(5000))
open('text.txt', 'wb').write(text)
np.frombuffer(text, dtype=np.uint8).astype(np.uint16).tofile('text.u16')
np.frombuffer(text, dtype=np.uint8).astype(np.uint32).tofile('text.u32')
np.arange(3000, dtype=np.uint16).tofile('big.u16')
)"));
  const ByteCorpus text(dir / "text.txt", 16);
  for (const auto& [file, type] : {std::pair{"text.u16", TokenType::U16}, {"text.u32", TokenType::U32}}) {
    SCOPED_TRACE(file);
    const ByteCorpus tokens(dir / file, {.type = type, .vocab = 256}, 16);
    ASSERT_EQ(tokens.trainBytes(), text.trainBytes());
    ASSERT_EQ(tokens.windows(true), text.windows(true));
    for (int64_t step : {0, 1, 7, 30}) {
      const Batch a = text.batch(step, 8, 11), b = tokens.batch(step, 8, 11);
      const Batch c = text.fileOrderBatch(step, 8, true), d = tokens.fileOrderBatch(step, 8, true);
      for (int64_t k = 0; k < 8 * 16; ++k) {
        ASSERT_EQ(a.inputs.data<int64_t>()[k], b.inputs.data<int64_t>()[k]);
        ASSERT_EQ(a.labels.data<int64_t>()[k], b.labels.data<int64_t>()[k]);
        ASSERT_EQ(c.inputs.data<int64_t>()[k], d.inputs.data<int64_t>()[k]);
      }
    }
  }
  // Tokens beyond a byte, read as NumPy wrote them; the vocabulary found from the file.
  const ByteCorpus big(dir / "big.u16", {.type = TokenType::U16}, 10);
  EXPECT_EQ(big.vocab(), 3000);
  const Batch window = big.windowBatch({200});
  EXPECT_EQ(window.inputs.data<int64_t>()[0], 2000);
  EXPECT_EQ(window.labels.data<int64_t>()[9], 2010);
}

TEST(TokenFile, RefusesATruncatedFileAndATokenOutsideTheVocabulary) {
  ScratchDir dir;
  writeText(dir / "odd.bin", std::string(301, 'a'));
  EXPECT_THAT(errorOf<FormatError>([&] { ByteCorpus(dir / "odd.bin", {.type = TokenType::U16}, 8); }),
              HasSubstr("token file " + dir / "odd.bin" + " holds 301 bytes, not a whole number of 16-bit tokens"));
  std::string tokens(400, '\0');
  tokens[2 * 150 + 1] = 1;  // token 150 is 256
  writeText(dir / "t.bin", tokens);
  const ByteCorpus corpus(dir / "t.bin", {.type = TokenType::U16, .vocab = 256}, 8);
  EXPECT_THAT(errorOf<FormatError>([&] { corpus.windowBatch({18}); }),
              HasSubstr("token 150 is 256, not below the vocabulary of 256"));
  EXPECT_THAT(errorOf<FileError>([&] { ByteCorpus(dir / "none.bin", {}, 8); }), HasSubstr("none.bin"));
}

TEST(Standardizer, UsesTheTrainingStatisticsAndRoundTripsAsText) {
  // Feature 0: 1, 2, 3, 4 (mean 2.5, std sqrt(1.25)); feature 1 constant (std taken as 1).
  auto train = std::make_shared<TensorDataset>(Tensor::fromVector({4, 2}, std::vector<float>{1, 7, 2, 7, 3, 7, 4, 7}),
                                               Tensor::fromVector({4}, std::vector<int64_t>{0, 1, 0, 1}));
  const Standardizer s = Standardizer::fit(*train);
  EXPECT_DOUBLE_EQ(s.mean[0], 2.5);
  EXPECT_DOUBLE_EQ(s.stddev[0], std::sqrt(1.25));
  EXPECT_DOUBLE_EQ(s.mean[1], 7.0);
  EXPECT_DOUBLE_EQ(s.stddev[1], 1.0);
  const Standardizer back = Standardizer::parse(s.toString(), "checkpoint");
  EXPECT_EQ(back.mean, s.mean);
  EXPECT_EQ(back.stddev, s.stddev);
  const StandardizedDataset standardized(train, s);
  const Batch batch = standardized.gather({3});
  EXPECT_FLOAT_EQ(batch.inputs.data<float>()[0], float(1.5 / std::sqrt(1.25)));
  EXPECT_FLOAT_EQ(batch.inputs.data<float>()[1], 0.0f);
  EXPECT_THAT(errorOf<FormatError>([] { Standardizer::parse("1,2", "ckpt/meta.json"); }), HasSubstr("ckpt/meta.json"));
}

TEST(Split, ByFractionSeededOrInFileOrderAndSubsetsByIndex) {
  auto dataset = std::make_shared<TensorDataset>(Tensor::arange(10).reshape({10, 1}),
                                                 Tensor::fromVector({10}, std::vector<int64_t>(10, 0)));
  const Split inOrder = splitDataset(dataset, 0.3, false);
  EXPECT_EQ(inOrder.train->indices(), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(inOrder.test->indices(), (std::vector<int64_t>{7, 8, 9}));
  EXPECT_EQ(inOrder.test->gather({1}).inputs.data<float>()[0], 8.0f);
  const Split shuffled = splitDataset(dataset, 0.3, true, 4);
  const std::vector<int64_t> order = epochPermutation(10, 4, 0);
  EXPECT_EQ(shuffled.test->indices(), std::vector<int64_t>(order.begin() + 7, order.end()));
  EXPECT_EQ(splitDataset(dataset, 0.3, true, 4).train->indices(), shuffled.train->indices());
  EXPECT_THAT(errorOf<InvalidArgument>([&] { splitDataset(dataset, 1.0); }), HasSubstr("(0, 1)"));
  EXPECT_THAT(errorOf<InvalidArgument>([&] { Subset(dataset, {3, 10}); }), HasSubstr("index 10 is outside"));
}

}  // namespace
}  // namespace kolo::data
