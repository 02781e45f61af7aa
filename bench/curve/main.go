// Command curve measures how compactcache and the stock cache plugin scale
// with the number of entries stored: bytes per entry and hit cost at each N,
// each (cache, N) in a child process of its own so that no two heaps mix. It
// writes the figures to curve.csv and draws them in curve.png: bytes per entry
// against N, and hit ns/op against N, both with N on a log scale.
//
// Bytes per entry are HeapInuse after runtime.GC() twice with the N entries
// stored, minus before, over N; every entry is then queried and must hit with
// its own payload. Hits go through ServeDNS with keys uniform over N: for
// compactcache both with raw writes (w.Write of the reply bytes) and through
// WriteMsg, the writer packing the reply as the server does; for the stock
// cache through WriteMsg. They are timed in rounds, pass after pass with the
// paths taking turns, and the plot shows the fastest round, the one other
// work on the machine disturbed least; curve.csv also has the means over all
// hits (wall and CPU time), allocations, and the share of the cores other
// processes kept busy meanwhile.
//
//	go run ./bench/curve                                  # about 8 minutes
//	go run ./bench/curve -compact 30000,1000000 -stock 30000
//	go run ./bench/curve -plot                            # redraw curve.png from curve.csv
//
// Progress goes to stderr. A cache that does not store every entry fails the
// run (exit status 1) rather than being plotted.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/compactcache/compactcache/bench"
	"github.com/compactcache/compactcache/bench/harness"
)

// The paths a hit takes to the client: compactcache's raw bytes (w.Write,
// what setup picks when no plugin in the block needs WriteMsg) and WriteMsg
// with a *dns.Msg, the reply packed by the writer as the server does.
const (
	pathRaw      = "raw"
	pathWriteMsg = "writemsg"
)

type config struct {
	compact, stock []int // the Ns measured
	hits           int   // hit queries timed per path
	rounds         int   // the hits are timed in rounds, the fastest kept apart
	passes         int   // times each path's hits are timed, the paths taking turns
	quietWait      time.Duration
	dir            string // where curve.csv and curve.png go
}

// cmd is this command, for its usage and its lines on stderr.
const cmd = harness.Command("curve")

func main() {
	// A flag set of its own: CoreDNS's packages define flags of theirs on
	// the default one (-conf, -dns.port, ...), which mean nothing here.
	fs := flag.NewFlagSet("curve", flag.ExitOnError)
	var (
		cfg     config
		compact = fs.String("compact", "30000,100000,300000,1000000,3000000", "Ns to measure compactcache at (empty: none)")
		stock   = fs.String("stock", "30000,100000,300000,1000000", "Ns to measure the stock cache at (empty: none)")
		plot    = fs.Bool("plot", false, "only redraw curve.png from curve.csv")
		child   = fs.String("child", "", "internal: run as the child measuring this cache")
		n       = fs.Int("n", 0, "internal: the child's N")
	)
	fs.IntVar(&cfg.hits, "hits", 500_000, "hit queries timed per cache, N and path; keys uniform over N")
	fs.IntVar(&cfg.rounds, "rounds", 100, "rounds the hits are timed in, each of whole batches of 4096: the fastest round's ns/op is plotted, the least disturbed by other work")
	fs.IntVar(&cfg.passes, "passes", 3, "passes of -hits hits on each path, the paths taking turns; the fastest round of all is kept")
	fs.DurationVar(&cfg.quietWait, "quiet-wait", 60*time.Second, "before each child, wait up to this long for the cores to be free of other work (0: do not wait)")
	fs.StringVar(&cfg.dir, "dir", "bench/curve", "directory of curve.csv and curve.png")
	fs.Usage = func() { cmd.Usage(fs) }
	fs.Parse(os.Args[1:])

	var err error
	switch {
	case *child != "":
		err = runChild(bench.Kind(*child), *n, cfg.hits, cfg.rounds, cfg.passes)
	case *plot:
		var rows []row
		if rows, err = readCSV(filepath.Join(cfg.dir, "curve.csv")); err == nil {
			err = writePNG(filepath.Join(cfg.dir, "curve.png"), rows)
		}
	default:
		if cfg.compact, err = parseNs(*compact); err != nil {
			cmd.Fatal(err)
		}
		if cfg.stock, err = parseNs(*stock); err != nil {
			cmd.Fatal(err)
		}
		err = run(cfg)
	}
	if err != nil {
		cmd.Fatal(err)
	}
}

func parseNs(s string) ([]int, error) {
	var ns []int
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("bad N %q", f)
		}
		ns = append(ns, n)
	}
	return ns, nil
}
