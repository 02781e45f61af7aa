package kube

import (
	"sync"

	"github.com/compactcache/compactcache/internal/admin"
	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"
)

// sources are the running sources, by the key of their block's cache.
var sources sync.Map // key → *Invalidator

// Setup starts the source of cfg for the block of c, whose cache is key,
// once its chain is known (the plugins after the one named name, where
// the kubernetes plugin to follow is), and stops it with the block. A
// source that cannot start fails the start, with what to write instead.
// target is read then, once the block's cache is settled.
func Setup(c *caddy.Controller, key any, cfg *Config, name string, target func(view string) Target) {
	c.OnStartup(func() error {
		sc := dnsserver.GetConfig(c)
		hs := sc.Handlers()
		var next []plugin.Handler
		for i, h := range hs {
			if h.Name() == name {
				next = hs[i+1:]
				break
			}
		}
		inv, err := Start(cfg, next, target(sc.ViewName))
		if err != nil {
			return plugin.Error(name, err)
		}
		sources.Store(key, inv)
		unstarted.add(c, key)
		return nil
	})
	c.OnShutdown(func() error {
		stop(key)
		return nil
	})
	// A reload failed: the new instance, whose sources may have started,
	// never starts its servers nor shuts down. caddy runs this instance's
	// hook (the old one's, still serving), which stops the new one's
	// sources, not its own.
	c.OnRestartFailed(func() error {
		unstarted.stopAll()
		return nil
	})
}

// StatsOf is what the source of the block whose cache is key has done
// since it started; nil without one.
func StatsOf(key any) *admin.Kubernetes {
	inv, ok := sources.Load(key)
	if !ok {
		return nil
	}
	st := inv.(*Invalidator).Stats()
	return &st
}

// Running returns the keys of the blocks whose sources run.
func Running() (keys []any) {
	sources.Range(func(key, _ any) bool {
		keys = append(keys, key)
		return true
	})
	return keys
}

// stop stops the source of the block whose cache is key, if one runs.
func stop(key any) {
	if inv, ok := sources.LoadAndDelete(key); ok {
		inv.(*Invalidator).Stop()
	}
}

// startedKey keeps, in a caddy instance's storage, the keys of its blocks
// whose sources started, until the instance's servers are up.
type startedKey struct{}

func init() { caddy.RegisterEventHook("compactcache-kubernetes", started) }

// started marks the sources of an instance whose servers are up as
// started, and stops those left of instances that never started: a failed
// reload from an instance without compactcache, whose hook would have.
func started(event caddy.EventName, info any) error {
	inst, ok := info.(*caddy.Instance)
	if event != caddy.InstanceStartupEvent || !ok {
		return nil
	}
	inst.StorageMu.RLock()
	keys, _ := inst.Storage[startedKey{}].([]any)
	inst.StorageMu.RUnlock()
	unstarted.remove(keys)
	unstarted.stopAll()
	return nil
}

// unstarted are the blocks whose sources run and whose instance's servers
// are not up yet.
var unstarted = keySet{m: map[any]bool{}}

type keySet struct {
	mu sync.Mutex
	m  map[any]bool
}

// add records key, of the block of c, until c's instance's servers are up.
func (s *keySet) add(c *caddy.Controller, key any) {
	s.mu.Lock()
	s.m[key] = true
	s.mu.Unlock()
	keys, _ := c.Get(startedKey{}).([]any)
	c.Set(startedKey{}, append(keys, key))
}

func (s *keySet) remove(keys []any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range keys {
		delete(s.m, k)
	}
}

// stopAll stops the sources of the set's blocks, and empties it.
func (s *keySet) stopAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for key := range s.m {
		stop(key)
		delete(s.m, key)
	}
}
