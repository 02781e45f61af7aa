package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/compactcache/compactcache/bench"
	"github.com/compactcache/compactcache/internal/workload"
)

// GC wall time and zipf hit rates are measured in child processes, each cache
// in one of its own: a GC cycle's time depends on everything on the heap,
// which must be that cache and nothing else, not the parent's leftovers.

// gcResult is what a gc child prints.
type gcResult struct {
	Median time.Duration
	All    []time.Duration
}

// zipfResult is what a zipf child prints.
type zipfResult struct {
	Hits, Queries int
	Entries       int64 // entries held at the end (the capacity, for the stock cache)
	HeapInuse     int64 // heap in use and mapped at the end, above the child's empty heap
	StoreBytes    int64 // compactcache's own accounting at the end
}

func (z zipfResult) rate() float64 { return float64(z.Hits) / float64(z.Queries) }

// spawn re-executes this program as a child with args and decodes what it
// prints on stdout into v. The child's stderr is the parent's.
func spawn(v any, args ...string) error {
	cmd := exec.Command(os.Args[0], args...)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("child %v: %v", args, err)
	}
	return json.Unmarshal(out.Bytes(), v)
}

func childArgs(cfg config, mode string, kind bench.Kind) []string {
	return []string{"-child", mode, "-cache", string(kind), "-variant", cfg.variant.String(),
		"-capacity", strconv.FormatInt(cfg.capacity>>20, 10), "-hits", strconv.Itoa(cfg.hits)}
}

// measureGC returns the median runtime.GC() wall time with n entries in
// kind, measured in a child.
func measureGC(cfg config, kind bench.Kind, n int) (gcResult, error) {
	cmd.Progress("%s: timing runtime.GC() with %d entries, in a child", kind, n)
	var r gcResult
	err := spawn(&r, append(childArgs(cfg, "gc", kind), "-n", strconv.Itoa(n))...)
	return r, err
}

// measureZipf runs the zipf children of the kinds, two at a time (one a
// core): hit rates do not depend on time, so they may share the machine.
// stockEntries gives the stock cache's capacity for each budget.
func measureZipf(cfg config, kinds []bench.Kind, stockEntries func(budget int64) int) (map[bench.Kind][]zipfResult, error) {
	res := map[bench.Kind][]zipfResult{}
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		errs []error
		sem  = make(chan struct{}, 2)
	)
	for _, kind := range kinds {
		res[kind] = make([]zipfResult, len(cfg.budgets))
		for k, budget := range cfg.budgets {
			args := append(childArgs(cfg, "zipf", kind), "-budget", strconv.FormatInt(budget, 10),
				"-trace", strconv.Itoa(cfg.trace))
			if kind == bench.Stock {
				args = append(args, "-stock-entries", strconv.Itoa(stockEntries(budget)))
			}
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				cmd.Progress("%s: zipf hit rate at %d MiB, in a child", kind, budget>>20)
				var z zipfResult
				err := spawn(&z, args...)
				mu.Lock()
				defer mu.Unlock()
				res[kind][k] = z
				if err != nil {
					errs = append(errs, err)
				}
			})
		}
	}
	wg.Wait()
	if len(errs) > 0 {
		return nil, errs[0]
	}
	return res, nil
}

func emit(v any) error { return json.NewEncoder(os.Stdout).Encode(v) }

// childGC stores cfg.n entries in kind, answers cfg.hits hits, and times
// five runtime.GC() calls.
func childGC(cfg config, kind bench.Kind) error {
	up := &bench.Upstream{Variant: cfg.variant}
	c, err := newCache(cfg, kind, up)
	if err != nil {
		return err
	}
	if err := fill(cfg, c, up); err != nil {
		return err
	}
	awaitHugePages(kind)
	// Hits first, as a server in use answers them. On this virtual machine a
	// cycle after seconds of little work is slower, whatever the cache: 10M
	// children timed after their store's held-back collapses gave medians
	// of 1.1-3.8 ms, the same after a second of hits 0.75-0.85 (session 6 in
	// BENCHMARKS.md).
	if _, err := hits(cfg, c, bench.NewDriver(cfg.variant, nil), up); err != nil {
		return err
	}
	runtime.GC() // the fill's garbage, so that every timed cycle finds the same heap
	var r gcResult
	for range 5 {
		start := time.Now()
		runtime.GC()
		r.All = append(r.All, time.Since(start))
	}
	sorted := slices.Clone(r.All)
	slices.Sort(sorted)
	r.Median = sorted[len(sorted)/2]
	runtime.KeepAlive(c)
	return emit(r)
}

// fill stores entries [0, cfg.n) in c and checks them: every thousandth
// entry must hit, and compactcache must count them all.
func fill(cfg config, c *bench.Cache, up *bench.Upstream) error {
	d := bench.NewDriver(cfg.variant, nil)
	for i := range cfg.n {
		if err := d.Query(c, i); err != nil {
			return err
		}
	}
	if c.Compact != nil {
		if st := c.Compact.Stats(); st.Entries != int64(cfg.n) {
			return fmt.Errorf("%s holds %d of %d entries", c.Kind, st.Entries, cfg.n)
		}
	}
	for i := 0; i < cfg.n; i += 1000 {
		if err := d.Hit(c, i); err != nil {
			return fmt.Errorf("%s: entry %d: %v", c.Kind, i, err)
		}
	}
	return nil
}

// childZipf runs two passes of the zipf trace through kind at budget: the
// first warms the cache up, the second is counted. A query is a hit when it
// does not reach the upstream.
func childZipf(cfg config, kind bench.Kind, budget int64, stockEntries int) error {
	up := &bench.Upstream{Variant: cfg.variant}
	var (
		c   *bench.Cache
		err error
	)
	empty := bench.Settled()
	if kind == bench.Stock {
		c, err = bench.NewStock(stockEntries, up)
	} else {
		c, err = bench.NewCompact(budget, up)
	}
	if err != nil {
		return err
	}
	d := bench.NewDriver(cfg.variant, nil)
	z := workload.NewTrace()
	pass := func() (int, error) {
		hits := 0
		for i := range z.Trace(cfg.trace) {
			calls := up.Calls()
			if err := d.Query(c, i); err != nil {
				return 0, err
			}
			if up.Calls() == calls {
				hits++
			}
		}
		return hits, nil
	}
	if _, err := pass(); err != nil {
		return err
	}
	r := zipfResult{Queries: cfg.trace, Entries: int64(stockEntries)}
	if r.Hits, err = pass(); err != nil {
		return err
	}
	end := bench.Settled() // the store's mapped memory counted in
	r.HeapInuse = int64(end.HeapInuse) - int64(empty.HeapInuse)
	if c.Compact != nil {
		st := c.Compact.Stats()
		r.Entries, r.StoreBytes = st.Entries, st.Bytes
	}
	runtime.KeepAlive(c)
	return emit(r)
}
