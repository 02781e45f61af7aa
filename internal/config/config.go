// Package config reads a compactcache block of a Corefile into Settings:
// the stock cache's options, with its syntax and defaults, and those of
// compactcache (capacity, ecs, frontend, snapshot, admin, warmup, shared,
// kubernetes), each checked at startup with an error that names the option
// and the value at fault.
package config

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/compactcache/compactcache/internal/adminserver"
	"github.com/compactcache/compactcache/internal/corefile"
	"github.com/compactcache/compactcache/internal/frontend"
	"github.com/compactcache/compactcache/internal/kube"
	"github.com/compactcache/compactcache/internal/persist"
	"github.com/compactcache/compactcache/internal/store"
	"github.com/compactcache/compactcache/internal/tier"
	"github.com/coredns/caddy"
	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/plugin/pkg/dnsutil"
)

// The defaults, the stock cache's unless said otherwise.
const (
	DefaultCapacity = 64 << 20
	// DefaultMaxEntry is the per-entry limit on the bytes of records.
	DefaultMaxEntry = 64 << 10

	MaxTTL        = dnsutil.MaximumDefaultTTL
	MinDefaultTTL = dnsutil.MinimalDefaultTTL
	MaxDenialTTL  = dnsutil.MaximumDefaultTTL / 2
	ServfailTTL   = 5 * time.Second

	// DefaultStaleTTL is the TTL of stale answers RFC 8767 section 4
	// recommends; the stock cache's default is 0.
	DefaultStaleTTL = 30 * time.Second
	// DefaultFailRecheck holds back the refreshes of an entry after one
	// failed, as RFC 8767 section 5 recommends; the stock cache's default
	// is 0, a retry storm when the upstream is down.
	DefaultFailRecheck = time.Second

	// MinEntryCap is the smallest entry cap of the stock cache, which
	// keeps this many for any CAPACITY below it.
	MinEntryCap = 1024

	DefaultSource4     = 24
	DefaultSource6     = 56
	DefaultMaxVariants = 100
)

// Settings are a block's options.
type Settings struct {
	Zones []string

	Capacity   int64 // the byte budget
	SuccessCap int   // success entries allowed, 0 for the byte budget alone
	DenialCap  int   // denial entries allowed, 0 for the byte budget alone
	MaxEntry   int   // the per-entry limit on the bytes of records

	SuccessTTL, SuccessMinTTL time.Duration
	DenialTTL, DenialMinTTL   time.Duration
	ServfailTTL               time.Duration
	KeepTTL                   bool

	// Entries hit Prefetch times with no gap of PrefetchWindow are fetched
	// again when their TTL drops below PrefetchPercentage of it.
	Prefetch           int
	PrefetchWindow     time.Duration
	PrefetchPercentage int

	// serve_stale (RFC 8767): expired entries are served for StaleUpTo
	// with StaleTTL, refreshed in the background, or first in verify mode.
	StaleUpTo      time.Duration
	VerifyStale    bool
	VerifyTimeout  time.Duration // 0: wait as long as the next plugin does
	StaleTTL       time.Duration
	FailRecheck    time.Duration // no refresh of an entry this long after one failed
	PreferPositive bool

	DisableSuccess []string // zones whose successes are not cached
	DisableDenial  []string // zones whose denials are not cached

	ECS ECS

	Frontend *frontend.Config // nil unless the block asks for one
	Snapshot *persist.Snapshot
	Warmup   *persist.Warmup
	Shared   *tier.Config // the second tier, nil for none
	// Kubernetes is the invalidation from the Kubernetes API; nil unless
	// the block asks for it.
	Kubernetes *kube.Config
}

// LongestTTL is the longest TTL, in seconds, a block of s stores an answer
// with.
func (s *Settings) LongestTTL() int64 {
	return int64(max(s.SuccessTTL, s.DenialTTL, s.ServfailTTL) / time.Second)
}

// ECS is the `ecs` option: the longest source prefixes sent upstream,
// whether to add ECS for clients that sent none, and the variants kept per
// name and family.
type ECS struct {
	Source4, Source6 int
	Add              bool
	MaxVariants      int
}

// Defaults returns the settings of a block that gives no options, for the
// root zone.
func Defaults() Settings {
	return Settings{
		Zones:              []string{"."},
		Capacity:           DefaultCapacity,
		MaxEntry:           DefaultMaxEntry,
		SuccessTTL:         MaxTTL,
		SuccessMinTTL:      MinDefaultTTL,
		DenialTTL:          MaxDenialTTL,
		DenialMinTTL:       MinDefaultTTL,
		ServfailTTL:        ServfailTTL,
		PrefetchWindow:     time.Minute,
		PrefetchPercentage: 10,
		StaleTTL:           DefaultStaleTTL,
		FailRecheck:        DefaultFailRecheck,
		ECS:                ECS{Source4: DefaultSource4, Source6: DefaultSource6, MaxVariants: DefaultMaxVariants},
	}
}

// Parse reads the compactcache block c is on.
func Parse(c *caddy.Controller) (Settings, error) {
	s := Defaults()
	for i := 0; c.Next(); i++ {
		if i > 0 {
			return s, plugin.ErrOnce
		}
		args := c.RemainingArgs()
		// The first argument is the TTL when it is a number, else a zone.
		if len(args) > 0 {
			if _, err := strconv.Atoi(args[0]); err == nil {
				ttl, err := parseTTL("TTL", args[0], 1)
				if err != nil {
					return s, err
				}
				s.SuccessTTL, s.DenialTTL = ttl, ttl
				args = args[1:]
			}
		}
		s.Zones = plugin.OriginsFromArgsOrServerBlock(args, c.ServerBlockKeys)
		seen := map[string]bool{}
		for c.NextBlock() {
			opt := c.Val()
			if seen[opt] && onlyOnce[opt] {
				return s, fmt.Errorf("%s: can only be given once", opt)
			}
			seen[opt] = true
			if err := parseOption(c, &s); err != nil {
				return s, err
			}
			// What is left on the line is a `{` the option did not read,
			// whose lines the dispenser would take for options, or text
			// after the `}` of one it read.
			switch {
			case !c.NextArg():
			case c.Val() == "{":
				return s, fmt.Errorf("%s: takes no { } block", opt)
			default:
				return s, fmt.Errorf("%s: %q after its block's }: an option starts a line", opt, c.Val())
			}
		}
		if seen["serve_stale_policy"] && !seen["serve_stale"] {
			return s, fmt.Errorf("serve_stale_policy: requires serve_stale")
		}
	}
	return s, nil
}

// onlyOnce are the options a block may give once; the stock cache lets the
// last of the others win, and so does this one.
var onlyOnce = map[string]bool{"capacity": true, "serve_stale_policy": true, "ecs": true, "frontend": true, "snapshot": true, "admin": true, "warmup": true, "shared": true, "kubernetes": true}

func parseOption(c *caddy.Controller, s *Settings) error {
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
		s.Capacity = size
	case "success":
		return parseKind(opt, args, &s.SuccessCap, &s.SuccessTTL, &s.SuccessMinTTL)
	case "denial":
		return parseKind(opt, args, &s.DenialCap, &s.DenialTTL, &s.DenialMinTTL)
	case "servfail":
		if len(args) != 1 {
			return fmt.Errorf("servfail: want one DURATION, got %d arguments", len(args))
		}
		d, err := time.ParseDuration(args[0])
		if err != nil || d < 0 || d > 5*time.Minute {
			return fmt.Errorf("servfail: %q is not a duration between 0s and 5m", args[0])
		}
		s.ServfailTTL = d
	case "keepttl":
		if len(args) != 0 {
			return fmt.Errorf("keepttl: takes no arguments, got %q", args)
		}
		s.KeepTTL = true
	case "prefetch":
		return parsePrefetch(args, s)
	case "serve_stale":
		return parseServeStale(args, s)
	case "serve_stale_policy":
		if len(args) != 1 || !strings.EqualFold(args[0], "prefer_positive") {
			return fmt.Errorf("serve_stale_policy: want prefer_positive, got %q", args)
		}
		s.PreferPositive = true
	case "disable":
		return parseDisable(args, s)
	case "ecs":
		return parseECS(c, args, s)
	case "frontend":
		fc, err := frontend.Parse(c, args)
		s.Frontend = fc
		return err
	case "snapshot":
		sc, err := persist.ParseSnapshot(args)
		s.Snapshot = sc
		return err
	case "admin":
		return adminserver.Parse(c, args)
	case "shared":
		tc, err := tier.Parse(c, args)
		s.Shared = tc
		return err
	case "warmup":
		wc, err := persist.ParseWarmup(c, args)
		s.Warmup = wc
		return err
	case "kubernetes":
		kc, err := kube.Parse(c, args)
		s.Kubernetes = kc
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
	if n > 0 {
		n = max(n, MinEntryCap)
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
// capacity option does.
func ParseSize(s string) (int64, error) {
	num, scale := s, int64(1)
	for _, u := range sizeUnits {
		if strings.HasSuffix(s, u.suffix) {
			num, scale = strings.TrimSuffix(s, u.suffix), u.scale
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%q is not a size such as 64MiB, 1GiB or a number of bytes", s)
	}
	if n > store.MaxCapacity/scale {
		return 0, fmt.Errorf("%q is above the largest budget, %dGiB", s, store.MaxCapacity>>30)
	}
	return n * scale, nil
}

// parsePrefetch parses `prefetch AMOUNT [[DURATION] [PERCENTAGE%]]`. A
// DURATION under a second is a second: entries keep their hits in seconds.
func parsePrefetch(args []string, s *Settings) error {
	if len(args) == 0 || len(args) > 3 {
		return fmt.Errorf("prefetch: want AMOUNT [[DURATION] [PERCENTAGE%%]], got %d arguments", len(args))
	}
	n, err := strconv.Atoi(args[0])
	if err != nil || n < 0 || n > math.MaxUint16 {
		return fmt.Errorf("prefetch: AMOUNT %q is not a number of queries between 0 and %d", args[0], math.MaxUint16)
	}
	s.Prefetch = n
	rest := args[1:]
	if len(rest) > 0 && !strings.HasSuffix(rest[0], "%") {
		d, err := time.ParseDuration(rest[0])
		if err != nil || d <= 0 {
			return fmt.Errorf("prefetch: DURATION %q is not a positive duration such as 1m", rest[0])
		}
		s.PrefetchWindow = max(d, time.Second)
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
	s.PrefetchPercentage = p
	if len(rest) > 1 {
		return fmt.Errorf("prefetch: %q after PERCENTAGE %q; want AMOUNT [[DURATION] [PERCENTAGE%%]]", rest[1], rest[0])
	}
	return nil
}

// parseServeStale parses `serve_stale [DURATION] [immediate [RESPONSE_TTL
// [FAILURE_RECHECK]] | verify [VERIFY_TIMEOUT [RESPONSE_TTL [FAILURE_RECHECK]]]]`.
func parseServeStale(args []string, s *Settings) error {
	if len(args) > 5 {
		return fmt.Errorf("serve_stale: want at most 5 arguments, got %d", len(args))
	}
	s.StaleUpTo, s.VerifyStale, s.VerifyTimeout = time.Hour, false, 0
	s.StaleTTL, s.FailRecheck = DefaultStaleTTL, DefaultFailRecheck
	if len(args) == 0 {
		return nil
	}
	d, err := time.ParseDuration(args[0])
	if err != nil || d < 0 {
		return fmt.Errorf("serve_stale: DURATION %q is not a duration such as 1h", args[0])
	}
	s.StaleUpTo = d
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
		s.VerifyStale = true
		if len(rest) > 0 {
			t, err := time.ParseDuration(rest[0])
			if err != nil || t < 0 {
				return fmt.Errorf("serve_stale: VERIFY_TIMEOUT %q is not a duration such as 100ms", rest[0])
			}
			s.VerifyTimeout = t
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
		s.StaleTTL = t
	}
	if len(rest) > 1 {
		t, err := time.ParseDuration(rest[1])
		if err != nil || t < 0 || t > 5*time.Minute {
			return fmt.Errorf("serve_stale: FAILURE_RECHECK %q is not a duration between 0s and 5m", rest[1])
		}
		s.FailRecheck = t
	}
	return nil
}

// parseDisable parses `disable success|denial [ZONES...]`.
func parseDisable(args []string, s *Settings) error {
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
		s.DisableSuccess = zones
	case "denial":
		s.DisableDenial = zones
	default:
		return fmt.Errorf("disable: %q is not success or denial", args[0])
	}
	return nil
}

// parseECS parses `ecs [SOURCE4 [SOURCE6]] { add; max_variants N }`.
func parseECS(c *caddy.Controller, args []string, s *Settings) error {
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
			s.ECS.Source4 = n
		} else {
			s.ECS.Source6 = n
		}
	}
	return corefile.Block(c, func(opt string, args []string) error {
		switch opt {
		case "add":
			if len(args) != 0 {
				return fmt.Errorf("ecs: add takes no arguments, got %q", args)
			}
			s.ECS.Add = true
		case "max_variants":
			n := -1
			if len(args) == 1 {
				n, _ = strconv.Atoi(args[0])
			}
			if n < 1 || n > 1000 {
				return fmt.Errorf("ecs: max_variants wants one number between 1 and 1000, got %q", args)
			}
			s.ECS.MaxVariants = n
		default:
			return fmt.Errorf("ecs: unknown option %q", opt)
		}
		return nil
	})
}
