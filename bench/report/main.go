// Command report measures compactcache beside the stock cache plugin on the
// reference workload and prints the figures of ../shared/WORKLOAD.md side by
// side, with ratios: bytes per entry, allocations and time per insert and per
// hit, GC wall time, and hit rates on the zipf trace at equal memory budgets.
// Given several Ns, it measures each in a child of its own and can write the
// figures against N to a CSV and draw them (bytes per entry, hit and insert
// time against N).
//
//	go run ./bench/report                              # N = 1M, both caches
//	go run ./bench/report -n 10000000 -caches compactcache
//	go run ./bench/report -n 100000,1000000,10000000 -caches compactcache -raw -budgets '' -csv c.csv -plot c.png
//	go run ./bench/report -from c.csv -plot c.png      # redraw from the CSV
//
// Progress goes to stderr, the tables to stdout. A cache that does not store
// every entry is reported as a failure, with exit status 1, not measured.
package main

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
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
		ns      = fs.String("n", "1000000", "entries stored (N), or a list of Ns each measured in a child of its own")
		csvPath = fs.String("csv", "", "write each cache's figures at each N to this CSV file")
		plotPNG = fs.String("plot", "", "draw bytes per entry, hit and insert time against N into this PNG file")
		from    = fs.String("from", "", "measure nothing: read the figures from this CSV file (for -plot)")
		rowsOut = fs.String("rows", "", "internal: write the figures of the N measured to this file")
		child   = fs.String("child", "", "internal: run as a child measurement (gc or zipf)")
		kind    = fs.String("cache", "", "internal: the child's cache")
		budget  = fs.Int64("budget", 0, "internal: the zipf child's budget in bytes")
		stockN  = fs.Int("stock-entries", 0, "internal: the zipf child's stock cache capacity")
	)
	fs.BoolVar(&cfg.raw, "raw", false, "compactcache writes hits as raw bytes (w.Write) instead of WriteMsg")
	fs.IntVar(&cfg.hits, "hits", 1_000_000, "hit queries timed")
	fs.IntVar(&cfg.gcSmall, "gc-small", 100_000, "the small N runtime.GC() is timed at, beside N (0: none)")
	fs.IntVar(&cfg.trace, "trace", 1_000_000, "zipf queries per pass: one pass warms up, the next is measured")
	fs.Usage = func() { cmd.Usage(fs) }
	fs.Parse(os.Args[1:])

	if *from != "" {
		rows, err := readCSV(*from)
		if err == nil {
			err = output(rows, "", *plotPNG)
		}
		if err != nil {
			cmd.Fatal(err)
		}
		return
	}
	var err error
	var sizes []int
	for f := range strings.SplitSeq(*ns, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			cmd.Fatal(fmt.Errorf("-n: bad N %q", f))
		}
		sizes = append(sizes, n)
	}
	cfg.n = sizes[0]
	if cfg.variant, err = workload.ParseVariant(*variant); err != nil {
		cmd.Fatal(err)
	}
	if slices.Min(sizes) <= 0 || cfg.hits <= 0 || cfg.trace <= 0 {
		cmd.Fatal(fmt.Errorf("-n, -hits and -trace must be positive"))
	}
	cfg.capacity = max(512<<20, int64(cfg.n)*512)
	if *capMiB > 0 {
		cfg.capacity = *capMiB << 20
	}
	for b := range strings.SplitSeq(*budgets, ",") {
		if b = strings.TrimSpace(b); b == "" {
			continue
		}
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
		if n := slices.Max(sizes); n > stockMax && slices.Contains(cfg.kinds, bench.Stock) {
			cmd.Fatal(fmt.Errorf("-n %d: the stock cache needs about 2.2 KB of memory per entry; above %d measure compactcache alone (-caches compactcache)", n, stockMax))
		}
		var rows []row
		if len(sizes) > 1 {
			rows, err = runEach(sizes, childFlags(fs))
		} else {
			rows, err = run(cfg)
		}
		if *rowsOut != "" {
			if werr := writeRows(*rowsOut, rows); werr != nil {
				cmd.Fatal(werr)
			}
		}
		if oerr := output(rows, *csvPath, *plotPNG); err == nil {
			err = oerr
		}
	default:
		err = fmt.Errorf("unknown child %q", *child)
	}
	if err != nil {
		cmd.Fatal(err)
	}
}

// childFlags returns the flags set on the command line for the children of
// runEach, but -n and those whose files are the parent's.
func childFlags(fs *flag.FlagSet) []string {
	var args []string
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "n", "csv", "plot", "rows":
			return
		}
		args = append(args, "-"+f.Name+"="+f.Value.String())
	})
	return args
}

// output writes rows to csvPath and draws them into plotPNG, each if given.
func output(rows []row, csvPath, plotPNG string) error {
	if csvPath != "" {
		if err := writeCSV(csvPath, rows); err != nil {
			return err
		}
		cmd.Progress("wrote %s", csvPath)
	}
	if plotPNG != "" {
		if err := writePNG(plotPNG, rows); err != nil {
			return err
		}
		cmd.Progress("wrote %s", plotPNG)
	}
	return nil
}
