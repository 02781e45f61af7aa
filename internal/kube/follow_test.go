package kube

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/admin"
	"github.com/compactcache/compactcache/internal/flush"
	"github.com/coredns/coredns/plugin/kubernetes"
	"github.com/coredns/coredns/plugin/kubernetes/object"
	"github.com/miekg/dns"
)

// fakeCtl is a controller as the kubernetes plugin's informers keep it:
// a changed object is a new one.
type fakeCtl struct {
	mu     sync.Mutex
	synced bool
	mod    int64
	svcs   []*object.Service
	eps    []*object.Endpoints
	ns     map[string]bool
	lists  int // ServiceList calls: the diffs done
}

func (f *fakeCtl) HasSynced() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.synced
}

func (f *fakeCtl) Modified(kubernetes.ModifiedMode) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mod
}

func (f *fakeCtl) ServiceList() []*object.Service {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lists++
	return slices.Clone(f.svcs)
}

func (f *fakeCtl) EndpointsList() []*object.Endpoints {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.eps)
}

func (f *fakeCtl) GetNamespaceByName(ns string) (*object.Namespace, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ns != nil && !f.ns[ns] {
		return nil, errors.New("namespace not found")
	}
	return &object.Namespace{Name: ns}, nil
}

// set replaces the Service or slice of the same key, or adds it; mod is
// the Modified it leaves, 0 to leave it alone.
func (f *fakeCtl) set(mod int64, s *object.Service, e *object.Endpoints) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s != nil {
		if i := slices.IndexFunc(f.svcs, func(x *object.Service) bool { return x.Index == s.Index }); i >= 0 {
			f.svcs[i] = s
		} else {
			f.svcs = append(f.svcs, s)
		}
	}
	if e != nil {
		if i := slices.IndexFunc(f.eps, func(x *object.Endpoints) bool { return keyOf(x) == keyOf(e) }); i >= 0 {
			f.eps[i] = e
		} else {
			f.eps = append(f.eps, e)
		}
	}
	if mod != 0 {
		f.mod = mod
	}
}

func (f *fakeCtl) diffs() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lists
}

// sink records the flushes a block's cache is asked for.
type sink struct {
	mu      sync.Mutex
	flushes []flush.Flush
	at      []time.Time
	got     chan struct{}
	// held, when not nil, holds each flush until it is closed.
	held chan struct{}
	// labels are the zones label of newTestFollow's counters: the sink's
	// own, not its address, which a later sink may take while counters
	// of an earlier one, never stopped, still hold the connected series.
	labels string
}

var sinks atomic.Int64

func newSink() *sink {
	return &sink{got: make(chan struct{}, 1000), labels: fmt.Sprintf("test-%d", sinks.Add(1))}
}

func (s *sink) flush(f flush.Flush) admin.Counts {
	s.mu.Lock()
	s.flushes = append(s.flushes, f)
	s.at = append(s.at, time.Now())
	s.mu.Unlock()
	s.got <- struct{}{}
	if s.held != nil {
		<-s.held
	}
	return admin.Counts{Success: int64(len(f.Names))}
}

// wait waits for n more flushes, up to a second.
func (s *sink) wait(t *testing.T, n int) {
	t.Helper()
	for range n {
		select {
		case <-s.got:
		case <-time.After(time.Second):
			t.Fatalf("no flush within a second")
		}
	}
}

// quiet checks no flush comes within d.
func (s *sink) quiet(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case <-s.got:
		t.Errorf("a flush nothing asked for: %v", s.all())
	case <-time.After(d):
	}
}

// all is the names flushed, each as NAME or *.NAME for a subtree.
func (s *sink) all() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, f := range s.flushes {
		for _, n := range f.Names {
			txt, _, _ := dns.UnpackDomainName(n, 0)
			if f.Scope == flush.Zones {
				txt = "*." + txt
			}
			out = append(out, txt)
		}
	}
	slices.Sort(out)
	return out
}

func (s *sink) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.flushes, s.at = nil, nil
}

// newTestFollow is a follow of ctl not yet running: the test steps it.
func newTestFollow(ctl *fakeCtl, opts pluginOptions, s *sink) (*follow, *[]string) {
	var logs []string
	var mu sync.Mutex
	c := newCounters(s.labels, "")
	f := newFollow(ctl, newClusterView(newNamer(clusterZones)), newEmitter(s.flush, nil, 0, c), c, newBaseline(""), opts, nil, func(up bool, why string) {
		mu.Lock()
		defer mu.Unlock()
		logs = append(logs, fmt.Sprint(up, " ", why))
	})
	return f, &logs
}

func TestFollowStep(t *testing.T) {
	ctl := &fakeCtl{}
	s := newSink()
	f, logs := newTestFollow(ctl, pluginOptions{podMode: podsDisabled}, s)
	defer f.em.close()
	at := func(sec int64, ms int64) time.Time { return time.Unix(sec, ms*int64(time.Millisecond)) }

	web := svc("ns", "web", []string{"10.96.0.10"}, port("http", 80))
	ctl.set(1000, web, nil)
	f.step(at(1000, 0))
	if f.filled || f.c.up.Load() {
		t.Fatalf("filled or connected before the controller synced")
	}
	ctl.synced = true
	f.step(at(1000, 100))
	if !f.filled || !f.c.up.Load() || len(*logs) != 1 {
		t.Fatalf("synced: filled %v, connected %v, logs %q", f.filled, f.c.up.Load(), *logs)
	}
	s.quiet(t, 2*interval) // the view's first fill flushes nothing

	// A change within the second the last diff began in leaves Modified
	// as it was; the next step diffs all the same.
	ctl.set(0, svc("ns", "web", []string{"10.96.0.20"}, port("http", 80)), nil)
	f.step(at(1000, 200))
	s.wait(t, 1)
	want := []string{"10.0.96.10.in-addr.arpa.", "20.0.96.10.in-addr.arpa.", "_http._tcp.web.ns" + z, "web.ns" + z}
	if got := s.all(); !slices.Equal(got, want) {
		t.Errorf("flushed %q, want %q", got, want)
	}
	// Diffs go on while the second of Modified lasts, finding nothing
	// more; once a diff began after it, none until Modified moves.
	n := ctl.diffs()
	f.step(at(1001, 0))
	f.step(at(1001, 100))
	f.step(at(1001, 200))
	if got := ctl.diffs() - n; got != 1 {
		t.Errorf("%d diffs after Modified's second ended, want 1 (the one that began after it)", got)
	}
	s.quiet(t, 2*interval)

	// A relist: every object new, none changed. Nothing flushed.
	s.reset()
	ctl.set(1002, svc("ns", "web", []string{"10.96.0.20"}, port("http", 80)), nil)
	f.step(at(1002, 0))
	s.quiet(t, 2*interval)

	// A Service gone and another come in the same diff.
	api := svc("ns", "api", []string{"10.96.0.30"})
	ctl.mu.Lock()
	ctl.svcs, ctl.mod = []*object.Service{api}, 1003
	ctl.mu.Unlock()
	f.step(at(1003, 0))
	s.wait(t, 1)
	want = []string{"20.0.96.10.in-addr.arpa.", "30.0.96.10.in-addr.arpa.", "_http._tcp.web.ns" + z, "api.ns" + z, "web.ns" + z}
	if got := s.all(); !slices.Equal(got, want) {
		t.Errorf("flushed %q, want %q", got, want)
	}
	// The emitter counts a flush's names once the sink has returned, so
	// after the sink signalled it: a wait for the count, bounded well past
	// what a loaded machine needs.
	st := f.c.stats("test")
	for deadline := time.Now().Add(10 * time.Second); st.Names != int64(len(want)+4) && time.Now().Before(deadline); st = f.c.stats("test") {
		time.Sleep(time.Millisecond)
	}
	if st.Services != 3 || st.Names != int64(len(want)+4) {
		t.Errorf("stats %+v: want 3 Service changes and %d names", st, len(want)+4)
	}
}

// TestFollowFullDiff: with Modified still, a diff comes every fullEvery.
func TestFollowFullDiff(t *testing.T) {
	ctl := &fakeCtl{synced: true, mod: 500}
	s := newSink()
	f, _ := newTestFollow(ctl, pluginOptions{podMode: podsDisabled}, s)
	defer f.em.close()
	t0 := time.Unix(1000, 0)
	f.step(t0)
	ctl.set(0, svc("ns", "web", []string{"10.96.0.10"}), nil) // Modified not moved: a clock set back
	n := ctl.diffs()
	f.step(t0.Add(fullEvery / 2))
	if ctl.diffs() != n {
		t.Errorf("a diff with Modified still, before fullEvery")
	}
	f.step(t0.Add(fullEvery))
	s.wait(t, 1)
	if got := s.all(); !slices.Contains(got, "web.ns"+z) {
		t.Errorf("flushed %q after fullEvery, want web's names", got)
	}
}

// TestFollowUnmarked: changes the plugin's answers show but its Modified
// does not (serviceModified compares no ClusterIPs, endpointsEquivalent
// no pod names) are flushed within a second all the same.
func TestFollowUnmarked(t *testing.T) {
	web := svc("ns", "web", []string{"10.96.0.10"}, port("http", 80))
	for _, tc := range []struct {
		name     string
		podNames bool
		before   *object.Endpoints
		svc      *object.Service
		ep       *object.Endpoints
		want     []string
	}{
		{
			name: "a Service made dual-stack: a second ClusterIP",
			svc:  svc("ns", "web", []string{"10.96.0.10", "fd00::10"}, port("http", 80)),
			want: []string{
				"0.1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa.", "10.0.96.10.in-addr.arpa.",
				"_http._tcp.web.ns" + z, "web.ns" + z,
			},
		},
		{
			name:     "endpoint_pod_names: a host-network pod replaced at the same address",
			podNames: true,
			before:   slice("ns", "web-1", "web", eport("http", 80), "10.0.0.5==web-a"),
			ep:       slice("ns", "web-1", "web", eport("http", 80), "10.0.0.5==web-b"),
			want:     []string{"5.0.0.10.in-addr.arpa.", "web-a.web.ns" + z, "web-b.web.ns" + z},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctl := &fakeCtl{synced: true, mod: 500}
			ctl.set(0, web, tc.before)
			s := newSink()
			f, _ := newTestFollow(ctl, pluginOptions{podMode: podsDisabled}, s)
			defer f.em.close()
			f.view.namer.PodNames = tc.podNames
			t0 := time.Unix(1000, 0)
			f.step(t0)
			ctl.set(0, tc.svc, tc.ep) // Modified stays at 500
			f.step(t0.Add(time.Second))
			s.wait(t, 1)
			if got := s.all(); !slices.Equal(got, tc.want) {
				t.Errorf("flushed %q, want %q", got, tc.want)
			}
		})
	}
}

// TestFollowPods: under pods verified, any move of Modified drops the
// pod names' subtree, at most every walkGap.
func TestFollowPods(t *testing.T) {
	ctl := &fakeCtl{synced: true, mod: 1000}
	s := newSink()
	f, _ := newTestFollow(ctl, pluginOptions{podMode: podsVerified}, s)
	defer f.em.close()
	t0 := time.Unix(1000, 0)
	f.step(t0)
	ctl.set(1001, nil, nil)
	f.step(t0.Add(time.Second))
	s.wait(t, 1)
	if got := s.all(); !slices.Equal(got, []string{"*.pod.cluster.local."}) {
		t.Errorf("flushed %q, want the subtree pod.cluster.local.", got)
	}
	s.reset()
	ctl.set(1001, nil, nil)
	f.step(t0.Add(1500 * time.Millisecond)) // Modified's second, but within walkGap
	s.quiet(t, 2*interval)
	f.step(t0.Add(2 * time.Second)) // the last pod flush began in second 1001: again
	s.wait(t, 1)
	f.step(t0.Add(3500 * time.Millisecond)) // Modified still 1001, and a flush began after it
	s.quiet(t, 2*interval)
	if got := f.c.kinds[kindPod].Load(); got != 2 {
		t.Errorf("%d pod changes counted, want 2", got)
	}
}

// TestFollowPodAlias: an ExternalName Service whose target is a pod name
// is flushed with the pod names' subtree, as with any name it aliases.
func TestFollowPodAlias(t *testing.T) {
	for _, tc := range []struct {
		mode   string
		target string
		change *object.Service // moves Modified
	}{
		{podsVerified, "10-1-2-3.ns.pod.cluster.local", nil},
		{podsInsecure, "10-1-2-3.new.pod.cluster.local", svc("new", "api", []string{"10.96.0.11"})}, // the namespace's first Service
	} {
		t.Run(tc.mode, func(t *testing.T) {
			ctl := &fakeCtl{synced: true, mod: 1000, ns: map[string]bool{"ns": true, "new": true}}
			ctl.set(0, external("ns", "alias", tc.target), nil)
			s := newSink()
			f, _ := newTestFollow(ctl, pluginOptions{podMode: tc.mode}, s)
			defer f.em.close()
			t0 := time.Unix(1000, 0)
			f.step(t0)
			ctl.set(1001, tc.change, nil)
			f.step(t0.Add(nsEvery))
			s.wait(t, 2) // the names, then the subtree
			if got := s.all(); !slices.Contains(got, "alias.ns"+z) {
				t.Errorf("flushed %q, not the alias alias.ns%s", got, z)
			}
		})
	}
}

// TestFollowNamespace: a namespace of the view's Services that goes
// flushes its names and its Services', and its pod names' subtree (pods
// insecure or verified); under pods insecure, also that of a namespace the
// view learns of through its first Service, whose pod names answered
// NXDOMAIN while it did not exist.
func TestFollowNamespace(t *testing.T) {
	nsGone := func(ctl *fakeCtl) { // deleted, or no longer selected
		ctl.mu.Lock()
		ctl.ns["ns"] = false
		ctl.mu.Unlock()
	}
	for _, tc := range []struct {
		name   string
		mode   string // the pods option; insecure when empty
		change func(ctl *fakeCtl)
		// early: the change shows in no flush before nsEvery.
		early bool
		// namespaces is the plugin's namespaces option.
		namespaces []string
		want       []string
	}{
		{
			// The plugin answers an endpoint's PTR query whatever its
			// namespace, but under the namespaces option.
			name:   "a namespace_labels selector that stopped matching",
			change: nsGone,
			early:  true,
			want:   []string{"*.ns.pod.cluster.local.", "10-1-0-1.web.ns" + z, "10.0.96.10.in-addr.arpa.", "ns.pod.cluster.local.", "ns.svc.cluster.local.", "web.ns" + z},
		},
		{
			// Its Pods stay, and move no Modified, but answer only while
			// their namespace is exposed.
			name:   "a namespace_labels selector that stopped matching, pods verified",
			mode:   podsVerified,
			change: nsGone,
			early:  true,
			want:   []string{"*.ns.pod.cluster.local.", "10-1-0-1.web.ns" + z, "10.0.96.10.in-addr.arpa.", "ns.pod.cluster.local.", "ns.svc.cluster.local.", "web.ns" + z},
		},
		{
			name:       "a namespace of the namespaces option deleted",
			change:     nsGone,
			early:      true,
			namespaces: []string{"ns", "new"},
			want:       []string{"*.ns.pod.cluster.local.", "1.0.1.10.in-addr.arpa.", "10-1-0-1.web.ns" + z, "10.0.96.10.in-addr.arpa.", "ns.pod.cluster.local.", "ns.svc.cluster.local.", "web.ns" + z},
		},
		{
			name:   "the first Service of a namespace",
			change: func(ctl *fakeCtl) { ctl.set(2001, svc("new", "api", []string{"10.96.0.11"}), nil) },
			want:   []string{"*.new.pod.cluster.local.", "11.0.96.10.in-addr.arpa.", "api.new" + z, "new.pod.cluster.local.", "new.svc.cluster.local."},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctl := &fakeCtl{synced: true, mod: 1000, ns: map[string]bool{"ns": true, "new": true}}
			s := newSink()
			mode := tc.mode
			if mode == "" {
				mode = podsInsecure
			}
			f, _ := newTestFollow(ctl, pluginOptions{podMode: mode}, s)
			defer f.em.close()
			if tc.namespaces != nil {
				f.view.namespaces = map[string]struct{}{}
				for _, ns := range tc.namespaces {
					f.view.namespaces[ns] = struct{}{}
				}
			}
			ctl.set(0, svc("ns", "web", []string{"10.96.0.10"}), slice("ns", "web-1", "web", nil, "10.1.0.1"))
			t0 := time.Unix(2000, 0)
			f.step(t0)
			tc.change(ctl)
			if tc.early {
				f.step(t0.Add(nsEvery / 2))
				s.quiet(t, 2*interval)
			}
			f.step(t0.Add(nsEvery))
			s.wait(t, 2) // the names, then the pod names' subtree
			if got := s.all(); !slices.Equal(got, tc.want) {
				t.Errorf("flushed %q, want %q", got, tc.want)
			}
		})
	}
}

// TestFollowStopLooks: a follow's last look as it stops, which a
// reload's new source that synced meanwhile takes as its base, flushes
// what changed since its last look at the namespaces and the pods, as its
// last diff does for Services and slices: nothing else ever would.
func TestFollowStopLooks(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mode   string
		change func(ctl *fakeCtl)
		want   []string // among the flushed
	}{
		{
			name: "a namespace_labels selector that stopped matching",
			mode: podsInsecure,
			change: func(ctl *fakeCtl) {
				ctl.mu.Lock()
				ctl.ns["ns"] = false
				ctl.mu.Unlock()
			},
			want: []string{"*.ns.pod.cluster.local.", "ns.svc.cluster.local.", "web.ns" + z},
		},
		{
			name:   "the first Service of a namespace",
			mode:   podsInsecure,
			change: func(ctl *fakeCtl) { ctl.set(time.Now().Unix(), svc("new", "api", []string{"10.96.0.11"}), nil) },
			want:   []string{"*.new.pod.cluster.local.", "api.new" + z, "new.svc.cluster.local."},
		},
		{
			name:   "a Pod, pods verified",
			mode:   podsVerified,
			change: func(ctl *fakeCtl) { ctl.set(time.Now().Unix()+1, nil, nil) },
			want:   []string{"*.pod.cluster.local."},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctl := &fakeCtl{synced: true, mod: 1000, ns: map[string]bool{"ns": true, "new": true}}
			ctl.set(0, svc("ns", "web", []string{"10.96.0.10"}), slice("ns", "web-1", "web", nil, "10.1.0.1"))
			s := newSink()
			f, _ := newTestFollow(ctl, pluginOptions{podMode: tc.mode}, s)
			f.step(time.Now())
			tc.change(ctl)
			// Stopped before its next look: run sees the stop at once.
			close(f.stop)
			f.run()
			got := s.all()
			for _, n := range tc.want {
				if !slices.Contains(got, n) {
					t.Errorf("flushed %q at the stop, want %s among them", got, n)
				}
			}
		})
	}
}

// TestFollowNameserverUnexposed: under the plugin's namespaces option,
// a change of the nameserver's own slice or Service in a namespace it
// does not expose flushes the apexes and ns.dns names, which nsAddrs
// makes of them whatever the option says; another Service there flushes
// nothing.
func TestFollowNameserverUnexposed(t *testing.T) {
	apex := []string{"cluster.local.", "ns.dns.cluster.local."}
	ctl := &fakeCtl{synced: true, mod: 1000}
	ctl.set(0, svc("kube-system", "kube-dns", []string{"10.96.0.10"}, port("dns", 53)),
		slice("kube-system", "kube-dns-1", "kube-dns", eport("dns", 53), "10.1.0.1", "10.1.0.2"))
	s := newSink()
	f, _ := newTestFollow(ctl, pluginOptions{podMode: podsDisabled}, s)
	defer f.em.close()
	f.view.namespaces = map[string]struct{}{"default": {}}
	f.view.setServers(map[string]struct{}{"10.1.0.1": {}})
	t0 := time.Unix(1000, 0)
	f.step(t0)
	for i, tc := range []struct {
		svc *object.Service
		ep  *object.Endpoints
	}{
		{ep: slice("kube-system", "kube-dns-1", "kube-dns", eport("dns", 53), "10.1.0.1", "10.1.0.3")},
		{svc: svc("kube-system", "kube-dns", []string{"10.96.0.11"}, port("dns", 53))},
	} {
		s.reset()
		ctl.set(int64(1001+i), tc.svc, tc.ep)
		f.step(t0.Add(time.Duration(i+1) * time.Second))
		s.wait(t, 1)
		if got := s.all(); !slices.Contains(got, apex[0]) || !slices.Contains(got, apex[1]) {
			t.Errorf("change %d flushed %q, want %q among them", i, got, apex)
		}
	}
	ctl.set(1010, svc("kube-system", "metrics", []string{"10.96.0.20"}), slice("kube-system", "metrics-1", "metrics", nil, "10.1.1.2"))
	f.step(t0.Add(10 * time.Second))
	s.quiet(t, 2*interval)
}

// TestFollowRun: the goroutine of a block, against a controller changing
// as the plugin's does, flushes each change within a poll and an
// interval, and a burst of changes as few flushes.
func TestFollowRun(t *testing.T) {
	ctl := &fakeCtl{}
	s := newSink()
	f, _ := newTestFollow(ctl, pluginOptions{podMode: podsDisabled}, s)
	db := headless("ns", "db", port("pg", 5432))
	ctl.set(time.Now().Unix(), db, slice("ns", "db-1", "db", eport("pg", 5432), "10.1.0.1=db-0"))
	ctl.synced = true
	go f.run()
	deadline := time.Now().Add(time.Second)
	for !f.c.up.Load() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if !f.c.up.Load() {
		t.Fatal("not connected a second after the controller synced")
	}
	changed := time.Now()
	ctl.set(changed.Unix(), nil, slice("ns", "db-1", "db", eport("pg", 5432), "10.1.0.1=db-0", "10.1.0.2"))
	s.wait(t, 1)
	if took := time.Since(changed); took > pollEvery+interval+50*time.Millisecond {
		t.Errorf("flushed %v after the change, want within a poll and an interval", took)
	}
	want := []string{"10-1-0-2.db.ns" + z, "2.0.1.10.in-addr.arpa.", "_pg._tcp.db.ns" + z, "db.ns" + z}
	if got := s.all(); !slices.Equal(got, want) {
		t.Errorf("flushed %q, want %q", got, want)
	}
	// A burst: 200 changes over half a second, each a new endpoint.
	s.reset()
	start := time.Now()
	for i := range 200 {
		addrs := []string{"10.1.0.1=db-0"}
		for j := 0; j <= i; j++ {
			addrs = append(addrs, fmt.Sprintf("10.2.%d.%d", j/250, j%250+1))
		}
		ctl.set(time.Now().Unix(), nil, slice("ns", "db-1", "db", eport("pg", 5432), addrs...))
		time.Sleep(time.Until(start.Add(time.Duration(i+1) * 2500 * time.Microsecond)))
	}
	time.Sleep(3 * (pollEvery + interval))
	close(f.stop)
	<-f.done
	s.mu.Lock()
	n, at := len(s.flushes), slices.Clone(s.at)
	s.mu.Unlock()
	burst := time.Since(start)
	if limit := int(burst/interval) + 2; n > limit {
		t.Errorf("%d flushes for 200 changes over %v, want at most %d", n, burst, limit)
	}
	for i := 1; i < len(at); i++ {
		if gap := at[i].Sub(at[i-1]); gap < interval-5*time.Millisecond {
			t.Errorf("flushes %d and %d %v apart, under the interval", i-1, i, gap)
		}
	}
	got := s.all()
	for j := range 200 {
		name := fmt.Sprintf("10-2-%d-%d.db.ns%s", j/250, j%250+1, z)
		if !slices.Contains(got, name) {
			t.Errorf("the burst's endpoint %s never flushed", name)
			break
		}
	}
	t.Logf("200 changes in %v: %d flushes, %d names", burst, n, len(got))
}

func TestEmitterAgain(t *testing.T) {
	const again = 300 * time.Millisecond
	for _, tc := range []struct {
		name string
		add  func(b *batch)
		want []string
		// The second flush's time after the first: a subtree's waits for
		// the walker, walkGap after the first walk.
		min, max time.Duration
	}{
		{"a name", func(b *batch) { b.name("web.ns" + z) }, []string{"web.ns" + z, "web.ns" + z}, again, 2 * again},
		{"a subtree", func(b *batch) { b.subtree("_zone.db.ns" + z) }, []string{"*._zone.db.ns" + z, "*._zone.db.ns" + z}, walkGap - 10*time.Millisecond, 5 * walkGap},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSink()
			e := newEmitter(s.flush, nil, again, newCounters("test-again-"+tc.name, ""))
			e.update(tc.add)
			s.wait(t, 1)
			select {
			case <-s.got:
			case <-time.After(5 * walkGap):
				t.Fatalf("no second flush within %v", 5*walkGap)
			}
			s.mu.Lock()
			gap := s.at[1].Sub(s.at[0])
			s.mu.Unlock()
			if gap < tc.min || gap > tc.max {
				t.Errorf("the second flush %v after the first, want %v to %v", gap, tc.min, tc.max)
			}
			if got := s.all(); !slices.Equal(got, tc.want) {
				t.Errorf("flushed %q, want %q", got, tc.want)
			}
			e.close()
			s.quiet(t, 2*interval)
		})
	}
}

// TestEmitterAgainEachBatch: a batch flushed while an earlier one waits
// for its second flush gets its own, again after its first.
func TestEmitterAgainEachBatch(t *testing.T) {
	const again = 300 * time.Millisecond
	s := newSink()
	e := newEmitter(s.flush, nil, again, newCounters("test-again-each", ""))
	defer e.close()
	e.update(func(b *batch) { b.name("a.ns" + z) })
	s.wait(t, 1)
	time.Sleep(again / 2)
	e.update(func(b *batch) { b.name("b.ns" + z) })
	s.wait(t, 3) // b's first, a's second, b's second
	s.mu.Lock()
	defer s.mu.Unlock()
	var at []time.Time // b's flushes
	for i, f := range s.flushes {
		for _, n := range f.Names {
			if name, _, _ := dns.UnpackDomainName(n, 0); name == "b.ns"+z {
				at = append(at, s.at[i])
			}
		}
	}
	if len(at) != 2 || at[1].Sub(at[0]) < again {
		t.Errorf("b flushed at %v: want twice, %v apart at least", at, again)
	}
}

// TestEmitterAgainAfterClose: a second flush due when the emitter closes
// (a reload) is made all the same, at its time.
func TestEmitterAgainAfterClose(t *testing.T) {
	const again = 300 * time.Millisecond
	s := newSink()
	e := newEmitter(s.flush, nil, again, newCounters("test-again-close", ""))
	e.update(func(b *batch) { b.name("a.ns" + z) })
	s.wait(t, 1)
	e.close()
	s.wait(t, 1)
	got := s.all()
	s.mu.Lock()
	defer s.mu.Unlock()
	if gap := s.at[1].Sub(s.at[0]); gap < again || !slices.Equal(got, []string{"a.ns" + z, "a.ns" + z}) {
		t.Errorf("flushed %q, the second %v after the first: want a.ns twice, %v apart", got, gap, again)
	}
}

// TestEmitterWalks: subtree flushes go at most every walkGap, those asked
// for meanwhile in one. The first walk is held until the other four wait
// for the walker, so that no moment of a loaded machine splits them.
func TestEmitterWalks(t *testing.T) {
	s := newSink()
	s.held = make(chan struct{})
	e := newEmitter(s.flush, nil, 0, newCounters("test-walks", ""))
	defer e.close()
	subtree := func(i int) { e.update(func(b *batch) { b.subtree(fmt.Sprintf("ns%d.pod.cluster.local.", i)) }) }
	subtree(0)
	s.wait(t, 1)
	for i := 1; i < 5; i++ {
		subtree(i)
	}
	waiting := func() int {
		e.walkMu.Lock()
		defer e.walkMu.Unlock()
		return len(e.walks)
	}
	for deadline := time.Now().Add(10 * time.Second); waiting() < 4 && time.Now().Before(deadline); {
		time.Sleep(interval / 10)
	}
	close(s.held)
	select { // walkGap after the first, which sink.wait's second may not see
	case <-s.got:
	case <-time.After(walkGap + 10*time.Second):
		t.Fatal("no second walk")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.flushes) != 2 || s.at[1].Sub(s.at[0]) < walkGap-10*time.Millisecond {
		t.Fatalf("%d walks, at %v: want 2, walkGap apart", len(s.flushes), s.at)
	}
	if len(s.flushes[0].Names) != 1 || len(s.flushes[1].Names) != 4 {
		t.Errorf("walks of %d and %d subtrees, want 1 then the 4 asked for meanwhile", len(s.flushes[0].Names), len(s.flushes[1].Names))
	}
}

// TestFollowNeverSynced: a controller that never syncs is said once, after
// probeEvery, though the block never lost what it never had.
func TestFollowNeverSynced(t *testing.T) {
	ctl := &fakeCtl{}
	f, logs := newTestFollow(ctl, pluginOptions{podMode: podsDisabled}, newSink())
	defer f.em.close()
	for _, d := range []time.Duration{0, probeEvery / 2, probeEvery, probeEvery + pollEvery, 2 * probeEvery} {
		f.step(f.started.Add(d))
	}
	if len(*logs) != 1 || !strings.HasPrefix((*logs)[0], "false the kubernetes plugin has not synced") {
		t.Errorf("logs %q, want one saying the plugin has not synced", *logs)
	}
	if f.c.up.Load() || f.c.lost.Load() != 0 {
		t.Errorf("connected %v, %d disconnects: want not connected and none lost", f.c.up.Load(), f.c.lost.Load())
	}
}
