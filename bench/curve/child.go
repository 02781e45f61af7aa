package main

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"time"

	"github.com/compactcache/compactcache/bench"
	"github.com/compactcache/compactcache/internal/workload"
)

// childResult is what a child prints: one cache's figures at one N.
type childResult struct {
	HeapInuse, HeapAlloc, Objects float64 // per entry, after GC
	StoreBytes                    float64 // compactcache's Stats().Bytes per entry
	Payload                       float64 // per entry
	Hits                          map[string]hitResult
}

// hitResult is the cost of one hit through ServeDNS on one path: Ns,
// CPUNs, Allocs and Bytes are means over all the hits.
type hitResult struct {
	Ns, Allocs, Bytes float64
	// CPUNs is the process's CPU time (user and system, all threads, the
	// GC's workers included) per hit: unlike Ns, waiting for a core that
	// other work holds does not count.
	CPUNs float64
	// BestNs is the wall time per hit of the fastest round: the one other
	// work disturbed least. It leaves out most of the GC work that garbage
	// from the hits causes, a cycle coming every few rounds at most.
	BestNs float64
	// Others is the share of the machine's cores busy with work not this
	// process's while the hits ran (-1 if unknown): the noise on Ns.
	Others float64
}

// runChild fills kind with n entries, checks that every one is stored,
// measures the heap they take and times hits on each path, passes times, and
// prints the result as JSON on stdout.
func runChild(kind bench.Kind, n, hits, rounds, passes int) error {
	var paths []string
	switch kind {
	case bench.Compact:
		paths = []string{pathRaw, pathWriteMsg}
	case bench.Stock:
		paths = []string{pathWriteMsg}
	default:
		return fmt.Errorf("unknown cache %q", kind)
	}
	// The qnames, shared by the fill and the hits so that a query allocates
	// no name. They are on the heap before and after the fill and cancel
	// out of the heap delta.
	names := workload.NewNames(n)
	up := &bench.Upstream{Variant: workload.Plain}
	c, err := newCache(kind, n, up)
	if err != nil {
		return err
	}
	d := bench.NewDriver(workload.Plain, names)

	before := bench.Settled()
	for i := range n {
		if err := d.Query(c, i); err != nil {
			return fmt.Errorf("%s: insert %d: %v", kind, i, err)
		}
	}
	after := bench.Settled()
	r := childResult{Hits: map[string]hitResult{}}
	perEntry := func(a, b uint64) float64 { return (float64(a) - float64(b)) / float64(n) }
	r.HeapInuse = perEntry(after.HeapInuse, before.HeapInuse)
	r.HeapAlloc = perEntry(after.HeapAlloc, before.HeapAlloc)
	r.Objects = perEntry(after.HeapObjects, before.HeapObjects)
	if calls := up.Calls(); calls != int64(n) {
		return fmt.Errorf("%s: the upstream answered %d of %d inserts", kind, calls, n)
	}

	// Every entry must be stored: each is queried without an index for the
	// upstream, so that a miss fails, and must come back with its payload.
	if c.Compact != nil {
		st := c.Compact.Stats()
		if st.Entries != int64(n) {
			return fmt.Errorf("%s: Stats() counts %d entries of the %d inserted", kind, st.Entries, n)
		}
		r.StoreBytes = float64(st.Bytes) / float64(n)
	}
	payload, err := bench.Verify(c, d, up, n)
	if err != nil {
		return fmt.Errorf("%s: %v", kind, err)
	}
	r.Payload = float64(payload) / float64(n)

	// The paths take turns, pass after pass, so that a stretch of other
	// work on the machine does not fall on one path alone; the fastest
	// round of all the passes is kept, the other figures are means.
	for pass := range passes {
		for _, path := range paths {
			if c.Compact != nil {
				c.Compact.SetRawWrites(path == pathRaw)
			}
			d.W.Pack = true // WriteMsg replies packed, as the server does
			h, err := timeHits(c, d, up, n, hits, rounds)
			if err != nil {
				return fmt.Errorf("%s, %s: %v", kind, path, err)
			}
			if pass > 0 {
				h = h.merge(r.Hits[path], pass)
			}
			r.Hits[path] = h
		}
	}
	runtime.KeepAlive(names)
	runtime.KeepAlive(c)
	return json.NewEncoder(os.Stdout).Encode(r)
}

// newCache returns kind in front of up for n entries, set up as the report
// sets them up: the stock cache with room for twice the entries, so that its
// random eviction never runs; compactcache with a budget of 512 MiB, or 512
// bytes per entry if more. compactcache allocates its arena chunks as it
// fills, so the budget is a ceiling, not memory taken.
func newCache(kind bench.Kind, n int, up *bench.Upstream) (*bench.Cache, error) {
	if kind == bench.Stock {
		return bench.NewStock(2*n, up)
	}
	return bench.NewCompact(max(512<<20, int64(n)*512), up)
}

// merge returns h combined with prev, the result of the passes before it:
// the fastest round of all, the means of all.
func (h hitResult) merge(prev hitResult, passes int) hitResult {
	mean := func(a, b float64) float64 { return (a + b*float64(passes)) / float64(passes+1) }
	return hitResult{
		Ns:     mean(h.Ns, prev.Ns),
		Allocs: mean(h.Allocs, prev.Allocs),
		Bytes:  mean(h.Bytes, prev.Bytes),
		CPUNs:  mean(h.CPUNs, prev.CPUNs),
		BestNs: min(h.BestNs, prev.BestNs),
		Others: mean(h.Others, prev.Others),
	}
}

// roundLen is the number of hits in a round: whole batches (bench.Batch),
// about hits/rounds.
func roundLen(hits, rounds int) int {
	return max(1, hits/rounds/bench.BatchLen) * bench.BatchLen
}

// timeHits times rounds of hit queries for keys uniform over [0, n) from a
// fixed seed, so that every cache and path sees the same keys, batch by
// batch, the batches' names built untimed. Wall time includes the GC work
// the queries cause. A query that reaches the upstream fails.
func timeHits(c *bench.Cache, d *bench.Driver, up *bench.Upstream, n, hits, rounds int) (hitResult, error) {
	r := rand.New(rand.NewPCG(1, 2))
	batch := new(bench.Batch)
	perRound := roundLen(hits, rounds) / bench.BatchLen
	calls := up.Calls()
	runtime.GC()
	var (
		wall, best   time.Duration
		cpu          = cpuSample{ok: true} // spent sending the queries
		mallocs, mem uint64
	)
	best = math.MaxInt64
	for range rounds {
		var round time.Duration
		for range perRound {
			batch.Fill(r, n)
			var a, b runtime.MemStats
			runtime.ReadMemStats(&a)
			cpu0 := readCPU()
			start := time.Now()
			for j := range bench.BatchLen {
				if err := d.HitBatch(c, batch, j); err != nil {
					return hitResult{}, err
				}
			}
			round += time.Since(start)
			cpu1 := readCPU()
			runtime.ReadMemStats(&b)
			cpu = cpu.plus(cpu1.since(cpu0))
			mallocs += b.Mallocs - a.Mallocs
			mem += b.TotalAlloc - a.TotalAlloc
		}
		wall += round
		best = min(best, round)
	}
	if up.Calls() != calls {
		return hitResult{}, fmt.Errorf("%d hits reached the upstream", up.Calls()-calls)
	}
	per := float64(perRound * bench.BatchLen)
	h := per * float64(rounds)
	return hitResult{
		Ns:     float64(wall.Nanoseconds()) / h,
		BestNs: float64(best.Nanoseconds()) / per,
		CPUNs:  float64(cpu.own.Nanoseconds()) / h,
		Allocs: float64(mallocs) / h,
		Bytes:  float64(mem) / h,
		Others: cpu.othersShare(wall),
	}, nil
}
