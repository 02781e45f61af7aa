//go:build linux

package main

import (
	"testing"
	"time"
)

func TestWindows(t *testing.T) {
	start := time.Unix(1_800_000_000, 0)
	p := &phase{}
	for i := range 1000 {
		l := 100 * time.Microsecond
		if i%100 == 99 {
			l = 10 * time.Millisecond // one slow query in each 100
		}
		if i == 500 {
			l = 0 // lost
		}
		p.samples = append(p.samples, sample{sent: start.Add(time.Duration(i) * time.Millisecond), latency: l})
	}
	w := p.between(start.Add(100*time.Millisecond), start.Add(199*time.Millisecond))
	if len(w.latencies) != 100 || w.lost != 0 || w.percentile(0.99) != 10*time.Millisecond || w.percentile(0.5) != 100*time.Microsecond {
		t.Errorf("window %v", w)
	}
	if all := p.all(); len(all.latencies) != 999 || all.lost != 1 {
		t.Errorf("all: %d answered, %d lost", len(all.latencies), all.lost)
	}
	// Stretches of 50 queries hold none or one slow query: p99 is the
	// slow one in half of them.
	if got := p.typicalP99(50 * time.Millisecond); got != 10*time.Millisecond && got != 100*time.Microsecond {
		t.Errorf("typical p99 of 50 ms stretches: %v", got)
	}
	if got := p.typicalP99(20 * time.Millisecond); got != 100*time.Microsecond {
		t.Errorf("typical p99 of 20 ms stretches: %v, want 100µs: most hold no slow query", got)
	}
}
