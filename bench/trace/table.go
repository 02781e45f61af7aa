package main

import (
	"fmt"
	"io"
	"runtime"
	"strings"
	"time"

	"github.com/compactcache/compactcache/bench"
	"github.com/compactcache/compactcache/bench/harness"
)

// columnTitle is what the table calls a column.
func columnTitle(c string) string {
	switch c {
	case string(bench.Stock):
		return "stock cache"
	case simTinyLF:
		return "W-TinyLFU (otter)"
	}
	return c
}

// The targets of issue 22 for compactcache beside the simulated W-TinyLFU,
// in points of hit rate, and for the hottest names.
const (
	targetMean  = -1.0
	targetWorst = -3.0
	targetHot   = 0.999
)

func printTables(out io.Writer, cfg config, traces []*prepared, results map[cell]result, started time.Time, revision string) {
	fmt.Fprintf(out, "Trace replays: hit rates at equal bytes, the plugins beside offline simulations\n")
	fmt.Fprintf(out, "%s; %s, GOMAXPROCS %d, %s\n", started.UTC().Format(time.DateTime+" UTC"), harness.CPUModel(), runtime.GOMAXPROCS(0), runtime.Version())
	fmt.Fprintf(out, "plugin: %s\n", revision)
	fmt.Fprintf(out, "%d queries a trace over %d Zipf names, the first %.0f%% warming up. A cell is the hit rate of the other queries /\n",
		cfg.queries, cfg.names, 100*cfg.warmUp)
	fmt.Fprintf(out, "of those to the hottest 1%% of the names (%d), their first asks left out. The simulations hold entries\n", cfg.names/100)
	fmt.Fprintf(out, "of the sizes the store keeps (the packed entry) in the budget; the stock cache holds budget / %d entries.\n", cfg.stockBytes)
	if cfg.dnssec.signed {
		fmt.Fprintf(out, "The upstream signs the Zipf names' answers (an RRSIG per RRset, to DO queries only); %d%% of the queries set DO.\n", cfg.dnssec.do)
	}

	for b, budget := range cfg.budgets {
		fmt.Fprintf(out, "\n%d MiB\n\n| trace |", budget>>20)
		for _, c := range cfg.columns {
			fmt.Fprintf(out, " %s |", columnTitle(c))
			if c == string(bench.Compact) {
				fmt.Fprintf(out, " entries | bytes/entry |")
			}
		}
		fmt.Fprintf(out, "\n|---|")
		for _, c := range cfg.columns {
			fmt.Fprintf(out, "--:|")
			if c == string(bench.Compact) {
				fmt.Fprintf(out, "--:|--:|")
			}
		}
		fmt.Fprintln(out)
		for t, p := range traces {
			fmt.Fprintf(out, "| %s |", p.name)
			for _, c := range cfg.columns {
				r := results[cell{t, b, c}]
				fmt.Fprintf(out, " %.3f / %.4f |", r.rate(), r.hotRate())
				if c == string(bench.Compact) {
					fmt.Fprintf(out, " %d | %.0f |", r.Entries, float64(r.Bytes)/float64(max(1, r.Entries)))
				}
			}
			fmt.Fprintln(out)
		}
	}
	fmt.Fprintln(out)
	printTargets(out, cfg, traces, results)
	fmt.Fprintf(out, "\nTraces:\n")
	for _, p := range traces {
		fmt.Fprintf(out, "  %-10s %s\n", p.name, p.doc)
	}
}

// printTargets compares compactcache with the simulated W-TinyLFU over every
// cell, and gives the worst hit rate of the hottest names.
func printTargets(out io.Writer, cfg config, traces []*prepared, results map[cell]result) {
	has := func(c string) bool {
		for _, col := range cfg.columns {
			if col == c {
				return true
			}
		}
		return false
	}
	if !has(string(bench.Compact)) {
		return
	}
	var (
		sum, worst         float64
		worstAt            string
		n                  int
		hot                = 1.0
		hotAt              string
		meanByBudget       = make([]float64, len(cfg.budgets))
		traceCount         = len(traces)
		compared, verdicts []string
	)
	worst = 100
	for b, budget := range cfg.budgets {
		for t, p := range traces {
			cc := results[cell{t, b, string(bench.Compact)}]
			if r := cc.hotRate(); r < hot {
				hot, hotAt = r, fmt.Sprintf("%s at %d MiB", p.name, budget>>20)
			}
			if !has(simTinyLF) {
				continue
			}
			d := 100 * (cc.rate() - results[cell{t, b, simTinyLF}].rate())
			sum += d
			meanByBudget[b] += d / float64(traceCount)
			n++
			if d < worst {
				worst, worstAt = d, fmt.Sprintf("%s at %d MiB", p.name, budget>>20)
			}
		}
	}
	if n > 0 {
		for b, budget := range cfg.budgets {
			compared = append(compared, fmt.Sprintf("%d MiB %+.2f", budget>>20, meanByBudget[b]))
		}
		mean := sum / float64(n)
		verdicts = append(verdicts, verdict(mean >= targetMean), verdict(worst >= targetWorst))
		fmt.Fprintf(out, "compactcache - W-TinyLFU, points of hit rate: mean %+.2f (target >= %+.0f: %s), worst %+.2f, %s (target >= %+.0f: %s)\n",
			mean, targetMean, verdicts[0], worst, worstAt, targetWorst, verdicts[1])
		fmt.Fprintf(out, "  mean by budget: %s\n", strings.Join(compared, ", "))
	}
	fmt.Fprintf(out, "compactcache, hottest 1%% of names: lowest %.4f, %s (target >= %.3f: %s)\n", hot, hotAt, targetHot, verdict(hot >= targetHot))
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}
