package compactcache

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"
	clog "github.com/coredns/coredns/plugin/pkg/log"
)

const pluginName = "compactcache"

var log = clog.NewWithPlugin(pluginName)

func init() { plugin.Register(pluginName, setup) }

func setup(c *caddy.Controller) error {
	ca, err := parse(c)
	if err != nil {
		return plugin.Error(pluginName, err)
	}
	c.OnStartup(func() error {
		ca.metrics.view = dnsserver.GetConfig(c).ViewName
		ca.SetRawWrites(rawSafe(dnsserver.GetConfig(c).Handlers()))
		return nil
	})
	dnsserver.GetConfig(c).AddPlugin(func(next plugin.Handler) plugin.Handler {
		ca.Next = next
		return ca
	})
	return nil
}

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

func parse(c *caddy.Controller) (*Cache, error) {
	ca := New()
	for i := 0; c.Next(); i++ {
		if i > 0 {
			return nil, plugin.ErrOnce
		}
		args := c.RemainingArgs()
		// The first argument is the TTL when it is a number, else a zone.
		if len(args) > 0 {
			if _, err := strconv.Atoi(args[0]); err == nil {
				ttl, err := parseTTL("TTL", args[0], 1)
				if err != nil {
					return nil, err
				}
				ca.pttl, ca.nttl = ttl, ttl
				args = args[1:]
			}
		}
		ca.Zones = plugin.OriginsFromArgsOrServerBlock(args, c.ServerBlockKeys)
		for c.NextBlock() {
			if err := parseOption(c, ca); err != nil {
				return nil, err
			}
		}
	}
	ca.metrics.zones = strings.Join(ca.Zones, ",")
	if err := ca.init(); err != nil {
		return nil, fmt.Errorf("capacity: %w", err)
	}
	return ca, nil
}

func parseOption(c *caddy.Controller, ca *Cache) error {
	opt := c.Val()
	args := c.RemainingArgs()
	switch opt {
	case "capacity":
		if len(args) != 1 {
			return fmt.Errorf("capacity: want one SIZE, got %d arguments", len(args))
		}
		size, err := parseSize(args[0])
		if err != nil {
			return fmt.Errorf("capacity: %w", err)
		}
		ca.capacity = size
	case "success":
		return parseKind(opt, args, &ca.pcap, &ca.pttl, &ca.minpttl)
	case "denial":
		return parseKind(opt, args, &ca.ncap, &ca.nttl, &ca.minnttl)
	case "servfail":
		if len(args) != 1 {
			return fmt.Errorf("servfail: want one DURATION, got %d arguments", len(args))
		}
		d, err := time.ParseDuration(args[0])
		if err != nil || d < 0 || d > 5*time.Minute {
			return fmt.Errorf("servfail: %q is not a duration between 0s and 5m", args[0])
		}
		ca.failttl = d
	case "keepttl":
		if len(args) != 0 {
			return fmt.Errorf("keepttl: takes no arguments, got %q", args)
		}
		ca.keepttl = true
	default:
		return fmt.Errorf("unknown option %q", opt)
	}
	return nil
}

// parseKind parses `success|denial CAPACITY [TTL [MINTTL]]`.
func parseKind(opt string, args []string, capacity *int, ttl, minttl *time.Duration) error {
	if len(args) == 0 || len(args) > 3 {
		return fmt.Errorf("%s: want CAPACITY [TTL [MINTTL]], got %d arguments", opt, len(args))
	}
	n, err := strconv.Atoi(args[0])
	if err != nil || n < 0 {
		return fmt.Errorf("%s: CAPACITY %q is not a non-negative number of entries", opt, args[0])
	}
	*capacity = n
	if len(args) > 1 {
		if *ttl, err = parseTTL(opt+" TTL", args[1], 1); err != nil {
			return err
		}
	}
	if len(args) > 2 {
		if *minttl, err = parseTTL(opt+" MINTTL", args[2], 0); err != nil {
			return err
		}
	}
	return nil
}

// parseTTL parses a TTL in seconds, at least lowest.
func parseTTL(what, s string, lowest int) (time.Duration, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < lowest {
		return 0, fmt.Errorf("%s: %q is not a number of seconds of at least %d", what, s, lowest)
	}
	return time.Duration(n) * time.Second, nil
}

// sizeUnits are the suffixes of capacity sizes; all are binary units.
var sizeUnits = []struct {
	suffix string
	scale  int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30},
	{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30},
}

// parseSize parses a byte count such as 256MiB, 1G or 1048576.
func parseSize(s string) (int64, error) {
	num, scale := s, int64(1)
	for _, u := range sizeUnits {
		if strings.HasSuffix(s, u.suffix) {
			num, scale = strings.TrimSuffix(s, u.suffix), u.scale
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n <= 0 || n > MaxCapacity/scale {
		return 0, fmt.Errorf("%q is not a size such as 64MiB, 1GiB or a number of bytes", s)
	}
	return n * scale, nil
}
