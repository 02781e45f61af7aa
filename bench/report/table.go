package main

import (
	"fmt"
	"io"
	"runtime"
	"time"

	"github.com/compactcache/compactcache/bench"
	"github.com/compactcache/compactcache/bench/harness"
	"github.com/compactcache/compactcache/internal/workload"
)

// table prints rows of figures, one column per cache and the ratio of
// compactcache's to the stock cache's where both are measured.
type table struct {
	w     io.Writer
	kinds []bench.Kind
}

// The label column is left-aligned, the figures right-aligned.
const (
	labelWidth = 42
	cellWidth  = 14
)

func (t *table) cell(s string) { fmt.Fprintf(t.w, "%*s", cellWidth, s) }

// row prints label with the figure get returns for each cache, formatted by
// format; ratio says how the two compare, nil for no comparison.
func (t *table) row(label, format string, ratio func(ours, stock float64) string, get func(bench.Kind) (float64, bool)) {
	vals := map[bench.Kind]float64{}
	fmt.Fprintf(t.w, "%-*s", labelWidth, label)
	for _, k := range t.kinds {
		v, ok := get(k)
		if !ok {
			t.cell("-")
			continue
		}
		vals[k] = v
		t.cell(fmt.Sprintf(format, v))
	}
	ours, okO := vals[bench.Compact]
	stock, okS := vals[bench.Stock]
	if okO && okS && ratio != nil {
		t.cell(ratio(ours, stock))
	}
	fmt.Fprintln(t.w)
}

func times(ours, stock float64) string { return fmt.Sprintf("%.3f", ours/stock) }

func points(ours, stock float64) string { return fmt.Sprintf("%+.1f pts", ours-stock) }

func printTable(out io.Writer, cfg config, r *results) {
	kinds := r.ok(cfg)
	path := "WriteMsg with a *dns.Msg"
	if cfg.raw {
		path = "w.Write of the reply bytes (-raw)"
	}
	fmt.Fprintf(out, "compactcache beside the stock cache plugin, reference workload (variant %s)\n", cfg.variant)
	fmt.Fprintf(out, "%s; %s, GOMAXPROCS %d, %s; %s/%s\n", r.started.UTC().Format(time.DateTime+" UTC"),
		harness.CPUModel(), runtime.GOMAXPROCS(0), runtime.Version(), runtime.GOOS, runtime.GOARCH)
	fmt.Fprintf(out, "plugin: %s\n", r.revision)
	fmt.Fprintf(out, "N = %d entries; compactcache budget %d MiB, hits through %s; stock cache sized for %d entries\n\n",
		cfg.n, cfg.capacity>>20, path, 2*cfg.n)

	t := &table{w: out, kinds: kinds}
	fmt.Fprintf(out, "%-*s", labelWidth, "figure")
	for _, k := range kinds {
		if k == bench.Stock {
			t.cell("stock cache")
			continue
		}
		t.cell(string(k))
	}
	if len(kinds) == 2 {
		t.cell("ours/stock")
	}
	fmt.Fprintln(out)
	fig := func(f func(*figures) float64) func(bench.Kind) (float64, bool) {
		return func(k bench.Kind) (float64, bool) { return f(r.figs[k]), true }
	}

	t.row("bytes/entry, HeapInuse+mapped after GC", "%.0f", times, fig(func(f *figures) float64 { return f.heapInuse }))
	t.row("bytes/entry, HeapAlloc+mapped after GC", "%.0f", times, fig(func(f *figures) float64 { return f.heapAlloc }))
	t.row("  of which mapped outside the Go heap", "%.0f", nil, func(k bench.Kind) (float64, bool) {
		return r.figs[k].mapped, k == bench.Compact
	})
	t.row("heap objects/entry", "%.2f", times, fig(func(f *figures) float64 { return f.objects }))
	t.row("bytes/entry, Stats().Bytes/N", "%.0f", nil, func(k bench.Kind) (float64, bool) {
		return r.figs[k].storeBytes, k == bench.Compact
	})
	t.row("payload bytes/entry", "%.1f", nil, fig(func(f *figures) float64 { return f.payload }))
	t.row("overhead, HeapInuse/payload", "%.2f", times, fig(func(f *figures) float64 { return f.heapInuse / f.payload }))

	own := func(f *figures) cost { return f.insert.minus(f.upstream) }
	t.row("insert ns, miss path with upstream", "%.0f", times, fig(func(f *figures) float64 { return f.insert.ns }))
	t.row("insert ns, upstream alone", "%.0f", nil, fig(func(f *figures) float64 { return f.upstream.ns }))
	t.row("insert ns, cache's own", "%.0f", times, fig(func(f *figures) float64 { return f.own.median }))
	t.row("  first quartile of the blocks", "%.0f", times, fig(func(f *figures) float64 { return f.own.q1 }))
	t.row("  third quartile of the blocks", "%.0f", times, fig(func(f *figures) float64 { return f.own.q3 }))
	t.row("  mean of the blocks, bursts included", "%.0f", times, fig(func(f *figures) float64 { return own(f).ns }))
	t.row("insert entries/s, cache's own", "%.0f", times, fig(func(f *figures) float64 { return 1e9 / f.own.median }))
	t.row("insert ns, cache's own, full (each evicts)", "%.0f", times, fig(func(f *figures) float64 { return f.ownAtBudget.median }))
	t.row("  first quartile of the blocks", "%.0f", times, fig(func(f *figures) float64 { return f.ownAtBudget.q1 }))
	t.row("  third quartile of the blocks", "%.0f", times, fig(func(f *figures) float64 { return f.ownAtBudget.q3 }))
	t.row("insert allocs, miss path with upstream", "%.1f", times, fig(func(f *figures) float64 { return f.insert.allocs }))
	t.row("insert allocs, upstream alone", "%.1f", nil, fig(func(f *figures) float64 { return f.upstream.allocs }))
	t.row("insert allocs, cache's own", "%.1f", times, fig(func(f *figures) float64 { return own(f).allocs }))
	t.row("insert bytes allocated, cache's own", "%.0f", times, fig(func(f *figures) float64 { return own(f).bytes }))

	t.row("hit ns/op, reply packed", "%.0f", times, fig(func(f *figures) float64 { return f.hit.ns }))
	t.row("hit allocs/op, reply packed", "%.2f", times, fig(func(f *figures) float64 { return f.hit.allocs }))
	t.row("hit bytes/op, reply packed", "%.0f", times, fig(func(f *figures) float64 { return f.hit.bytes }))
	t.row("hit ns/op, writer's packing excluded", "%.0f", times, fig(func(f *figures) float64 { return f.hitUnpacked.ns }))
	t.row("hit allocs/op, writer's packing excluded", "%.2f", times, fig(func(f *figures) float64 { return f.hitUnpacked.allocs }))
	t.row("hit bytes/op, writer's packing excluded", "%.0f", times, fig(func(f *figures) float64 { return f.hitUnpacked.bytes }))
	t.row("dependent random read ns, over its bytes", "%.0f", times, fig(func(f *figures) float64 { return f.readNs }))

	ms := func(m map[bench.Kind]gcResult) func(bench.Kind) (float64, bool) {
		return func(k bench.Kind) (float64, bool) {
			g, ok := m[k]
			return float64(g.Median) / 1e6, ok
		}
	}
	if cfg.gcSmall > 0 && cfg.gcSmall < cfg.n {
		t.row(fmt.Sprintf("runtime.GC() ms at %d, median of 5", cfg.gcSmall), "%.2f", times, ms(r.gcSmall))
	}
	t.row(fmt.Sprintf("runtime.GC() ms at %d, median of 5", cfg.n), "%.2f", times, ms(r.gcN))
	if cfg.gcSmall > 0 && cfg.gcSmall < cfg.n {
		t.row("  GC growth, N over small", "%.2f", nil, func(k bench.Kind) (float64, bool) {
			s, okS := r.gcSmall[k]
			n, okN := r.gcN[k]
			return float64(n.Median) / float64(s.Median), okS && okN
		})
	}

	for b, budget := range cfg.budgets {
		z := func(f func(zipfResult) float64) func(bench.Kind) (float64, bool) {
			return func(k bench.Kind) (float64, bool) {
				res, ok := r.zipf[k]
				if !ok {
					return 0, false
				}
				return f(res[b]), true
			}
		}
		t.row(fmt.Sprintf("zipf hit %%, %d MiB", budget>>20), "%.1f", points, z(func(z zipfResult) float64 { return 100 * z.rate() }))
		t.row("  entries held (stock: its capacity)", "%.0f", times, z(func(z zipfResult) float64 { return float64(z.Entries) }))
		t.row("  heap in use + mapped at the end, MiB", "%.1f", times, z(func(z zipfResult) float64 { return float64(z.HeapInuse) / (1 << 20) }))
	}

	fmt.Fprintf(out, `
bytes/entry: heap after GC (bench.Settled) with the N entries stored, minus before, plus the memory
  compactcache's store maps outside the Go heap (OffHeapBytes, chunks handed out and mapped index tables),
  over N; every entry was then queried and had to hit with its own payload. Stats().Bytes is
  compactcache's count of what its store holds, on or off the Go heap. Payload: qname in wire form plus
  each record's rdata and 2 bytes.
insert: N misses through ServeDNS, each answered by an upstream that packs workload.Reply and unpacks it as
  forward does; "upstream alone" is that upstream, same queries, its own driver, without a cache in front,
  timed in blocks of %d queries alternating with the inserts'. The cache's own time is the median over
  the blocks of the difference, robust to load elsewhere on the machine, with the quartiles of the
  blocks' differences under it; the mean also counts
  the blocks where all shards grow their tables at once, and bursts of load elsewhere. Allocations: the
  difference of the MemStats.Mallocs and TotalAlloc deltas.
insert, full: a cache sized for about N entries (compactcache: the bytes Stats() counted above; the stock
  cache: N entries) filled with the N, then N more timed as above, each displacing an entry: the share a
  cache in service pays. The fill's inserts also write fresh memory, which this machine charges as the
  page line below says (an entry is about a 27th of a page); a full cache writes pages written before.
hit: %d queries, keys uniform over N, through ServeDNS with the reply written to a writer that packs
  WriteMsg replies as the server does (its compression map allocates); the second set of hit rows has the
  writer only keep the message. Wall time includes the GC work the operations cause.
dependent random read: a walk of reads through a buffer of the cache's bytes (HeapInuse above) in huge
  pages, each at a place the read before returned, after the cache is gone: the machine's price of each
  of the two reads a hit makes (index slot, entry) at that size; the median of 3 walks of 2M reads.
runtime.GC(): each cache alone in a child process, after its fill, compactcache's pending huge pages, %d
  hits and one settling GC.
zipf: %d names, Zipf(s=%.1f); a warm-up pass of %d queries, then %d counted; a hit is a query that does
  not reach the upstream. Equal budgets: the stock cache holds budget / its bytes per entry (HeapInuse)
  above; compactcache gets "capacity <budget>".
`, insertBlock, cfg.hits, cfg.hits, workload.TraceNames, workload.TraceSkew, cfg.trace, cfg.trace)
	if p := r.pages; p.fault > 0 {
		fmt.Fprintf(out, "\nfresh memory on this machine, µs per 4 KiB page of 64 MiB in small pages: a page fault %.2f; "+
			"MADV_POPULATE_WRITE %.2f, then the first write %.2f, a later write %.3f\n", p.fault, p.populate, p.firstWrite, p.again)
	}
	for _, err := range r.failed {
		fmt.Fprintf(out, "\nFAILED, NOT MEASURED: %v\n", err)
	}
}
