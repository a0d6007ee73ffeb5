//! rows_bench: dmlc/ps-lite's side of `ps-microbench rows` (microbench/src/rows.rs).
//!
//! Each worker draws the same batches as the candle-ps worker of the same
//! index: --batch ids from a Zipf law (exponent --zipf) over --rows rows, by
//! the same rejection-inversion sampler over the same SplitMix64 stream,
//! deduplicated. ps-lite wants sorted keys partitioned by range over the
//! servers, so an id's key is SplitMix64's finaliser of the id (candle-ps's
//! bucket hash), spreading rows evenly over the servers' ranges as candle-ps's
//! buckets do; each batch is then sorted by key. A row is --width floats.
//!
//! Servers keep rows in a hash map (key -> row, with Adagrad's sum of squares
//! starting at 0.1, as candle-ps does): a push applies Adagrad (lr 0.01) to
//! each row, making it on first touch; a pull copies the rows out (zeros for a
//! row never pushed). For each operation (push, then pull, as `rows` runs
//! them) every worker runs a latency phase (one batch in flight for
//! --seconds) and a throughput phase (--window batches in flight); CPU is read
//! with getrusage at the barriers around the throughput phase.
//!
//! Each process prints `PSLITE_RESULT {json}` lines; scripts/pslite_bench.sh
//! (`run-rows`) starts the roles and sums them up.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ps/ps.h"

using namespace ps;
using Clock = std::chrono::steady_clock;

static const int kEveryone = kScheduler + kServerGroup + kWorkerGroup;
static const float kLearningRate = 0.01f;
static const float kInitialAccumulator = 0.1f;
static const float kEps = 1e-10f;
static const int kBatches = 32;

struct Args {
  size_t batch = 4096;
  size_t width = 64;
  uint64_t rows = 10000000;
  double zipf = 1.05;
  int window = 4;
  double seconds = 3;
};

static double CpuSeconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec +
         (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

static double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

/// SplitMix64's finaliser (ps_proto::rows::mix).
static uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// ps_common::rng::SplitMix64.
struct SplitMix64 {
  uint64_t state;
  uint64_t NextU64() { state += 0x9e3779b97f4a7c15ULL; return Mix(state); }
  double NextF64() { return double(NextU64() >> 11) / double(1ULL << 53); }
};

/// ps_common::zipf::Zipf, term by term.
struct Zipf {
  double n, s, hx1, hn, threshold;
  Zipf(uint64_t count, double exponent) : n(double(std::max<uint64_t>(count, 1))), s(exponent) {
    hx1 = HIntegral(1.5) - 1.0;
    hn = HIntegral(n + 0.5);
    threshold = 2.0 - HIntegralInverse(HIntegral(2.5) - H(2.0));
  }
  static double Ln1pOver(double x) {
    return std::fabs(x) > 1e-8 ? std::log1p(x) / x : 1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x));
  }
  static double Expm1Over(double x) {
    return std::fabs(x) > 1e-8 ? std::expm1(x) / x : 1.0 + x * 0.5 * (1.0 + x / 3.0 * (1.0 + 0.25 * x));
  }
  double H(double x) const { return std::exp(-s * std::log(x)); }
  double HIntegral(double x) const { double l = std::log(x); return Expm1Over((1.0 - s) * l) * l; }
  double HIntegralInverse(double x) const {
    double t = std::max(x * (1.0 - s), -1.0);
    return std::exp(Ln1pOver(t) * x);
  }
  uint64_t Sample(SplitMix64* rng) const {
    for (;;) {
      double u = hn + rng->NextF64() * (hx1 - hn);
      double x = HIntegralInverse(u);
      double k = std::min(std::max(std::floor(x + 0.5), 1.0), n);
      if (k - x <= threshold || u >= HIntegral(k + 0.5) - H(k)) return uint64_t(k);
    }
  }
};

/// The batches of worker `index` (rows::zipf_batches), as sorted ps-lite keys.
static std::vector<SArray<Key>> Batches(const Args& a, uint64_t index) {
  Zipf zipf(a.rows, a.zipf);
  SplitMix64 rng{index};
  std::vector<SArray<Key>> out;
  for (int b = 0; b < kBatches; ++b) {
    std::unordered_set<uint64_t> seen;
    std::vector<Key> keys;
    for (size_t i = 0; i < a.batch; ++i) {
      uint64_t id = zipf.Sample(&rng) - 1;
      if (seen.insert(id).second) keys.push_back(Mix(id));
    }
    std::sort(keys.begin(), keys.end());
    out.emplace_back(SArray<Key>(keys));
  }
  return out;
}

/// The server: rows in a hash map, Adagrad on push, a copy on pull.
struct RowsHandle {
  size_t width;
  std::unordered_map<Key, size_t> index;
  std::vector<float> values, sums;

  void operator()(const KVMeta& meta, const KVPairs<float>& req, KVServer<float>* server) {
    KVPairs<float> res;
    size_t n = req.keys.size();
    if (meta.push) {
      CHECK_EQ(req.vals.size(), n * width);
      for (size_t i = 0; i < n; ++i) {
        auto found = index.emplace(req.keys[i], index.size());
        size_t start = found.first->second * width;
        if (found.second) {
          values.resize(start + width, 0.0f);
          sums.resize(start + width, kInitialAccumulator);
        }
        const float* g = req.vals.data() + i * width;
        for (size_t j = 0; j < width; ++j) {
          sums[start + j] += g[j] * g[j];
          values[start + j] -= kLearningRate * g[j] / (std::sqrt(sums[start + j]) + kEps);
        }
      }
    } else {
      res.keys = req.keys;
      res.vals.resize(n * width);
      for (size_t i = 0; i < n; ++i) {
        auto found = index.find(req.keys[i]);
        float* out = res.vals.data() + i * width;
        if (found == index.end()) std::fill(out, out + width, 0.0f);
        else std::memcpy(out, &values[found->second * width], width * sizeof(float));
      }
    }
    server->Response(meta, res);
  }
};

/// Keeps at most `window` batches in flight; callbacks free their slot.
struct Window {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int> free_slots;
  explicit Window(int k) { for (int i = 0; i < k; ++i) free_slots.push_back(i); }
  int Take() {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [this] { return !free_slots.empty(); });
    int s = free_slots.back();
    free_slots.pop_back();
    return s;
  }
  void Give(int slot) {
    { std::lock_guard<std::mutex> lk(mu); free_slots.push_back(slot); }
    cv.notify_one();
  }
  void Drain(size_t k) {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return free_slots.size() == k; });
  }
};

/// One operation's two phases on a worker; prints its result line.
static void RunWorker(KVWorker<float>* kv, const Args& a, bool push) {
  uint64_t index = MyRank() + (push ? 0 : NumWorkers());
  std::vector<SArray<Key>> batches = Batches(a, index);
  size_t largest = 0;
  for (auto& b : batches) largest = std::max(largest, b.size());
  SArray<float> grad(largest * a.width, 1e-3f);
  std::vector<SArray<float>> bufs(a.window, SArray<float>(largest * a.width));
  auto issue = [&](size_t b, int slot, const std::function<void()>& cb) {
    const SArray<Key>& keys = batches[b % kBatches];
    if (!push) bufs[slot].resize(keys.size() * a.width);  // ZPull wants the exact size
    return push ? kv->ZPush(keys, grad.segment(0, keys.size() * a.width), {}, 0, cb)
                : kv->ZPull(keys, &bufs[slot], nullptr, 0, cb);
  };

  Postoffice::Get()->Barrier(0, kEveryone);
  std::vector<double> lat_us;
  size_t next = 0;
  auto end = Clock::now() + std::chrono::duration<double>(a.seconds);
  while (Clock::now() < end) {
    auto began = Clock::now();
    kv->Wait(issue(next++, 0, nullptr));
    lat_us.push_back(Since(began) * 1e6);
  }
  std::sort(lat_us.begin(), lat_us.end());
  auto quantile = [&](double q) {
    return lat_us[std::min(lat_us.size() - 1, size_t(q * lat_us.size()))];
  };

  Window win(a.window);
  std::mutex counted;
  uint64_t done = 0, rows = 0;
  Postoffice::Get()->Barrier(0, kEveryone);
  double cpu = CpuSeconds();
  auto start = Clock::now();
  end = start + std::chrono::duration<double>(a.seconds);
  while (Clock::now() < end) {
    int slot = win.Take();
    size_t b = next++;
    size_t n = batches[b % kBatches].size();
    issue(b, slot, [&win, &counted, &done, &rows, slot, n] {
      { std::lock_guard<std::mutex> lk(counted); ++done; rows += n; }
      win.Give(slot);
    });
  }
  win.Drain(a.window);
  double secs = Since(start);
  Postoffice::Get()->Barrier(0, kEveryone);
  cpu = CpuSeconds() - cpu;
  printf("PSLITE_RESULT {\"op\":\"%s\",\"role\":\"worker\",\"rank\":%d,"
         "\"batches\":%llu,\"rows\":%llu,\"secs\":%.6f,\"p50_us\":%.1f,\"p99_us\":%.1f,"
         "\"cpu_s\":%.6f}\n",
         push ? "push" : "pull", MyRank(), (unsigned long long)done,
         (unsigned long long)rows, secs, quantile(0.5), quantile(0.99), cpu);
  fflush(stdout);
}

/// Schedulers and servers: follow the workers' barriers, report CPU.
static void FollowPhase(bool push) {
  Postoffice::Get()->Barrier(0, kEveryone);
  Postoffice::Get()->Barrier(0, kEveryone);
  double cpu = CpuSeconds();
  Postoffice::Get()->Barrier(0, kEveryone);
  cpu = CpuSeconds() - cpu;
  printf("PSLITE_RESULT {\"op\":\"%s\",\"role\":\"%s\",\"rank\":%d,\"cpu_s\":%.6f}\n",
         push ? "push" : "pull", IsServer() ? "server" : "scheduler",
         IsServer() ? MyRank() : 0, cpu);
  fflush(stdout);
}

int main(int argc, char* argv[]) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string f = argv[i];
    if (f == "--batch") a.batch = strtoul(argv[i + 1], nullptr, 10);
    else if (f == "--width") a.width = strtoul(argv[i + 1], nullptr, 10);
    else if (f == "--rows") a.rows = strtoull(argv[i + 1], nullptr, 10);
    else if (f == "--zipf") a.zipf = atof(argv[i + 1]);
    else if (f == "--window") a.window = atoi(argv[i + 1]);
    else if (f == "--seconds") a.seconds = atof(argv[i + 1]);
    else { fprintf(stderr, "unknown flag %s\n", f.c_str()); return 2; }
  }
  Start(0);
  if (IsServer()) {
    auto server = new KVServer<float>(0);
    RowsHandle handle;
    handle.width = a.width;
    server->set_request_handle(handle);
    RegisterExitCallback([server] { delete server; });
  }
  KVWorker<float>* kv = IsWorker() ? new KVWorker<float>(0, 0) : nullptr;
  for (bool push : {true, false}) {
    if (kv) RunWorker(kv, a, push);
    else FollowPhase(push);
  }
  delete kv;
  Finalize(0, true);
  return 0;
}
