// Package lifecycle ties what a Corefile block starts beside its servers
// (a front end's sockets, a source of invalidations, a shared tier's
// connections, a registration with an admin listener, timed snapshot
// writes) to whether its caddy instance's servers come up.
//
// caddy runs an instance's OnStartup hooks and only then starts its
// servers. When that fails on a reload (a port another process holds, a
// later block's startup error), caddy keeps the running instance, runs the
// running instance's OnRestartFailed hooks, and neither starts nor shuts
// down the new one: its OnShutdown hooks never run, and what its blocks
// started would run on for good. A Waiting holds each such thing until its
// instance's servers are up (caddy.InstanceStartupEvent), and stops those
// whose instance never got there: when the reload fails, by the hook
// watchRestart gives the running instance's OnRestartFailed, or else when
// the next instance starts.
//
// OnStop is the other end: what a block stops with its instance, at a
// reload with the instance it replaces, and at the process's stop after
// the final shutdown callbacks (health's lameduck); OnLastStop what runs
// after all that at the process's stop.
package lifecycle

import (
	"sync"
	"sync/atomic"

	"github.com/coredns/caddy"
)

// Waiting is what blocks started that waits for its instance's servers.
type Waiting[T comparable] struct {
	start func(inst *caddy.Instance, t T) // the servers are up; may be nil
	stop  func(t T)                       // they never came up; may be nil

	mu      sync.Mutex
	waiting map[T]struct{}
}

// New returns a Waiting that calls start for each thing added once its
// instance's servers are up, and stop for each whose instance failed.
func New[T comparable](start func(inst *caddy.Instance, t T), stop func(t T)) *Waiting[T] {
	w := &Waiting[T]{start: start, stop: stop, waiting: map[T]struct{}{}}
	all.Lock()
	defer all.Unlock()
	all.sets = append(all.sets, w)
	return w
}

// Add holds t, which the block of c started or opened, until c's
// instance's servers are up.
func (w *Waiting[T]) Add(c *caddy.Controller, t T) {
	hook()
	watchRestart(c)
	w.mu.Lock()
	w.waiting[t] = struct{}{}
	w.mu.Unlock()
	c.Set(w, append(w.Of(c), t))
}

// Of returns what the blocks of c's instance added, in the order they did.
func (w *Waiting[T]) Of(c *caddy.Controller) []T {
	ts, _ := c.Get(w).([]T)
	return ts
}

// started starts what the blocks of inst, whose servers are up, added.
func (w *Waiting[T]) started(inst *caddy.Instance) {
	inst.StorageMu.RLock()
	ts, _ := inst.Storage[w].([]T)
	inst.StorageMu.RUnlock()
	w.mu.Lock()
	for _, t := range ts {
		delete(w.waiting, t)
	}
	w.mu.Unlock()
	if w.start != nil {
		for _, t := range ts {
			w.start(inst, t)
		}
	}
}

// stopFailed stops what is still waiting: its instance's servers never
// came up, since an instance starts or fails before the next one begins.
func (w *Waiting[T]) stopFailed() {
	w.mu.Lock()
	left := w.waiting
	w.waiting = map[T]struct{}{}
	w.mu.Unlock()
	if w.stop != nil {
		for t := range left {
			w.stop(t)
		}
	}
}

// set is a Waiting of any type.
type set interface {
	started(inst *caddy.Instance)
	stopFailed()
}

// all are the process's Waitings, made once each, at package init.
var all struct {
	sync.Mutex
	sets []set
}

func sets() []set {
	all.Lock()
	defer all.Unlock()
	return all.sets
}

// hook registers onEvent with caddy unless it is registered. Registering
// it once, at init, is not enough: a reload by SIGUSR1 drops every event
// hook before it sets the new instance up (caddy's sigtrap_posix.go,
// purgeEventHooks), and nothing would start after the first such reload
// (CoreDNS's reload plugin, which registers its hook once, stops so:
// coredns/coredns#6263). Add calls it, at a block's startup, which comes
// after that drop.
func hook() {
	hooked.Lock()
	defer hooked.Unlock()
	// RegisterEventHook panics when a hook of the name is registered, and
	// caddy has no other way to ask.
	defer func() { _ = recover() }()
	caddy.RegisterEventHook("compactcache-lifecycle", onEvent)
}

var hooked sync.Mutex

func onEvent(event caddy.EventName, info any) error {
	inst, ok := info.(*caddy.Instance)
	if event != caddy.InstanceStartupEvent || !ok {
		return nil
	}
	for _, s := range sets() {
		s.started(inst)
	}
	// What is left belongs to an instance that never started, whose
	// failed reload did not stop it (one by SIGUSR1 restores the event
	// hooks of before it, but not the OnRestartFailed hooks; see hook).
	stopAllFailed()
	return nil
}

// ownKey marks, in an instance's storage, the instance whose blocks call
// watchRestart; watchedKey an instance that stops what failed.
type (
	ownKey     struct{}
	watchedKey struct{}
)

// watchRestart has every running instance, which c's instance replaces on a
// reload, stop what failed when the reload fails: caddy then runs its
// OnRestartFailed callbacks, and it may have no block of this plugin (a
// Corefile that switches from cache to compactcache). Else what c's
// instance started would run on until an instance with an event hook
// starts, and after a reload by SIGUSR1, which purges the event hooks and
// on failure restores those of before, which then hold none of this
// package's, until one whose blocks add something: a front end's sockets
// unread in the SO_REUSEPORT group of an address the running servers
// answer on would take a share of their queries. caddy sets a new instance
// up on the goroutine that restarts the running one, which reads its
// OnRestartFailed only after that.
func watchRestart(c *caddy.Controller) {
	if c.Get(ownKey{}) != nil {
		return
	}
	own := new(int)
	c.Set(ownKey{}, own)
	for _, inst := range caddy.Instances() {
		inst.StorageMu.Lock()
		hook := inst.Storage[ownKey{}] != own && inst.Storage[watchedKey{}] == nil
		if hook {
			inst.Storage[watchedKey{}] = true
		}
		inst.StorageMu.Unlock()
		if hook {
			inst.OnRestartFailed = append(inst.OnRestartFailed, func() error {
				stopAllFailed()
				return nil
			})
		}
	}
}

// stopsKey keeps, in an instance's storage, what its blocks gave OnStop.
type stopsKey struct{}

// OnStop calls stop once when the instance of c's block stops. At a reload
// that is with the running instance's shutdown callbacks, as the new one
// takes over. At the process's stop (SIGTERM) it is with the final ones,
// after health's lameduck, during which CoreDNS's servers keep answering
// while the pod leaves its Service, and so must what the block runs beside
// them; caddy runs every shutdown callback before the final ones.
func OnStop(c *caddy.Controller, stop func()) {
	var once sync.Once
	stopOnce := func() error {
		once.Do(stop)
		return nil
	}
	var reloading atomic.Bool
	c.OnRestart(func() error {
		reloading.Store(true)
		return nil
	})
	c.OnRestartFailed(func() error {
		reloading.Store(false)
		return nil
	})
	c.OnShutdown(func() error {
		if reloading.Load() {
			stopOnce()
		}
		return nil
	})
	c.OnFinalShutdown(stopOnce)
	stops, _ := c.Get(stopsKey{}).([]func() error)
	c.Set(stopsKey{}, append(stops, stopOnce))
}

// OnLastStop calls last at the process's stop (SIGTERM), after the final
// shutdown callbacks every block of c's instance gave as it was set up:
// health's lameduck, and what the blocks gave OnStop, the sources of
// flushes among them (the shared tier, the Kubernetes API, the admin
// listener), which apply flushes until then. Not at a reload. caddy runs
// the final callbacks in the order given, and one given as the instance
// starts comes after every block's setup.
func OnLastStop(c *caddy.Controller, last func()) {
	c.OnStartup(func() error {
		c.OnFinalShutdown(func() error {
			last()
			return nil
		})
		return nil
	})
}

// Stop runs what the blocks of inst gave OnStop, as the process's stop
// does, for a program that stops an instance without caddy's final
// shutdown callbacks, which stop what the process shares too.
func Stop(inst *caddy.Instance) {
	inst.StorageMu.RLock()
	stops, _ := inst.Storage[stopsKey{}].([]func() error)
	inst.StorageMu.RUnlock()
	for _, stop := range stops {
		stop()
	}
}

// stopAllFailed stops what the blocks of instances whose servers never
// came up started.
func stopAllFailed() {
	for _, s := range sets() {
		s.stopFailed()
	}
}
