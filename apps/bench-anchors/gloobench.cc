// gloobench: Gloo's collectives timed the way mwbench times meshwire's, as
// an anchor for scripts/bench.  Not part of meshwire: it links Gloo only.
//
//   gloobench -n RANKS [-t ibverbs|tcp] [-d DEVICE] [-g GID_INDEX] ADDR OP [BYTES...]
//
// OP: allreduce-ring, allreduce-hd (halving-doubling), allgather (ring),
// broadcast (one to all): the algorithm classes Gloo's ibverbs transport
// supports.  RANKS processes run on this host, forked before any device is
// opened, meeting through a file store in a temporary directory.  BYTES is
// the result buffer per rank (allgather: all ranks' parts together), f32.
// Rank 0 prints one line per size, as mwbench does:
//   op bytes ranks algo iters time_us algbw_MiB/s cpu_s
// cpu_s is rank 0's process (all its threads) during the timed iterations.
#include <gloo/allgather_ring.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/barrier_all_to_all.h>
#include <gloo/broadcast_one_to_all.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/ibverbs/device.h>
#include <gloo/transport/tcp/device.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace {

struct Options {
    int ranks = 2;
    std::string transport = "ibverbs", device = "rxe0", addr, op, store;
    int gid_index = 1;      // rxe: the IPv4-mapped GID, i.e. RoCE v2
    std::vector<size_t> sizes;
};

double now()
{
    using namespace std::chrono;
    return duration<double>(steady_clock::now().time_since_epoch()).count();
}

double cpu()
{
    rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
           (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

std::shared_ptr<gloo::transport::Device> open_device(const Options &o)
{
    if (o.transport == "tcp") {
        gloo::transport::tcp::attr a;
        a.hostname = o.addr;
        return gloo::transport::tcp::CreateDevice(a);
    }
    gloo::transport::ibverbs::attr a;
    a.name = o.device;
    a.port = 1;
    a.index = o.gid_index;
    return gloo::transport::ibverbs::CreateDevice(a);
}

// The algorithm for @op over @in/@out (count elements of the result).
std::unique_ptr<gloo::Algorithm> make(const Options &o,
                                      const std::shared_ptr<gloo::Context> &ctx,
                                      std::vector<float> &in, std::vector<float> &out)
{
    int count = static_cast<int>(out.size());
    if (o.op == "allreduce-ring")
        return std::make_unique<gloo::AllreduceRing<float>>(ctx, std::vector<float *>{out.data()}, count);
    if (o.op == "allreduce-hd")
        return std::make_unique<gloo::AllreduceHalvingDoubling<float>>(
            ctx, std::vector<float *>{out.data()}, count);
    if (o.op == "allgather")
        return std::make_unique<gloo::AllgatherRing<float>>(
            ctx, std::vector<const float *>{in.data()}, out.data(), count / ctx->size);
    if (o.op == "broadcast")
        return std::make_unique<gloo::BroadcastOneToAll<float>>(ctx, std::vector<float *>{out.data()},
                                                                out.size());
    return nullptr;
}

int run_rank(const Options &o, int rank)
{
    auto dev = open_device(o);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, o.ranks);
    gloo::rendezvous::FileStore store(o.store);
    ctx->connectFullMesh(store, dev);
    gloo::BarrierAllToAll barrier(ctx);
    for (size_t bytes : o.sizes) {
        size_t count = bytes / sizeof(float);
        count -= count % o.ranks;            // allgather: equal parts
        if (!count)
            count = o.ranks;
        std::vector<float> in(count / o.ranks, 1.0f), out(count, 1.0f);
        auto algo = make(o, ctx, in, out);
        if (!algo) {
            std::fprintf(stderr, "gloobench: unknown op %s\n", o.op.c_str());
            return 2;
        }
        unsigned iters = static_cast<unsigned>((32u << 20) / (count * sizeof(float)));
        iters = iters < 5 ? 5 : iters > 500 ? 500 : iters;
        algo->run();                                        // warm-up
        barrier.run();
        double t0 = now(), c0 = cpu();
        for (unsigned k = 0; k < iters; k++)
            algo->run();
        double t = (now() - t0) / iters, cs = cpu() - c0;
        barrier.run();
        if (rank == 0)
            std::printf("%-16s %-10zu %6d %6s %8u %12.1f %12.1f %8.3f\n", o.op.c_str(),
                        count * sizeof(float), o.ranks, ("gloo-" + o.transport).c_str(), iters,
                        t * 1e6, count * sizeof(float) / t / (1 << 20), cs);
    }
    return 0;
}

int usage()
{
    std::fprintf(stderr,
                 "usage: gloobench -n RANKS [-t ibverbs|tcp] [-d DEVICE] [-g GID_INDEX] ADDR OP [BYTES...]\n"
                 "       OP: allreduce-ring | allreduce-hd | allgather | broadcast\n");
    return 2;
}

}  // namespace

int main(int argc, char **argv)
{
    Options o;
    int c;
    while ((c = getopt(argc, argv, "n:t:d:g:")) != -1) {
        switch (c) {
        case 'n': o.ranks = std::atoi(optarg); break;
        case 't': o.transport = optarg; break;
        case 'd': o.device = optarg; break;
        case 'g': o.gid_index = std::atoi(optarg); break;
        default: return usage();
        }
    }
    if (argc - optind < 2 || o.ranks < 1 || o.ranks > 64 ||
        (o.transport != "ibverbs" && o.transport != "tcp"))
        return usage();
    o.addr = argv[optind];
    o.op = argv[optind + 1];
    for (int i = optind + 2; i < argc; i++)
        o.sizes.push_back(std::strtoull(argv[i], nullptr, 0));
    if (o.sizes.empty())
        o.sizes = {4096, 1u << 20, 16u << 20};
    char dir[] = "/tmp/gloobench.XXXXXX";
    if (!mkdtemp(dir)) {
        std::perror("gloobench: mkdtemp");
        return 1;
    }
    o.store = dir;
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    std::vector<pid_t> pids;
    for (int r = 0; r < o.ranks; r++) {
        pid_t pid = fork();
        if (pid == 0) {
            try {
                _exit(run_rank(o, r));
            } catch (const std::exception &e) {
                std::fprintf(stderr, "gloobench rank %d: %s\n", r, e.what());
                _exit(1);
            }
        }
        pids.push_back(pid);
    }
    int bad = 0;
    for (pid_t p : pids) {
        int st;
        waitpid(p, &st, 0);
        bad += !WIFEXITED(st) || WEXITSTATUS(st) != 0;
    }
    std::string rm = std::string("rm -rf ") + dir;
    if (std::system(rm.c_str()) != 0)
        bad++;
    return bad ? 1 : 0;
}
