//go:build linux

package main

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/compactcache/compactcache/bench/harness"
)

// The log lines as the plugin writes them (snapshot.go, warmup.go).
const serverLog = `[INFO] plugin/compactcache: Snapshot /tmp/x/round1.snap: 183220 entries loaded in 92ms from a file written 3s ago, 0 expired
[INFO] plugin/compactcache: Warm-up of dns://.:5353 (bind 127.0.0.1) from http://127.0.0.1:4000: 183220 entries in 1.25s, 0 expired
[INFO] plugin/compactcache: Snapshot /tmp/x/round1.snap: 190001 entries written in 140ms
[INFO] plugin/compactcache: Snapshot /tmp/x/round1.snap: 190500 entries written in 1.5s
`

func TestLogLines(t *testing.T) {
	for _, tc := range []struct {
		name string
		re   *regexp.Regexp
		want []timed
	}{
		{"loaded", loadedLine, []timed{{entries: 183220, took: 92 * time.Millisecond}}},
		{"warmed", warmedLine, []timed{{entries: 183220, took: 1250 * time.Millisecond}}},
		{"written", writtenLine, []timed{{entries: 190001, took: 140 * time.Millisecond}, {entries: 190500, took: 1500 * time.Millisecond}}},
	} {
		got := findAll(tc.re, []byte(serverLog))
		if len(got) != len(tc.want) {
			t.Fatalf("%s: %d lines found, want %d: %+v", tc.name, len(got), len(tc.want), got)
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Errorf("%s %d: %+v, want %+v", tc.name, i, got[i], tc.want[i])
			}
		}
	}
	if got := (timed{entries: 250_000, took: 100 * time.Millisecond}).perMillion(); got != 400*time.Millisecond {
		t.Errorf("100ms for 250,000 entries: %v per million, want 400ms", got)
	}
	if got := (timed{}).perMillion(); got != 0 {
		t.Errorf("no entries: %v per million, want 0", got)
	}
}

// A query a millisecond, half of them asked of the upstream in the first
// second, none in the next.
func TestHitRate(t *testing.T) {
	start := time.Unix(1_800_000_000, 0)
	p := &harness.Phase{}
	up := &upstream{}
	for i := range 2000 {
		at := start.Add(time.Duration(i) * time.Millisecond)
		p.Samples = append(p.Samples, harness.Sample{Sent: at, Latency: 100 * time.Microsecond})
		if i < 1000 && i%2 == 0 {
			up.asked = append(up.asked, at.Add(50*time.Microsecond).UnixNano())
		}
	}
	for _, tc := range []struct {
		from, to time.Duration
		want     float64
	}{
		{0, time.Second, 0.5},
		{time.Second, 2 * time.Second, 1},
		{0, 2 * time.Second, 0.75},
		{500 * time.Millisecond, 1500 * time.Millisecond, 0.75},
		{3 * time.Second, 4 * time.Second, 0}, // no queries
	} {
		if got := hitRate(p, up, start.Add(tc.from), start.Add(tc.to)); got != tc.want {
			t.Errorf("hit rate from %v to %v: %v, want %v", tc.from, tc.to, got, tc.want)
		}
	}
}

// Queries every millisecond for a second, slow ones while two writes ran.
func TestMeasureWrites(t *testing.T) {
	start := time.Unix(1_800_000_000, 0)
	writes := []timed{
		{took: 100 * time.Millisecond, seen: start.Add(300 * time.Millisecond)}, // 200-300 ms
		{took: 50 * time.Millisecond, seen: start.Add(750 * time.Millisecond)},  // 700-750 ms
	}
	p := &harness.Phase{}
	for i := range 1000 {
		l := 100 * time.Microsecond
		if i >= 200 && i <= 300 || i >= 700 && i <= 750 {
			l = 5 * time.Millisecond
		}
		p.Samples = append(p.Samples, harness.Sample{Sent: start.Add(time.Duration(i) * time.Millisecond), Latency: l})
	}
	w := measureWrites(p, writes)
	if len(w.during.Latencies) != 101+51 || w.during.Percentile(0.5) != 5*time.Millisecond {
		t.Errorf("during: %v", w.during)
	}
	// The margin leaves out 50 ms either side of each write.
	if want := 1000 - (201 + 151); len(w.outside.Latencies) != want || w.outside.Percentile(1) != 100*time.Microsecond {
		t.Errorf("outside: %d queries, want %d: %v", len(w.outside.Latencies), want, w.outside)
	}
	// Stretches of 100 ms (the median write) away from writes: 0-100,
	// 400-500 and 500-600 ms.
	if w.p99Write != 5*time.Millisecond || w.p99Typical != 100*time.Microsecond || w.typicalRatio() != 50 || w.pooledRatio() != 50 {
		t.Errorf("p99 of each write %v, of stretches away %v: ratios %v, %v; want 5ms, 100µs: 50, 50", w.p99Write, w.p99Typical, w.typicalRatio(), w.pooledRatio())
	}
}

func TestSummaryTargets(t *testing.T) {
	round := func(hit2 float64, load time.Duration, p99 time.Duration) roundResult {
		return roundResult{
			before:   0.5,
			final:    timed{entries: 100_000, took: 50 * time.Millisecond},
			snapshot: scenario{hit2: hit2, hit10: 0.5, upstream: 40, fill: timed{entries: 100_000, took: load}},
			cold:     scenario{hit2: 0.2, hit10: 0.3, upstream: 100},
			warmup:   scenario{hit2: 0.45, hit10: 0.5, upstream: 50, hit2r: 0.5, fill: timed{entries: 100_000, took: time.Second}},
			writes: writesResult{
				writes:   []timed{{entries: 100_000, took: 60 * time.Millisecond}},
				during:   harness.Window{Latencies: []time.Duration{p99}},
				outside:  harness.Window{Latencies: []time.Duration{time.Millisecond}},
				p99Write: p99, p99Typical: time.Millisecond,
			},
		}
	}
	// Medians: hit2 0.49 (0.98 of before), load 0.9 s per 1M, p99 3x.
	s := summary([]roundResult{
		round(0.49, 90*time.Millisecond, 3*time.Millisecond),
		round(0.40, 200*time.Millisecond, time.Millisecond),
		round(0.50, 50*time.Millisecond, 3*time.Millisecond),
	})
	for _, want := range []string{
		"| snapshot: hit rate 0-2 s ÷ the 10 s before | 0.98 | 0.98, 0.80, 1.00 |",
		"| snapshot: upstream queries, first minute ÷ cold start's | 0.40 |",
		"snapshot 0.98 met, peer warm-up 0.90 NOT met (from ready: 1.00 met)",
		"load <= 1 s per 1M entries: 0.90 s met",
		"p99 during a write <= 2x: 3.00 NOT met (all writes' queries pooled: 3.00 NOT met)",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("summary lacks %q:\n%s", want, s)
		}
	}
}

func TestLoadCPU(t *testing.T) {
	r := roundResult{
		snapshot: scenario{cpu: 150 * time.Millisecond, fill: timed{entries: 200_000}},
		cold:     scenario{cpu: 50 * time.Millisecond},
	}
	if got := r.loadCPU().perMillion(); got != 500*time.Millisecond {
		t.Errorf("100 ms of CPU more for 200,000 entries: %v per million, want 500ms", got)
	}
}
