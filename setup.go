package compactcache

import (
	"fmt"
	"strings"
	"time"

	"github.com/compactcache/compactcache/internal/admin"
	"github.com/compactcache/compactcache/internal/adminserver"
	"github.com/compactcache/compactcache/internal/cachemetrics"
	"github.com/compactcache/compactcache/internal/config"
	"github.com/compactcache/compactcache/internal/coredns"
	"github.com/compactcache/compactcache/internal/frontend"
	"github.com/compactcache/compactcache/internal/lifecycle"
	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"
	clog "github.com/coredns/coredns/plugin/pkg/log"
)

const pluginName = "compactcache"

var log = clog.NewWithPlugin(pluginName)

var stopWait = 5 * time.Second // the process's stop waits for background fetches

func init() { plugin.Register(pluginName, setup) }

func setup(c *caddy.Controller) error {
	if _, err := cachemetrics.Register(); err != nil {
		return plugin.Error(pluginName, err)
	}
	ca, err := parse(c)
	if err != nil {
		return plugin.Error(pluginName, err)
	}
	if err := ca.Snapshot.Setup(c, operator{ca}); err != nil {
		return plugin.Error(pluginName, err)
	}
	// A warm-up from a peer, at the process's first startup alone: its
	// OnFirstStartup callbacks run before the OnStartup ones, which know
	// the block's name.
	first := false
	c.OnFirstStartup(func() error {
		first = true
		return nil
	})
	// The block's name for handoffs, known once the servers are made: blocks
	// of several views or binds share their keys.
	var block string
	c.OnRestart(func() error {
		ca.offer(block)
		return nil
	})
	c.OnRestartFailed(func() error {
		withdraw(block, ca.store)
		return nil
	})
	c.OnStartup(func() error {
		cfg := dnsserver.GetConfig(c)
		ca.plan = planOf(cfg.Handlers())
		if ca.plan.stock {
			// Two caches in a row: the mistake of a switch half made.
			return plugin.Error(pluginName, fmt.Errorf("the block has cache too; compactcache replaces it: remove cache"))
		}
		block = blockID(c.ServerBlockKeys, cfg.ListenHosts, cfg.ViewName)
		if ca.takeOver(block) {
			log.Infof("Reloaded %s with the cache of the previous instance: %d entries", block, ca.Stats().Entries)
		}
		if first && ca.Warmup != nil {
			ca.Warmup.Start(operator{ca}, block)
		}
		ca.metrics.View = cfg.ViewName
		ca.StartShared(cfg.ViewName)
		if ca.Shared != nil {
			connected.Add(c, ca)
		}
		ca.listen = coredns.ServerAddrs(c)
		if ca.Frontend != nil {
			if err := frontend.Setup(c, cfg, ca.Frontend, pluginName, frontCache{ca}); err != nil {
				return plugin.Error(pluginName, err)
			}
		}
		return nil
	})
	adminserver.Hooks(c, operator{ca}, func() admin.Block {
		cfg := dnsserver.GetConfig(c)
		return admin.Block{Name: block, Zones: ca.Zones, Listen: ca.listen, View: cfg.ViewName}
	})
	// Background fetches end with the instance; a reload does not wait for
	// them, which a failing upstream may hold past the new one's start.
	c.OnShutdown(func() error {
		withdraw(block, ca.store)
		ca.refreshes.cancel()
		return nil
	})
	c.OnFinalShutdown(func() error { ca.refreshes.shutdown(stopWait); return nil })
	lifecycle.OnStop(c, ca.StopShared)
	setupKubernetes(c, ca) // after OnStartup's takeOver: it flushes the store the block ends with
	dnsserver.GetConfig(c).AddPlugin(func(next plugin.Handler) plugin.Handler {
		ca.Next = next
		return ca
	})
	return nil
}

// parse makes the Cache of the block c is on.
func parse(c *caddy.Controller) (*Cache, error) {
	s, err := config.Parse(c)
	if err != nil {
		return nil, err
	}
	ca, err := newCache(s)
	if err != nil {
		return nil, fmt.Errorf("capacity: %w", err)
	}
	ca.metrics.Zones = strings.Join(ca.Zones, ",")
	return ca, nil
}

// ParseSize parses a byte count such as 256MiB, 1G or 1048576 as the
// capacity option does; deploy/ sizes containers from it.
func ParseSize(s string) (int64, error) { return config.ParseSize(s) }
