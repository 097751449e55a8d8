#include "common/data/csv_source.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/data/csv_reader.h"
#include "tests/common/data/scratch_dir.h"

namespace fedfleet::data {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class CsvSourceTest : public testing::ScratchDirTest {
 protected:
};

TEST_F(CsvSourceTest, ReadsFeaturesInFileOrderAndLabels) {
  const std::string path = write("d.csv",
                                 "x1,label,x2\n"
                                 "0.5,2,-1e3\n"
                                 " 1 ,0,\"2.25\"\n"
                                 "3,4,0\n");
  auto ds = loadCsv(path, CsvColumns{});
  ASSERT_TRUE(ds.isOk()) << ds.status().toString();
  EXPECT_EQ(ds->size(), 3u);
  EXPECT_EQ(ds->feature_dim, 2u);
  EXPECT_EQ(ds->num_classes, 5u) << "largest label + 1";
  EXPECT_EQ(ds->features, (std::vector<float>{0.5f, -1000.0f, 1.0f, 2.25f, 3.0f, 0.0f}));
  EXPECT_EQ(ds->labels, (std::vector<data::Label>{2, 0, 4}));
  EXPECT_TRUE(checkSampleStorage(*ds).isOk());
}

TEST_F(CsvSourceTest, NamedFeatureColumnsAreTakenInTheirOrderAndOthersIgnored) {
  const std::string path = write("d.csv",
                                 "id,a,b,c,y\n"
                                 "p,1,2,3,1\n"
                                 "q,4,5,6,0");  // no newline at the end
  CsvColumns cols;
  cols.label = "y";
  cols.features = {"c", "a"};
  auto ds = loadCsv(path, cols);
  ASSERT_TRUE(ds.isOk()) << ds.status().toString();
  EXPECT_EQ(ds->features, (std::vector<float>{3, 1, 6, 4}));
  EXPECT_EQ(ds->labels, (std::vector<data::Label>{1, 0}));
  EXPECT_EQ(ds->num_classes, 2u) << "at least two classes";
}

TEST_F(CsvSourceTest, ALimitKeepsTheFirstSamplesButChecksTheWholeFile) {
  const std::string good = write("good.csv", "f,label\n1,0\n2,1\n3,0\n");
  auto ds = loadCsv(good, CsvColumns{}, 2);
  ASSERT_TRUE(ds.isOk());
  EXPECT_EQ(ds->features, (std::vector<float>{1, 2}));
  const std::string bad = write("bad.csv", "f,label\n1,0\n2,1\nx,0\n");
  auto st = loadCsv(bad, CsvColumns{}, 1).status();
  EXPECT_THAT(st.message(), HasSubstr("row 4"));
}

struct BrokenCase {
  std::string name, text, expected;
  CsvColumns columns;
};

TEST_F(CsvSourceTest, BrokenFilesAreClearErrorsNamingTheFile) {
  CsvColumns named;
  named.features = {"a", "zz"};
  CsvColumns label_as_feature;
  label_as_feature.features = {"label"};
  const std::vector<BrokenCase> cases = {
      {"empty", "", "is empty", {}},
      {"header-only", "a,label\n", "has a header but no samples", {}},
      {"no-label",
       "a,b\n1,2\n",
       "the label column 'label' is not in the header (columns: a, b)",
       {}},
      {"duplicate", "a,a,label\n1,2,0\n", "column 'a' appears twice", {}},
      {"unnamed", "a,,label\n1,2,0\n", "column 2 has no name", {}},
      {"missing-feature", "a,label\n1,0\n", "the feature column 'zz' is not in the header", named},
      {"label-feature", "a,label\n1,0\n", "is the label; it cannot be a feature", label_as_feature},
      {"only-label", "label\n1\n", "no feature columns", {}},
      {"short-row", "a,b,label\n1,2,0\n1,0\n", "row 3: 2 fields, the header has 3", {}},
      {"long-row", "a,label\n1,0\n1,0,7\n", "row 3: more fields than the 2 columns", {}},
      {"not-number",
       "a,label\n1,0\nabc,1\n",
       "row 3, column 'a': 'abc' is not a finite number",
       {}},
      {"trailing-junk", "a,label\n1.5x,0\n", "'1.5x' is not a finite number", {}},
      {"infinite", "a,label\ninf,0\n", "'inf' is not a finite number", {}},
      {"overflow-float", "a,label\n1e39,0\n", "'1e39' is not a finite number", {}},
      {"missing", "a,label\n,0\n", "row 2, column 'a': a missing value", {}},
      {"label-fraction", "a,label\n1,1.5\n", "the label '1.5' is not a class id", {}},
      {"label-negative", "a,label\n1,-1\n", "the label '-1' is not a class id", {}},
      {"label-range", "a,label\n1,1048576\n", "labels are integers from 0 to 1048575", {}},
      {"label-missing", "a,label\n1,\n", "the label is missing", {}},
      {"bad-quote", "a,label\n\"1,0\n", "not valid CSV", {}},
      {"quote-inside", "a,label\n1\"2,0\n", "not valid CSV", {}},
  };
  for (const auto& c : cases) {
    const std::string path = write(c.name + ".csv", c.text);
    auto ds = loadCsv(path, c.columns);
    ASSERT_FALSE(ds.isOk()) << c.name;
    EXPECT_EQ(ds.status().code(), StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(ds.status().message(), HasSubstr(c.expected)) << c.name;
    EXPECT_THAT(ds.status().message(), HasSubstr(path)) << c.name << ": names the file";
  }
}

TEST_F(CsvSourceTest, ARegressionReadsTheLabelColumnAsFloatTargets) {
  CsvColumns cols;
  cols.label = "price";
  cols.regression = true;
  auto ds = loadCsv(write("r.csv", "a,price,b\n1,2.5,3\n4,-0.125,6\n7,1e3,9\n"), cols);
  ASSERT_TRUE(ds.isOk()) << ds.status().toString();
  EXPECT_EQ(ds->size(), 3u);
  EXPECT_TRUE(ds->hasTargets());
  EXPECT_EQ(ds->target_dim, 1u);
  EXPECT_TRUE(ds->labels.empty());
  EXPECT_EQ(ds->num_classes, 0u);
  EXPECT_EQ(ds->targets, (std::vector<float>{2.5f, -0.125f, 1000.0f}));
  EXPECT_EQ(ds->features, (std::vector<float>{1, 3, 4, 6, 7, 9}));
  EXPECT_TRUE(checkSampleStorage(*ds).isOk());
  // Many classes: a label far above 255 is a class id like any other.
  auto many = loadCsv(write("many.csv", "a,label\n1,0\n2,4999\n"), CsvColumns{});
  ASSERT_TRUE(many.isOk()) << many.status().toString();
  EXPECT_EQ(many->num_classes, 5000u);

  for (const auto& [name, text, expected] : std::vector<std::array<std::string, 3>>{
           {"nan", "a,price\n1,nan\n", "row 2, column 'price': the target 'nan' is not a finite"},
           {"word", "a,price\n1,2\n3,cheap\n", "row 3, column 'price': the target 'cheap'"},
           {"none", "a,price\n1,\n", "the target is missing"}}) {
    const std::string path = write(name + ".csv", text);
    auto bad = loadCsv(path, cols);
    ASSERT_FALSE(bad.isOk()) << name;
    EXPECT_THAT(bad.status().message(), HasSubstr(expected)) << name;
    EXPECT_THAT(bad.status().message(), HasSubstr(path)) << name;
  }
}

TEST_F(CsvSourceTest, AMissingFileIsNotFound) {
  auto ds = loadCsv((dir_ / "nope.csv").string(), CsvColumns{});
  ASSERT_FALSE(ds.isOk());
  EXPECT_EQ(ds.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(ds.status().message(), HasSubstr("nope.csv"));
}

TEST_F(CsvSourceTest, AFileLargerThanTheReadBlockIsReadWhole) {
  // Rows straddle the 1 MiB read blocks: every value must still come through once.
  std::string text = "a,b,label\n";
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    text += std::to_string(i) + "," + std::to_string(-i) + "," + std::to_string(i % 7) + "\n";
  }
  ASSERT_GT(text.size(), 2u << 20);
  auto ds = loadCsv(write("big.csv", text), CsvColumns{});
  ASSERT_TRUE(ds.isOk()) << ds.status().toString();
  ASSERT_EQ(ds->size(), static_cast<size_t>(n));
  double sum = 0;
  for (size_t i = 0; i < ds->size(); ++i) {
    ASSERT_EQ(ds->feature(i)[0], static_cast<float>(i));
    ASSERT_EQ(ds->feature(i)[1], -static_cast<float>(i));
    ASSERT_EQ(ds->labels[i], i % 7);
    sum += ds->labels[i];
  }
  EXPECT_EQ(ds->num_classes, 7u);
  EXPECT_GT(sum, 0);
}

TEST_F(CsvSourceTest, RowsOfASmallFileComeBackWithQuotedFields) {
  auto rows = readCsvRows(write("t.csv", "name,x\n\"a, b\",\"say \"\"hi\"\"\"\n"), "table");
  ASSERT_TRUE(rows.isOk()) << rows.status().toString();
  ASSERT_EQ(rows->size(), 2u);
  EXPECT_EQ((*rows)[1], (std::vector<std::string>{"a, b", "say \"hi\""}));
}

}  // namespace
}  // namespace fedfleet::data
