package kube

import (
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coredns/coredns/plugin/kubernetes/object"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// reloadCluster is the cluster a reload's old instance last saw.
func reloadCluster() ([]*object.Service, []*object.Endpoints) {
	return []*object.Service{
			svc("ns", "web", []string{"10.96.0.10"}, port("http", 80)),
			headless("ns", "db", port("pg", 5432)),
		}, []*object.Endpoints{
			slice("ns", "db-1", "db", eport("pg", 5432), "10.1.0.1=db-0"),
		}
}

// runFollow runs a follow of ctl as the source of block, as Setup does.
func runFollow(t *testing.T, key any, block string, ctl *fakeCtl, s *sink) *follow {
	f, _ := newTestFollow(ctl, pluginOptions{podMode: podsDisabled}, s)
	f.base = newBaseline(block)
	sources.Store(key, f.invalidator())
	t.Cleanup(func() { stop(key) })
	go f.run()
	return f
}

var blocks atomic.Int64

// testBlock names a block no other test's sources have: the blocks that
// have had a source are the process's.
func testBlock(name string) string { return fmt.Sprintf("%s %d", name, blocks.Add(1)) }

// coldFlush checks that the next flush s gets, within d, drops the
// cluster's zones whole, as a block's first source does once it fills,
// and forgets it.
func coldFlush(t *testing.T, s *sink, d time.Duration) {
	t.Helper()
	select {
	case <-s.got:
	case <-time.After(d):
		t.Fatalf("the zones not dropped within %v of the block's first source", d)
	}
	if got, want := s.all(), []string{"*.cluster.local.", "*.in-addr.arpa.", "*.ip6.arpa."}; !slices.Equal(got, want) {
		t.Errorf("the block's first source dropped %q, want %q", got, want)
	}
	s.reset()
}

func waitUp(t *testing.T, f *follow) {
	t.Helper()
	deadline := time.Now().Add(time.Second)
	for !f.c.up.Load() {
		if time.Now().After(deadline) {
			t.Fatal("not connected a second after the controller synced")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestReloadGap: at a reload whose new kubernetes plugin syncs only after
// the old instance stopped (its startup wait ran out), a change made
// while neither source looks is flushed once the new one syncs; the store
// is carried across the reload, and would keep the names it made wrong
// for their TTL.
func TestReloadGap(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(svcs []*object.Service, eps []*object.Endpoints) ([]*object.Service, []*object.Endpoints)
		want   []string
	}{
		{
			name: "a Service recreated at another ClusterIP",
			change: func(svcs []*object.Service, eps []*object.Endpoints) ([]*object.Service, []*object.Endpoints) {
				svcs[0] = svc("ns", "web", []string{"10.96.0.20"}, port("http", 80))
				return svcs, eps
			},
			want: []string{"10.0.96.10.in-addr.arpa.", "20.0.96.10.in-addr.arpa.", "_http._tcp.web.ns" + z, "web.ns" + z},
		},
		{
			name: "a headless Service's endpoint moved",
			change: func(svcs []*object.Service, eps []*object.Endpoints) ([]*object.Service, []*object.Endpoints) {
				eps[0] = slice("ns", "db-1", "db", eport("pg", 5432), "10.1.0.2=db-0")
				return svcs, eps
			},
			want: []string{"1.0.1.10.in-addr.arpa.", "2.0.1.10.in-addr.arpa.", "_pg._tcp.db.ns" + z, "db-0.db.ns" + z, "db.ns" + z},
		},
		{
			name: "a Service created, its name cached as NXDOMAIN",
			change: func(svcs []*object.Service, eps []*object.Endpoints) ([]*object.Service, []*object.Endpoints) {
				return append(svcs, svc("ns", "api", []string{"10.96.0.30"})), eps
			},
			want: []string{"30.0.96.10.in-addr.arpa.", "api.ns" + z},
		},
		{
			name: "a Service deleted",
			change: func(svcs []*object.Service, eps []*object.Endpoints) ([]*object.Service, []*object.Endpoints) {
				return svcs[1:], eps
			},
			want: []string{"10.0.96.10.in-addr.arpa.", "_http._tcp.web.ns" + z, "web.ns" + z},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			oldCtl := &fakeCtl{synced: true, mod: 1000}
			oldCtl.svcs, oldCtl.eps = reloadCluster()
			oldSink, newSink := newSink(), newSink()
			oldKey := new(int)
			block := testBlock(tc.name)
			old := runFollow(t, oldKey, block, oldCtl, oldSink)
			waitUp(t, old)
			coldFlush(t, oldSink, time.Second)

			// The new instance: its plugin has not synced when the old
			// instance stops.
			newCtl := &fakeCtl{}
			cur := runFollow(t, new(int), block, newCtl, newSink)
			stop(oldKey)
			oldSink.quiet(t, 0)

			svcs, eps := tc.change(reloadCluster())
			newCtl.mu.Lock()
			newCtl.svcs, newCtl.eps, newCtl.mod, newCtl.synced = svcs, eps, 1000, true
			newCtl.mu.Unlock()
			waitUp(t, cur)
			newSink.wait(t, 1)
			if got := newSink.all(); !slices.Equal(got, tc.want) {
				t.Errorf("flushed %q once the new source synced, want %q", got, tc.want)
			}
			newSink.quiet(t, 2*interval)
		})
	}
}

// TestReloadNoGap: a new source that syncs while the old one still runs
// takes nothing over: the old one's last diff has what changed before
// the new one's first.
func TestReloadNoGap(t *testing.T) {
	oldCtl := &fakeCtl{synced: true, mod: 1000}
	oldCtl.svcs, oldCtl.eps = reloadCluster()
	oldSink, newSink := newSink(), newSink()
	oldKey := new(int)
	block := testBlock("no gap")
	old := runFollow(t, oldKey, block, oldCtl, oldSink)
	waitUp(t, old)
	coldFlush(t, oldSink, time.Second)
	newCtl := &fakeCtl{synced: true, mod: 1000}
	newCtl.svcs, newCtl.eps = reloadCluster()
	cur := runFollow(t, new(int), block, newCtl, newSink)
	waitUp(t, cur)
	stop(oldKey)
	cur.base.mu.Lock()
	handed := cur.base.base != nil
	cur.base.mu.Unlock()
	if handed {
		t.Errorf("the new source, synced, was handed the old one's view")
	}
	oldSink.quiet(t, 0)
	newSink.quiet(t, 2*interval)
}

// TestColdSourceDropsZones: the first source of a block in the process
// drops the cluster's zones once it has its first full state: what the
// store holds was stored while none looked (a snapshot, a peer's warm-up,
// answers from before the plugin synced), and what changed meanwhile is
// told against nothing. A reload's source takes the old one's view or
// none instead; one whose block's source before never filled is the
// first to fill, and drops them.
func TestColdSourceDropsZones(t *testing.T) {
	cluster := func(synced bool) *fakeCtl {
		ctl := &fakeCtl{synced: synced, mod: 1000}
		ctl.svcs, ctl.eps = reloadCluster()
		return ctl
	}
	block := testBlock("cold")
	first, firstKey := newSink(), new(int)
	waitUp(t, runFollow(t, firstKey, block, cluster(true), first))
	coldFlush(t, first, time.Second)
	first.quiet(t, 2*interval)

	// A reload whose source syncs while the first runs.
	second, secondKey := newSink(), new(int)
	waitUp(t, runFollow(t, secondKey, block, cluster(true), second))
	stop(firstKey)
	second.quiet(t, 2*interval)
	stop(secondKey)

	// A block whose first source stopped before its plugin synced: the
	// next to fill is the first.
	block = testBlock("cold, never filled")
	unsynced := newSink()
	unsyncedKey := new(int)
	runFollow(t, unsyncedKey, block, cluster(false), unsynced)
	later := newSink()
	runFollow(t, new(int), block, cluster(false), later)
	stop(unsyncedKey)
	unsynced.quiet(t, 2*interval)
	ctl := cluster(true)
	cur := runFollow(t, new(int), block, ctl, later)
	waitUp(t, cur)
	coldFlush(t, later, time.Second)
}

// TestSourceAfterNone: a block whose source stopped with none to follow it
// (a reload that took the kubernetes option away, or moved it to another
// block) keeps a store that no source watches from then on: the source a
// later reload gives it drops its zones as a block's first one does.
func TestSourceAfterNone(t *testing.T) {
	cluster := func() *fakeCtl {
		ctl := &fakeCtl{synced: true, mod: 1000}
		ctl.svcs, ctl.eps = reloadCluster()
		return ctl
	}
	block := testBlock("left without a source")
	first, firstKey := newSink(), new(int)
	waitUp(t, runFollow(t, firstKey, block, cluster(), first))
	coldFlush(t, first, time.Second)
	stop(firstKey)
	again := newSink()
	waitUp(t, runFollow(t, new(int), block, cluster(), again))
	coldFlush(t, again, time.Second)
}

// gauge is the connected series of zones and view: its value, and
// whether it exists.
func gauge(zones, view string) (float64, bool) {
	ch := make(chan prometheus.Metric, 100)
	go func() {
		connected.Collect(ch)
		close(ch)
	}()
	var v float64
	found := false
	for m := range ch {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			continue
		}
		labels := map[string]string{}
		for _, l := range pb.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["zones"] == zones && labels["view"] == view {
			v, found = pb.GetGauge().GetValue(), true
		}
	}
	return v, found
}

// TestConnectedGauge: the connected series of a block goes when its source
// stops for good, and stays the new source's when a reload keeps the
// option: the old one's stop neither deletes it nor sets it.
func TestConnectedGauge(t *testing.T) {
	s := newSink()
	labels := s.labels
	check := func(when string, want float64, exists bool) {
		t.Helper()
		v, ok := gauge(labels, "")
		switch {
		case ok != exists:
			t.Errorf("%s: the series exists: %v, want %v", when, ok, exists)
		case ok && v != want:
			t.Errorf("%s: connected %v, want %v", when, v, want)
		}
	}
	oldCtl := &fakeCtl{synced: true, mod: 1000}
	oldKey, newKey := new(int), new(int)
	old := runFollow(t, oldKey, "", oldCtl, s)
	waitUp(t, old)
	check("the old source connected", 1, true)

	newCtl := &fakeCtl{}
	cur := runFollow(t, newKey, "", newCtl, s)
	check("a reload's new source started, the old one connected", 1, true)
	newCtl.mu.Lock()
	newCtl.synced = true
	newCtl.mu.Unlock()
	waitUp(t, cur)
	stop(oldKey)
	check("the old source stopped", 1, true)
	old.c.connected(false) // a late word of the old source's
	check("the old source, stopped, lost the API server", 1, true)

	stop(newKey)
	check("the new source stopped, the option removed at the next reload", 0, false)
}
