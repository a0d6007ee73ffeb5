//! kv_bench: dmlc/ps-lite's side of `ps-microbench kv` (microbench/src/kv.rs).
//!
//! One float32 "key" of --size bytes is split evenly over the S servers: it is
//! S ps-lite keys, key i = kMaxKey / S * i (the start of server i's range, as
//! ps-lite's own tests place keys), each holding size / 4 / S floats. The W
//! worker processes push the whole key (a small gradient), then pull it. For
//! each operation, every worker runs
//!   - a latency phase: one operation in flight for --seconds, giving p50/p99;
//!   - a throughput phase: --window operations in flight for --seconds.
//! Servers apply each push with SGD (w -= 0.01 * g, weights start at 0.5, as
//! ps-server registers the key in kv.rs) and answer pulls with a copy of their
//! slice. CPU: every process (scheduler, servers, workers) reads getrusage
//! (user + sys, all threads) at the barriers that open and close the
//! throughput phase.
//!
//! Caveat: ps-lite's KVWorker keeps callbacks in an unordered_map and runs
//! one with an iterator held while unlocked; a --window above ~12 can grow
//! (rehash) that map under it. The default window of 8 never does.
//!
//! Each process prints one line per operation, `PSLITE_RESULT {json}`, to
//! stdout; scripts/pslite_bench.sh starts the roles (DMLC_* env vars) and sums
//! the lines up. All roles run this binary with the same flags.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "ps/ps.h"

using namespace ps;
using Clock = std::chrono::steady_clock;

static const float kLearningRate = 0.01f;
static const int kEveryone = kScheduler + kServerGroup + kWorkerGroup;

struct Args {
  size_t size = 4096;
  int window = 8;
  double seconds = 5;
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

/// Floats each server holds: the key split evenly over the servers.
static size_t SliceLen(const Args& a) { return a.size / 4 / NumServers(); }

static Key SliceKey(int server) { return kMaxKey / NumServers() * server; }

/// The server: SGD on push, a copy of the slice on pull.
struct SgdHandle {
  std::unordered_map<Key, std::vector<float>> store;

  void operator()(const KVMeta& meta, const KVPairs<float>& req,
                  KVServer<float>* server) {
    KVPairs<float> res;
    float* out = nullptr;
    for (size_t i = 0; i < req.keys.size(); ++i) {
      std::vector<float>& w = store.at(req.keys[i]);
      if (meta.push) {
        CHECK_EQ(req.vals.size(), req.keys.size() * w.size());
        const float* g = req.vals.data() + i * w.size();
        for (size_t j = 0; j < w.size(); ++j) w[j] -= kLearningRate * g[j];
      }
      if (meta.pull) {
        if (!out) {
          res.keys = req.keys;
          res.vals.resize(req.keys.size() * w.size());
          out = res.vals.data();
        }
        out = std::copy(w.begin(), w.end(), out);
      }
    }
    server->Response(meta, res);
  }
};

/// Keeps at most `window` operations in flight; callbacks free their slot.
struct Window {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int> free_slots;
  uint64_t done = 0;

  explicit Window(int k) {
    for (int i = 0; i < k; ++i) free_slots.push_back(i);
  }
  int Take() {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [this] { return !free_slots.empty(); });
    int s = free_slots.back();
    free_slots.pop_back();
    return s;
  }
  void Give(int slot) {
    {
      std::lock_guard<std::mutex> lk(mu);
      free_slots.push_back(slot);
      ++done;
    }
    cv.notify_one();
  }
  void Drain(size_t k) {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return free_slots.size() == k; });
  }
};

/// Runs one operation's two phases on a worker; prints its result line.
static void RunWorker(KVWorker<float>* kv, const Args& a, bool push) {
  const size_t len = SliceLen(a);
  std::vector<Key> key_list;
  for (int s = 0; s < NumServers(); ++s) key_list.push_back(SliceKey(s));
  SArray<Key> keys(key_list);
  SArray<float> grad(len * NumServers());
  for (size_t i = 0; i < grad.size(); ++i) grad[i] = ((i % 97) - 48.0f) * 1e-6f;
  std::vector<SArray<float>> bufs(a.window, SArray<float>(grad.size()));

  auto issue = [&](int slot, const std::function<void()>& cb) {
    return push ? kv->ZPush(keys, grad, {}, 0, cb)
                : kv->ZPull(keys, &bufs[slot], nullptr, 0, cb);
  };

  // Latency: one operation in flight.
  Postoffice::Get()->Barrier(0, kEveryone);
  std::vector<double> lat_us;
  auto end = Clock::now() + std::chrono::duration<double>(a.seconds);
  while (Clock::now() < end) {
    auto began = Clock::now();
    kv->Wait(issue(0, nullptr));
    lat_us.push_back(Since(began) * 1e6);
  }
  std::sort(lat_us.begin(), lat_us.end());
  auto quantile = [&](double q) {
    return lat_us[std::min(lat_us.size() - 1, size_t(q * lat_us.size()))];
  };

  // Throughput: `window` in flight, CPU read at the barriers around it.
  Window win(a.window);
  Postoffice::Get()->Barrier(0, kEveryone);
  double cpu = CpuSeconds();
  auto start = Clock::now();
  end = start + std::chrono::duration<double>(a.seconds);
  while (Clock::now() < end) {
    int slot = win.Take();
    issue(slot, [&win, slot] { win.Give(slot); });
  }
  win.Drain(a.window);
  double secs = Since(start);
  Postoffice::Get()->Barrier(0, kEveryone);
  cpu = CpuSeconds() - cpu;
  printf("PSLITE_RESULT {\"op\":\"%s\",\"role\":\"worker\",\"rank\":%d,"
         "\"ops\":%llu,\"secs\":%.6f,\"p50_us\":%.1f,\"p99_us\":%.1f,"
         "\"lat_ops\":%zu,\"cpu_s\":%.6f}\n",
         push ? "push" : "pull", MyRank(), (unsigned long long)win.done, secs,
         quantile(0.5), quantile(0.99), lat_us.size(), cpu);
  fflush(stdout);
}

/// Schedulers and servers: follow the workers' barriers, report CPU.
static void FollowPhase(bool push) {
  Postoffice::Get()->Barrier(0, kEveryone);  // latency starts
  Postoffice::Get()->Barrier(0, kEveryone);  // throughput starts
  double cpu = CpuSeconds();
  Postoffice::Get()->Barrier(0, kEveryone);  // throughput drained
  cpu = CpuSeconds() - cpu;
  printf("PSLITE_RESULT {\"op\":\"%s\",\"role\":\"%s\",\"rank\":%d,"
         "\"cpu_s\":%.6f}\n",
         push ? "push" : "pull", IsServer() ? "server" : "scheduler",
         IsServer() ? MyRank() : 0, cpu);
  fflush(stdout);
}

int main(int argc, char* argv[]) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string f = argv[i];
    if (f == "--size") a.size = strtoul(argv[i + 1], nullptr, 10);
    else if (f == "--window") a.window = atoi(argv[i + 1]);
    else if (f == "--seconds") a.seconds = atof(argv[i + 1]);
    else { fprintf(stderr, "unknown flag %s\n", f.c_str()); return 2; }
  }
  Start(0);
  if (a.size % (4 * NumServers()) != 0 || a.size == 0 || a.window < 1) {
    LOG(FATAL) << "--size must be a multiple of 4 * servers, --window >= 1";
  }
  if (IsServer()) {
    auto server = new KVServer<float>(0);
    SgdHandle handle;
    handle.store[SliceKey(MyRank())] = std::vector<float>(SliceLen(a), 0.5f);
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
