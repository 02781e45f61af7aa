package compactcache

import (
	"fmt"
	"github.com/compactcache/compactcache/internal/admin"
	"github.com/compactcache/compactcache/internal/adminserver"
	"github.com/compactcache/compactcache/internal/cachemetrics"
	"github.com/compactcache/compactcache/internal/coredns"
	"github.com/compactcache/compactcache/internal/persist"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/compactcache/compactcache/internal/frontend"
	"github.com/compactcache/compactcache/internal/store"
	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"
	clog "github.com/coredns/coredns/plugin/pkg/log"
)

const pluginName = "compactcache"

var log = clog.NewWithPlugin(pluginName)

func init() { plugin.Register(pluginName, setup) }

func setup(c *caddy.Controller) error {
	if _, err := cachemetrics.Register(); err != nil {
		return plugin.Error(pluginName, err)
	}
	ca, err := parse(c)
	if err != nil {
		return plugin.Error(pluginName, err)
	}
	if ca.snapshot != nil {
		ca.snapshot.Setup(c, operator{ca})
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
		frontend.CloseUnstarted() // what a failed new instance opened
		return nil
	})
	c.OnStartup(func() error {
		cfg := dnsserver.GetConfig(c)
		for _, h := range cfg.Handlers() {
			if h.Name() == "cache" {
				// Two caches in a row: the mistake of a switch half made.
				return plugin.Error(pluginName, fmt.Errorf("the block has cache too; compactcache replaces it: remove cache"))
			}
		}
		block = blockID(c.ServerBlockKeys, cfg.ListenHosts, cfg.ViewName)
		if ca.takeOver(block) {
			log.Infof("Reloaded %s with the cache of the previous instance: %d entries", block, ca.Stats().Entries)
		}
		if first && ca.warmup != nil {
			ca.warmup.Start(operator{ca}, block)
		}
		ca.metrics.View = cfg.ViewName
		ca.listen = coredns.ServerAddrs(cfg)
		ca.raw = rawPlanOf(cfg.Handlers())
		for _, h := range cfg.Handlers() {
			if b, ok := h.(ZoneBypasser); ok {
				ca.bypass = append(ca.bypass, newZoneSet(b.CacheBypassZones())...)
			}
		}
		if ca.frontend != nil {
			ca.front = frontPolicyOf(cfg.Handlers())
			if err := frontend.Setup(c, cfg, ca.frontend, pluginName, frontCache{ca}); err != nil {
				return plugin.Error(pluginName, err)
			}
		}
		return nil
	})
	adminserver.Hooks(c, operator{ca}, func() admin.Block {
		cfg := dnsserver.GetConfig(c)
		return admin.Block{Name: block, Zones: ca.Zones, Listen: ca.listen, View: cfg.ViewName}
	})
	// Background fetches end with the instance, on shutdown and on reload.
	c.OnShutdown(func() error {
		withdraw(block, ca.store)
		ca.refreshes.shutdown(5 * time.Second)
		return nil
	})
	dnsserver.GetConfig(c).AddPlugin(func(next plugin.Handler) plugin.Handler {
		ca.Next = next
		return ca
	})
	return nil
}

// ZoneBypasser is the stock cache's interface for plugins whose zones must
// always be answered by them, never from the cache.
type ZoneBypasser interface {
	CacheBypassZones() []string
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
		ca.zones = newZoneSet(ca.Zones)
		seen := map[string]bool{}
		for c.NextBlock() {
			opt := c.Val()
			if seen[opt] && onlyOnce[opt] {
				return nil, fmt.Errorf("%s: can only be given once", opt)
			}
			seen[opt] = true
			if err := parseOption(c, ca); err != nil {
				return nil, err
			}
		}
		if seen["serve_stale_policy"] && !seen["serve_stale"] {
			return nil, fmt.Errorf("serve_stale_policy: requires serve_stale")
		}
	}
	ca.metrics.Zones = strings.Join(ca.Zones, ",")
	if err := ca.init(); err != nil {
		return nil, fmt.Errorf("capacity: %w", err)
	}
	return ca, nil
}

// onlyOnce are the options a block may give once; the stock cache lets the
// last of the others win, and so does this one.
var onlyOnce = map[string]bool{"capacity": true, "serve_stale_policy": true, "ecs": true, "frontend": true, "snapshot": true, "admin": true, "warmup": true}

func parseOption(c *caddy.Controller, ca *Cache) error {
	opt := c.Val()
	args := c.RemainingArgs()
	switch opt {
	case "capacity":
		if len(args) != 1 {
			return fmt.Errorf("capacity: want one SIZE, got %d arguments", len(args))
		}
		size, err := ParseSize(args[0])
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
	case "prefetch":
		return parsePrefetch(args, ca)
	case "serve_stale":
		return parseServeStale(args, ca)
	case "serve_stale_policy":
		if len(args) != 1 || !strings.EqualFold(args[0], "prefer_positive") {
			return fmt.Errorf("serve_stale_policy: want prefer_positive, got %q", args)
		}
		ca.preferPositive = true
	case "disable":
		return parseDisable(args, ca)
	case "ecs":
		return parseECS(c, args, ca)
	case "frontend":
		fc, err := frontend.Parse(c, args)
		ca.frontend = fc
		return err
	case "snapshot":
		sc, err := persist.ParseSnapshot(args)
		ca.snapshot = sc
		return err
	case "admin":
		return adminserver.Parse(c, args)
	case "warmup":
		wc, err := persist.ParseWarmup(c, args)
		ca.warmup = wc
		return err
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

// parseTTL parses a TTL in seconds, at least lowest and at most the
// largest TTL there is (RFC 2181 section 8).
func parseTTL(what, s string, lowest int) (time.Duration, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < lowest || n > math.MaxInt32 {
		return 0, fmt.Errorf("%s: %q is not a number of seconds between %d and %d", what, s, lowest, math.MaxInt32)
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

// ParseSize parses a byte count such as 256MiB, 1G or 1048576 as the
// capacity option does; deploy/ sizes containers from it.
func ParseSize(s string) (int64, error) {
	num, scale := s, int64(1)
	for _, u := range sizeUnits {
		if strings.HasSuffix(s, u.suffix) {
			num, scale = strings.TrimSuffix(s, u.suffix), u.scale
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n <= 0 || n > store.MaxCapacity/scale {
		return 0, fmt.Errorf("%q is not a size such as 64MiB, 1GiB or a number of bytes", s)
	}
	return n * scale, nil
}

// parsePrefetch parses `prefetch AMOUNT [[DURATION] [PERCENTAGE%]]`. A
// DURATION under a second is a second: entries keep their hits in seconds.
func parsePrefetch(args []string, ca *Cache) error {
	if len(args) == 0 || len(args) > 3 {
		return fmt.Errorf("prefetch: want AMOUNT [[DURATION] [PERCENTAGE%%]], got %d arguments", len(args))
	}
	n, err := strconv.Atoi(args[0])
	if err != nil || n < 0 || n > math.MaxUint16 {
		return fmt.Errorf("prefetch: AMOUNT %q is not a number of queries between 0 and %d", args[0], math.MaxUint16)
	}
	ca.prefetch = n
	rest := args[1:]
	if len(rest) > 0 && !strings.HasSuffix(rest[0], "%") {
		d, err := time.ParseDuration(rest[0])
		if err != nil || d <= 0 {
			return fmt.Errorf("prefetch: DURATION %q is not a positive duration such as 1m", rest[0])
		}
		ca.prefetchWindow = max(d, time.Second)
		rest = rest[1:]
	}
	if len(rest) == 0 {
		return nil
	}
	pct, ok := strings.CutSuffix(rest[0], "%")
	if !ok {
		return fmt.Errorf("prefetch: PERCENTAGE %q needs its %% sign", rest[0])
	}
	p, err := strconv.Atoi(pct)
	if err != nil || p < 10 || p > 90 {
		return fmt.Errorf("prefetch: PERCENTAGE %q is not between 10%% and 90%%", rest[0])
	}
	ca.percentage = p
	if len(rest) > 1 {
		return fmt.Errorf("prefetch: %q after PERCENTAGE %q; want AMOUNT [[DURATION] [PERCENTAGE%%]]", rest[1], rest[0])
	}
	return nil
}

// parseServeStale parses `serve_stale [DURATION] [immediate [RESPONSE_TTL
// [FAILURE_RECHECK]] | verify [VERIFY_TIMEOUT [RESPONSE_TTL [FAILURE_RECHECK]]]]`.
func parseServeStale(args []string, ca *Cache) error {
	if len(args) > 5 {
		return fmt.Errorf("serve_stale: want at most 5 arguments, got %d", len(args))
	}
	ca.staleUpTo, ca.verifyStale, ca.verifyTimeout = time.Hour, false, 0
	ca.staleTTL, ca.failRecheck = defaultStaleTTL, defaultFailRecheck
	if len(args) == 0 {
		return nil
	}
	d, err := time.ParseDuration(args[0])
	if err != nil || d < 0 {
		return fmt.Errorf("serve_stale: DURATION %q is not a duration such as 1h", args[0])
	}
	ca.staleUpTo = d
	if len(args) == 1 {
		return nil
	}
	rest := args[2:]
	switch mode := strings.ToLower(args[1]); mode {
	case "immediate":
		if len(rest) > 2 {
			return fmt.Errorf("serve_stale: immediate takes [RESPONSE_TTL [FAILURE_RECHECK]], got %q", rest)
		}
	case "verify":
		ca.verifyStale = true
		if len(rest) > 0 {
			t, err := time.ParseDuration(rest[0])
			if err != nil || t < 0 {
				return fmt.Errorf("serve_stale: VERIFY_TIMEOUT %q is not a duration such as 100ms", rest[0])
			}
			ca.verifyTimeout = t
			rest = rest[1:]
		}
	default:
		return fmt.Errorf("serve_stale: mode %q is not immediate or verify", args[1])
	}
	if len(rest) > 0 {
		t, err := time.ParseDuration(rest[0])
		if err != nil || t < 0 || t%time.Second != 0 {
			return fmt.Errorf("serve_stale: RESPONSE_TTL %q is not a whole number of seconds such as 30s", rest[0])
		}
		if t/time.Second > math.MaxInt32 {
			return fmt.Errorf("serve_stale: RESPONSE_TTL %q is above the largest TTL, %ds", rest[0], math.MaxInt32)
		}
		ca.staleTTL = t
	}
	if len(rest) > 1 {
		t, err := time.ParseDuration(rest[1])
		if err != nil || t < 0 || t > 5*time.Minute {
			return fmt.Errorf("serve_stale: FAILURE_RECHECK %q is not a duration between 0s and 5m", rest[1])
		}
		ca.failRecheck = t
	}
	return nil
}

// parseDisable parses `disable success|denial [ZONES...]`.
func parseDisable(args []string, ca *Cache) error {
	if len(args) == 0 {
		return fmt.Errorf("disable: want success or denial and optional ZONES")
	}
	zones := []string{"."}
	if len(args) > 1 {
		zones = zones[:0]
		for _, z := range args[1:] {
			nz := plugin.Name(z).Normalize()
			if nz == "" {
				return fmt.Errorf("disable: zone %q is not a domain name", z)
			}
			zones = append(zones, nz)
		}
	}
	switch args[0] {
	case "success":
		ca.pexcept = zones
	case "denial":
		ca.nexcept = zones
	default:
		return fmt.Errorf("disable: %q is not success or denial", args[0])
	}
	return nil
}

// parseECS parses `ecs [SOURCE4 [SOURCE6]] { add; max_variants N }`. The
// block is read token by token: the caddy dispenser's NextBlock would take
// the options after a block-less `ecs` for its own.
func parseECS(c *caddy.Controller, args []string, ca *Cache) error {
	// RemainingArgs stops before a block's brace, on the same line.
	block := c.NextArg()
	if len(args) > 2 {
		return fmt.Errorf("ecs: want [SOURCE4 [SOURCE6]], got %d arguments", len(args))
	}
	for i, bits := range []int{32, 128} {
		if i >= len(args) {
			break
		}
		n, err := strconv.Atoi(args[i])
		if err != nil || n < 0 || n > bits {
			return fmt.Errorf("ecs: source prefix %q is not a length between 0 and %d", args[i], bits)
		}
		if i == 0 {
			ca.ecs.source4 = n
		} else {
			ca.ecs.source6 = n
		}
	}
	for block && c.Next() && c.Val() != "}" {
		switch opt, args := c.Val(), c.RemainingArgs(); opt {
		case "add":
			if len(args) != 0 {
				return fmt.Errorf("ecs: add takes no arguments, got %q", args)
			}
			ca.ecs.add = true
		case "max_variants":
			n := -1
			if len(args) == 1 {
				n, _ = strconv.Atoi(args[0])
			}
			if n < 1 || n > 1000 {
				return fmt.Errorf("ecs: max_variants wants one number between 1 and 1000, got %q", args)
			}
			ca.ecs.maxVariants = n
		default:
			return fmt.Errorf("ecs: unknown option %q", opt)
		}
	}
	return nil
}
