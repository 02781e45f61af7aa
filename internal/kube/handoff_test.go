package kube

import (
	"slices"
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
	sources.Store(key, f.invalidator(block))
	t.Cleanup(func() { stop(key) })
	go f.run()
	return f
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
			old := runFollow(t, oldKey, "block "+tc.name, oldCtl, oldSink)
			waitUp(t, old)

			// The new instance: its plugin has not synced when the old
			// instance stops.
			newCtl := &fakeCtl{}
			cur := runFollow(t, new(int), "block "+tc.name, newCtl, newSink)
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
	old := runFollow(t, oldKey, "block", oldCtl, oldSink)
	waitUp(t, old)
	newCtl := &fakeCtl{synced: true, mod: 1000}
	newCtl.svcs, newCtl.eps = reloadCluster()
	cur := runFollow(t, new(int), "block", newCtl, newSink)
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
