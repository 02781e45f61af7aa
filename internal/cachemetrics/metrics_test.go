package cachemetrics

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
	"weak"

	"github.com/compactcache/compactcache/internal/store"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// TestStoreGone: a store that is gone is no longer read: the collector does
// not keep it alive, and its server leaves the collector's list.
func TestStoreGone(t *testing.T) {
	const server = "gauges://gone"
	s, err := store.New(1<<20, store.PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := &Block{Zones: ".", Store: func() *store.Store { return s }}
	b.Server(server)
	listed := func() bool {
		storeGauges.mu.Lock()
		defer storeGauges.mu.Unlock()
		storeGauges.prune()
		return slices.ContainsFunc(storeGauges.servers, func(m *Server) bool { return m.server == server })
	}
	if !listed() {
		t.Fatal("the collector does not read the store of a live block")
	}
	s, b = nil, nil
	runtime.GC()
	// The cleanup that tells the collector runs on a goroutine of its own.
	for deadline := time.Now().Add(5 * time.Second); listed() && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	if listed() {
		t.Fatal("the collector still reads the store of a block that is gone")
	}
}

// TestStoresGoWhileServersCome: a collection finds a dropped store
// unreachable even while blocks keep adding servers to the collector, as
// in a process that makes caches one after another.
func TestStoresGoWhileServersCome(t *testing.T) {
	s, err := store.New(1<<20, store.PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	(&Block{Zones: ".", Store: func() *store.Store { return s }}).Server("gauges://dropped")
	dropped := weak.Make(s)
	s = nil
	live, err := store.New(1<<20, store.PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	for cycle := range 5 {
		done := make(chan struct{})
		go func() {
			runtime.GC()
			close(done)
		}()
	adding:
		for i := 0; ; i++ {
			select {
			case <-done:
				break adding
			default:
			}
			(&Block{Zones: ".", Store: func() *store.Store { return live }}).Server(fmt.Sprintf("gauges://adding-%d-%d", cycle, i))
		}
		if dropped.Value() == nil {
			return
		}
	}
	t.Fatal("a dropped store outlived 5 collections while servers were added")
}

// TestMetricsStockRegistration registers the stock families in a registry
// without them, in one where the stock cache registered them, and in one
// where a family differs.
func TestMetricsStockRegistration(t *testing.T) {
	t.Run("absent", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		f := newStockFamilies()
		requests := f.requests
		if err := f.register(reg, &storeCollector{}); err != nil {
			t.Fatal(err)
		}
		if f.requests != requests {
			t.Error("the requests family was replaced in a registry without it")
		}
		// The entries family is registered as its own: a second one is refused.
		err := reg.Register(newStockFamilies().entries)
		if _, ok := errors.AsType[prometheus.AlreadyRegisteredError](err); !ok {
			t.Errorf("registering coredns_cache_entries again: %v, want AlreadyRegisteredError", err)
		}
	})
	t.Run("present", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		registered := newStockFamilies() // as the stock cache registers them
		for _, c := range []prometheus.Collector{registered.requests, registered.hits, registered.misses, registered.prefetch,
			registered.drops, registered.stale, registered.evictions, registered.entries} {
			reg.MustRegister(c)
		}
		f := newStockFamilies()
		if err := f.register(reg, &storeCollector{}); err != nil {
			t.Fatal(err)
		}
		if f.requests != registered.requests || f.evictions != registered.evictions {
			t.Error("the counters registered before were not adopted")
		}
		if err := reg.Register(registered.entries); err == nil {
			t.Error("the stock entries family was left unregistered")
		}
		// The stock cache's series and ours in one family, summed where a
		// block of each has the same labels.
		registered.entries.WithLabelValues("dns://:53", "success", ".", "").Set(1)
		f.entries.WithLabelValues("dns://:53", "success", ".", "").Set(2)
		f.entries.WithLabelValues("dns://:54", "success", ".", "").Set(3)
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var got []float64
		for _, mf := range mfs {
			if mf.GetName() == "coredns_cache_entries" {
				for _, m := range mf.GetMetric() {
					got = append(got, m.GetGauge().GetValue())
				}
			}
		}
		if !slices.Equal(got, []float64{3, 3}) {
			t.Errorf("coredns_cache_entries: %v, want 1+2 for dns://:53 and 3 for dns://:54", got)
		}
	})
	t.Run("different", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		reg.MustRegister(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "coredns_cache_drops_total", Help: "Another help."}, blockLabels))
		err := newStockFamilies().register(reg, &storeCollector{})
		if err == nil || !strings.Contains(err.Error(), "coredns_cache_drops_total") {
			t.Errorf("registering beside another coredns_cache_drops_total: %v, want an error naming it", err)
		}
	})
}

// TestTotalsFollowTheStore: a store handed over at a reload to an instance
// of other ZONES keeps the counts of the instances that had it in the
// block's totals (the admin stats), before and after the new instance's
// first request; a block of another store does not take them.
func TestTotalsFollowTheStore(t *testing.T) {
	const server = "totals://rezone"
	s, err := store.New(1<<20, store.PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	old := &Block{Zones: "totals-old.", View: "v", Store: func() *store.Store { return s }}
	m := old.Server(server)
	for range 3 {
		m.Requests.Inc()
	}
	m.Hits[store.KindSuccess].Inc()
	m.Misses.Inc()
	m.Misses.Inc()
	m.Evicted(store.Displaced{Evicted: store.PerKind{store.KindDenial: 4}})
	want := Totals{Requests: 3, Hits: 1, Misses: 2, Evictions: [2]int64{store.KindDenial: 4}}
	if got := old.Totals([]string{server}); got != want {
		t.Fatalf("totals of the first instance: %+v, want %+v", got, want)
	}

	reloaded := &Block{Zones: "totals-old.,totals-new.", View: "v", Store: func() *store.Store { return s }}
	if got := reloaded.Totals([]string{server}); got != want {
		t.Errorf("totals after a reload to other ZONES that kept the store: %+v, want %+v", got, want)
	}
	reloaded.Server(server).Requests.Inc()
	want.Requests++
	if got := reloaded.Totals([]string{server}); got != want {
		t.Errorf("totals after the reloaded instance's first request: %+v, want %+v", got, want)
	}

	other, err := store.New(1<<20, store.PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	apart := &Block{Zones: "totals-apart.", View: "v", Store: func() *store.Store { return other }}
	apart.Server(server)
	if got := apart.Totals([]string{server}); got != (Totals{}) {
		t.Errorf("totals of a block of another store: %+v, want none", got)
	}
	runtime.KeepAlive(s)
	runtime.KeepAlive(other)
}

// TestReloadsBackAndForth: a store handed over at reloads that switch its
// block between two ZONES and back keeps, in the block's totals, the
// counts of every instance; its gauges are those of the live instance's
// labels alone; and the collector keeps one server of each labels, however
// many reloads there were.
func TestReloadsBackAndForth(t *testing.T) {
	const server = "totals://back-and-forth"
	s, err := store.New(1<<20, store.PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	zones := [2]string{"totals-back.", "totals-back.,totals-forth."}
	for i := range 6 {
		b := &Block{Zones: zones[i%2], View: "v", Store: func() *store.Store { return s }}
		b.Server(server).Requests.Inc()
		if got := b.Totals([]string{server}).Requests; got != int64(i+1) {
			t.Errorf("reload %d, to %q: %d requests in the totals, want %d", i, b.Zones, got, i+1)
		}
		if got := gaugedZones(server); !slices.Equal(got, []string{b.Zones}) {
			t.Errorf("reload %d, to %q: bytes gauged under zones %q, want the live instance's alone", i, b.Zones, got)
		}
		storeGauges.mu.Lock()
		kept := 0
		for _, m := range storeGauges.servers {
			if m.server == server {
				kept++
			}
		}
		storeGauges.mu.Unlock()
		if kept > len(zones) {
			t.Errorf("reload %d: the collector keeps %d servers of %s, want one of each labels at most", i, kept, server)
		}
	}
	runtime.KeepAlive(s)
}

// gaugedZones returns the zones labels of server's series of the bytes
// gauge, once the gauges are set as at a gathering.
func gaugedZones(server string) []string {
	storeGauges.mu.Lock()
	defer storeGauges.mu.Unlock()
	storeGauges.set()
	var zones []string
	for m := range collect(cacheBytes) {
		var d dto.Metric
		if m.Write(&d) != nil {
			continue
		}
		if labels := labelsOf(&d); labels["server"] == server {
			zones = append(zones, labels["zones"])
		}
	}
	return zones
}
