package main

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/compactcache/compactcache/bench"
	"github.com/compactcache/compactcache/bench/harness"
	"github.com/compactcache/compactcache/internal/workload"
)

// results are everything the table shows.
type results struct {
	figs     map[bench.Kind]*figures
	gcSmall  map[bench.Kind]gcResult
	gcN      map[bench.Kind]gcResult
	zipf     map[bench.Kind][]zipfResult
	stockCap map[int64]int // the stock cache's capacity for each zipf budget
	pages    pageCosts     // the machine's, for fresh memory
	failed   []error

	// The run's start and the plugin's state then: a commit made while it
	// runs is not what it measures.
	started  time.Time
	revision string
}

// ok returns the kinds measured so far without a failure, in cfg's order.
func (r *results) ok(cfg config) []bench.Kind {
	var kinds []bench.Kind
	for _, k := range cfg.kinds {
		if r.figs[k] != nil {
			kinds = append(kinds, k)
		}
	}
	return kinds
}

func (r *results) fail(kind bench.Kind, err error) {
	cmd.Progress("%s: FAILED: %v", kind, err)
	r.failed = append(r.failed, fmt.Errorf("%s: %w", kind, err))
	delete(r.figs, kind)
}

// run measures every cache of cfg and prints the table. A cache that fails
// (an entry not stored, a wrong reply) is left out of the table and makes run
// fail once the others are printed.
func run(cfg config) ([]row, error) {
	r := &results{
		figs:     map[bench.Kind]*figures{},
		gcSmall:  map[bench.Kind]gcResult{},
		gcN:      map[bench.Kind]gcResult{},
		stockCap: map[int64]int{},
		started:  time.Now(),
		revision: harness.Revision(),
	}
	names := workload.NewNames(cfg.n)
	var err error
	for _, kind := range cfg.kinds {
		f, err := measure(cfg, kind, names)
		if err != nil {
			r.fail(kind, err)
			continue
		}
		r.figs[kind] = f
		debug.FreeOSMemory() // return the cache's memory before the next one and the children
	}
	runtime.KeepAlive(names)
	names = nil
	debug.FreeOSMemory()
	for _, kind := range r.ok(cfg) {
		cmd.Progress("%s: timing a random read over as many bytes as it held", kind)
		r.figs[kind].readNs = readNs(int64(r.figs[kind].heapInuse * float64(cfg.n)))
	}
	r.pages = pageWrites()
	for _, kind := range r.ok(cfg) {
		f := r.figs[kind]
		if f.ownAtBudget, err = insertsAtBudget(cfg, kind, int64(f.storeBytes*float64(cfg.n))); err != nil {
			r.fail(kind, err)
		}
		debug.FreeOSMemory()
	}

	for _, kind := range r.ok(cfg) {
		if cfg.gcSmall > 0 && cfg.gcSmall < cfg.n {
			small := cfg
			small.n = cfg.gcSmall
			if r.gcSmall[kind], err = measureGC(small, kind, small.n); err != nil {
				r.fail(kind, err)
				continue
			}
		}
		if r.gcN[kind], err = measureGC(cfg, kind, cfg.n); err != nil {
			r.fail(kind, err)
		}
	}

	// The stock cache's capacity for a budget is the budget over its heap
	// bytes per entry, measured above.
	if f := r.figs[bench.Stock]; f != nil {
		for _, b := range cfg.budgets {
			r.stockCap[b] = int(float64(b) / f.heapInuse)
		}
	}
	if zipfKinds := r.ok(cfg); len(zipfKinds) > 0 {
		if r.zipf, err = measureZipf(cfg, zipfKinds, func(b int64) int { return r.stockCap[b] }); err != nil {
			return nil, err
		}
	}

	printTable(os.Stdout, cfg, r)
	if len(r.failed) > 0 {
		return r.rows(cfg), fmt.Errorf("NOT MEASURED, a cache failed:\n%w", errors.Join(r.failed...))
	}
	return r.rows(cfg), nil
}
