//go:build linux

package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/compactcache/compactcache/bench/harness"
	"github.com/compactcache/compactcache/internal/workload"
)

// writesResult is what a phase with snapshots written every interval
// measured.
type writesResult struct {
	writes []timed
	// The queries sent while a write ran and those sent away from any,
	// pooled.
	during, outside harness.Window
	// The median over writes of the p99 of the queries sent during each,
	// and the median p99 of stretches as long as the median write away
	// from writes: a stall of the shared machine stretches the write it
	// falls in and weighs on the pooled p99, not on these medians.
	p99Write, p99Typical time.Duration
}

func (w writesResult) pooledRatio() float64 {
	return ratio(float64(w.during.Percentile(0.99)), float64(w.outside.Percentile(0.99)))
}

func (w writesResult) typicalRatio() float64 {
	return ratio(float64(w.p99Write), float64(w.p99Typical))
}

// writesPhase runs build bin from the snapshot at path, written again every
// -interval, under -write of the queries of post, and reads from its log
// when each write ran.
func (e *env) writesPhase(bin, path string, cfg config, post workload.Zipf, names *workload.Names) (writesResult, error) {
	var res writesResult
	s, err := e.startBin(bin, "writes", e.serverCorefile(fmt.Sprintf("        snapshot %s %v\n", path, cfg.interval)))
	if err != nil {
		return res, err
	}
	defer s.Stop(time.Minute)
	if _, err := firstAnswer(s, e.dnsAddr(), time.Minute); err != nil {
		return res, err
	}
	stop := make(chan struct{})
	seen := s.watchWrites(stop)
	p, err := harness.OpenLoop(e.dnsAddr(), cfg.rate, cfg.write, zipfQueries(&post, names), nil)
	close(stop)
	writes := <-seen
	if err != nil {
		return res, err
	}
	if len(writes) == 0 {
		return res, fmt.Errorf("no snapshot written in %v (see %s)", cfg.write, s.Log)
	}
	return measureWrites(p, writes), nil
}

// margin keeps the queries sent just around a write out of those away
// from writes: a write's end is known to within the log's polling.
const margin = 50 * time.Millisecond

// measureWrites splits the phase's queries into those sent while a write
// ran and those sent more than margin away from any.
func measureWrites(p *harness.Phase, writes []timed) writesResult {
	res := writesResult{writes: writes}
	near := func(from, to time.Time, slack time.Duration) bool {
		for _, w := range writes {
			if !to.Before(w.seen.Add(-w.took-slack)) && !from.After(w.seen.Add(slack)) {
				return true
			}
		}
		return false
	}
	res.during = p.Where(func(t time.Time) bool { return near(t, t, 0) })
	res.outside = p.Where(func(t time.Time) bool { return !near(t, t, margin) })

	var each []time.Duration
	for _, w := range writes {
		if win := p.Between(w.seen.Add(-w.took), w.seen); len(win.Latencies) > 0 {
			each = append(each, win.Percentile(0.99))
		}
	}
	itself := func(d time.Duration) time.Duration { return d }
	res.p99Write = harness.Median(each, itself)
	took := func(w timed) time.Duration { return w.took }
	length := max(harness.Median(writes, took), time.Millisecond)
	res.p99Typical = harness.Median(p.StretchP99s(length, func(from, to time.Time) bool { return near(from, to, margin) }), itself)
	return res
}

// print gives the phase's figures.
func (w writesResult) print(r int, label string) {
	var took []string
	for _, t := range w.writes {
		took = append(took, t.took.String())
	}
	fmt.Printf("round %d %s %d writes of %d entries or more (%s), %.2f s per 1M (median)\n",
		r, label, len(w.writes), w.writes[0].entries, strings.Join(took, " "), harness.Median(w.writes, func(t timed) float64 { return t.perMillion().Seconds() }))
	fmt.Printf("round %d %s p99 of the %d queries sent during writes %d µs / of the %d sent away from them %d µs: %.2f; median of each write's p99 %d µs / of as long stretches away from writes %d µs: %.2f\n",
		r, label, len(w.during.Latencies), w.during.Percentile(0.99).Microseconds(), len(w.outside.Latencies), w.outside.Percentile(0.99).Microseconds(), w.pooledRatio(),
		w.p99Write.Microseconds(), w.p99Typical.Microseconds(), w.typicalRatio())
}
