package tier

import (
	"slices"
	"sync"

	"github.com/coredns/caddy"
)

// Blocks of one Corefile on other ports may use one tier's server with the
// same settings and forward each to an upstream of its own: their answers
// differ, and they must share neither values nor flushes. Replicas, each
// of one Corefile, must share both, whatever ports they listen on (a test's
// free ports, a pod's). So a block mixes its ports into its keys only when
// another block of its Corefile uses the same server on other ports; a
// block alone on its server keeps the keys of its settings and view.

// parsing are the tiers parsed for the instance being set up. caddy sets
// its instances up one at a time, and parses every block's options before
// any block starts, so once a block starts its Corefile's tiers are all
// there.
var parsing struct {
	sync.Mutex
	ctx   caddy.Context
	tiers *[]*Config
}

// declare adds cfg, parsed for a block of the instance whose setup context
// is ctx, to that instance's tiers.
func declare(ctx caddy.Context, cfg *Config) {
	parsing.Lock()
	defer parsing.Unlock()
	if parsing.ctx != ctx || parsing.tiers == nil {
		parsing.ctx, parsing.tiers = ctx, new([]*Config)
	}
	*parsing.tiers = append(*parsing.tiers, cfg)
	cfg.peers = parsing.tiers
}

// apart returns the ports to mix into cfg's keys: its own, when another
// block of its Corefile uses the same server on other ports; else none.
func (cfg *Config) apart() []string {
	if cfg.peers == nil {
		return nil
	}
	parsing.Lock()
	defer parsing.Unlock()
	for _, o := range *cfg.peers {
		if o != cfg && o.sameServer(cfg) && !slices.Equal(o.ports, cfg.ports) {
			return cfg.ports
		}
	}
	return nil
}

// sameServer reports whether cfg and o read and write the same keys'
// server: the same addresses, user and database.
func (cfg *Config) sameServer(o *Config) bool {
	return slices.Equal(cfg.addrs, o.addrs) && cfg.sentinel == o.sentinel && cfg.username == o.username && cfg.db == o.db
}
