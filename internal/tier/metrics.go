package tier

import (
	"sync/atomic"

	"github.com/compactcache/compactcache/internal/admin"
	"github.com/compactcache/compactcache/internal/cachemetrics"
	"github.com/coredns/coredns/plugin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// The families of a block's tier, by the block's zones and view.
var (
	requests = cachemetrics.CounterVec("shared_requests_total", cachemetrics.OptionLabels("result"),
		"The lookups in the shared tier, by result: hit, miss, error, timeout, skipped (the breaker was open, the tier not connected, or the request canceled before the tier answered).")
	rejected = cachemetrics.CounterVec("shared_rejected_total", cachemetrics.OptionLabels("reason"),
		"The values read from the shared tier that failed their checks, by reason: short, tag (not authenticated by the secret), format (not an entry), key (another key's entry), epoch (a flush's time that is not a number), evicted (an epoch the value is written with is gone: the tier evicted it, and maybe a flush with it).")
	writes = cachemetrics.CounterVec("shared_writes_total", cachemetrics.OptionLabels("result"),
		"The entries written to the shared tier, by result: written, dropped (the queue was full, the breaker open, or the tier erred).")
	flushes = cachemetrics.CounterVec("shared_flushes_total", cachemetrics.OptionLabels("direction"),
		"The flushes sent to the other replicas through the shared tier, and received from them.")
	breakerGauge = cachemetrics.GaugeVec("shared_breaker_state", cachemetrics.OptionLabels(),
		"The shared tier's breaker: 0 closed (asked), 1 open (skipped), 2 half-open (probed).")
	lookupSeconds = promauto.NewHistogramVec(prometheus.HistogramOpts{Namespace: plugin.Namespace, Subsystem: cachemetrics.Subsystem, Name: "shared_lookup_duration_seconds",
		Help:    "The time a lookup in the shared tier took, timeouts included.",
		Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1}}, cachemetrics.OptionLabels())
)

// count is a counter of the tier's: a series, and a number the admin stats
// read.
type count struct {
	series prometheus.Counter
	n      atomic.Int64
}

func (c *count) inc() {
	c.series.Inc()
	c.n.Add(1)
}

// series are a tier's resolved counters.
type series struct {
	hits, misses, errors, timeouts, skipped count
	rejected                                map[error]*count
	written, dropped                        count
	sent, received                          count
	breaker                                 prometheus.Gauge
	lookup                                  prometheus.Observer
}

func newSeries(zones, view string) *series {
	s := &series{rejected: map[error]*count{}}
	for _, c := range []struct {
		c      *count
		vec    *prometheus.CounterVec
		result string
	}{
		{&s.hits, requests, "hit"}, {&s.misses, requests, "miss"}, {&s.errors, requests, "error"},
		{&s.timeouts, requests, "timeout"}, {&s.skipped, requests, "skipped"},
		{&s.written, writes, "written"}, {&s.dropped, writes, "dropped"},
		{&s.sent, flushes, "sent"}, {&s.received, flushes, "received"},
	} {
		c.c.series = c.vec.WithLabelValues(zones, view, c.result)
	}
	for _, err := range []error{errShort, errTag, errFormat, errKey, errEpoch, errEvicted} {
		s.rejected[err] = &count{series: rejected.WithLabelValues(zones, view, err.Error())}
	}
	s.breaker = breakerGauge.WithLabelValues(zones, view)
	s.lookup = lookupSeconds.WithLabelValues(zones, view)
	return s
}

// stats fills what the admin stats show.
func (s *series) stats(st *admin.Shared) {
	st.Hits, st.Misses, st.Errors, st.Timeouts, st.Skipped = s.hits.n.Load(), s.misses.n.Load(), s.errors.n.Load(), s.timeouts.n.Load(), s.skipped.n.Load()
	st.Requests = st.Hits + st.Misses + st.Errors + st.Timeouts + st.Skipped
	for _, c := range s.rejected {
		st.Rejected += c.n.Load()
	}
	st.Writes, st.WritesDropped = s.written.n.Load(), s.dropped.n.Load()
	st.FlushesSent, st.FlushesReceived = s.sent.n.Load(), s.received.n.Load()
}
