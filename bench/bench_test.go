package bench

import (
	"math/rand/v2"
	"testing"

	"github.com/compactcache/compactcache/internal/workload"
)

// TestCaches stores entries of every variant in both caches and checks that
// each one comes back whole: the harness works, and compactcache answers the
// workload as the stock cache does.
func TestCaches(t *testing.T) {
	const n = 3000
	for _, v := range []workload.Variant{workload.Plain, workload.CNAME | workload.DNSSEC | workload.ECS} {
		for _, kind := range []Kind{Stock, Compact} {
			for _, raw := range []bool{false, true} {
				if raw && kind == Stock {
					continue
				}
				up := &Upstream{Variant: v}
				c := newCache(t, kind, up)
				if c.Compact != nil {
					c.Compact.SetRawWrites(raw)
				}
				d := NewDriver(v, workload.NewNames(n))
				for i := range n {
					if err := d.Query(c, i); err != nil {
						t.Fatalf("%s, %s: insert %d: %v", kind, v, i, err)
					}
				}
				if _, err := Verify(c, d, up, n); err != nil {
					t.Errorf("%s (raw %t), %s: %v", kind, raw, v, err)
				}
			}
		}
	}
}

// TestHitBatch sends a batch of hits and checks that each query asked for
// its own entry's name and got that entry's reply.
func TestHitBatch(t *testing.T) {
	const n = 500
	up := &Upstream{}
	c := newCache(t, Compact, up)
	d := NewDriver(workload.Plain, workload.NewNames(n))
	for i := range n {
		if err := d.Query(c, i); err != nil {
			t.Fatal(err)
		}
	}
	b := new(Batch)
	b.Fill(rand.New(rand.NewPCG(3, 4)), n)
	seen := map[int]bool{}
	for j := range BatchLen {
		i, name := b.query(j)
		if want := workload.Name(i); name != want {
			t.Fatalf("query %d: name %q for entry %d, want %q", j, name, i, want)
		}
		if err := d.HitBatch(c, b, j); err != nil {
			t.Fatalf("query %d, entry %d: %v", j, i, err)
		}
		m, err := d.W.Reply()
		if err != nil {
			t.Fatal(err)
		}
		if m.Id != uint16(i) || workload.PayloadOf(m) != workload.PayloadOf(workload.Reply(i, workload.Plain)) {
			t.Fatalf("query %d: reply %d with payload %d, want entry %d's", j, m.Id, workload.PayloadOf(m), i)
		}
		seen[i] = true
	}
	if len(seen) < n/2 {
		t.Fatalf("a batch of %d drew %d of %d entries", BatchLen, len(seen), n)
	}
}
