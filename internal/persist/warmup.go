package persist

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/compactcache/compactcache/internal/admin"
	"github.com/compactcache/compactcache/internal/cachemetrics"
	"github.com/compactcache/compactcache/internal/corefile"
	"github.com/compactcache/compactcache/internal/snapshot"
	"github.com/coredns/caddy"
)

// With `warmup URL { token_file PATH; timeout DURATION }`, a block that
// starts with its process fills its store from a peer's admin endpoint (the
// snapshot operation), for the pods of a Deployment that land on nodes
// without a snapshot file: a new replica asks a running one. The fill runs
// in the background while the plugin reports not ready to the ready plugin,
// which keeps the pod out of its Service until the fill is done or given
// up; a reload never fills. The stream is a snapshot file (internal/
// snapshot): the sender's clock and format version in its header, every
// entry checked, nothing stored from a stream that fails.

// Warmup is the `warmup` option.
type Warmup struct {
	url       string // the peer's admin endpoint, http://HOST:PORT
	tokenFile string
	timeout   time.Duration
}

const defaultWarmupTimeout = 10 * time.Second

// warmupClient asks the peer at the warm-up's URL alone, which the request's
// token is for: not a proxy of the environment (HTTP_PROXY), nor the
// target of a redirect, which an admin endpoint never answers and Go's
// client would send the token on to, on another port of the same host.
var warmupClient = &http.Client{
	Transport: func() *http.Transport {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.Proxy = nil
		return t
	}(),
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

// ParseWarmup parses the option whose name c is on.
func ParseWarmup(c *caddy.Controller, args []string) (*Warmup, error) {
	if len(args) != 1 {
		return nil, fmt.Errorf("warmup: want one URL, got %d arguments", len(args))
	}
	u, err := url.Parse(args[0])
	if err != nil || u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("warmup: %q is not an http:// or https:// URL of a peer's admin endpoint", args[0])
	}
	// The URL is logged and labels the warm-ups' errors: a secret in it
	// would be shown wherever they are.
	if u.User != nil {
		return nil, fmt.Errorf("warmup: %s carries credentials: give the token with token_file", u.Redacted())
	}
	wc := &Warmup{url: strings.TrimSuffix(args[0], "/"), timeout: defaultWarmupTimeout}
	err = corefile.Block(c, func(opt string, vals []string) error {
		switch opt {
		case "token_file":
			if len(vals) != 1 {
				return fmt.Errorf("warmup: token_file wants one PATH, got %q", vals)
			}
			wc.tokenFile = vals[0]
		case "timeout":
			d, err := time.ParseDuration(strings.Join(vals, " "))
			if len(vals) != 1 || err != nil || d <= 0 {
				return fmt.Errorf("warmup: timeout %q is not a duration above 0", vals)
			}
			wc.timeout = d
		default:
			return fmt.Errorf("warmup: unknown option %q", opt)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return wc, nil
}

// warming counts the fills in progress in the process. The ready plugin
// keeps one Readiness per plugin name, whichever block's it met last, so
// every compactcache block reports them all (Warming).
var warming atomic.Int64

// Warming reports whether a block of the process fills its store from a
// peer.
func Warming() bool { return warming.Load() != 0 }

// Start fills the store of the block named block from the peer in the
// background; the plugin calls it once, at the process's first startup.
func (wc *Warmup) Start(ca Cache, block string) {
	warming.Add(1)
	go func() {
		defer warming.Add(-1)
		start := time.Now()
		l, err := wc.fill(ca, block)
		switch {
		case errors.Is(err, snapshot.ErrSettings) || errors.Is(err, snapshot.ErrVersion):
			log.Infof("Warm-up of %s from %s: the peer's cache settings or format differ, starting cold: %v", block, wc.url, err)
		case err != nil:
			cachemetrics.SnapshotErrors.WithLabelValues(wc.url, "warmup").Inc()
			log.Warningf("Warm-up of %s from %s: starting cold: %v", block, wc.url, err)
		default:
			log.Infof("Warm-up of %s from %s: %d entries in %v, %d expired", block, wc.url, l.Entries, time.Since(start).Round(time.Millisecond), l.Expired)
		}
	}()
}

func (wc *Warmup) fill(ca Cache, block string) (snapshot.Loaded, error) {
	// The flushes begun from here on, before the peer takes its stream,
	// cover what the stream holds.
	gen := ca.Fence().Gen()
	ctx, cancel := context.WithTimeout(context.Background(), wc.timeout)
	defer cancel()
	u := wc.url + admin.Prefix + admin.OpSnapshot + "?" + url.Values{admin.ParamBlock: {block}}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return snapshot.Loaded{}, err
	}
	if wc.tokenFile != "" {
		tok, err := admin.ReadToken(wc.tokenFile)
		if err != nil {
			return snapshot.Loaded{}, err
		}
		req.Header.Set("Authorization", "Bearer "+string(tok))
	}
	resp, err := warmupClient.Do(req)
	if err != nil {
		return snapshot.Loaded{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return snapshot.Loaded{}, fmt.Errorf("the peer answered %s: %q", resp.Status, refusal(resp.Body))
	}
	return read(ca, resp.Body, gen)
}

// refusal returns why a peer's body says it refused: the admin endpoint's
// error (a wrong token, a block it does not have, which it names), or the
// first bytes of another body.
func refusal(body io.Reader) string {
	b, _ := io.ReadAll(io.LimitReader(body, 4<<10))
	var e admin.Error
	if json.Unmarshal(b, &e) == nil && e.Error != "" {
		return e.Error
	}
	return string(bytes.TrimSpace(b[:min(len(b), 200)]))
}
