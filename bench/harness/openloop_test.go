package harness

import (
	"testing"
	"time"
)

func TestWindows(t *testing.T) {
	start := time.Unix(1_800_000_000, 0)
	p := &Phase{}
	for i := range 1000 {
		l := 100 * time.Microsecond
		if i%100 == 99 {
			l = 10 * time.Millisecond // one slow query in each 100
		}
		if i == 500 {
			l = 0 // lost
		}
		p.Samples = append(p.Samples, Sample{Sent: start.Add(time.Duration(i) * time.Millisecond), Latency: l})
	}
	w := p.Between(start.Add(100*time.Millisecond), start.Add(200*time.Millisecond))
	if len(w.Latencies) != 100 || w.Lost != 0 || w.Percentile(0.99) != 10*time.Millisecond || w.Percentile(0.5) != 100*time.Microsecond {
		t.Errorf("window %v", w)
	}
	if all := p.All(); len(all.Latencies) != 999 || all.Lost != 1 {
		t.Errorf("all: %d answered, %d lost", len(all.Latencies), all.Lost)
	}
	if got := p.Sent(start.Add(450*time.Millisecond), start.Add(550*time.Millisecond)); got != 100 {
		t.Errorf("sent from 450 to 550 ms: %d, want 100 (the lost one counted)", got)
	}
	// Stretches of 50 queries hold none or one slow query: p99 is the
	// slow one in half of them.
	if got := p.TypicalP99(50 * time.Millisecond); got != 10*time.Millisecond && got != 100*time.Microsecond {
		t.Errorf("typical p99 of 50 ms stretches: %v", got)
	}
	if got := p.TypicalP99(20 * time.Millisecond); got != 100*time.Microsecond {
		t.Errorf("typical p99 of 20 ms stretches: %v, want 100µs: most hold no slow query", got)
	}
}
