package kube

import (
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/compactcache/compactcache/internal/admin"
	"github.com/coredns/coredns/plugin/kubernetes/object"
	api "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	meta "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8swatch "k8s.io/apimachinery/pkg/watch"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// Source 2: a watch of its own, for a cache with no kubernetes plugin in
// its block (a node-local cache in front of the cluster DNS). Two
// informers, Services and EndpointSlices, each one list and then one
// watch, shared by the blocks of the process that connect alike and kept
// across reloads while a block uses them; their objects are the
// kubernetes plugin's trimmed ones (object.ToService,
// object.EndpointSliceToEndpoints), so the names are made as Source 1
// makes them, from the events themselves rather than a diff.

// watch is one connection's informers and what they cost the API server.
type watch struct {
	key  string
	refs int // under watches' lock

	svc, eps cache.SharedIndexInformer
	cancel   context.CancelFunc
	probe    *prober
	probeErr atomic.Pointer[error]
	// failing is, for each of watched, whether its list or watch failed
	// (an error other than the ends a watch has in normal running) and no
	// watch has started since: once failures persist the reflector tries
	// again only every 30 to 60 s, and the watch fails all that while; a
	// list alone, which RBAC may allow where it refuses the watch, follows
	// nothing.
	failing [2]atomic.Bool

	lists, watches, other, bytes atomic.Int64
}

// watches are the process's watches, by connection.
var watches = struct {
	sync.Mutex
	m map[string]*watch
}{m: map[string]*watch{}}

// acquire returns the running watch of c, started if none is.
func acquire(c conn) (*watch, error) {
	watches.Lock()
	defer watches.Unlock()
	if w := watches.m[c.String()]; w != nil {
		w.refs++
		return w, nil
	}
	cfg, err := c.restConfig()
	if err != nil {
		return nil, err
	}
	w, err := startWatch(cfg, silentAfter)
	if err != nil {
		return nil, err
	}
	w.key, w.refs = c.String(), 1
	watches.m[w.key] = w
	return w, nil
}

// release stops w once no block uses it.
func (w *watch) release() {
	watches.Lock()
	defer watches.Unlock()
	if w.refs--; w.refs > 0 {
		return
	}
	delete(watches.m, w.key)
	w.cancel()
}

// silentAfter is how long a watch may send nothing before it is taken for
// stalled: the API server sends a bookmark about every minute to a watch
// that allows them (the reflector's do), however quiet the cluster.
const silentAfter = 2 * time.Minute

func startWatch(cfg *rest.Config, silent time.Duration) (*watch, error) {
	w := &watch{}
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return metered{next: rt, lists: &w.lists, watches: &w.watches, other: &w.other, bytes: &w.bytes, watching: w.watching}
	})
	cs, err := k8s.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	if w.probe, err = newProber(cfg); err != nil {
		return nil, err
	}
	stalled := func(i int) func() {
		return func() {
			log.Warningf("kubernetes: the watch of %s sent nothing for %s: watching again", watched[i], silent)
			w.failing[i].Store(true)
		}
	}
	w.svc = informer(cs, &api.Service{}, object.ToService, silent, stalled(0),
		func(ctx context.Context, o meta.ListOptions) (runtime.Object, error) {
			return cs.CoreV1().Services(api.NamespaceAll).List(ctx, o)
		},
		func(ctx context.Context, o meta.ListOptions) (k8swatch.Interface, error) {
			return cs.CoreV1().Services(api.NamespaceAll).Watch(ctx, o)
		})
	w.eps = informer(cs, &discovery.EndpointSlice{}, object.EndpointSliceToEndpoints, silent, stalled(1),
		func(ctx context.Context, o meta.ListOptions) (runtime.Object, error) {
			return cs.DiscoveryV1().EndpointSlices(api.NamespaceAll).List(ctx, o)
		},
		func(ctx context.Context, o meta.ListOptions) (k8swatch.Interface, error) {
			return cs.DiscoveryV1().EndpointSlices(api.NamespaceAll).Watch(ctx, o)
		})
	for i, inf := range []cache.SharedIndexInformer{w.svc, w.eps} {
		if err := inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
			w.watchError(ctx, r, err, &w.failing[i])
		}); err != nil {
			return nil, err
		}
	}
	ok := error(nil)
	w.probeErr.Store(&ok)
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	go w.svc.RunWithContext(ctx)
	go w.eps.RunWithContext(ctx)
	go w.probing(ctx)
	return w, nil
}

// informer returns the informer of one resource; a watch of it that sends
// nothing for silent is ended, stalled called, and the reflector watches
// again.
func informer(cs *k8s.Clientset, example runtime.Object, convert object.ToFunc, silent time.Duration, stalled func(),
	list func(context.Context, meta.ListOptions) (runtime.Object, error),
	watch func(context.Context, meta.ListOptions) (k8swatch.Interface, error)) cache.SharedIndexInformer {
	guarded := func(ctx context.Context, o meta.ListOptions) (k8swatch.Interface, error) {
		wi, err := watch(ctx, o)
		if err != nil {
			return nil, err
		}
		return guard(wi, silent, stalled), nil
	}
	lw := cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{ListWithContextFunc: list, WatchFuncWithContext: guarded}, cs)
	inf := cache.NewSharedIndexInformerWithOptions(lw, example, cache.SharedIndexInformerOptions{})
	// The informer keeps the trimmed objects only, as the kubernetes
	// plugin's do: a Service's annotations and managed fields would
	// otherwise be held for every Service of the cluster.
	_ = inf.SetTransform(func(o any) (any, error) {
		if mo, ok := o.(meta.Object); ok {
			return convert(mo)
		}
		return o, nil
	})
	return inf
}

// guarded is a watch that ends once silent for its deadline: a watch
// stalled with its connection up (a proxy or load balancer that stopped
// passing it on) says nothing, and the reflector would wait out its
// timeout, 5 to 10 minutes, following nothing. Watched again from the
// last resource version, the API server sends what it missed, or has the
// reflector list again (410 Gone), and the informer tells the changes.
type guarded struct {
	in   k8swatch.Interface
	out  chan k8swatch.Event
	stop chan struct{}
	once sync.Once
}

func guard(in k8swatch.Interface, silent time.Duration, stalled func()) k8swatch.Interface {
	g := &guarded{in: in, out: make(chan k8swatch.Event), stop: make(chan struct{})}
	go g.run(silent, stalled)
	return g
}

func (g *guarded) run(silent time.Duration, stalled func()) {
	defer close(g.out)
	defer g.in.Stop()
	t := time.NewTimer(silent)
	defer t.Stop()
	for {
		select {
		case ev, ok := <-g.in.ResultChan():
			if !ok {
				return
			}
			select {
			case g.out <- ev:
			case <-g.stop:
				return
			}
			t.Reset(silent)
		case <-t.C:
			stalled()
			return
		case <-g.stop:
			return
		}
	}
}

func (g *guarded) Stop() { g.once.Do(func() { close(g.stop) }) }

func (g *guarded) ResultChan() <-chan k8swatch.Event { return g.out }

func (w *watch) watchError(ctx context.Context, r *cache.Reflector, err error, failing *atomic.Bool) {
	cache.DefaultWatchErrorHandler(ctx, r, err) // its log line
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
		return // a watch's end in normal running: the reflector lists again
	}
	failing.Store(true)
}

// watched are the resources of the watch's informers, Services and
// EndpointSlices: the last element of their watch paths.
var watched = [2]string{"services", "endpointslices"}

// watching notes a watch of resource that the API server accepted: its
// informer no longer fails.
func (w *watch) watching(resource string) {
	if i := slices.Index(watched[:], resource); i >= 0 {
		w.failing[i].Store(false)
	}
}

func (w *watch) probing(ctx context.Context) {
	t := time.NewTicker(probeEvery)
	defer t.Stop()
	for {
		err := w.probe.probe(ctx)
		w.probeErr.Store(&err)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// state says whether the watch follows the cluster, and why not.
func (w *watch) state() (bool, string) {
	switch {
	case !w.svc.HasSynced() || !w.eps.HasSynced():
		return false, "the watch has not listed the cluster's Services and EndpointSlices yet"
	case w.failing[0].Load() || w.failing[1].Load():
		return false, "the watch fails"
	}
	if err := *w.probeErr.Load(); err != nil {
		return false, "the API server does not answer: " + err.Error()
	}
	return true, ""
}

func (w *watch) load() *admin.KubernetesAPI {
	return &admin.KubernetesAPI{Lists: w.lists.Load(), Watches: w.watches.Load(), Other: w.other.Load(), Bytes: w.bytes.Load()}
}

// subscriber is one block's use of a watch: its view and emitter, fed by
// its handlers on the watch's informers.
type subscriber struct {
	w    *watch
	view *clusterView
	em   *emitter
	c    *counters
	log  func(up bool, why string)
	base *baseline
	// filled: its handlers have had the informers' objects (watchHealth's);
	// closed: it stops, and its handlers change the view no more (under
	// the emitter's lock).
	filled, closed bool
	regs           []struct {
		inf cache.SharedIndexInformer
		reg cache.ResourceEventHandlerRegistration
	}
	stop chan struct{}
	done chan struct{}
}

func subscribe(w *watch, view *clusterView, em *emitter, c *counters, base *baseline, log func(bool, string)) (*subscriber, error) {
	s := &subscriber{w: w, view: view, em: em, c: c, log: log, base: base, stop: make(chan struct{}), done: make(chan struct{})}
	// The adds of the objects the informer holds when the handler comes
	// (isInInitialList) fill the view and flush nothing.
	svc := cache.ResourceEventHandlerDetailedFuncs{
		AddFunc:    func(o any, initial bool) { s.service(o, initial) },
		UpdateFunc: func(_, o any) { s.service(o, false) },
		DeleteFunc: func(o any) { s.serviceGone(o) },
	}
	eps := cache.ResourceEventHandlerDetailedFuncs{
		AddFunc:    func(o any, initial bool) { s.endpoints(o, initial) },
		UpdateFunc: func(_, o any) { s.endpoints(o, false) },
		DeleteFunc: func(o any) { s.endpointsGone(o) },
	}
	for _, h := range []struct {
		inf cache.SharedIndexInformer
		h   cache.ResourceEventHandler
	}{{w.svc, svc}, {w.eps, eps}} {
		reg, err := h.inf.AddEventHandler(h.h)
		if err != nil {
			s.unregister()
			return nil, err
		}
		s.regs = append(s.regs, struct {
			inf cache.SharedIndexInformer
			reg cache.ResourceEventHandlerRegistration
		}{h.inf, reg})
	}
	go s.watchHealth()
	return s, nil
}

func (s *subscriber) service(o any, initial bool) {
	if svc, ok := o.(*object.Service); ok {
		s.update(func(b *batch) { s.view.Service(orNil(b, initial), svc.Index, svc) })
	}
}

func (s *subscriber) serviceGone(o any) {
	key := ""
	switch x := o.(type) {
	case *object.Service:
		key = x.Index
	case cache.DeletedFinalStateUnknown:
		// Its key is NAMESPACE/NAME; the view's, NAME.NAMESPACE.
		if ns, name, ok := strings.Cut(x.Key, "/"); ok {
			key = object.ServiceKey(name, ns)
		}
	}
	if key != "" {
		s.update(func(b *batch) { s.view.Service(b, key, nil) })
	}
}

func (s *subscriber) endpoints(o any, initial bool) {
	if e, ok := o.(*object.Endpoints); ok {
		s.update(func(b *batch) { s.view.Endpoints(orNil(b, initial), keyOf(e), e) })
	}
}

func (s *subscriber) endpointsGone(o any) {
	var key epKey
	switch x := o.(type) {
	case *object.Endpoints:
		key = keyOf(x)
	case cache.DeletedFinalStateUnknown:
		ns, name, _ := strings.Cut(x.Key, "/")
		key = epKey{ns, name}
	}
	if key.name != "" {
		s.update(func(b *batch) { s.view.Endpoints(b, key, nil) })
	}
}

// update has the emitter call f unless s is closed: a handler may still
// run once removed, and the view is then the next source's.
func (s *subscriber) update(f func(b *batch)) {
	s.em.update(func(b *batch) {
		if !s.closed {
			f(b)
		}
	})
}

func orNil(b *batch, initial bool) *batch {
	if initial {
		return nil
	}
	return b
}

// healthEvery is how often a block reads its watch's state.
const healthEvery = time.Second

func (s *subscriber) watchHealth() {
	defer close(s.done)
	t := time.NewTicker(healthEvery)
	defer t.Stop()
	started, warned := time.Now(), false
	for {
		up, why := s.w.state()
		synced := true
		for _, r := range s.regs {
			synced = synced && r.reg.HasSynced()
		}
		if up && !synced {
			up, why = false, "the watch has not handed the block the cluster's objects yet"
		}
		if synced && !s.filled {
			s.filled = true
			base, cold := s.base.fill()
			if cold {
				s.update(s.view.namer.zones)
			}
			if base != nil {
				// The block's source before a reload stopped before this
				// one had the cluster's objects: what changed meanwhile is
				// told against what it knew.
				s.update(func(b *batch) { s.view.rebase(b, base.view) })
			}
		}
		if s.c.connected(up) {
			s.log(up, why)
			warned = true
		} else if !up && !warned && time.Since(started) >= probeEvery {
			// Never connected, so never lost: said once.
			warned = true
			s.log(false, why)
		}
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
	}
}

func (s *subscriber) unregister() {
	for _, r := range s.regs {
		_ = r.inf.RemoveEventHandler(r.reg)
	}
}

// close stops the block's use of the watch: its handlers first, then its
// emitter, which flushes what they left.
func (s *subscriber) close() {
	s.unregister()
	close(s.stop)
	<-s.done
	s.em.update(func(*batch) { s.closed = true })
	s.em.close()
	s.w.release()
}

// last is what the subscriber, closed, knew of the cluster: its view, or
// before it had the cluster's objects the base it was handed.
func (s *subscriber) last() *state {
	if s.filled {
		return &state{view: s.view}
	}
	return s.base.release()
}
