// Package adminserver is compactcache's admin endpoint: one HTTP listener
// per process and address, opened by the first block that configures it,
// through which operators flush, look up, dump, count and snapshot what
// every compactcache block of the instance holds. It knows the blocks only
// as a Cache, the small interface the plugin implements, as the prometheus
// plugin's listener knows nothing of the plugins it serves. The listener
// outlives reloads: blocks register their live cache with it when they
// start and leave when they shut down, and on a reload the new instance's
// blocks register before the old ones leave, so it never closes in
// between.
package adminserver

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/compactcache/compactcache/internal/admin"
	"github.com/compactcache/compactcache/internal/corefile"
	"github.com/compactcache/compactcache/internal/entry"
	"github.com/compactcache/compactcache/internal/flush"
	"github.com/compactcache/compactcache/internal/lifecycle"
	"github.com/coredns/caddy"
	clog "github.com/coredns/coredns/plugin/pkg/log"
)

var log = clog.NewWithPlugin("compactcache")

// Cache is what the endpoint reaches of one block's cache.
type Cache interface {
	// Flush drops what f covers and counts it; an error says what it
	// did not reach (the shared tier, the other replicas).
	Flush(f flush.Flush) (admin.Counts, error)
	// Entries calls each with every entry of name (lowercased wire form)
	// of one of types (every type when empty), under its shard's lock.
	Entries(name []byte, types []uint16, each func(e entry.Entry))
	// Walk calls visit with every entry, a chunk at a time under the
	// chunk's shard lock, and between, when given, after each chunk with
	// no lock held; between's error ends the walk.
	Walk(visit func(e entry.Entry), between func() error) error
	// Stats describes the cache and its counters.
	Stats() admin.Stats
	// Snapshot writes the cache in the snapshot format (internal/snapshot)
	// and returns the entries written.
	Snapshot(w io.Writer) (int, error)
	// Now is the cache's clock, unix seconds; Grace is how long, in
	// seconds, it serves entries past their TTL (serve_stale).
	Now() int64
	Grace() int64
}

// adminConfig is the `admin` option.
type adminConfig struct {
	addr      string // host:port
	tokenFile string // "" with insecure
	insecure  bool   // insecure_loopback: no token, on a loopback address only
}

// minTokenLen is the shortest token taken: a guessable token is no token.
const minTokenLen = 16

// Parse parses `admin ADDRESS { token_file PATH | insecure_loopback }`,
// the option whose name c is on. Every block of an instance that gives it
// must give the same; a block that does not is still reached through it.
func Parse(c *caddy.Controller, args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("admin: want one ADDRESS, got %d arguments", len(args))
	}
	cfg := adminConfig{addr: args[0]}
	host, port, err := net.SplitHostPort(cfg.addr)
	if err != nil {
		return fmt.Errorf("admin: ADDRESS %q is not HOST:PORT: %v", cfg.addr, err)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
		return fmt.Errorf("admin: ADDRESS %q: port %q is not a number between 0 and 65535", cfg.addr, port)
	}
	err = corefile.Block(c, func(opt string, vals []string) error {
		switch opt {
		case "token_file":
			if len(vals) != 1 {
				return fmt.Errorf("admin: token_file wants one PATH, got %q", vals)
			}
			cfg.tokenFile = vals[0]
		case "insecure_loopback":
			if len(vals) != 0 {
				return fmt.Errorf("admin: insecure_loopback takes no arguments, got %q", vals)
			}
			cfg.insecure = true
		default:
			return fmt.Errorf("admin: unknown option %q", opt)
		}
		return nil
	})
	if err != nil {
		return err
	}
	switch {
	case cfg.tokenFile != "" && cfg.insecure:
		return fmt.Errorf("admin: token_file and insecure_loopback: give one")
	case cfg.tokenFile == "" && !cfg.insecure:
		return fmt.Errorf("admin: %s needs token_file PATH (a bearer token), or insecure_loopback on a loopback address", cfg.addr)
	case cfg.insecure && !loopback(host):
		return fmt.Errorf("admin: insecure_loopback on %q, which is not a loopback address: give a token_file", cfg.addr)
	}
	ai := &adminInstance{cfg: cfg, from: strings.Join(c.ServerBlockKeys, " ")}
	if cfg.tokenFile != "" {
		ai.token = &tokenFile{path: cfg.tokenFile}
		if err := ai.token.load(); err != nil {
			return fmt.Errorf("admin: token_file: %w", err)
		}
	}
	if prev, ok := c.Get(adminInstanceKey{}).(*adminInstance); ok {
		if prev.cfg != cfg {
			return fmt.Errorf("admin: block %q says %s, block %q said %s: the listener is one per process, every block that configures it must agree", ai.from, cfg, prev.from, prev.cfg)
		}
		return nil
	}
	c.Set(adminInstanceKey{}, ai)
	return nil
}

func (cfg adminConfig) String() string {
	if cfg.insecure {
		return cfg.addr + " { insecure_loopback }"
	}
	return cfg.addr + " { token_file " + cfg.tokenFile + " }"
}

// loopback reports whether host names only the loopback interface.
func loopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// tokenFile is the bearer token, read from its file at startup and again
// whenever the file changes (a Kubernetes Secret's rotation), so that a new
// token takes effect without a reload. A file that cannot be read or holds
// no token then keeps the token in force.
type tokenFile struct {
	path string

	mu     sync.Mutex
	digest [sha256.Size]byte
	mod    time.Time
	size   int64
}

// load reads the token; the caller holds t.mu or is its only user.
func (t *tokenFile) load() error {
	fi, err := os.Stat(t.path)
	if err != nil {
		return err
	}
	tok, err := admin.ReadToken(t.path)
	if err != nil {
		return err
	}
	if len(tok) < minTokenLen {
		return fmt.Errorf("%s holds %d bytes of token, want at least %d", t.path, len(tok), minTokenLen)
	}
	t.digest, t.mod, t.size = sha256.Sum256(tok), fi.ModTime(), fi.Size()
	return nil
}

// matches reports whether got is the token, in time that does not depend
// on how much of it is right: the digests are compared, in constant time.
func (t *tokenFile) matches(got string) bool {
	t.mu.Lock()
	if fi, err := os.Stat(t.path); err == nil && (!fi.ModTime().Equal(t.mod) || fi.Size() != t.size) {
		if err := t.load(); err != nil {
			log.Errorf("admin: token_file changed and cannot be taken, the previous token stays: %v", err)
			t.mod, t.size = fi.ModTime(), fi.Size() // said once per change
		}
	}
	want := t.digest
	t.mu.Unlock()
	d := sha256.Sum256([]byte(got))
	return subtle.ConstantTimeCompare(d[:], want[:]) == 1
}

// adminInstance is what the blocks of one caddy instance share: the admin
// configuration they agreed on. It lives in the instance's storage.
type adminInstance struct {
	cfg   adminConfig
	from  string // the block that gave it first, for errors
	token *tokenFile
}

type adminInstanceKey struct{}

// adminBlock is one block registered with a listener.
type adminBlock struct {
	inst *adminInstance
	c    Cache
	info admin.Block
}

// Hooks registers a block's cache with the instance's admin listener when
// the instance has one. info is called at startup, once the plugin's own
// startup hooks, which come first, have settled the block's name and
// which store is live.
func Hooks(c *caddy.Controller, ca Cache, info func() admin.Block) {
	var reg *adminBlock
	c.OnStartup(func() error {
		ai, ok := c.Get(adminInstanceKey{}).(*adminInstance)
		if !ok {
			return nil
		}
		reg = &adminBlock{inst: ai, c: ca, info: info()}
		if err := admins.register(reg); err != nil {
			return err
		}
		registered.Add(c, reg)
		return nil
	})
	// After health's lameduck at the process's stop: a peer warming up
	// from this replica, which is leaving its Service, still gets its
	// snapshot.
	lifecycle.OnStop(c, func() {
		if reg != nil {
			admins.unregister(reg)
		}
	})
}

// registered are the blocks registered until their instance's servers are
// up; those of an instance that never starts (a failed reload, which also
// never shuts down) are taken off.
var registered = lifecycle.New(nil, admins.unregister)

// admins are the process's admin listeners, by address.
var admins = adminRegistry{servers: map[string]*adminServer{}}

type adminRegistry struct {
	mu      sync.Mutex
	servers map[string]*adminServer
}

// adminServer is one listener and the blocks it reaches.
type adminServer struct {
	addr string
	ln   net.Listener
	http *http.Server
	// writeTimeout bounds each write of a reply: a client that stops
	// reading a stream (a dump, a snapshot) would hold the handler, and
	// the walk of the store it makes, for good.
	writeTimeout time.Duration

	blocks []*adminBlock // in the order they registered; guarded by admins.mu
}

// register adds b to its instance's listener, opening it if need be.
func (r *adminRegistry) register(b *adminBlock) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	addr := b.inst.cfg.addr
	s := r.servers[addr]
	if s == nil {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("admin: %w", err)
		}
		s = &adminServer{addr: addr, ln: ln, writeTimeout: writeTimeout}
		s.http = &http.Server{Handler: s, ReadTimeout: readTimeout, IdleTimeout: time.Minute}
		go s.http.Serve(ln)
		r.servers[addr] = s
		log.Infof("admin: listening on %s", ln.Addr())
		if b.inst.cfg.insecure {
			log.Warningf("admin: %s takes requests without a token (insecure_loopback): every process in this network namespace can flush the cache, on a hostNetwork pod every process on the node", ln.Addr())
		}
	}
	s.blocks = append(s.blocks, b)
	return nil
}

// unregister takes b off its listener, and closes the listener when b was
// its last block.
func (r *adminRegistry) unregister(b *adminBlock) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.remove(func(x *adminBlock) bool { return x == b })
}

// readTimeout bounds the reading of a request, its head and its body: no
// operation takes a body, but the server reads one to its end before it
// replies, and a client that declares one and never sends it would hold
// its connection for good. A handler's reply is not bound by it.
var readTimeout = 10 * time.Second

// writeTimeout is a listener's adminServer.writeTimeout.
var writeTimeout = 30 * time.Second

// drainTimeout bounds how long a listener that closes lets the requests
// under way (a dump, a long flush_zone) finish before it cuts them.
var drainTimeout = 10 * time.Second

// remove takes the blocks drop picks off every listener and closes the
// listeners left without blocks. The caller holds r.mu.
func (r *adminRegistry) remove(drop func(*adminBlock) bool) {
	for addr, s := range r.servers {
		s.blocks = slices.DeleteFunc(s.blocks, drop)
		if len(s.blocks) == 0 {
			// The listener at once, so that the address is free for a
			// reload that opens it again (Shutdown closes only what Serve
			// has taken, and the goroutine of a listener just opened may
			// not have yet); the requests under way in the background.
			s.ln.Close()
			go s.drain(drainTimeout)
			delete(r.servers, addr)
			log.Infof("admin: closed %s", s.ln.Addr())
		}
	}
}

// drain lets the requests under way on a closed listener finish, for at
// most timeout, and then cuts those left.
func (s *adminServer) drain(timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := s.http.Shutdown(ctx); err != nil {
		log.Warningf("admin: requests under way on %s cut after %s: %v", s.ln.Addr(), timeout, err)
		s.http.Close()
	}
}

// view is what one request sees of a listener: the instance whose settings
// apply (the newest's), and the live block of each name (the newest's,
// which a reload hands the store), in the order they first registered.
func (s *adminServer) view() (*adminInstance, []*adminBlock) {
	admins.mu.Lock()
	defer admins.mu.Unlock()
	if len(s.blocks) == 0 {
		return nil, nil
	}
	var live []*adminBlock
	at := map[string]int{}
	for _, b := range s.blocks {
		if i, ok := at[b.info.Name]; ok {
			live[i] = b
			continue
		}
		at[b.info.Name] = len(live)
		live = append(live, b)
	}
	return s.blocks[len(s.blocks)-1].inst, live
}
