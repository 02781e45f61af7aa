package main

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"time"

	"github.com/compactcache/compactcache/bench"
	"github.com/compactcache/compactcache/internal/store"
	"github.com/compactcache/compactcache/internal/workload"
)

// cost is what one operation of a loop took on average.
type cost struct {
	ns, allocs, bytes float64
}

func (c cost) minus(d cost) cost { return cost{c.ns - d.ns, c.allocs - d.allocs, c.bytes - d.bytes} }

func (c cost) plus(d cost) cost { return cost{c.ns + d.ns, c.allocs + d.allocs, c.bytes + d.bytes} }

func (c cost) times(f float64) cost { return cost{c.ns * f, c.allocs * f, c.bytes * f} }

// loop runs f over [lo, hi) and returns its cost per operation: wall time
// (the GC work the operations cause included), MemStats.Mallocs and
// TotalAlloc deltas.
func loop(lo, hi int, f func(i int) error) (cost, error) {
	var a, b runtime.MemStats
	runtime.ReadMemStats(&a)
	start := time.Now()
	for i := lo; i < hi; i++ {
		if err := f(i); err != nil {
			return cost{}, err
		}
	}
	elapsed := time.Since(start)
	runtime.ReadMemStats(&b)
	n := float64(hi - lo)
	return cost{
		ns:     float64(elapsed.Nanoseconds()) / n,
		allocs: float64(b.Mallocs-a.Mallocs) / n,
		bytes:  float64(b.TotalAlloc-a.TotalAlloc) / n,
	}, nil
}

// newCache returns kind in front of up, sized for cfg.n entries: the stock
// cache with twice the entries, so that its random eviction (per shard, a
// 256th of the capacity each) never runs; compactcache with cfg.capacity.
func newCache(cfg config, kind bench.Kind, up *bench.Upstream) (*bench.Cache, error) {
	return newCacheSized(cfg, kind, up, 2*cfg.n, cfg.capacity)
}

// newCacheSized returns a cache of kind: the stock cache holding entries,
// compactcache within capacity bytes.
func newCacheSized(cfg config, kind bench.Kind, up *bench.Upstream, entries int, capacity int64) (*bench.Cache, error) {
	if kind == bench.Stock {
		return bench.NewStock(entries, up)
	}
	c, err := bench.NewCompact(capacity, up)
	if err == nil {
		c.Compact.SetRawWrites(cfg.raw)
	}
	return c, err
}

// figures are one cache's in-process measurements.
type figures struct {
	heapInuse, heapAlloc, objects float64   // per entry, after GC, mapped included
	mapped                        float64   // per entry, outside the Go heap
	storeBytes                    float64   // compactcache's own accounting per entry
	payload                       float64   // per entry, over the N entries
	insert                        cost      // per insert, upstream included
	upstream                      cost      // per query, the upstream alone, timed beside the inserts
	own                           quartiles // per insert, the cache's own: see timeInserts
	ownAtBudget                   quartiles // the same once the cache is full: see insertsAtBudget
	hit, hitUnpacked              cost      // per hit, with and without the writer packing
	readNs                        float64   // a dependent random read over the cache's bytes (readNs)
}

// insertBlock is how many queries timeInserts times at a time.
const insertBlock = 10000

// quartiles are the quartiles of the blocks' figures.
type quartiles struct{ q1, median, q3 float64 }

// timeInserts runs insert over the N queries in blocks, each beside a block
// of alone, the upstream alone answering the same queries through its own
// driver, and returns their costs per query and the cache's own share of an
// insert: the quartiles over the blocks of the difference, the median being
// the share, the others how much it moved from block to block. A burst of
// load elsewhere on the machine, which slows one block of one of them, then
// moves neither the median nor the share, as it moved the difference of two
// loops timed minutes apart. The order within a pair alternates, so that
// neither pays more of the other's garbage collection.
func timeInserts(n int, insert, alone func(i int) error) (with, upstream cost, own quartiles, err error) {
	var diffs []float64
	for lo := 0; lo < n; lo += insertBlock {
		hi := min(lo+insertBlock, n)
		var w, a cost
		if lo/insertBlock%2 == 0 {
			if a, err = loop(lo, hi, alone); err == nil {
				w, err = loop(lo, hi, insert)
			}
		} else {
			if w, err = loop(lo, hi, insert); err == nil {
				a, err = loop(lo, hi, alone)
			}
		}
		if err != nil {
			return cost{}, cost{}, quartiles{}, err
		}
		share := float64(hi-lo) / float64(n)
		with = with.plus(w.times(share))
		upstream = upstream.plus(a.times(share))
		diffs = append(diffs, w.ns-a.ns)
	}
	slices.Sort(diffs)
	k := len(diffs)
	return with, upstream, quartiles{diffs[k/4], diffs[k/2], diffs[3*k/4]}, nil
}

// measure fills kind with the N entries, checks that it holds every one, and
// measures its memory, inserts and hits. names holds the N qnames; it lives
// on the heap before and after the fill, so it cancels out of the heap delta.
func measure(cfg config, kind bench.Kind, names *workload.Names) (*figures, error) {
	up := &bench.Upstream{Variant: cfg.variant}
	c, err := newCache(cfg, kind, up)
	if err != nil {
		return nil, err
	}
	d := bench.NewDriver(cfg.variant, names)
	f := new(figures)

	cmd.Progress("%s: inserting %d entries, beside the upstream alone", kind, cfg.n)
	alone, aloneUp := bench.NewDriver(cfg.variant, names), &bench.Upstream{Variant: cfg.variant}
	before, mappedBefore := bench.Settled(), store.OffHeapBytes()
	f.insert, f.upstream, f.own, err = timeInserts(cfg.n, func(i int) error { return d.Query(c, i) }, func(i int) error { return alone.Query(aloneUp, i) })
	if err != nil {
		return nil, err
	}
	after, mappedAfter := bench.Settled(), store.OffHeapBytes()
	n := float64(cfg.n)
	// bench.Settled counts the store's memory outside the Go heap as if it
	// were on it.
	f.mapped = float64(mappedAfter-mappedBefore) / n
	f.heapInuse = (float64(after.HeapInuse) - float64(before.HeapInuse)) / n
	f.heapAlloc = (float64(after.HeapAlloc) - float64(before.HeapAlloc)) / n
	f.objects = (float64(after.HeapObjects) - float64(before.HeapObjects)) / n
	if up.Calls() != int64(cfg.n) {
		return nil, fmt.Errorf("the upstream answered %d of %d inserts", up.Calls(), cfg.n)
	}

	cmd.Progress("%s: checking that every entry is stored", kind)
	if c.Compact != nil {
		st := c.Compact.Stats()
		if st.Entries != int64(cfg.n) {
			return nil, fmt.Errorf("Stats() counts %d entries of the %d inserted (%d bytes of a %d-byte budget)", st.Entries, cfg.n, st.Bytes, st.Capacity)
		}
		f.storeBytes = float64(st.Bytes) / n
	}
	payload, err := bench.Verify(c, d, up, cfg.n)
	if err != nil {
		return nil, err
	}
	f.payload = float64(payload) / n

	awaitHugePages(kind)
	cmd.Progress("%s: timing %d hits", kind, cfg.hits)
	if f.hit, err = hits(cfg, c, d, up); err != nil {
		return nil, err
	}
	d.W.Pack = false
	if f.hitUnpacked, err = hits(cfg, c, d, up); err != nil {
		return nil, err
	}
	runtime.KeepAlive(c)
	return f, nil
}

// hits times about cfg.hits queries for keys uniform over the N entries, in
// batches whose names are built untimed (see bench.Batch). The keys come
// from a fixed seed, so that every cache and both writer modes see the same
// sequence.
func hits(cfg config, c *bench.Cache, d *bench.Driver, up *bench.Upstream) (cost, error) {
	r := rand.New(rand.NewPCG(1, 2))
	batch := new(bench.Batch)
	batches := max(1, cfg.hits/bench.BatchLen)
	calls := up.Calls()
	runtime.GC()
	var sum cost
	for range batches {
		batch.Fill(r, cfg.n)
		h, err := loop(0, bench.BatchLen, func(j int) error { return d.HitBatch(c, batch, j) })
		if err != nil {
			return cost{}, err
		}
		sum = sum.plus(h)
	}
	if up.Calls() != calls {
		return cost{}, fmt.Errorf("%d hits reached the upstream", up.Calls()-calls)
	}
	return sum.times(1 / float64(batches)), nil
}

// insertsAtBudget returns the cache's own share of an insert once it is
// full, as a cache in service spends it: a cache of kind sized for about N
// entries (compactcache: budget bytes, what the N took in measure; the stock
// cache: N entries) is filled with the N, and N more are timed beside the
// upstream alone (timeInserts), each displacing an entry. Unlike the fill's,
// they write into memory the cache has written before.
func insertsAtBudget(cfg config, kind bench.Kind, budget int64) (quartiles, error) {
	up := &bench.Upstream{Variant: cfg.variant}
	c, err := newCacheSized(cfg, kind, up, cfg.n, budget)
	if err != nil {
		return quartiles{}, err
	}
	d := bench.NewDriver(cfg.variant, nil)
	cmd.Progress("%s: filling a cache sized for %d entries", kind, cfg.n)
	for i := range cfg.n {
		if err := d.Query(c, i); err != nil {
			return quartiles{}, err
		}
	}
	cmd.Progress("%s: inserting %d more, each displacing one, beside the upstream alone", kind, cfg.n)
	alone, aloneUp := bench.NewDriver(cfg.variant, nil), &bench.Upstream{Variant: cfg.variant}
	_, _, own, err := timeInserts(cfg.n, func(i int) error { return d.Query(c, cfg.n+i) }, func(i int) error { return alone.Query(aloneUp, cfg.n+i) })
	if err == nil && up.Calls() != int64(2*cfg.n) {
		err = fmt.Errorf("the upstream answered %d of %d inserts", up.Calls(), 2*cfg.n)
	}
	runtime.KeepAlive(c)
	return own, err
}

// awaitHugePages waits for compactcache's pending huge page collapses, which
// it holds back while its store grows, so that what follows is timed with
// the store as it settles.
func awaitHugePages(kind bench.Kind) {
	if !bench.HugePagesMade(hugePagesWait) {
		cmd.Progress("%s: huge pages still pending after %v; timing anyway", kind, hugePagesWait)
	}
}

// hugePagesWait bounds awaitHugePages: 10M entries leave about 750 pages to
// collapse after their fill, each up to 6 ms here and followed by a gap at
// least as long (10 ms, the collapser's polling), about 13 s in all.
const hugePagesWait = time.Minute

// pageCosts are what fresh memory costs the machine, µs per 4 KiB page
// (pageWrites): a page fault; MADV_POPULATE_WRITE; the first write after
// it; a later write. Zero where not measured.
type pageCosts struct{ fault, populate, firstWrite, again float64 }
