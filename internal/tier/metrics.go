package tier

import (
	"slices"
	"sync"
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
		"The lookups in the shared tier, by result: hit, miss, error, timeout, skipped (the breaker was open, the tier not connected, or the request canceled, or past a deadline of its own that left the tier less than half its timeout, before the tier answered).")
	rejected = cachemetrics.CounterVec("shared_rejected_total", cachemetrics.OptionLabels("reason"),
		"The values read from the shared tier that failed their checks, by reason: short, tag (not authenticated by the secret), format (not an entry), key (another key's entry), epoch (a flush's time that is not a number), evicted (an epoch the value is written with is gone: the tier evicted it, and maybe a flush with it).")
	writes = cachemetrics.CounterVec("shared_writes_total", cachemetrics.OptionLabels("result"),
		"The entries written to the shared tier, by result: written, dropped (the queue was full, the breaker open, or the tier erred).")
	flushes = cachemetrics.CounterVec("shared_flushes_total", cachemetrics.OptionLabels("direction"),
		"The flushes sent to the other replicas through the shared tier, received from them, and lost: the stream was trimmed, deleted or made again past flushes this replica had not read, and it flushed its store whole (and the tier, for a stream deleted or made again).")
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
	sent, received, lost                    count
	lookup                                  prometheus.Observer
	breaker                                 atomic.Int32 // the state of the tier's, for the gauge
	labels                                  [2]string    // zones, view
}

// holders are the series of the running tiers that hold each breaker
// series, by its labels: the old and the new instance's tier of a block
// across a reload, and blocks of the same zones and view on other ports.
// The series says open while one of their breakers is open, half-open
// while one is, closed otherwise, and goes with the last of them: one left
// behind by a tier that no longer runs would say its last state for good.
var holders = struct {
	sync.Mutex
	m map[[2]string][]*series
}{m: map[[2]string][]*series{}}

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
		{&s.sent, flushes, "sent"}, {&s.received, flushes, "received"}, {&s.lost, flushes, "lost"},
	} {
		c.c.series = c.vec.WithLabelValues(zones, view, c.result)
	}
	for _, err := range []error{errShort, errTag, errFormat, errKey, errEpoch, errEvicted} {
		s.rejected[err] = &count{series: rejected.WithLabelValues(zones, view, err.Error())}
	}
	s.lookup = lookupSeconds.WithLabelValues(zones, view)
	s.labels = [2]string{zones, view}
	holders.Lock()
	holders.m[s.labels] = append(holders.m[s.labels], s)
	holders.Unlock()
	s.breakerChanged(closed)
	return s
}

// breakerChanged records the state of s's tier's breaker and sets the
// gauge from its holders, unless s holds it no more: a closed tier's word
// comes too late.
func (s *series) breakerChanged(to breakerState) {
	s.breaker.Store(int32(to))
	holders.Lock()
	defer holders.Unlock()
	if hs := holders.m[s.labels]; slices.Contains(hs, s) {
		showBreaker(s.labels, hs)
	}
}

// release lets go of the breaker series as s's tier closes: the series
// goes unless another running tier holds it.
func (s *series) release() {
	holders.Lock()
	defer holders.Unlock()
	hs := slices.DeleteFunc(holders.m[s.labels], func(h *series) bool { return h == s })
	if len(hs) == 0 {
		delete(holders.m, s.labels)
		breakerGauge.DeleteLabelValues(s.labels[0], s.labels[1])
		return
	}
	holders.m[s.labels] = hs
	showBreaker(s.labels, hs)
}

// showBreaker sets the breaker series of labels from hs, its holders. The
// caller holds holders.
func showBreaker(labels [2]string, hs []*series) {
	v := closed
	for _, h := range hs {
		switch st := breakerState(h.breaker.Load()); {
		case st == open:
			v = open
		case st == halfOpen && v == closed:
			v = halfOpen
		}
	}
	breakerGauge.WithLabelValues(labels[0], labels[1]).Set(float64(v))
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
