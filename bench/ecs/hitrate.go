package main

import (
	"fmt"
	"runtime"
	"time"

	"github.com/compactcache/compactcache/bench"
	"github.com/compactcache/compactcache/internal/workload"
)

// traceResult is one cache's pass over the hit-rate trace.
type traceResult struct {
	label       string
	queries     int
	hits, wrong int
	entries     int64 // compactcache's Stats().Entries at the end
	bytes       int64 // compactcache's Stats().Bytes at the end
	elapsed     time.Duration
	cpu         time.Duration // the process's CPU time, GC included
}

// runTrace sends the trace to c: names from the workload's zipf trace
// (10M names, s = 0.9), each query from a client subnet drawn uniformly
// from the 1,000 (seeded, so every cache sees the same queries). The first
// cfg.warm queries warm the cache; of the next cfg.trace, a query that does
// not reach the upstream is a hit, and its reply's records tell whether it
// was made for the client's subnet.
func runTrace(cfg config, label string, c *bench.Cache, up *geoUpstream) (*traceResult, error) {
	z := workload.NewTrace()
	rnd := newRand(7)
	cl := newClient(workload.ECS, nil)
	res := &traceResult{label: label, queries: cfg.trace}
	progress("trace: %s", label)
	start, cpu := time.Now(), processCPU()
	for q := range cfg.warm + cfg.trace {
		i, j := z.Next(), rnd.IntN(workload.Clients)
		calls := up.Calls()
		if err := cl.query(c, i, workload.Subnet(j)); err != nil {
			return nil, err
		}
		if q < cfg.warm || up.Calls() != calls {
			continue
		}
		res.hits++
		tag, err := cl.tag()
		if err != nil {
			return nil, err
		}
		if tag != j {
			res.wrong++
		}
	}
	res.elapsed, res.cpu = time.Since(start), processCPU()-cpu
	if c.Compact != nil {
		st := c.Compact.Stats()
		res.entries, res.bytes = st.Entries, st.Bytes
	}
	runtime.KeepAlive(c)
	return res, nil
}

// traceBound returns the hit rates of caches that never evict on the same
// trace: keyed by (name, subnet), as an ECS-aware cache, and by name alone,
// as the stock cache (which then serves most hits to another subnet).
func traceBound(cfg config) (pairs, names float64) {
	z := workload.NewTrace()
	rnd := newRand(7)
	seenPair := make(map[uint64]struct{})
	seenName := make(map[int]struct{})
	var hitPair, hitName int
	for q := range cfg.warm + cfg.trace {
		i, j := z.Next(), rnd.IntN(workload.Clients)
		key := uint64(i)*workload.Clients + uint64(j)
		_, p := seenPair[key]
		_, n := seenName[i]
		if q >= cfg.warm {
			if p {
				hitPair++
			}
			if n {
				hitName++
			}
		}
		seenPair[key] = struct{}{}
		seenName[i] = struct{}{}
	}
	return float64(hitPair) / float64(cfg.trace), float64(hitName) / float64(cfg.trace)
}

// hitRateFigure prints figure 2: compactcache at the budget (with the
// default max_variants 100 and with 1000, one per subnet), and the stock
// cache holding budget / its bytes per entry entries.
func hitRateFigure(cfg config, stockPerEntry float64) error {
	var results []*traceResult
	for _, maxVariants := range []int{0, 1000} {
		up := newGeoUpstream()
		c, err := newCompact(cfg.budgetMiB, maxVariants, up)
		if err != nil {
			return err
		}
		label := fmt.Sprintf("compactcache, capacity %d MiB, max_variants 100 (default)", cfg.budgetMiB)
		if maxVariants != 0 {
			label = fmt.Sprintf("compactcache, capacity %d MiB, max_variants %d", cfg.budgetMiB, maxVariants)
		}
		r, err := runTrace(cfg, label, c, up)
		if err != nil {
			return err
		}
		results = append(results, r)
		bench.Settled()
	}
	capacity := int(float64(cfg.budgetMiB<<20) / stockPerEntry)
	up := newGeoUpstream()
	c, err := bench.NewStock(capacity, up)
	if err != nil {
		return err
	}
	r, err := runTrace(cfg, fmt.Sprintf("stock cache, success %d (%d MiB / %.0f B per entry)", capacity, cfg.budgetMiB, stockPerEntry), c, up)
	if err != nil {
		return err
	}
	results = append(results, r)
	bench.Settled()

	fmt.Printf("## 2. Hit rate on the ecs variant at %d MiB\n\n", cfg.budgetMiB)
	fmt.Printf("Trace: names from the workload's zipf trace (10M names, s = 0.9, seed 1) x client subnet uniform over the 1,000 (PCG seed 7); %d queries of warm-up, then %d counted. A hit is a query that did not reach the upstream; it is for another subnet when its records carry another subnet's tag.\n\n", cfg.warm, cfg.trace)
	fmt.Println("| cache | hit rate | hits for another subnet | correct hit rate | entries at end | Stats().Bytes at end | CPU | wall |")
	fmt.Println("|---|--:|--:|--:|--:|--:|--:|--:|")
	for _, r := range results {
		q := float64(r.queries)
		entries, bytes := "-", "-"
		if r.entries != 0 {
			entries, bytes = fmt.Sprint(r.entries), fmt.Sprintf("%.1f MiB", float64(r.bytes)/(1<<20))
		}
		fmt.Printf("| %s | %.2f%% | %d (%.1f%% of hits) | %.2f%% | %s | %s | %.1f s | %.1f s |\n",
			r.label, 100*float64(r.hits)/q, r.wrong, 100*float64(r.wrong)/max(1, float64(r.hits)),
			100*float64(r.hits-r.wrong)/q, entries, bytes, r.cpu.Seconds(), r.elapsed.Seconds())
	}
	progress("trace: bounds without eviction")
	pairs, byName := traceBound(cfg)
	fmt.Printf("| bound: no eviction, keyed by (name, subnet) | %.2f%% | 0 | %.2f%% | | | | |\n", 100*pairs, 100*pairs)
	fmt.Printf("| bound: no eviction, keyed by name alone | %.2f%% | | | | | | |\n", 100*byName)
	fmt.Println()
	return nil
}
