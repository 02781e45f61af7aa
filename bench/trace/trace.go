package main

import (
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/compactcache/compactcache/internal/workload"
)

// A trace is a seeded sequence of queries, each an entry index that names
// the question and its reply (replies.go):
//
//	[0, names)                 the Zipf names, workload entries, index k-1
//	                           the k-th most popular
//	[names, names+scanNames)   the cold names a same-names scan repeats
//	[oneOffBase, ...)          one-off and fresh-scan names, workload entries
//	[denialBase, ...)          one-off names answered NXDOMAIN
//	[sizedBase, ...)           one-off names answered with 64 B to 4 KB
//
// Every index below 26^5 (about 11.9 million) names a distinct qname
// (workload.Name), so no two kinds share a name.
const (
	oneOffBase = 2_000_000
	denialBase = 5_000_000
	sizedBase  = 8_000_000
	rangeLen   = 3_000_000 // names in each range: sizedBase+rangeLen stays below 26^5
)

// spec describes a trace.
type spec struct {
	name string
	doc  string
	skew float64 // the Zipf exponent of the popular names

	// oneOff is the share of queries that go to a name never asked again,
	// answered as oneOffBase, denialBase or sizedBase names are.
	oneOff     float64
	oneOffBase int

	// Every scanEvery Zipf queries, scanLen queries in a row to cold names:
	// the same ones each time (scanSame) or fresh ones.
	scanEvery, scanLen int
	scanSame           bool
}

// The scans of the scan traces: 20,000 cold names every 50,000 queries.
const (
	scanNames = 20_000
	scanEvery = 50_000
)

// specs are the traces the benchmark replays, by name.
var specs = []spec{
	{name: "zipf-0.7", skew: 0.7, doc: "Zipf(0.7)"},
	{name: "zipf-0.9", skew: 0.9, doc: "Zipf(0.9)"},
	{name: "zipf-1.1", skew: 1.1, doc: "Zipf(1.1)"},
	{name: "oneoff", skew: 0.9, oneOff: 0.5, oneOffBase: oneOffBase,
		doc: "Zipf(0.9), half the queries to names never asked again"},
	{name: "nxdomain", skew: 0.9, oneOff: 0.5, oneOffBase: denialBase,
		doc: "Zipf(0.9), half the queries to names never asked again, answered NXDOMAIN (search-path expansions, random subdomains)"},
	{name: "flood", skew: 0.9, oneOff: 0.5, oneOffBase: sizedBase,
		doc: "Zipf(0.9), half the queries to names never asked again, whose entries take 64 B to 4 KB"},
	{name: "scan-same", skew: 0.9, scanEvery: scanEvery, scanLen: scanNames, scanSame: true,
		doc: "Zipf(0.9), every 50,000 queries a scan of the same 20,000 cold names"},
	{name: "scan-fresh", skew: 0.9, scanEvery: scanEvery, scanLen: scanNames,
		doc: "Zipf(0.9), every 50,000 queries a scan of 20,000 fresh names"},
}

func findSpecs(list string) ([]spec, error) {
	if list == "all" {
		return specs, nil
	}
	var out []spec
	for name := range strings.SplitSeq(list, ",") {
		found := false
		for _, s := range specs {
			if s.name == strings.TrimSpace(name) {
				out = append(out, s)
				found = true
			}
		}
		if !found {
			return nil, fmt.Errorf("unknown trace %q (want all, or some of %s)", name, specList())
		}
	}
	return out, nil
}

// trace is a generated trace.
type trace struct {
	spec
	names   int      // Zipf names
	queries []uint32 // entry indices, in order
	warmUp  int      // the first warmUp queries are not counted
}

// hot reports whether index i is one of the hottest 1% of the Zipf names.
func (t *trace) hot(i uint32) bool { return int(i) < t.names/100 }

// generate builds the trace: length queries over names Zipf names, the same
// for the same arguments on every machine (the Zipf sampler and PCG are
// specified bit for bit).
func (s spec) generate(names, length int, warmUp float64) *trace {
	t := &trace{spec: s, names: names, queries: make([]uint32, 0, length), warmUp: int(warmUp * float64(length))}
	z := workload.NewZipf(names, s.skew, 1)
	mix := rand.New(rand.NewPCG(2, 3))
	fresh := oneOffBase // the next fresh scan name
	next := s.oneOffBase
	since := 0 // Zipf queries since the last scan
	for len(t.queries) < length {
		if s.scanEvery > 0 && since == s.scanEvery {
			for k := 0; k < s.scanLen && len(t.queries) < length; k++ {
				if s.scanSame {
					t.queries = append(t.queries, uint32(names+k))
				} else {
					t.queries = append(t.queries, uint32(fresh))
					fresh++
				}
			}
			since = 0
			continue
		}
		if s.oneOff > 0 && mix.Float64() < s.oneOff {
			t.queries = append(t.queries, uint32(next))
			next++
			continue
		}
		t.queries = append(t.queries, uint32(z.Next()))
		since++
	}
	if next-s.oneOffBase >= rangeLen || fresh-oneOffBase >= rangeLen {
		panic("trace: one-off names ran past their range")
	}
	return t
}
