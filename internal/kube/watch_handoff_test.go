package kube

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/coredns/coredns/plugin/kubernetes/object"
	"k8s.io/client-go/tools/cache"
	fcache "k8s.io/client-go/tools/cache/testing"
)

// fakeWatch is a watch of its own over in-memory sources of the trimmed
// objects; it lists once started.
func fakeWatch(svcs []*object.Service, eps []*object.Endpoints) (*watch, func()) {
	w := &watch{key: "fake", refs: 1}
	ss, es := fcache.NewFakeControllerSource(), fcache.NewFakeControllerSource()
	for _, s := range svcs {
		ss.Add(s)
	}
	for _, e := range eps {
		es.Add(e)
	}
	w.svc = cache.NewSharedIndexInformer(ss, &object.Service{}, 0, cache.Indexers{})
	w.eps = cache.NewSharedIndexInformer(es, &object.Endpoints{}, 0, cache.Indexers{})
	ok := error(nil)
	w.probeErr.Store(&ok)
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	return w, func() {
		go w.svc.RunWithContext(ctx)
		go w.eps.RunWithContext(ctx)
	}
}

// TestReloadGapWatch: as TestReloadGap, for a watch of its own whose new
// connection lists only after the old source stopped.
func TestReloadGapWatch(t *testing.T) {
	svcs, eps := reloadCluster()
	oldW, run := fakeWatch(svcs, eps)
	run()
	oldSink, newSink := newSink(), newSink()
	block := testBlock("watch")
	start := func(w *watch, s *sink) *Invalidator {
		c := newCounters("test-watch-gap", "")
		sub, err := subscribe(w, watchView(newNamer(clusterZones)), newEmitter(s.flush, nil, 0, c), c, newBaseline(block), func(bool, string) {})
		if err != nil {
			t.Fatal(err)
		}
		return &Invalidator{source: "watch", c: c, stop: sub.close, base: sub.base, last: sub.last}
	}
	oldKey, newKey := new(int), new(int)
	sources.Store(oldKey, start(oldW, oldSink))
	defer stop(oldKey)
	deadline := time.Now().Add(2 * time.Second)
	for v, _ := gauge("test-watch-gap", ""); v != 1; v, _ = gauge("test-watch-gap", "") {
		if time.Now().After(deadline) {
			t.Fatal("the old watch not connected within 2 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	coldFlush(t, oldSink, healthEvery+time.Second)

	svcs, eps = reloadCluster()
	svcs[0] = svc("ns", "web", []string{"10.96.0.20"}, port("http", 80))
	newW, run := fakeWatch(svcs, eps)
	sources.Store(newKey, start(newW, newSink))
	defer stop(newKey)
	stop(oldKey)
	oldSink.quiet(t, 0)
	run()
	// The block looks at its state every healthEvery from its start, just
	// before run: a listing that a loaded machine makes miss one look is
	// told at the next.
	select {
	case <-newSink.got:
	case <-time.After(2*healthEvery + time.Second):
		t.Fatal("no flush once the new watch listed")
	}
	want := []string{"10.0.96.10.in-addr.arpa.", "20.0.96.10.in-addr.arpa.", "_http._tcp.web.ns" + z, "web.ns" + z}
	if got := newSink.all(); !slices.Equal(got, want) {
		t.Errorf("flushed %q once the new watch listed, want %q", got, want)
	}
}
