// The thread communicator (comm/threads.h) on CPU tensors: every collective on 1–4 rank threads
// against a naive loop over what each rank contributed (rank r's element e is a known function of
// r and e), the sub-groups of split, the non-blocking all-reduce, and a failing rank that ends the
// job instead of hanging it. Assertions run on the Catch thread, after run_thread_ranks returns.
#include <catch2/catch.hpp>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/threads.h"
#include "device/stream_slot.h"
#include "tensor/convert.h"

namespace autosp {
namespace {

// Rank r's contribution at element e: distinct per (r, e), exact in f32 and bf16 sums.
double value(int r, int64_t e) { return static_cast<double>((r + 1) * 8 + e % 7 - 3); }

Tensor rank_tensor(int r, int64_t n, DType dt) {
  std::vector<double> v;
  for (int64_t e = 0; e < n; ++e) v.push_back(value(r, e));
  Tensor d = Tensor::from_vector<double>({n}, v);
  if (dt == DType::f64) return d;
  Tensor t = Tensor::empty({n}, dt);
  for (int64_t e = 0; e < n; ++e) {
    switch (dt) {
      case DType::f32: t.data<float>()[e] = static_cast<float>(v[static_cast<size_t>(e)]); break;
      case DType::i64: t.data<int64_t>()[e] = static_cast<int64_t>(v[static_cast<size_t>(e)]); break;
      case DType::bf16: t.data<uint16_t>()[e] = cpu::f32_to_bf16(static_cast<float>(v[static_cast<size_t>(e)])); break;
      default: FAIL("dtype");
    }
  }
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

TEST_CASE("threads: all_reduce_sum equals the naive sum on every rank, bitwise alike", "[threads]") {
  for (const DType dt : {DType::f32, DType::f64, DType::i64, DType::bf16}) {
    for (int P = 1; P <= 4; ++P) {
      INFO(dtype_name(dt) << ", P = " << P);
      const int64_t n = 37;
      std::vector<Tensor> got(static_cast<size_t>(P));
      run_thread_ranks(P, [&](ThreadCommunicator& w) {
        Tensor t = rank_tensor(w.rank(), n, dt);
        w.all_reduce_sum(t);
        got[static_cast<size_t>(w.rank())] = t;
      });
      for (int r = 0; r < P; ++r) {
        const auto g = got[static_cast<size_t>(r)].to_doubles();
        for (int64_t e = 0; e < n; ++e) {
          double want = 0;
          for (int i = 0; i < P; ++i) want += value(i, e);
          CHECK(g[static_cast<size_t>(e)] == want);
        }
        CHECK(same_bytes(got[static_cast<size_t>(r)], got[0]));
      }
    }
  }
}

TEST_CASE("threads: broadcast, all_to_all, all_gather and reduce_scatter_sum move the right chunks",
          "[threads]") {
  for (int P = 1; P <= 4; ++P) {
    INFO("P = " << P);
    const int64_t chunk = 5, n = chunk * P;
    struct Out {
      std::vector<Tensor> bcast;  // by root
      Tensor a2a, a2a_in_place, gathered, scattered;
    };
    std::vector<Out> out(static_cast<size_t>(P));
    run_thread_ranks(P, [&](ThreadCommunicator& w) {
      Out& o = out[static_cast<size_t>(w.rank())];
      for (int root = 0; root < P; ++root) {
        Tensor t = rank_tensor(w.rank(), 11, DType::f32);
        w.broadcast(t, root);
        o.bcast.push_back(t);
      }
      const Tensor in = rank_tensor(w.rank(), n, DType::f32);
      o.a2a = Tensor::empty({n}, DType::f32);
      w.all_to_all(in, o.a2a);
      o.a2a_in_place = rank_tensor(w.rank(), n, DType::f32);
      w.all_to_all(o.a2a_in_place, o.a2a_in_place);
      const Tensor piece = rank_tensor(w.rank(), chunk, DType::f64);
      o.gathered = Tensor::empty({n}, DType::f64);
      w.all_gather(piece, o.gathered);
      o.scattered = Tensor::empty({chunk}, DType::f32);
      w.reduce_scatter_sum(in, o.scattered);
    });
    for (int r = 0; r < P; ++r) {
      INFO("rank " << r);
      const Out& o = out[static_cast<size_t>(r)];
      for (int root = 0; root < P; ++root) {
        const auto b = o.bcast[static_cast<size_t>(root)].to_doubles();
        for (int64_t e = 0; e < 11; ++e) CHECK(b[static_cast<size_t>(e)] == value(root, e));
      }
      const auto a = o.a2a.to_doubles(), ai = o.a2a_in_place.to_doubles(), g = o.gathered.to_doubles(),
                 sc = o.scattered.to_doubles();
      for (int i = 0; i < P; ++i)
        for (int64_t e = 0; e < chunk; ++e) {
          // all_to_all: chunk i here is chunk r of rank i; all_gather: chunk i is rank i's piece.
          const size_t at = static_cast<size_t>(i * chunk + e);
          CHECK(a[at] == value(i, r * chunk + e));
          CHECK(ai[at] == value(i, r * chunk + e));
          CHECK(g[at] == value(i, e));
        }
      for (int64_t e = 0; e < chunk; ++e) {
        double want = 0;
        for (int i = 0; i < P; ++i) want += value(i, r * chunk + e);
        CHECK(sc[static_cast<size_t>(e)] == want);
      }
    }
  }
}

// On a GPU each rank then has its own compute stream and allocator (device/cuda/device.h; the
// streams themselves are checked in tests/cuda/test_thread_sp.cpp).
TEST_CASE("threads: rank r runs in stream slot r + 1, and the caller's thread stays in slot 0", "[threads]") {
  for (int P = 1; P <= 4; ++P) {
    std::vector<int> slot(static_cast<size_t>(P), -1);
    run_thread_ranks(P, [&](ThreadCommunicator& w) { slot[static_cast<size_t>(w.rank())] = stream_slot(); });
    for (int r = 0; r < P; ++r) CHECK(slot[static_cast<size_t>(r)] == r + 1);
    CHECK(stream_slot() == 0);
  }
  // A rank that throws leaves its slot too; the next run's ranks enter theirs afresh.
  CHECK_THROWS(run_thread_ranks(2, [](ThreadCommunicator& w) {
    if (w.rank() == 1) throw std::runtime_error("rank 1 fails");
  }));
  std::vector<int> again(2, -1);
  run_thread_ranks(2, [&](ThreadCommunicator& w) { again[static_cast<size_t>(w.rank())] = stream_slot(); });
  CHECK(again == std::vector<int>{1, 2});
}

TEST_CASE("threads: a stream slot scope sets the thread's slot, restores 0 and does not nest", "[threads]") {
  CHECK(stream_slot() == 0);
  {
    StreamSlotScope in(3);
    CHECK(stream_slot() == 3);
    CHECK_THROWS_WITH(StreamSlotScope(2), Catch::Contains("already in slot 3"));
    CHECK(stream_slot() == 3);
    in.leave();
    CHECK(stream_slot() == 0);
  }
  {
    StreamSlotScope in(1);
  }
  CHECK(stream_slot() == 0);
  CHECK_THROWS(StreamSlotScope(-1));
}

TEST_CASE("threads: split makes the sub-groups MPI_Comm_split makes", "[threads]") {
  // 4 ranks, color rank % 2, key -rank: {0, 2} and {1, 3}, each ordered by descending world rank.
  struct Out {
    int sub_rank = -1, sub_size = -1, nested_size = -1;
    double sum = 0;
  };
  std::vector<Out> out(4);
  run_thread_ranks(4, [&](ThreadCommunicator& w) {
    Out& o = out[static_cast<size_t>(w.rank())];
    auto sub = w.split(w.rank() % 2, -w.rank());
    o.sub_rank = sub->rank();
    o.sub_size = sub->size();
    Tensor t = Tensor::from_vector<double>({1}, {static_cast<double>(w.rank() + 1)});
    sub->all_reduce_sum(t);
    o.sum = t.to_doubles()[0];
    auto nested = sub->split(0, sub->rank());  // a split of a split
    o.nested_size = nested->size();
    w.barrier();
  });
  const int want_sub_rank[4] = {1, 1, 0, 0};
  const double want_sum[4] = {1 + 3, 2 + 4, 1 + 3, 2 + 4};
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r);
    CHECK(out[static_cast<size_t>(r)].sub_size == 2);
    CHECK(out[static_cast<size_t>(r)].sub_rank == want_sub_rank[r]);
    CHECK(out[static_cast<size_t>(r)].sum == want_sum[r]);
    CHECK(out[static_cast<size_t>(r)].nested_size == 2);
  }
}

TEST_CASE("threads: non-blocking all-reduces and a reduce-scatter finish in order, before a blocking collective",
          "[threads]") {
  const int P = 3, k = 5;
  std::vector<std::vector<double>> got(P);
  run_thread_ranks(P, [&](ThreadCommunicator& w) {
    std::vector<Tensor> ts;
    for (int i = 0; i < k; ++i) ts.push_back(Tensor::from_vector<double>({2}, {double(w.rank() + i), 1.0}));
    std::vector<std::unique_ptr<PendingCollective>> pending;
    for (auto& t : ts) pending.push_back(w.all_reduce_sum_async(t));
    // A non-blocking reduce-scatter among them: chunk r of [r0, r1, r2] summed onto rank r.
    const Tensor scatter_in = Tensor::from_vector<double>({3}, {1.0 * w.rank(), 10.0 * w.rank(), 100.0 * w.rank()});
    Tensor scatter_out = Tensor::empty({1}, DType::f64);
    pending.push_back(w.reduce_scatter_sum_async(scatter_in, scatter_out));
    Tensor blocking = Tensor::from_vector<double>({1}, {double(w.rank())});
    w.all_reduce_sum(blocking);  // runs after the started ones
    pending[0]->wait();
    for (auto& p : pending) {
      while (!p->test()) {
      }
    }
    for (auto& t : ts) got[static_cast<size_t>(w.rank())].push_back(t.to_doubles()[0]);
    got[static_cast<size_t>(w.rank())].push_back(ts[0].to_doubles()[1]);
    got[static_cast<size_t>(w.rank())].push_back(blocking.to_doubles()[0]);
    got[static_cast<size_t>(w.rank())].push_back(scatter_out.to_doubles()[0]);
  });
  for (int r = 0; r < P; ++r) {
    INFO("rank " << r);
    const auto& g = got[static_cast<size_t>(r)];
    REQUIRE(g.size() == static_cast<size_t>(k + 3));
    for (int i = 0; i < k; ++i) CHECK(g[static_cast<size_t>(i)] == 0 + 1 + 2 + 3.0 * i);
    CHECK(g[k] == 3.0);
    CHECK(g[k + 1] == 0 + 1 + 2);
    const double scale[3] = {1, 10, 100};
    CHECK(g[k + 2] == scale[r] * (0 + 1 + 2));
  }
}

// ZeRO-3's prefetch: all_gather_async returns on rank 0 before rank 1 has reached the collective
// (rank 1 waits, up to 5 s, for rank 0 to say it has returned; a blocking gather would hold rank 0
// until rank 1 came, and rank 1 would see no word for 5 s), and the result is the ranks' shards in
// rank order once waited for.
TEST_CASE("threads: all_gather_async returns before the peers arrive, then holds every rank's shard", "[threads]") {
  const int P = 2;
  const int64_t n = 3;
  std::mutex mu;
  std::condition_variable cv;
  bool returned = false, rank1_saw_it = false;
  std::vector<std::vector<double>> got(P);
  run_thread_ranks(P, [&](ThreadCommunicator& w) {
    const Tensor shard = rank_tensor(w.rank(), n, DType::f64);
    Tensor whole = Tensor::empty({P * n}, DType::f64);
    if (w.rank() == 1) {
      std::unique_lock<std::mutex> lock(mu);
      rank1_saw_it = cv.wait_for(lock, std::chrono::seconds(5), [&] { return returned; });
    }
    auto pending = w.all_gather_async(shard, whole);
    if (w.rank() == 0) {
      {
        std::lock_guard<std::mutex> lock(mu);
        returned = true;
      }
      cv.notify_all();
    }
    pending->wait();
    got[static_cast<size_t>(w.rank())] = whole.to_doubles();
  });
  CHECK(rank1_saw_it);
  for (int r = 0; r < P; ++r) {
    INFO("rank " << r);
    REQUIRE(got[static_cast<size_t>(r)].size() == static_cast<size_t>(P * n));
    for (int src = 0; src < P; ++src)
      for (int64_t e = 0; e < n; ++e) CHECK(got[static_cast<size_t>(r)][static_cast<size_t>(src * n + e)] == value(src, e));
  }
}

TEST_CASE("threads: a rank that throws ends the job with its own error, not a hang", "[threads]") {
  // Rank 1 fails before the collective the others wait in: they stop with "another rank failed",
  // and run_thread_ranks rethrows rank 1's UsageError.
  std::vector<std::string> others(4);
  try {
    run_thread_ranks(4, [&](ThreadCommunicator& w) {
      if (w.rank() == 1) throw UsageError("rank 1: bad input");
      try {
        Tensor t = Tensor::from_vector<double>({1}, {1.0});
        w.all_reduce_sum(t);
      } catch (const RuntimeFailure& e) {
        others[static_cast<size_t>(w.rank())] = e.what();
        throw;
      }
    });
    FAIL("run_thread_ranks returned");
  } catch (const UsageError& e) {
    CHECK(std::string(e.what()) == "rank 1: bad input");
  }
  for (const int r : {0, 2, 3}) CHECK(others[static_cast<size_t>(r)].find("another rank failed") != std::string::npos);
  CHECK_THROWS_AS(run_thread_ranks(0, [](ThreadCommunicator&) {}), UsageError);
}

TEST_CASE("threads: mismatched sizes on two ranks are an error on every rank", "[threads]") {
  int failed = 0;
  std::mutex mu;
  CHECK_THROWS(run_thread_ranks(2, [&](ThreadCommunicator& w) {
    try {
      Tensor t = Tensor::zeros({w.rank() == 0 ? 4 : 6}, DType::f32);
      Tensor out = Tensor::zeros({w.rank() == 0 ? 4 : 6}, DType::f32);
      w.all_to_all(t, out);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      ++failed;
      throw;
    }
  }));
  CHECK(failed == 2);
}

// Point to point (ring attention's windowed exchange, decision 135): each side has its own size,
// and an empty side is no message. A receiver that expects other bytes than its sender sends is
// an error on every rank, not a hang.
TEST_CASE("threads: send_recv_async sides of different sizes, empty ones, and a size mismatch", "[threads]") {
  // A ring of 3: rank r sends r + 1 floats (value 10r + i) to r + 1 and receives its predecessor's.
  run_thread_ranks(3, [&](ThreadCommunicator& w) {
    const int r = w.rank(), from = (r + 2) % 3;
    std::vector<float> out;
    for (int i = 0; i <= r; ++i) out.push_back(float(10 * r + i));
    const Tensor send = Tensor::from_vector<float>({r + 1}, out);
    Tensor recv = Tensor::zeros({from + 1}, DType::f32);
    w.send_recv_async(send, (r + 1) % 3, recv, from)->wait();
    for (int i = 0; i <= from; ++i) CHECK(recv.data<float>()[i] == float(10 * from + i));
  });
  // Two ranks: rank 0 sends 3 floats and receives nothing; rank 1 the other way round.
  run_thread_ranks(2, [&](ThreadCommunicator& w) {
    const Tensor send = Tensor::from_vector<float>({w.rank() == 0 ? 3 : 0}, w.rank() == 0 ? std::vector<float>{1, 2, 3}
                                                                                         : std::vector<float>{});
    Tensor recv = Tensor::zeros({w.rank() == 0 ? 0 : 3}, DType::f32);
    w.send_recv_async(send, 1 - w.rank(), recv, 1 - w.rank())->wait();
    if (w.rank() == 1) CHECK(recv.to_doubles() == std::vector<double>{1, 2, 3});
  });
  int failed = 0;
  std::mutex mu;
  CHECK_THROWS_WITH(run_thread_ranks(2, [&](ThreadCommunicator& w) {
    try {
      const Tensor send = Tensor::zeros({2}, DType::f32);
      Tensor recv = Tensor::zeros({w.rank() == 0 ? 2 : 3}, DType::f32);  // rank 1 expects 3 floats
      w.send_recv_async(send, 1 - w.rank(), recv, 1 - w.rank())->wait();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      ++failed;
      throw;
    }
  }), Catch::Contains("rank 0 sends 8 bytes to rank 1, which receives 12"));
  CHECK(failed == 2);
}

}  // namespace
}  // namespace autosp
