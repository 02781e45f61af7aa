package kube

import (
	"fmt"
	"sync"

	"github.com/compactcache/compactcache/internal/admin"
	"github.com/compactcache/compactcache/internal/lifecycle"
	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"
)

// sources are the running sources, by the key of their block's cache.
var sources sync.Map // key → *Invalidator

// Setup starts the source of cfg for the block of c, whose cache is key,
// once its chain is known (the plugins after the one named name, where
// the kubernetes plugin to follow is), and stops it with the block: after
// health's lameduck at the process's stop, so that a replica still
// answering while it leaves its Service drops what changes. A
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
		t := target(sc.ViewName)
		t.Block = fmt.Sprint(c.ServerBlockKeys, sc.ListenHosts, sc.ViewName)
		inv, err := Start(cfg, next, t)
		if err != nil {
			return plugin.Error(name, err)
		}
		sources.Store(key, inv)
		waiting.Add(c, key)
		return nil
	})
	lifecycle.OnStop(c, func() { stop(key) })
}

// waiting are the keys of the blocks whose sources run, until their
// instance's servers are up; the sources of an instance that never starts
// (a failed reload, which also never shuts down) are stopped.
var waiting = lifecycle.New(started, stop)

// started tells the source of the block whose cache is key, if one runs,
// that its instance's servers are up.
func started(_ *caddy.Instance, key any) {
	if inv, ok := sources.Load(key); ok {
		inv.(*Invalidator).Started()
	}
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

// stop stops the source of the block whose cache is key, if one runs,
// and hands what it knew to the block's next source.
func stop(key any) {
	if inv, ok := sources.LoadAndDelete(key); ok {
		inv.(*Invalidator).Stop()
		handOver(inv.(*Invalidator))
	}
}
