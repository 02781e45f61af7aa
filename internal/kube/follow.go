package kube

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/coredns/coredns/plugin/kubernetes"
)

// Source 1: the kubernetes plugin's own informers. The plugin shows no
// hook on their events, only the second of the last change that its
// answers show (Modified), set after the informer's store. follow reads
// that second every pollEvery, an atomic load, and when it moved diffs the
// controller's lists against its view: an object whose pointer is the
// one the view holds has not changed (the informers replace an object on
// every change, and only then), so a diff costs a map lookup per object
// and the names of the changed ones.
const (
	pollEvery = 100 * time.Millisecond
	// fullEvery is the longest time between two diffs, whatever Modified
	// says: the plugin leaves it still for some changes its answers show
	// (serviceModified compares no ClusterIPs, which a Service made
	// dual-stack gains; endpointsEquivalent no pod names, which
	// endpoint_pod_names answers), and a clock set back would hide a
	// change from it. A diff that finds nothing costs a map lookup per
	// object.
	fullEvery = time.Second
	// nsEvery is how often the namespaces of the view's Services are
	// looked up: the plugin's namespace informer moves no Modified.
	nsEvery = time.Second
)

type follow struct {
	ctl   controller
	view  *clusterView
	em    *emitter
	c     *counters
	opts  pluginOptions
	probe *prober // nil: the connection is the controller's sync alone
	log   func(up bool, why string)
	base  *baseline

	filled     bool
	lastMod    int64 // Modified at the last diff
	lastDiff   int64 // the second the last diff began in
	lastFull   time.Time
	lastPods   time.Time // the last flush of pod names (pods verified)
	lastPodMod int64
	lastPodSec int64
	lastNS     time.Time
	nsExists   map[string]bool

	probeErr atomic.Pointer[error] // the last probe's error; nil pointer: never probed
	started  time.Time
	warned   bool // that the controller has not synced since the start
	stop     chan struct{}
	done     chan struct{}
}

func newFollow(ctl controller, view *clusterView, em *emitter, c *counters, base *baseline, opts pluginOptions, probe *prober, log func(bool, string)) *follow {
	f := &follow{ctl: ctl, view: view, em: em, c: c, opts: opts, probe: probe, log: log,
		base: base, nsExists: map[string]bool{}, started: time.Now(), stop: make(chan struct{}), done: make(chan struct{})}
	ok := error(nil)
	f.probeErr.Store(&ok)
	return f
}

func (f *follow) run() {
	defer close(f.done)
	if f.probe != nil {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go f.probing(ctx)
	}
	// Until the controller first syncs, a tick is short: the view taken
	// then is the base the first changes are told against, and a reload's
	// old instance stops (after a last diff) once the plugin has synced.
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-f.stop:
			f.final()
			f.em.close()
			return
		case now := <-tick.C:
			filled := f.filled
			f.step(now)
			if !filled && f.filled {
				tick.Reset(pollEvery)
			}
		}
	}
}

func (f *follow) probing(ctx context.Context) {
	t := time.NewTicker(probeEvery)
	defer t.Stop()
	for {
		err := f.probe.probe(ctx)
		f.probeErr.Store(&err)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// step does what the time now calls for: a diff when Modified moved, or
// may have moved unseen within the second it holds; pod names when
// anything moved, at most every walkGap; the namespaces every nsEvery.
func (f *follow) step(now time.Time) {
	if !f.ctl.HasSynced() {
		const why = "the kubernetes plugin has not synced with the API server"
		if !f.filled && !f.warned && now.Sub(f.started) >= probeEvery {
			// Never connected, so never lost: said once.
			f.warned = true
			f.log(false, why)
		}
		f.health(false, why)
		return
	}
	m := f.ctl.Modified(kubernetes.ModifiedInternal)
	sec := now.Unix()
	if !f.filled {
		f.diff(nil)
		f.filled = true
		f.lastMod, f.lastDiff, f.lastFull, f.lastPodMod, f.lastPodSec = m, sec, now, m, sec
		base, cold := f.base.fill()
		if cold {
			f.em.update(f.view.namer.zones)
		}
		if base != nil {
			// The block's source before a reload stopped before this one
			// synced: what changed meanwhile is told against what it knew.
			f.em.update(func(b *batch) {
				f.view.rebase(b, base.view)
				if f.opts.podMode == podsVerified {
					// Pods changed unseen too.
					f.view.namer.pods(b, "")
					f.view.aliasNames(b)
				}
			})
		}
		if base != nil && base.ns != nil {
			f.nsExists = base.ns
			f.em.update(f.namespaces)
		} else {
			f.namespaces(nil)
		}
		f.lastNS = now
		f.health(true, "")
		return
	}
	// A change within second m after the last diff began leaves m as it
	// was: diff again until a diff has begun after second m.
	if m != f.lastMod || f.lastDiff <= m || now.Sub(f.lastFull) >= fullEvery {
		f.em.update(f.diff)
		f.lastMod, f.lastDiff, f.lastFull = m, sec, now
	}
	if f.podsMoved(m) && now.Sub(f.lastPods) >= walkGap {
		f.em.update(f.pods)
		f.lastPodMod, f.lastPodSec, f.lastPods = m, sec, now
	}
	if now.Sub(f.lastNS) >= nsEvery {
		f.em.update(f.namespaces)
		f.lastNS = now
	}
	if err := *f.probeErr.Load(); err != nil {
		f.health(false, "the API server does not answer: "+err.Error())
	} else {
		f.health(true, "")
	}
}

// podsMoved reports whether, under pods verified, a Pod may have changed
// since the last flush of pod names, Modified being m: it moved, or the
// last flush began within its second.
func (f *follow) podsMoved(m int64) bool {
	return f.opts.podMode == podsVerified && (m != f.lastPodMod || f.lastPodSec <= m)
}

// pods adds the pod names: the controller lists no Pods, so a Pod's names
// are dropped as the subtree pod.ZONE, whatever moved Modified.
func (f *follow) pods(b *batch) {
	b.changes[kindPod]++
	f.view.namer.pods(b, "")
	f.view.aliasNames(b)
}

// final is the follow's last look as it stops, at all it looks at: a
// reload's new source that synced meanwhile took the cluster as it was
// then for its base, so a change since this one's last look is flushed
// now or never.
func (f *follow) final() {
	if !f.filled || !f.ctl.HasSynced() {
		return
	}
	f.em.update(f.diff)
	f.em.update(f.namespaces)
	if f.podsMoved(f.ctl.Modified(kubernetes.ModifiedInternal)) {
		f.em.update(f.pods)
	}
}

// last is what the follow, stopped, knew of the cluster: its view, or
// before its first full state the base it was handed.
func (f *follow) last() *state {
	if f.filled {
		return &state{view: f.view, ns: f.nsExists}
	}
	return f.base.release()
}

func (f *follow) health(up bool, why string) {
	if f.c.connected(up) {
		f.log(up, why)
	}
}

// diff tells the view the controller's objects, adding to b the names
// their changes make wrong; b is nil for the first, which fills the view.
func (f *follow) diff(b *batch) {
	v := f.view
	v.gen++
	seen := 0
	for _, s := range f.ctl.ServiceList() {
		e := v.svcs[s.Index]
		if e == nil && !v.keepsService(s.Index, s) {
			// Told, it would cost a walk of the aliases each diff.
			continue
		}
		if e == nil || e.s != s {
			v.Service(b, s.Index, s)
			if e = v.svcs[s.Index]; e == nil {
				continue // in a namespace the plugin does not expose, not the nameserver's
			}
		}
		e.gen = v.gen
		seen++
	}
	if seen < len(v.svcs) {
		for k, e := range v.svcs {
			if e.gen != v.gen {
				v.Service(b, k, nil)
			}
		}
	}
	seen = 0
	for _, ep := range f.ctl.EndpointsList() {
		k := keyOf(ep)
		e := v.eps[k]
		if e == nil && !v.keepsSlice(ep) {
			continue
		}
		if e == nil || e.e != ep {
			v.Endpoints(b, k, ep)
			if e = v.eps[k]; e == nil {
				continue
			}
		}
		e.gen = v.gen
		seen++
	}
	if seen < len(v.eps) {
		for k, e := range v.eps {
			if e.gen != v.gen {
				v.Endpoints(b, k, nil)
			}
		}
	}
}

// namespaces looks up the namespaces of the view's Services: one that
// appears or goes changes its own names, and every name under it where
// it still has Services (a namespace_labels selector that stops or starts
// matching it), and its pod names.
func (f *follow) namespaces(b *batch) {
	for ns := range f.view.perNS {
		if _, ok := f.nsExists[ns]; !ok {
			f.nsExists[ns] = f.exists(ns)
			if f.nsExists[ns] && b != nil && f.opts.podMode == podsInsecure {
				// Its first Service: as near as Services tell to the
				// namespace's creation, before which its pod names
				// answered NXDOMAIN.
				f.view.namer.pods(b, ns)
			}
		}
	}
	for ns, was := range f.nsExists {
		now := f.exists(ns)
		if now != was && b != nil {
			b.changes[kindNamespace]++
			f.view.namer.namespace(b, ns)
			if f.opts.podMode != podsDisabled {
				// Pod names answer only while their namespace is exposed,
				// verified ones too: their Pods move no Modified when a
				// namespace_labels selector stops or starts matching it.
				f.view.namer.pods(b, ns)
			}
			f.view.namespaceNames(b, ns)
		}
		if !now && f.view.perNS[ns] == 0 {
			delete(f.nsExists, ns)
		} else {
			f.nsExists[ns] = now
		}
	}
	if b != nil {
		f.view.aliasNames(b)
	}
}

func (f *follow) exists(ns string) bool {
	_, err := f.ctl.GetNamespaceByName(ns)
	return err == nil
}
