// Package cachemetrics owns compactcache's Prometheus families: the stock
// cache's (coredns_cache_*), which a block feeds so that what reads
// CoreDNS's metrics reads compactcache's, registered or adopted beside the
// stock cache's own; compactcache's (coredns_compactcache_*) for what the
// stock ones have no name for; and the gauges that describe stores, read
// from them when the metrics are gathered. A block resolves its series
// once per server (Block.Server), so that the request path hashes no
// label values.
package cachemetrics

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"weak"

	"github.com/compactcache/compactcache/internal/frontend"
	"github.com/compactcache/compactcache/internal/store"
	"github.com/coredns/coredns/plugin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	dto "github.com/prometheus/client_model/go"
)

// The own families that repeat a stock one are deprecated (README,
// Metrics): their counts go to both through counter and gauge below.

// The families of compactcache, with the stock cache's labels.
var (
	cacheSize = storeGauge("entries", kindedLabels,
		deprecated("The number of elements in the cache.", "entries"))
	cacheRequests = CounterVec("requests_total", blockLabels,
		deprecated("The count of cache requests.", "requests_total"))
	cacheHits = CounterVec("hits_total", kindedLabels,
		deprecated("The count of cache hits.", "hits_total"))
	cacheMisses = CounterVec("misses_total", blockLabels,
		deprecated("The count of cache misses.", "misses_total"))
	cacheDrops = CounterVec("drops_total", blockLabels,
		deprecated("The number of responses that are not cached because they are malformed, truncated or do not match the request.", "drops_total"))
	evictions = CounterVec("evictions_total", kindedLabels,
		deprecated("The count of cache evictions.", "evictions_total"))
	cachePrefetches = CounterVec("prefetch_total", blockLabels,
		deprecated("The number of times the cache has prefetched a cached item.", "prefetch_total"))
	servedStale = CounterVec("served_stale_total", blockLabels,
		deprecated("The number of requests served from stale cache entries.", "served_stale_total"))
	notAdmitted = CounterVec("not_admitted_total", kindedLabels,
		"The count of entries dropped from probation without being asked for again there: refused admission to the main queue, not counted in evictions_total.")
	cacheBytes = storeGauge("bytes", blockLabels,
		"The bytes the cache holds: arenas, index and bookkeeping.")
	cacheCapacity = storeGauge("capacity_bytes", blockLabels,
		"The byte budget of the cache.")
	ecsVariants = storeGauge("ecs_variants", blockLabels,
		"The number of entries tailored to a client subnet (EDNS Client Subnet).")
	cacheRefused = CounterVec("refused_total", blockLabels,
		"The number of responses not cached because they exceed the per-entry limit.")
	frontendRequests = CounterVec("frontend_requests_total", resultLabels,
		"The requests the front end read, by result: hit (answered from the cache), chain (handed to the server block), shed (dropped: the chain had too many in flight), dropped (unreadable, or a reply the kernel refused to send).")
	// SnapshotErrors counts the snapshot files and warm-up streams that
	// could not be used.
	SnapshotErrors = CounterVec("snapshot_errors_total", []string{"path", "op"},
		"The snapshot files that could not be read (damaged, unreadable) or written (no space, no directory, read-only file system), by file and op.")
	frontendLogDropped = CounterVec("frontend_log_dropped_total", blockLabels,
		"The front end's hits whose access log line (for the block's log plugin) was dropped: the log did not keep up.")
)

// deprecated marks the help of a family that repeats the stock one named.
func deprecated(help, name string) string {
	return help + " Deprecated: use " + prometheus.BuildFQName(plugin.Namespace, stockSubsystem, name) + "."
}

// The labels of the stock cache's families: per block, and per kind of entry.
var (
	blockLabels  = []string{"server", "zones", "view"}
	kindedLabels = []string{"server", "type", "zones", "view"}
	resultLabels = []string{"server", "zones", "view", "result"}
)

// storeGauge makes a gauge family that describes stores; storeGauges
// registers and sets it.
func storeGauge(name string, labels []string, help string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: plugin.Namespace, Subsystem: Subsystem, Name: name, Help: help}, labels)
}

// CounterVec makes and registers a counter family of compactcache's.
func CounterVec(name string, labels []string, help string) *prometheus.CounterVec {
	return promauto.NewCounterVec(prometheus.CounterOpts{Namespace: plugin.Namespace, Subsystem: Subsystem, Name: name, Help: help}, labels)
}

// GaugeVec makes and registers a gauge family of compactcache's.
func GaugeVec(name string, labels []string, help string) *prometheus.GaugeVec {
	return promauto.NewGaugeVec(prometheus.GaugeOpts{Namespace: plugin.Namespace, Subsystem: Subsystem, Name: name, Help: help}, labels)
}

// OptionLabels label the families of a block's options (shared,
// kubernetes), which serve the block whatever server listens for it: its
// zones and view, without the server label of the stock cache's families.
func OptionLabels(more ...string) []string { return append([]string{"zones", "view"}, more...) }

// Subsystem is the middle of the names of compactcache's families.
const Subsystem = "compactcache"

// KindLabels are the type label values, as the stock cache's.
var KindLabels = [...]string{store.KindSuccess: "success", store.KindDenial: "denial"}

const stockSubsystem = "cache"

// stockFamilies are the stock cache's families as a compactcache block feeds
// them: the names, labels and help texts of plugin/cache/metrics.go, byte for
// byte, for the registry finds a family registered before only when all
// three agree (and refuses it otherwise).
type stockFamilies struct {
	requests, misses, drops, prefetch, stale *prometheus.CounterVec
	hits, evictions                          *prometheus.CounterVec
	// entries holds the compactcache blocks' series; see register.
	entries *prometheus.GaugeVec
	// stockEntries is the stock cache's entries family, where it is linked
	// in: entriesFamily collects it beside entries.
	stockEntries *prometheus.GaugeVec
}

func newStockFamilies() *stockFamilies {
	counter := func(name string, labels []string, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: plugin.Namespace, Subsystem: stockSubsystem, Name: name, Help: help}, labels)
	}
	return &stockFamilies{
		requests:  counter("requests_total", blockLabels, "The count of cache requests."),
		hits:      counter("hits_total", kindedLabels, "The count of cache hits."),
		misses:    counter("misses_total", blockLabels, "The count of cache misses. Deprecated, derive misses from cache hits/requests counters."),
		prefetch:  counter("prefetch_total", blockLabels, "The number of times the cache has prefetched a cached item."),
		drops:     counter("drops_total", blockLabels, "The number responses that are not cached, because the reply is malformed."),
		stale:     counter("served_stale_total", blockLabels, "The number of requests served from stale cache entries."),
		evictions: counter("evictions_total", kindedLabels, "The count of cache evictions."),
		entries: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: plugin.Namespace, Subsystem: stockSubsystem, Name: "entries",
			Help: "The number of elements in the cache."}, kindedLabels),
	}
}

// Register returns the stock families, registered in the registry the
// prometheus plugin serves. They are registered at the first setup, not in
// init: Go initializes packages that do not import each other in the order of
// their import paths, so this one before github.com/coredns/coredns/plugin/cache,
// whose promauto panics on a family registered before it. The families are
// usable even when registering failed: the error fails the setup.
var Register = sync.OnceValues(func() (*stockFamilies, error) {
	f := newStockFamilies()
	return f, f.register(prometheus.DefaultRegisterer, storeGauges)
})

// register registers f's families in reg, or adopts those the stock cache
// registered: its blocks and ours then count in the same series.
//
// The entries gauge is not adopted like the counters. The stock cache sets
// its series as it inserts, ours are set from the stores as the metrics are
// gathered (storeGauges), and setting them in the stock GaugeVec would race
// with its Collect, which the registry runs in a goroutine of its own: a
// scrape could read the values of the one before. So ours are set, and the
// family collected, in one Collect of our own (entriesFamily), which takes
// the stock GaugeVec's place in the registry and collects its series too.
func (f *stockFamilies) register(reg prometheus.Registerer, sc *storeCollector) error {
	var errs []error
	for _, v := range []**prometheus.CounterVec{&f.requests, &f.hits, &f.misses, &f.prefetch, &f.drops, &f.stale, &f.evictions} {
		err := reg.Register(*v)
		if are, ok := errors.AsType[prometheus.AlreadyRegisteredError](err); ok {
			if existing, ok := are.ExistingCollector.(*prometheus.CounterVec); ok {
				*v, err = existing, nil
			}
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	desc := make(chan *prometheus.Desc, 1)
	f.entries.Describe(desc)
	entries := &entriesFamily{sc: sc, own: f.entries, desc: <-desc}
	err := reg.Register(entries)
	if are, ok := errors.AsType[prometheus.AlreadyRegisteredError](err); ok {
		if existing, ok := are.ExistingCollector.(*prometheus.GaugeVec); ok && reg.Unregister(existing) {
			entries.stock, f.stockEntries = existing, existing
			if err = reg.Register(entries); err != nil {
				reg.Register(existing) // as it was
			}
		}
	}
	if err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("registering the stock cache's metrics: %w", err)
	}
	return nil
}

// Counter counts in a stock family and in the deprecated one of
// compactcache that repeats it.
type Counter struct{ stock, own prometheus.Counter }

func (c Counter) Inc()          { c.stock.Inc(); c.own.Inc() }
func (c Counter) Add(v float64) { c.stock.Add(v); c.own.Add(v) }

// gauge is Counter's gauge.
type gauge struct{ stock, own prometheus.Gauge }

func (g gauge) Set(v float64) { g.stock.Set(v); g.own.Set(v) }

// Server holds one server's counters of a block, resolved once, and the
// labels of its gauges, which storeGauges sets.
type Server struct {
	server    string
	zones     string
	view      string
	store     weak.Pointer[store.Store] // what the gauges describe; see storeGauges
	collected atomic.Bool               // the store is gone (set by a cleanup), or there was none
	replaced  bool                      // a later instance's server describes the store; guarded by storeGauges.mu
	Requests  Counter
	Misses    Counter
	Drops     Counter // replies not cached for being malformed or not what was asked
	Prefetch  Counter
	Stale     Counter
	Hits      [2]Counter // by kind
	evictions [2]Counter
	TooLarge  prometheus.Counter    // replies not cached for the per-entry limit
	refusals  [2]prometheus.Counter // entries not admitted (notAdmitted)
}

// Block maps a block's servers to their series. A block serves few
// servers, so a copy-on-write slice scanned linearly beats a map and
// allocates nothing.
type Block struct {
	// Zones and View are the block's labels, set before its first request.
	Zones, View string
	// Store returns the store the gauges describe: the block's live one
	// once its instance has started.
	Store func() *store.Store

	mu      sync.Mutex
	servers atomic.Pointer[[]*Server]
}

// Server returns the series of server.
func (s *Block) Server(server string) *Server {
	if p := s.servers.Load(); p != nil {
		for _, m := range *p {
			if m.server == server {
				return m
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var list []*Server
	if p := s.servers.Load(); p != nil {
		list = *p
	}
	for _, m := range list {
		if m.server == server {
			return m
		}
	}
	m := s.resolve(server)
	list = append(list[:len(list):len(list)], m)
	s.servers.Store(&list)
	storeGauges.add(m)
	return m
}

func (s *Block) resolve(server string) *Server {
	f, _ := Register() // an error failed the setup; a block made without one counts all the same
	block := func(stock, own *prometheus.CounterVec) Counter {
		return Counter{stock.WithLabelValues(server, s.Zones, s.View), own.WithLabelValues(server, s.Zones, s.View)}
	}
	st := s.Store() // the instance has started: requests have come
	// The stock cache's entries of these labels are those of a block that
	// this one replaced, which are never set again: summed with this block's
	// (entriesFamily), they would count what the block held before. A stock
	// block of the same labels, in another server block, sets them again at
	// its next insert.
	if f.stockEntries != nil {
		for _, t := range KindLabels {
			f.stockEntries.DeleteLabelValues(server, t, s.Zones, s.View)
		}
	}
	m := &Server{
		server:   server,
		zones:    s.Zones,
		view:     s.View,
		store:    weak.Make(st),
		Requests: block(f.requests, cacheRequests),
		Misses:   block(f.misses, cacheMisses),
		Drops:    block(f.drops, cacheDrops),
		Prefetch: block(f.prefetch, cachePrefetches),
		Stale:    block(f.stale, servedStale),
		TooLarge: cacheRefused.WithLabelValues(server, s.Zones, s.View),
	}
	for k, t := range KindLabels {
		m.Hits[k] = Counter{f.hits.WithLabelValues(server, t, s.Zones, s.View), cacheHits.WithLabelValues(server, t, s.Zones, s.View)}
		m.evictions[k] = Counter{f.evictions.WithLabelValues(server, t, s.Zones, s.View), evictions.WithLabelValues(server, t, s.Zones, s.View)}
		m.refusals[k] = notAdmitted.WithLabelValues(server, t, s.Zones, s.View)
	}
	if st == nil {
		m.collected.Store(true)
	} else {
		runtime.AddCleanup(st, func(collected *atomic.Bool) { collected.Store(true) }, &m.collected)
	}
	return m
}

// Evicted counts the entries a store dropped for room: evicted, and
// refused admission.
func (m *Server) Evicted(d store.Displaced) {
	for k := range KindLabels {
		if n := d.Evicted[k]; n > 0 {
			m.evictions[k].Add(float64(n))
		}
		if n := d.Refused[k]; n > 0 {
			m.refusals[k].Add(float64(n))
		}
	}
}

// Totals are a block's counts since the process started, summed over its
// servers.
type Totals struct {
	Requests, Hits, Misses int64
	Evictions              [2]int64 // by kind
}

// Totals reads the block's counters of servers: the series of its zones
// and view, of every instance the block has had, and those of the other
// zones its store counted under before a reload handed it over.
func (s *Block) Totals(servers []string) Totals {
	var t Totals
	of := storeGauges.labelsOf(s.Store(), [2]string{s.Zones, s.View})
	sum := func(vec *prometheus.CounterVec, each func(kind string, v int64)) {
		for m := range collect(vec) {
			var d dto.Metric
			if m.Write(&d) != nil {
				continue
			}
			labels := labelsOf(&d)
			if slices.Contains(servers, labels["server"]) && slices.Contains(of, [2]string{labels["zones"], labels["view"]}) {
				each(labels["type"], int64(d.GetCounter().GetValue()))
			}
		}
	}
	sum(cacheRequests, func(_ string, v int64) { t.Requests += v })
	sum(cacheMisses, func(_ string, v int64) { t.Misses += v })
	sum(cacheHits, func(_ string, v int64) { t.Hits += v })
	sum(evictions, func(kind string, v int64) {
		if k := slices.Index(KindLabels[:], kind); k >= 0 {
			t.Evictions[k] += v
		}
	})
	return t
}

// labelsOf returns the labels of a gathered series, by name.
func labelsOf(d *dto.Metric) map[string]string {
	labels := map[string]string{}
	for _, l := range d.GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	return labels
}

// storeGauges sets the gauges of every server's store when the metrics are
// gathered, instead of on every insert, which would add atomic stores to a
// miss for values that only a scrape reads.
var storeGauges = func() *storeCollector {
	sc := &storeCollector{}
	prometheus.MustRegister(&storeFamilies{sc, []*prometheus.GaugeVec{cacheSize, cacheBytes, cacheCapacity, ecsVariants}})
	return sc
}()

// storeCollector sets the store gauge families from the stores of the
// servers that have had requests. A server's gauges are those of the
// instance that saw requests last, as when inserts set them: on reload the
// new instance comes after the old one. The stores are held weakly, so that a
// cache dropped by a reload goes, and its server with it.
//
// A server that a later instance's replaced is kept while its store lives,
// one of each labels, so that a store handed over at a reload to an
// instance of other ZONES keeps, in its block's Totals, the counts of the
// instances that had it (labelsOf).
//
// Only a gathering makes the weak pointers strong. Doing so while a garbage
// collection marks keeps the store alive through that cycle, so a prune
// that did it for every server at every server's first request would keep
// every dropped store alive, with the memory it maps, in a process that
// makes caches faster than its cycles end (a fuzzer's). Prune reads
// collected.
type storeCollector struct {
	mu      sync.Mutex
	servers []*Server // in the order of their first request
}

func (sc *storeCollector) add(m *Server) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.servers = append(sc.servers, m) // before the series are deleted: m's are live
	if m.collected.Load() {
		sc.prune()
		return
	}
	// A store handed over at a reload is described by the new instance's
	// server alone: the old one's labels (other ZONES) would count it twice.
	// An old server of m's labels is dropped, m keeping them for Totals.
	var replaced []*Server
	sc.servers = slices.DeleteFunc(sc.servers, func(l *Server) bool {
		if l == m || l.server != m.server || l.store != m.store {
			return false
		}
		if l.zones == m.zones && l.view == m.view {
			return true
		}
		if !l.replaced {
			l.replaced = true
			replaced = append(replaced, l)
		}
		return false
	})
	sc.deleteSeries(replaced)
	sc.prune()
}

// prune drops the servers whose store is gone, and their gauges' series:
// a store that is gone holds nothing. The caller holds sc.mu.
func (sc *storeCollector) prune() {
	var collected []*Server
	sc.servers = slices.DeleteFunc(sc.servers, func(m *Server) bool {
		if m.collected.Load() {
			collected = append(collected, m)
			return true
		}
		return false
	})
	sc.deleteSeries(collected)
}

// deleteSeries deletes the gauges' series of the servers gone, those no
// server that describes a store has the labels of: coredns_cache_entries
// sums the series of its labels with the stock cache's (entriesFamily).
// The caller holds sc.mu.
func (sc *storeCollector) deleteSeries(gone []*Server) {
	for _, m := range gone {
		if slices.ContainsFunc(sc.servers, func(l *Server) bool {
			return l.describes() && l.server == m.server && l.zones == m.zones && l.view == m.view
		}) {
			continue
		}
		f, _ := Register()
		for _, t := range KindLabels {
			f.entries.DeleteLabelValues(m.server, t, m.zones, m.view)
			cacheSize.DeleteLabelValues(m.server, t, m.zones, m.view)
		}
		for _, v := range []*prometheus.GaugeVec{cacheBytes, cacheCapacity, ecsVariants} {
			v.DeleteLabelValues(m.server, m.zones, m.view)
		}
	}
}

// describes reports whether m's gauges describe its store: it is neither
// gone nor replaced. The caller holds storeGauges.mu.
func (m *Server) describes() bool { return !m.replaced && !m.collected.Load() }

// labelsOf returns labels and the zones and view labels under which the
// servers of st counted.
func (sc *storeCollector) labelsOf(st *store.Store, labels [2]string) [][2]string {
	all := [][2]string{labels}
	if st == nil {
		return all
	}
	key := weak.Make(st)
	sc.mu.Lock()
	defer sc.mu.Unlock()
	for _, m := range sc.servers {
		if l := [2]string{m.zones, m.view}; m.store == key && !slices.Contains(all, l) {
			all = append(all, l)
		}
	}
	return all
}

// set sets the gauges from the stores. The caller holds sc.mu.
func (sc *storeCollector) set() {
	sc.prune()
	for _, m := range sc.servers {
		if m.replaced {
			continue
		}
		s := m.store.Value()
		if s == nil {
			continue // gone since prune
		}
		u := s.Usage()
		// Looked up here, under sc.mu, not kept: prune deletes series.
		f, _ := Register()
		for k, t := range KindLabels {
			gauge{f.entries.WithLabelValues(m.server, t, m.zones, m.view), cacheSize.WithLabelValues(m.server, t, m.zones, m.view)}.Set(float64(u.Kinds[k]))
		}
		cacheBytes.WithLabelValues(m.server, m.zones, m.view).Set(float64(u.Held))
		cacheCapacity.WithLabelValues(m.server, m.zones, m.view).Set(float64(s.Capacity()))
		ecsVariants.WithLabelValues(m.server, m.zones, m.view).Set(float64(u.Variants))
	}
}

// storeFamilies collects compactcache's families that sc sets.
type storeFamilies struct {
	sc   *storeCollector
	vecs []*prometheus.GaugeVec
}

// Describe implements prometheus.Collector.
func (f *storeFamilies) Describe(ch chan<- *prometheus.Desc) {
	for _, v := range f.vecs {
		v.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (f *storeFamilies) Collect(ch chan<- prometheus.Metric) {
	// Set and collected under the lock, so that a concurrent gathering does
	// not interleave its values with these.
	f.sc.mu.Lock()
	defer f.sc.mu.Unlock()
	f.sc.set()
	for _, v := range f.vecs {
		v.Collect(ch)
	}
}

// entriesFamily collects coredns_cache_entries: the series sc sets, and
// those of the stock cache's GaugeVec where it is linked in (see register).
type entriesFamily struct {
	sc         *storeCollector
	own, stock *prometheus.GaugeVec
	desc       *prometheus.Desc // own's
}

// Describe implements prometheus.Collector.
func (e *entriesFamily) Describe(ch chan<- *prometheus.Desc) { e.own.Describe(ch) }

// Collect implements prometheus.Collector.
func (e *entriesFamily) Collect(ch chan<- prometheus.Metric) {
	e.sc.mu.Lock()
	defer e.sc.mu.Unlock()
	e.sc.set()
	if e.stock == nil {
		e.own.Collect(ch)
		return
	}
	// A block of each cache may have the same labels (one server, the same
	// zones): the counters count both in one series, and so does this, for
	// a series collected twice fails the whole scrape.
	type series struct {
		labels []string
		value  float64
	}
	sums := map[string]*series{}
	for _, v := range [...]*prometheus.GaugeVec{e.stock, e.own} {
		for m := range collect(v) {
			var d dto.Metric
			if err := m.Write(&d); err != nil {
				ch <- prometheus.NewInvalidMetric(e.desc, err)
				continue
			}
			labels := make([]string, len(kindedLabels))
			for _, l := range d.GetLabel() {
				if i := slices.Index(kindedLabels, l.GetName()); i >= 0 {
					labels[i] = l.GetValue()
				}
			}
			key := strings.Join(labels, "\x00")
			if sums[key] == nil {
				sums[key] = &series{labels: labels}
			}
			sums[key].value += d.GetGauge().GetValue()
		}
	}
	for _, s := range sums {
		ch <- prometheus.MustNewConstMetric(e.desc, prometheus.GaugeValue, s.value, s.labels...)
	}
}

// collect returns the metrics c collects; the caller reads them all.
func collect(c prometheus.Collector) <-chan prometheus.Metric {
	ch := make(chan prometheus.Metric)
	go func() {
		defer close(ch)
		c.Collect(ch)
	}()
	return ch
}

// Frontend returns the counters of a front end's requests, resolved for
// its server.
func (s *Block) Frontend(server string) frontend.Counters {
	of := func(result string) prometheus.Counter {
		return frontendRequests.WithLabelValues(server, s.Zones, s.View, result)
	}
	return frontend.Counters{Hit: of("hit"), Chain: of("chain"), Shed: of("shed"), Dropped: of("dropped"),
		LogDropped: frontendLogDropped.WithLabelValues(server, s.Zones, s.View)}
}
