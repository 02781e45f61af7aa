// Command report measures compactcache beside the stock cache plugin on the
// reference workload and prints the figures of ../shared/WORKLOAD.md side by
// side, with ratios: bytes per entry, allocations and time per insert and per
// hit, GC wall time, and hit rates on the zipf trace at equal memory budgets.
//
//	go run ./bench/report                              # N = 1M, both caches
//	go run ./bench/report -n 10000000 -caches compactcache
//
// Progress goes to stderr, the table to stdout. A cache that does not store
// every entry is reported as a failure, with exit status 1, not measured.
package main

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/compactcache/compactcache/bench"
	"github.com/compactcache/compactcache/bench/harness"
	"github.com/compactcache/compactcache/internal/workload"
)

// stockMax is the largest N the stock cache is measured at: it holds about
// 1.1 KB of heap per entry, and the GC lets the heap grow to twice that.
const stockMax = 2_000_000

type config struct {
	n        int
	kinds    []bench.Kind
	variant  workload.Variant
	raw      bool
	capacity int64 // compactcache's budget for the N entries
	hits     int
	gcSmall  int
	budgets  []int64 // zipf budgets, bytes
	trace    int
}

// cmd is this command, for its usage and its lines on stderr.
const cmd = harness.Command("report")

func main() {
	// A flag set of its own: CoreDNS's packages define flags of theirs on
	// the default one (-conf, -dns.port, ...), which mean nothing here.
	fs := flag.NewFlagSet("report", flag.ExitOnError)
	var (
		cfg     config
		caches  = fs.String("caches", "cache,compactcache", "caches to measure: cache (the stock plugin), compactcache")
		variant = fs.String("variant", "plain", "workload variant: plain, or a list of cname, dnssec, ecs")
		capMiB  = fs.Int64("capacity", 0, "compactcache's budget in MiB for the N entries (0: 512, or N*512 bytes if more)")
		budgets = fs.String("budgets", "16,64,256", "zipf hit-rate budgets in MiB")
		child   = fs.String("child", "", "internal: run as a child measurement (gc or zipf)")
		kind    = fs.String("cache", "", "internal: the child's cache")
		budget  = fs.Int64("budget", 0, "internal: the zipf child's budget in bytes")
		stockN  = fs.Int("stock-entries", 0, "internal: the zipf child's stock cache capacity")
	)
	fs.IntVar(&cfg.n, "n", 1_000_000, "entries stored (N)")
	fs.BoolVar(&cfg.raw, "raw", false, "compactcache writes hits as raw bytes (w.Write) instead of WriteMsg")
	fs.IntVar(&cfg.hits, "hits", 1_000_000, "hit queries timed")
	fs.IntVar(&cfg.gcSmall, "gc-small", 100_000, "the small N runtime.GC() is timed at, beside N")
	fs.IntVar(&cfg.trace, "trace", 1_000_000, "zipf queries per pass: one pass warms up, the next is measured")
	fs.Usage = func() { cmd.Usage(fs) }
	fs.Parse(os.Args[1:])

	var err error
	if cfg.variant, err = workload.ParseVariant(*variant); err != nil {
		cmd.Fatal(err)
	}
	if cfg.n <= 0 || cfg.hits <= 0 || cfg.trace <= 0 {
		cmd.Fatal(fmt.Errorf("-n, -hits and -trace must be positive"))
	}
	cfg.capacity = max(512<<20, int64(cfg.n)*512)
	if *capMiB > 0 {
		cfg.capacity = *capMiB << 20
	}
	for _, b := range strings.Split(*budgets, ",") {
		var mib int64
		if _, err := fmt.Sscan(b, &mib); err != nil || mib <= 0 {
			cmd.Fatal(fmt.Errorf("bad budget %q", b))
		}
		cfg.budgets = append(cfg.budgets, mib<<20)
	}

	switch *child {
	case "gc":
		err = childGC(cfg, bench.Kind(*kind))
	case "zipf":
		err = childZipf(cfg, bench.Kind(*kind), *budget, *stockN)
	case "":
		for _, k := range strings.Split(*caches, ",") {
			switch k := bench.Kind(strings.TrimSpace(k)); k {
			case bench.Stock, bench.Compact:
				cfg.kinds = append(cfg.kinds, k)
			default:
				cmd.Fatal(fmt.Errorf("unknown cache %q (want cache, compactcache)", k))
			}
		}
		if cfg.n > stockMax && slices.Contains(cfg.kinds, bench.Stock) {
			cmd.Fatal(fmt.Errorf("-n %d: the stock cache needs about 2.2 KB of memory per entry; above %d measure compactcache alone (-caches compactcache)", cfg.n, stockMax))
		}
		err = run(cfg)
	default:
		err = fmt.Errorf("unknown child %q", *child)
	}
	if err != nil {
		cmd.Fatal(err)
	}
}
