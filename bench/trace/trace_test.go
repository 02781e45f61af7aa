package main

import (
	"slices"
	"testing"

	"github.com/compactcache/compactcache/bench"
)

// TestTraces checks what every trace is made of: the same queries for the
// same seed, the share of one-off and scan names, names of each kind in
// their own range.
func TestTraces(t *testing.T) {
	const names, length = 2000, 20_000
	for _, s := range specs {
		tr := s.generate(names, length, 0.2)
		if len(tr.queries) != length || tr.warmUp != length/5 {
			t.Fatalf("%s: %d queries, %d warming up", s.name, len(tr.queries), tr.warmUp)
		}
		if again := s.generate(names, length, 0.2); !slices.Equal(again.queries, tr.queries) {
			t.Fatalf("%s: two traces from the same seed differ", s.name)
		}
		zipf, other := 0, map[uint32]int{}
		for _, i := range tr.queries {
			if int(i) < names {
				zipf++
				continue
			}
			other[i]++
		}
		switch {
		case s.oneOff > 0:
			share := float64(len(other)) / length
			if share < s.oneOff-0.02 || share > s.oneOff+0.02 {
				t.Errorf("%s: %.3f of the queries one-off, want %.2f", s.name, share, s.oneOff)
			}
			for i, n := range other {
				if n != 1 || int(i) < s.oneOffBase || int(i) >= s.oneOffBase+rangeLen {
					t.Fatalf("%s: name %d asked %d times", s.name, i, n)
				}
			}
		case s.scanEvery > 0:
			// 20,000 queries hold no scan: scanEvery is 50,000.
			if len(other) != 0 {
				t.Errorf("%s: %d scan names in %d queries", s.name, len(other), length)
			}
		default:
			if zipf != length {
				t.Errorf("%s: %d of %d queries to the Zipf names", s.name, zipf, length)
			}
		}
	}
	scan := spec{name: "scan", skew: 0.9, scanEvery: 100, scanLen: 30, scanSame: true}
	tr := scan.generate(names, 1300, 0)
	for k, i := range tr.queries {
		period, at := k/130, k%130
		if at >= 100 && int(i) != names+at-100 || at < 100 && int(i) >= names {
			t.Fatalf("query %d of period %d: name %d", at, period, i)
		}
	}
}

// TestSizes checks that sized names make entries of 64 B to 4 KB, as the
// store keeps them, and that denials are entries too.
func TestSizes(t *testing.T) {
	sz := newSizer(dnssecMode{})
	lo, hi := maxSized, 0
	for i := sizedBase; i < sizedBase+2000; i++ {
		n := sz.size(i)
		lo, hi = min(lo, n), max(hi, n)
	}
	if lo < minSized || lo > minSized+100 || hi > maxSized+16 || hi < maxSized-100 {
		t.Errorf("sized entries of %d to %d bytes, want %d to %d", lo, hi, minSized, maxSized)
	}
	if n := sz.size(denialBase); n < 60 || n > 200 {
		t.Errorf("a denial of %d bytes", n)
	}
}

// TestSimulations replays a small trace through every simulation: each
// admits and evicts as it should, and OPT is the best of them.
func TestSimulations(t *testing.T) {
	tr := spec{name: "t", skew: 0.9, oneOff: 0.3, oneOffBase: sizedBase}.generate(5000, 50_000, 0.2)
	p := prepare(tr, &sizes{s: newSizer(dnssecMode{}), known: map[uint32]int32{}})
	const budget = 256 << 10
	rates := map[string]float64{}
	for _, name := range simNames {
		r := simulate(p, name, budget)
		if r.Queries != 40_000 {
			t.Fatalf("%s counted %d queries", name, r.Queries)
		}
		rates[name] = r.rate()
	}
	for _, name := range simNames {
		if rates[name] <= 0.1 || rates[name] > rates[simOPT] {
			t.Errorf("%s: hit rate %.3f, OPT's %.3f", name, rates[name], rates[simOPT])
		}
	}
	if rates[simS3FIFO] <= rates[simLRU] || rates[simTinyLF] <= rates[simLRU] {
		t.Errorf("one-off names: S3-FIFO %.3f and W-TinyLFU %.3f do not beat LRU's %.3f", rates[simS3FIFO], rates[simTinyLF], rates[simLRU])
	}
	// A budget that holds every name: only first asks miss.
	firsts := 0
	for pos := p.warmUp; pos < len(p.queries); pos++ {
		if p.first[pos] {
			firsts++
		}
	}
	for _, name := range simNames {
		if r := simulate(p, name, 1<<30); r.Queries-r.Hits != firsts {
			t.Errorf("%s, budget for all: %d misses, %d first asks", name, r.Queries-r.Hits, firsts)
		}
	}
}

// TestReplay replays a trace through both plugins: replies are checked
// along the way, and what hits is what the upstream was not asked.
func TestReplay(t *testing.T) {
	tr := spec{name: "t", skew: 0.9, oneOff: 0.5, oneOffBase: denialBase}.generate(3000, 20_000, 0.2)
	p := prepare(tr, &sizes{s: newSizer(dnssecMode{}), known: map[uint32]int32{}})
	for _, kind := range []bench.Kind{bench.Compact, bench.Stock} {
		c, up, err := newCache(kind, 4<<20, 1071, dnssecMode{})
		if err != nil {
			t.Fatal(err)
		}
		r, err := replay(p, c, up, dnssecMode{})
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		if r.Queries != 16_000 || r.Hits == 0 || int(up.Calls()) < len(p.queries)-r.Hits-p.warmUp {
			t.Fatalf("%s: %d hits of %d queries, %d asked upstream", kind, r.Hits, r.Queries, up.Calls())
		}
	}
}

// TestReplaySigned replays a trace of signed answers through a budget
// smaller than its names: with no client that sets DO the store keeps no
// signatures, so it holds more entries, in fewer bytes each, and misses
// less than when every client sets DO; a share of DO clients misses more
// than none (the upgrades and the larger entries). The stock cache, at its
// bytes an entry, misses more at every share.
func TestReplaySigned(t *testing.T) {
	tr := spec{name: "t", skew: 0.9}.generate(20_000, 40_000, 0.2)
	perEntry := map[int]float64{}
	misses := map[bench.Kind]map[int]int{bench.Compact: {}, bench.Stock: {}}
	for _, do := range []int{0, 10, 100} {
		mode := dnssecMode{signed: true, do: do}
		p := prepare(tr, &sizes{s: newSizer(mode), known: map[uint32]int32{}})
		for _, kind := range []bench.Kind{bench.Compact, bench.Stock} {
			c, up, err := newCache(kind, 1<<20, 1071, mode)
			if err != nil {
				t.Fatal(err)
			}
			r, err := replay(p, c, up, mode)
			if err != nil {
				t.Fatalf("%s, %d%% DO: %v", kind, do, err)
			}
			misses[kind][do] = int(up.Calls())
			if kind == bench.Compact {
				perEntry[do] = float64(c.Compact.Stats().Bytes) / float64(r.Entries)
			}
		}
	}
	if perEntry[0] >= perEntry[100] {
		t.Errorf("bytes an entry: %.0f with no DO client, %.0f with every client DO; want fewer without", perEntry[0], perEntry[100])
	}
	cc, st := misses[bench.Compact], misses[bench.Stock]
	if cc[0] >= cc[10] || cc[0] >= cc[100] || st[0] <= cc[0] || st[10] <= cc[10] || st[100] <= cc[100] {
		t.Errorf("upstream queries at 0/10/100%% DO: compactcache %d/%d/%d, stock cache %d/%d/%d", cc[0], cc[10], cc[100], st[0], st[10], st[100])
	}
}
