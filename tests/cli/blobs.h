// A CSV data set the command-line tests write: three Gaussian blobs in 4 dimensions, separable,
// so that a model trained on them gets nearly every test sample right.
#pragma once

#include <cstdint>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace fedfleet::testing {

// n samples with an unused "id" column first, features f0..f3 and the label in "class"; sample i
// has class classes[i % classes.size()], and class c is centred at +3 in coordinate c and -3 in
// coordinate 3, unit spread.
inline void writeBlobsOf(const std::string& path, int n, uint64_t seed,
                         const std::vector<int>& classes) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> noise(0, 1);
  std::ofstream out(path);
  out << "id,f0,f1,f2,f3,class\n";
  for (int i = 0; i < n; ++i) {
    const int c = classes[static_cast<size_t>(i) % classes.size()];
    out << "s" << i;
    for (int d = 0; d < 4; ++d) {
      const double centre = d == c ? 3 : (d == 3 ? -3 : 0);
      out << "," << centre + noise(rng);
    }
    out << "," << c << "\n";
  }
}

// The three classes in turn (sample i has class i % 3).
inline void writeBlobs(const std::string& path, int n, uint64_t seed) {
  writeBlobsOf(path, n, seed, {0, 1, 2});
}

// The --set keys of a simulation on blobs files DIR/train.csv and DIR/test.csv (iid, logreg).
inline std::vector<std::string> blobsSimSets(const std::string& dir) {
  return {"data.format=csv",
          "data.path=" + dir + "/train.csv",
          "data.test_path=" + dir + "/test.csv",
          "data.label_column=class",
          "data.feature_columns=[\"f0\",\"f1\",\"f2\",\"f3\"]",
          "data.partition=iid",
          "model.name=logreg",
          "train.lr=0.1"};
}

// `fedfleet sim` of 6 clients, 3 a round, for `rounds` rounds into `db`, progress off, with
// each of `sets` as a --set (the data keys are the caller's).
inline std::vector<std::string> smallSimArgs(const std::string& binary, const std::string& db,
                                             int rounds, const std::vector<std::string>& sets) {
  std::vector<std::string> args = {binary,
                                   "sim",
                                   "--clients",
                                   "6",
                                   "--clients-per-round",
                                   "3",
                                   "--rounds",
                                   std::to_string(rounds),
                                   "--progress",
                                   "off",
                                   "--db",
                                   db};
  for (const std::string& s : sets) {
    args.push_back("--set");
    args.push_back(s);
  }
  return args;
}

}  // namespace fedfleet::testing
