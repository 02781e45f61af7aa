// Command dnssec prints the DNSSEC figures of issue 5 on the reference
// workload (internal/workload), in one run:
//
//  1. Mixed clients, dnssec variant: every one of N names is asked once by a
//     client that sets DO and once by one that does not. compactcache keeps
//     one entry per name (DO is not in its key; it filters at read time),
//     and asks the upstream again for the names a client without DO asked
//     first (the DO client's upgrade of an entry stored without RRSIGs); the
//     same store keyed by DO (two compactcache stores, one per DO value) and
//     the stock cache, which keys by DO, keep two. Entry counts, upstream
//     queries and memory per name, side by side.
//  2. No client sets DO: what the DNSSEC records (one RRSIG per RRset, ECDSA
//     P-256) of a signing upstream cost compactcache per entry, dnssec
//     variant minus plain, from Stats().Bytes and from the heap after GC:
//     entries stored for clients without DO leave them out.
//
// The upstream (bench.Upstream) answers as a signing server does: RRSIGs only
// when the query has DO (compactcache always asks with DO; the stock cache
// passes the client's).
//
//	go run ./bench/dnssec [-n 200000]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"

	"github.com/compactcache/compactcache/bench"
	"github.com/compactcache/compactcache/bench/harness"
	"github.com/compactcache/compactcache/internal/workload"

	"github.com/coredns/coredns/plugin"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

const cmd = harness.Command("dnssec")

func main() {
	// A flag set of its own: CoreDNS's packages define flags of theirs on
	// the default one (-conf, -dns.port, ...), which mean nothing here.
	fs := flag.NewFlagSet("dnssec", flag.ExitOnError)
	n := fs.Int("n", 200_000, "names (entries of the reference workload)")
	fs.Usage = func() { cmd.Usage(fs) }
	fs.Parse(os.Args[1:])
	if err := run(*n); err != nil {
		cmd.Fatal(err)
	}
}

// mixed is one cache's figures for the mixed-DO traffic.
type mixed struct {
	entries  int64
	upstream int64
	heap     float64 // heap in use after GC per name
	store    float64 // compactcache's Stats().Bytes per name
}

// noDO is compactcache's figures for one variant with DO=0 clients.
type noDO struct {
	store, heap float64 // per entry
	payload     float64 // per entry: qname and rdata (workload.PayloadOf)
}

func run(n int) error {
	names := workload.NewNames(n) // on the heap before and after each fill
	fmt.Printf("compactcache DNSSEC figures, N = %d names, %s/%s, %s\n\n", n, runtime.GOOS, runtime.GOARCH, runtime.Version())

	rows := []struct {
		label string
		kind  bench.Kind
		split bool
		m     *mixed
	}{
		{label: "compactcache (one entry for DO and DO=0)", kind: bench.Compact},
		{label: "compactcache keyed by DO (one store per DO value)", kind: bench.Compact, split: true},
		{label: "stock cache (keys by DO)", kind: bench.Stock},
	}
	for k := range rows {
		r := &rows[k]
		m, err := measureMixed(r.kind, r.split, n, names)
		if err != nil {
			return fmt.Errorf("%s, mixed DO: %v", r.label, err)
		}
		r.m = m
	}
	fmt.Println("1. dnssec variant; each name asked once with DO=1 and once with DO=0 (2N queries)")
	fmt.Println()
	fmt.Println("| cache | entries | entries / N | upstream queries | heap after GC / name | Stats().Bytes / name |")
	fmt.Println("|---|---:|---:|---:|---:|---:|")
	for _, r := range rows {
		store := "-"
		if r.kind == bench.Compact {
			store = fmt.Sprintf("%.0f B", r.m.store)
		}
		fmt.Printf("| %s | %d | %.2f | %d | %.0f B | %s |\n", r.label, r.m.entries, float64(r.m.entries)/float64(n), r.m.upstream, r.m.heap, store)
	}
	fmt.Println()

	var plain, signed noDO
	for _, v := range []struct {
		variant workload.Variant
		out     *noDO
	}{{workload.Plain, &plain}, {workload.DNSSEC, &signed}} {
		f, err := measureNoDO(v.variant, n, names)
		if err != nil {
			return fmt.Errorf("%s, no DO: %v", v.variant, err)
		}
		*v.out = *f
	}
	fmt.Println("2. compactcache, no client sets DO: what a signing upstream's RRSIGs cost")
	fmt.Println()
	fmt.Println("| upstream variant | Stats().Bytes / entry | heap after GC / entry | payload / entry |")
	fmt.Println("|---|---:|---:|---:|")
	fmt.Printf("| plain | %.0f B | %.0f B | %.0f B |\n", plain.store, plain.heap, plain.payload)
	fmt.Printf("| dnssec | %.0f B | %.0f B | %.0f B |\n", signed.store, signed.heap, signed.payload)
	fmt.Printf("| dnssec - plain | %.0f B | %.0f B | %.0f B |\n",
		signed.store-plain.store, signed.heap-plain.heap, signed.payload-plain.payload)
	fmt.Println("\n(payload: qname in wire form plus each record's rdata and 2-byte length, workload.PayloadOf)")
	return nil
}

func newCache(kind bench.Kind, n int, next plugin.Handler) (*bench.Cache, error) {
	if kind == bench.Stock {
		// Twice the 2N entries it will hold, so that its per-shard random
		// eviction never runs.
		return bench.NewStock(4*n, next)
	}
	c, err := bench.NewCompact(max(512<<20, int64(n)*1024), next)
	if err == nil {
		c.Compact.SetRawWrites(true)
	}
	return c, err
}

// measureMixed asks each name twice, DO=1 then DO=0 for even names and the
// other way round for odd ones, and checks every reply: RRSIGs for the DO
// client only. With split, DO and DO=0 clients go to two compactcache stores
// of their own: compactcache as it would be if DO were in its key.
func measureMixed(kind bench.Kind, split bool, n int, names *workload.Names) (*mixed, error) {
	up := &bench.Upstream{Variant: workload.DNSSEC}
	var caches [2]*bench.Cache // by DO
	for k := range caches {
		if k == 1 && !split {
			caches[1] = caches[0]
			break
		}
		c, err := newCache(kind, n, up)
		if err != nil {
			return nil, err
		}
		caches[k] = c
	}
	req := workload.NewRequest(0, workload.DNSSEC)
	w := bench.NewWriter()
	before := bench.Settled()
	for i := range n {
		for k := range 2 {
			do := (i+k)%2 == 0
			workload.SetRequest(req, i, workload.DNSSEC, names.Name(i))
			req.Extra[0].(*dns.OPT).SetDo(do)
			c := caches[0]
			if do {
				c = caches[1]
			}
			if _, err := c.ServeDNS(bench.WithIndex(context.Background(), i), w, req); err != nil {
				return nil, fmt.Errorf("name %d DO=%v: %v", i, do, err)
			}
			if err := checkReply(w, i, do); err != nil {
				return nil, err
			}
		}
	}
	after := bench.Settled()
	m := &mixed{upstream: up.Calls(), heap: float64(int64(after.HeapInuse)-int64(before.HeapInuse)) / float64(n)}
	if kind == bench.Stock {
		var err error
		if m.entries, err = stockEntries(); err != nil {
			return nil, err
		}
	} else {
		for k, c := range caches {
			if k == 1 && !split {
				break
			}
			st := c.Compact.Stats()
			m.entries += st.Entries
			m.store += float64(st.Bytes) / float64(n)
		}
	}
	runtime.KeepAlive(caches)
	return m, nil
}

// checkReply checks the reply to name i: its records, with an RRSIG exactly
// when the client set DO, and DO echoed.
func checkReply(w *bench.Writer, i int, do bool) error {
	m, err := w.Reply()
	if err != nil {
		return err
	}
	want := workload.Reply(i, workload.DNSSEC)
	sigs := 0
	for _, rr := range m.Answer {
		if rr.Header().Rrtype == dns.TypeRRSIG {
			sigs++
		}
	}
	o := m.IsEdns0()
	switch {
	case m.Rcode != dns.RcodeSuccess || len(m.Answer) != len(want.Answer)-sigsIf(!do, want):
		return fmt.Errorf("name %d DO=%v: %s with %d answers, want %d", i, do, dns.RcodeToString[m.Rcode], len(m.Answer), len(want.Answer)-sigsIf(!do, want))
	case do != (sigs > 0):
		return fmt.Errorf("name %d DO=%v: %d RRSIGs in the reply", i, do, sigs)
	case o != nil && o.Do() != do:
		// The stock cache leaves OPT to the server's ScrubWriter; where
		// there is one, DO must be the client's.
		return fmt.Errorf("name %d DO=%v: reply OPT %v", i, do, o)
	}
	return nil
}

func sigsIf(cond bool, m *dns.Msg) int {
	if !cond {
		return 0
	}
	n := 0
	for _, rr := range m.Answer {
		if rr.Header().Rrtype == dns.TypeRRSIG {
			n++
		}
	}
	return n
}

// stockEntries reads the stock cache's entry count from its
// coredns_cache_entries gauge, success and denial, the one stock cache in
// this process.
func stockEntries() (int64, error) {
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		return 0, err
	}
	for _, mf := range mfs {
		if mf.GetName() != "coredns_cache_entries" {
			continue
		}
		var n float64
		for _, m := range mf.GetMetric() {
			n += m.GetGauge().GetValue()
		}
		return int64(n), nil
	}
	return 0, fmt.Errorf("no coredns_cache_entries metric")
}

// measureNoDO fills compactcache with the N entries asked by DO=0 clients
// from an upstream of variant v.
func measureNoDO(v workload.Variant, n int, names *workload.Names) (*noDO, error) {
	up := &bench.Upstream{Variant: v}
	c, err := newCache(bench.Compact, n, up)
	if err != nil {
		return nil, err
	}
	d := bench.NewDriver(workload.Plain, names) // requests without DO
	before := bench.Settled()
	for i := range n {
		if err := d.Query(c, i); err != nil {
			return nil, fmt.Errorf("name %d: %v", i, err)
		}
	}
	after := bench.Settled()
	st := c.Compact.Stats()
	if st.Entries != int64(n) || up.Calls() != int64(n) {
		return nil, fmt.Errorf("%d entries, %d upstream queries for %d names", st.Entries, up.Calls(), n)
	}
	payload := 0
	for i := range n {
		payload += workload.PayloadOf(workload.Reply(i, v))
	}
	runtime.KeepAlive(c)
	return &noDO{
		store:   float64(st.Bytes) / float64(n),
		heap:    float64(int64(after.HeapInuse)-int64(before.HeapInuse)) / float64(n),
		payload: float64(payload) / float64(n),
	}, nil
}
