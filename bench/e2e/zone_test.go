//go:build linux

package main

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/compactcache/compactcache/internal/workload"
	"github.com/miekg/dns"
)

// TestZone parses the zone back and finds in it exactly the records of each
// entry's reply, and nothing else but the apex.
func TestZone(t *testing.T) {
	const n = 3000
	var buf bytes.Buffer
	if err := writeZone(&buf, n); err != nil {
		t.Fatal(err)
	}
	type key struct {
		name  string
		qtype uint16
	}
	got := map[key][]dns.RR{}
	zp := dns.NewZoneParser(&buf, ".", "zone.db")
	for rr, ok := zp.Next(); ok; rr, ok = zp.Next() {
		h := rr.Header()
		k := key{h.Name, h.Rrtype}
		got[k] = append(got[k], rr)
	}
	if err := zp.Err(); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		want := workload.Reply(i, workload.Plain).Answer
		q := workload.Question(i)
		k := key{q.Name, q.Qtype}
		have := got[k]
		if len(have) != len(want) {
			t.Fatalf("entry %d (%s %s): %d records in the zone, want %d", i, q.Name, dns.TypeToString[q.Qtype], len(have), len(want))
		}
		for j := range want {
			if !dns.IsDuplicate(have[j], want[j]) || have[j].Header().Ttl != want[j].Header().Ttl {
				t.Fatalf("entry %d record %d: zone has %v, want %v", i, j, have[j], want[j])
			}
		}
		delete(got, k)
	}
	for k := range got {
		if k.name != "." && k.name != "ns.e2e.invalid." {
			t.Errorf("unexpected RRset %s %s", k.name, dns.TypeToString[k.qtype])
		}
	}
}

// TestQueries checks that both query files ask for every entry once, the
// fill file in order.
func TestQueries(t *testing.T) {
	const n = 1000
	var fill, hit bytes.Buffer
	if err := writeQueries(&fill, fillOrder(n)); err != nil {
		t.Fatal(err)
	}
	if err := writeQueries(&hit, hitOrder(n, 1)); err != nil {
		t.Fatal(err)
	}
	fillLines := strings.Split(strings.TrimSuffix(fill.String(), "\n"), "\n")
	hitLines := strings.Split(strings.TrimSuffix(hit.String(), "\n"), "\n")
	if len(fillLines) != n || len(hitLines) != n {
		t.Fatalf("%d and %d lines, want %d", len(fillLines), len(hitLines), n)
	}
	for i, line := range fillLines {
		want := fmt.Sprintf("%s %s", workload.Name(i), dns.TypeToString[workload.Qtype(i)])
		if line != want {
			t.Fatalf("fill line %d: %q, want %q", i, line, want)
		}
	}
	if slices.Equal(fillLines, hitLines) {
		t.Fatal("hit.txt is in fill order")
	}
	slices.Sort(fillLines)
	slices.Sort(hitLines)
	if !slices.Equal(fillLines, hitLines) {
		t.Fatal("hit.txt does not ask for the same entries as fill.txt")
	}
}
