// Command trace replays seeded query traces through compactcache and the
// stock cache plugin at fixed byte budgets, and beside them through offline
// simulations of eviction policies given the same entry sizes and the same
// bytes: LRU, CLOCK, S3-FIFO, W-TinyLFU (otter v2) and Belady's OPT. It
// prints the hit rate of every trace at every budget, and that of the
// hottest 1% of the names.
//
//	go run ./bench/trace                                  # every trace and budget, about 10 minutes
//	go run ./bench/trace -traces flood -budgets 4 -caches compactcache,W-TinyLFU
//	go run ./bench/trace -traces zipf-0.9 -budgets 6 -caches cache,compactcache -signed -do 10
//
// With -signed the upstream signs the answers of the Zipf names (an RRSIG per
// RRset, sent to DO queries only, as a signing server sends it), and -do sets
// the share of queries that set DO.
//
// compactcache's hashes, and so its hit rates, differ from run to run with
// the store's random seed. Built with -tags compactcache_seed, the store
// hashes keys from COMPACTCACHE_SEED (a uint64) when it is set, the same in
// every run, so that two builds compare on the same draws:
//
//	go build -tags compactcache_seed -o /tmp/trace ./trace && COMPACTCACHE_SEED=1 /tmp/trace -traces flood
//
// Hit rates do not depend on timing: every replay is single-threaded, and
// replays run side by side (-parallel). Progress goes to stderr, the tables
// to stdout.
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/compactcache/compactcache/bench"
	"github.com/compactcache/compactcache/bench/harness"
)

const cmd = harness.Command("trace")

type config struct {
	specs      []spec
	budgets    []int64
	columns    []string // bench.Compact, bench.Stock and simulation names, in table order
	queries    int
	names      int
	warmUp     float64
	stockBytes int
	procs      int
	parallel   int
	dnssec     dnssecMode
}

func main() {
	fs := flag.NewFlagSet("trace", flag.ExitOnError)
	var (
		cfg     config
		traces  = fs.String("traces", "all", "traces to replay: all, or a list of "+specList())
		budgets = fs.String("budgets", "4,6,16,64", "byte budgets in MiB")
		caches  = fs.String("caches", "all", "columns: all, or a list of cache, compactcache, "+strings.Join(simNames, ", "))
	)
	fs.IntVar(&cfg.queries, "queries", 1_000_000, "queries per trace")
	fs.IntVar(&cfg.names, "names", 200_000, "names of the Zipf popularity")
	fs.Float64Var(&cfg.warmUp, "warmup", 0.2, "share of each trace that warms the caches up, not counted")
	fs.IntVar(&cfg.stockBytes, "stock-bytes", 1071, "the stock cache's bytes per entry: it gets budget / this many entries (BENCHMARKS.md, key R)")
	fs.IntVar(&cfg.procs, "procs", 2, "GOMAXPROCS, which sets compactcache's number of shards")
	fs.IntVar(&cfg.parallel, "parallel", 2, "replays run at a time")
	fs.BoolVar(&cfg.dnssec.signed, "signed", false, "the upstream signs the Zipf names' answers: an RRSIG per RRset, to DO queries only")
	fs.IntVar(&cfg.dnssec.do, "do", 0, "percent of queries with DO (0 to 100)")
	fs.Usage = func() { cmd.Usage(fs) }
	fs.Parse(os.Args[1:])

	var err error
	if cfg.specs, err = findSpecs(*traces); err != nil {
		cmd.Fatal(err)
	}
	for b := range strings.SplitSeq(*budgets, ",") {
		var mib int64
		if _, err := fmt.Sscan(b, &mib); err != nil || mib <= 0 {
			cmd.Fatal(fmt.Errorf("bad budget %q", b))
		}
		cfg.budgets = append(cfg.budgets, mib<<20)
	}
	all := append([]string{string(bench.Stock), string(bench.Compact)}, simNames...)
	if *caches == "all" {
		cfg.columns = all
	} else {
		for c := range strings.SplitSeq(*caches, ",") {
			c = strings.TrimSpace(c)
			if !slices.Contains(all, c) {
				cmd.Fatal(fmt.Errorf("unknown column %q (want all, or some of %s)", c, strings.Join(all, ", ")))
			}
			cfg.columns = append(cfg.columns, c)
		}
		slices.SortStableFunc(cfg.columns, func(a, b string) int { return slices.Index(all, a) - slices.Index(all, b) })
	}
	if cfg.queries <= 0 || cfg.names < 100 || cfg.warmUp < 0 || cfg.warmUp >= 1 || cfg.parallel < 1 || cfg.procs < 1 || cfg.dnssec.do < 0 || cfg.dnssec.do > 100 {
		cmd.Fatal(fmt.Errorf("bad -queries, -names, -warmup, -parallel, -procs or -do"))
	}
	runtime.GOMAXPROCS(cfg.procs)
	if err := run(cfg); err != nil {
		cmd.Fatal(err)
	}
}

func specList() string {
	var names []string
	for _, s := range specs {
		names = append(names, s.name)
	}
	return strings.Join(names, ", ")
}

// cell names one replay: a trace, a budget and a column.
type cell struct {
	trace, budget int
	column        string
}

func run(cfg config) error {
	started, revision := time.Now(), harness.Revision()
	cmd.Progress("generating %d traces of %d queries and sizing their entries", len(cfg.specs), cfg.queries)
	sz := &sizes{s: newSizer(cfg.dnssec), known: map[uint32]int32{}}
	traces := make([]*prepared, len(cfg.specs))
	for k, s := range cfg.specs {
		traces[k] = prepare(s.generate(cfg.names, cfg.queries, cfg.warmUp), sz)
	}
	sz.known = nil

	var cells []cell
	for t := range traces {
		for b := range cfg.budgets {
			for _, c := range cfg.columns {
				cells = append(cells, cell{t, b, c})
			}
		}
	}
	// The slowest first, so that the last replays running are short ones.
	cost := func(c cell) int {
		switch c.column {
		case string(bench.Stock):
			return 3
		case string(bench.Compact), simTinyLF:
			return 2
		}
		return 1
	}
	slices.SortStableFunc(cells, func(a, b cell) int { return cost(b) - cost(a) })

	var (
		mu      sync.Mutex
		results = map[cell]result{}
		errs    []error
		wg      sync.WaitGroup
		queue   = make(chan cell)
		done    int
	)
	for range cfg.parallel {
		wg.Go(func() {
			for c := range queue {
				p, budget := traces[c.trace], cfg.budgets[c.budget]
				start := time.Now()
				r, err := replayCell(cfg, p, budget, c.column)
				mu.Lock()
				done++
				if err != nil {
					errs = append(errs, fmt.Errorf("%s, %s at %d MiB: %v", p.name, c.column, budget>>20, err))
				} else {
					results[c] = r
					cmd.Progress("[%d/%d] %s at %d MiB, %s: %.4f, hot %.4f (%.1f s)", done, len(cells), p.name, budget>>20, c.column,
						r.rate(), r.hotRate(), time.Since(start).Seconds())
				}
				mu.Unlock()
			}
		})
	}
	for _, c := range cells {
		queue <- c
	}
	close(queue)
	wg.Wait()
	if len(errs) > 0 {
		return errs[0]
	}
	printTables(os.Stdout, cfg, traces, results, started, revision)
	return nil
}

// replayCell replays p through column at budget.
func replayCell(cfg config, p *prepared, budget int64, column string) (result, error) {
	if column != string(bench.Stock) && column != string(bench.Compact) {
		return result{tally: simulate(p, column, budget)}, nil
	}
	c, up, err := newCache(bench.Kind(column), budget, cfg.stockBytes, cfg.dnssec)
	if err != nil {
		return result{}, err
	}
	return replay(p, c, up, cfg.dnssec)
}
