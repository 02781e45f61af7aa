// Command ecs prints compactcache's figures on the workload's ecs variant
// (1,000 client subnets, answers scoped /24 for IPv4 and /56 for IPv6) beside
// plain entries and beside the stock cache, in one run:
//
//  1. bytes per ECS variant beside bytes per plain entry, and the marginal
//     bytes of one more variant of a name;
//  2. hit rate on a zipf trace of names asked from uniformly drawn client
//     subnets, at one byte budget, with the stock cache's hits for another
//     subnet counted;
//  3. hit ns/op and allocs/op with 1, 10 and 100 variants per name, through
//     ServeDNS with raw writes, beside a plain hit.
//
// The upstream answers as an authoritative GeoDNS server would (see
// geoUpstream): it echoes the query's ECS with the workload's scope and
// tailors the records to the subnet.
//
//	go run ./bench/ecs            # N = 100k: about 85 s of CPU (see RESULTS.md)
//	go run ./bench/ecs -n 1000000
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/compactcache/compactcache/bench/cli"
	"github.com/compactcache/compactcache/internal/workload"
)

type config struct {
	n           int // names
	k           int // variants per name for the marginal bytes
	hits        int // timed hits per row
	warm, trace int // queries of the zipf trace: warm-up and counted
	budgetMiB   int
	figures     string // which figures to print: "123" for all
}

func main() {
	var cfg config
	flag.IntVar(&cfg.n, "n", 100_000, "names (figure 1), entries stored (figure 3)")
	flag.IntVar(&cfg.k, "k", 10, "variants per name for the marginal bytes per variant")
	flag.IntVar(&cfg.hits, "hits", 500_000, "timed hits per row of figure 3")
	flag.IntVar(&cfg.warm, "warm", 400_000, "warm-up queries of the hit-rate trace")
	flag.IntVar(&cfg.trace, "trace", 800_000, "counted queries of the hit-rate trace")
	flag.IntVar(&cfg.budgetMiB, "budget", 64, "byte budget of the hit-rate figure, MiB")
	flag.StringVar(&cfg.figures, "figures", "123", "figures to print (1 bytes, 2 hit rate, 3 hit cost); 2 needs 1 for the stock cache's size")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile to this file")
	flag.Parse()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "ecs:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	if cfg.n < 1000 || cfg.k < 2 || cfg.k > 500 {
		fmt.Fprintln(os.Stderr, "ecs: want -n >= 1000 and 2 <= -k <= 500")
		os.Exit(2)
	}
	if err := run(cfg); err != nil {
		pprof.StopCPUProfile()
		fmt.Fprintln(os.Stderr, "ecs:", err)
		os.Exit(1)
	}
}

var began = time.Now()

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "# %5.1fs "+format+"\n", append([]any{time.Since(began).Seconds()}, args...)...)
}

func run(cfg config) error {
	start := time.Now()
	fmt.Printf("go run ./bench/ecs %s\n\n", strings.Join(os.Args[1:], " "))
	fmt.Printf("%s, %d CPUs (GOMAXPROCS %d), %s\n\n", cli.CPUModel(), runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version())

	names := workload.NewNames(cfg.n)
	stockPerEntry := 1100.0 // bench/README.md's figure, when figure 1 is not run
	if strings.Contains(cfg.figures, "1") {
		var err error
		if stockPerEntry, err = memoryFigure(cfg, names); err != nil {
			return err
		}
	}
	if strings.Contains(cfg.figures, "2") {
		if err := hitRateFigure(cfg, stockPerEntry); err != nil {
			return err
		}
	}
	if strings.Contains(cfg.figures, "3") {
		if err := lookupFigure(cfg, names); err != nil {
			return err
		}
	}
	runtime.KeepAlive(names)
	fmt.Printf("total %.0f s\n", time.Since(start).Seconds())
	return nil
}

// capacityFor returns a compactcache budget in MiB that holds entries
// entries of the workload without evicting: 1 KiB each, four to eight times
// what they take.
func capacityFor(entries int) int { return max(64, (entries*1024+(1<<20)-1)>>20) }
