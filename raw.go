package compactcache

import (
	"github.com/coredns/coredns/plugin"
)

// rawWriters are the plugins that neither wrap the ResponseWriter to read
// or change replies nor make nested lookups through the chain. In a block of
// these alone, hits can go out as bytes.
var rawWriters = map[string]bool{
	pluginName: true,
	"acl":      true,
	"any":      true,
	"bufsize":  true,
	"cancel":   true,
	"chaos":    true,
	"errors":   true,
	"forward":  true,
	"hosts":    true,
	"local":    true,
	"loop":     true,
	"metadata": true,
	"whoami":   true,
}

func rawSafe(handlers []plugin.Handler) bool {
	for _, h := range handlers {
		if !rawWriters[h.Name()] {
			return false
		}
	}
	return true
}
