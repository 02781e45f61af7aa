package kube

import (
	"fmt"
	"net/url"
	"os"

	"github.com/compactcache/compactcache/internal/corefile"
	"github.com/coredns/caddy"
	"github.com/coredns/coredns/plugin"
)

// Config is the `kubernetes` option of a compactcache block:
//
//	kubernetes
//	kubernetes [ZONES...] {
//	    kubeconfig KUBECONFIG [CONTEXT]
//	    endpoint URL
//	    tls CERT KEY CACERT
//	    endpoint_pod_names
//	}
//
// Alone, it follows the kubernetes plugin of the block, behind the cache:
// its informers, its zones and its options; no second watch. With ZONES
// or a block, the cache watches Services and EndpointSlices itself, for a
// block without the kubernetes plugin (a node-local cache): ZONES are the
// zones the cluster DNS serves (cluster.local in-addr.arpa ip6.arpa), the
// block's own zones when none are given; the API server is reached as the
// kubernetes plugin reaches it with the same settings (a kubeconfig, an
// endpoint with TLS files, or else the pod's service account);
// endpoint_pod_names is to be given where the cluster DNS gives it.
type Config struct {
	watch    bool
	zones    []string
	conn     conn
	podNames bool
}

// Watch reports whether the option asks for a watch of its own.
func (c *Config) Watch() bool { return c.watch }

// Parse parses the option whose name c is on, args its arguments.
func Parse(c *caddy.Controller, args []string) (*Config, error) {
	cfg := &Config{watch: len(args) > 0}
	for _, z := range args {
		n := plugin.Name(z).Normalize()
		if n == "" {
			return nil, fmt.Errorf("kubernetes: zone %q is not a domain name", z)
		}
		cfg.zones = append(cfg.zones, n)
	}
	err := corefile.Block(c, func(opt string, vals []string) error {
		cfg.watch = true
		switch opt {
		case "kubeconfig":
			if len(vals) < 1 || len(vals) > 2 {
				return fmt.Errorf("kubernetes: kubeconfig wants KUBECONFIG [CONTEXT], got %q", vals)
			}
			if err := readable(vals[0]); err != nil {
				return fmt.Errorf("kubernetes: kubeconfig: %w", err)
			}
			cfg.conn.kubeconfig = vals[0]
			if len(vals) == 2 {
				cfg.conn.context = vals[1]
			}
		case "endpoint":
			if len(vals) != 1 {
				return fmt.Errorf("kubernetes: endpoint wants one URL, got %q", vals)
			}
			u, err := url.Parse(vals[0])
			if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
				return fmt.Errorf("kubernetes: endpoint %q is not an http or https URL", vals[0])
			}
			cfg.conn.endpoint = vals[0]
		case "tls":
			if len(vals) != 3 {
				return fmt.Errorf("kubernetes: tls wants CERT KEY CACERT, got %q", vals)
			}
			for _, f := range vals {
				if err := readable(f); err != nil {
					return fmt.Errorf("kubernetes: tls: %w", err)
				}
			}
			cfg.conn.tlsCert, cfg.conn.tlsKey, cfg.conn.tlsCA = vals[0], vals[1], vals[2]
		case "endpoint_pod_names":
			if len(vals) != 0 {
				return fmt.Errorf("kubernetes: endpoint_pod_names takes no arguments, got %q", vals)
			}
			cfg.podNames = true
		default:
			return fmt.Errorf("kubernetes: unknown option %q", opt)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if cfg.conn.kubeconfig != "" && (cfg.conn.endpoint != "" || cfg.conn.tlsCA != "") {
		return nil, fmt.Errorf("kubernetes: kubeconfig and endpoint or tls exclude each other: the kubeconfig names the server and its credentials")
	}
	return cfg, nil
}

func readable(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	return f.Close()
}
