package tier

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/compactcache/compactcache/internal/coredns"
	"github.com/compactcache/compactcache/internal/corefile"
	"github.com/coredns/caddy"
)

// DefaultTimeout is how long a lookup waits for the tier. A round trip to
// a Redis on the same network takes well under a millisecond; an answer
// that comes later than an upstream's would have is worth nothing, and the
// upstream of cluster DNS is itself near.
const DefaultTimeout = 20 * time.Millisecond

// minSecretLen is the shortest secret taken: a guessable secret
// authenticates nothing.
const minSecretLen = 16

// defaultQueue is how many entries wait to be written at most; past it
// new ones are dropped.
const defaultQueue = 4096

// Config is the `shared` option:
//
//	shared URL... {
//	    secret_file PATH
//	    password_file PATH
//	    timeout DURATION
//	    sentinel MASTER
//	    tls_ca PATH
//	    tls_server_name NAME
//	    write_queue N
//	}
//
// URL is redis://[USER@]HOST:PORT[/DB] or rediss:// for TLS; several name
// the seeds of a Cluster, or with sentinel the Sentinels.
type Config struct {
	addrs      []string
	tls        bool
	username   string
	db         int
	password   string // read from password_file
	secret     []byte // read from secret_file; nil without one
	sentinel   string // the master set's name
	caFile     string
	serverName string
	timeout    time.Duration
	queue      int
	// The TLS of rediss://, made by Parse: tls_ca read again at the start
	// could be gone, and a nil config would connect in the clear.
	tlsConf *tls.Config
	ports   []string   // of the block's servers
	peers   *[]*Config // the tiers of the block's Corefile (blocks.go)
}

// Parse parses the option whose name c is on, reading its files: a
// missing or short secret, or an unreadable password, stops the start.
func Parse(c *caddy.Controller, args []string) (*Config, error) {
	if len(args) == 0 {
		return nil, fmt.Errorf("shared: want a redis:// or rediss:// URL")
	}
	cfg := &Config{timeout: DefaultTimeout, queue: defaultQueue}
	for i, a := range args {
		if err := cfg.addURL(a, i == 0); err != nil {
			return nil, err
		}
	}
	var secretFile, passwordFile string
	seen := map[string]bool{}
	err := corefile.Block(c, func(opt string, vals []string) error {
		// A second value of a setting would silently replace the first.
		if seen[opt] {
			return fmt.Errorf("shared: %s given twice", opt)
		}
		seen[opt] = true
		one := func() (string, error) {
			if len(vals) != 1 {
				return "", fmt.Errorf("shared: %s wants one value, got %q", opt, vals)
			}
			return vals[0], nil
		}
		var err error
		switch opt {
		case "secret_file":
			secretFile, err = one()
		case "password_file":
			passwordFile, err = one()
		case "sentinel":
			cfg.sentinel, err = one()
		case "tls_ca":
			cfg.caFile, err = one()
		case "tls_server_name":
			cfg.serverName, err = one()
		case "timeout":
			var v string
			if v, err = one(); err == nil {
				d, perr := time.ParseDuration(v)
				if perr != nil || d <= 0 || d > 10*time.Second {
					return fmt.Errorf("shared: timeout %q is not a duration between 0 and 10s", v)
				}
				cfg.timeout = d
			}
		case "write_queue":
			var v string
			if v, err = one(); err == nil {
				n, perr := strconv.Atoi(v)
				if perr != nil || n < 1 || n > 1<<20 {
					return fmt.Errorf("shared: write_queue %q is not a number between 1 and %d", v, 1<<20)
				}
				cfg.queue = n
			}
		default:
			return fmt.Errorf("shared: unknown option %q", opt)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	if secretFile != "" {
		if cfg.secret, err = readSecret(secretFile, minSecretLen); err != nil {
			return nil, fmt.Errorf("shared: secret_file: %w", err)
		}
	}
	if passwordFile != "" {
		p, err := readSecret(passwordFile, 1)
		if err != nil {
			return nil, fmt.Errorf("shared: password_file: %w", err)
		}
		cfg.password = string(p)
	}
	if (cfg.caFile != "" || cfg.serverName != "") && !cfg.tls {
		return nil, fmt.Errorf("shared: tls_ca or tls_server_name without a rediss:// URL")
	}
	if cfg.tlsConf, err = cfg.tlsConfig(); err != nil {
		return nil, err
	}
	cfg.ports = coredns.Ports(c)
	declare(c.Context(), cfg)
	return cfg, nil
}

// addURL takes one URL of the option; the first sets the scheme, user and
// database, which the others must share.
func (cfg *Config) addURL(s string, first bool) error {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "redis" && u.Scheme != "rediss") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("shared: %q is not a URL such as redis://HOST:PORT or rediss://USER@HOST:PORT/DB", s)
	}
	if _, has := u.User.Password(); has {
		return fmt.Errorf("shared: %q holds a password: give it in password_file", s)
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil || host == "" {
		return fmt.Errorf("shared: %q: want HOST:PORT", s)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("shared: %q: port %q is not a number between 1 and 65535", s, port)
	}
	db := 0
	if path := strings.TrimPrefix(u.Path, "/"); path != "" {
		if db, err = strconv.Atoi(path); err != nil || db < 0 {
			return fmt.Errorf("shared: %q: database %q is not a number", s, path)
		}
	}
	tls, user := u.Scheme == "rediss", u.User.Username()
	if first {
		cfg.tls, cfg.username, cfg.db = tls, user, db
	} else if tls != cfg.tls || user != cfg.username || db != cfg.db {
		return fmt.Errorf("shared: %q: every URL must have the scheme, user and database of the first", s)
	}
	cfg.addrs = append(cfg.addrs, u.Host)
	return nil
}

// readSecret reads a file that holds one token (trailing white space
// aside) of at least min bytes.
func readSecret(path string, min int) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	b = []byte(strings.TrimRight(string(b), " \t\r\n"))
	if len(b) < min {
		return nil, fmt.Errorf("%s holds %d bytes, want at least %d", path, len(b), min)
	}
	return b, nil
}

// tlsConfig is the TLS of rediss:// URLs: the system's roots, or those of
// tls_ca.
func (cfg *Config) tlsConfig() (*tls.Config, error) {
	if !cfg.tls {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: cfg.serverName}
	if cfg.caFile != "" {
		pem, err := os.ReadFile(cfg.caFile)
		if err != nil {
			return nil, fmt.Errorf("shared: tls_ca: %w", err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("shared: tls_ca: %s holds no PEM certificate", cfg.caFile)
		}
	}
	return tc, nil
}

// Timeout is how long a lookup waits.
func (cfg *Config) Timeout() time.Duration { return cfg.timeout }

// String names the tier for logs and metrics: its addresses, without
// credentials.
func (cfg *Config) String() string {
	scheme := "redis"
	if cfg.tls {
		scheme = "rediss"
	}
	return scheme + "://" + strings.Join(cfg.addrs, ",")
}
