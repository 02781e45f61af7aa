package kube

import (
	"context"
	"fmt"
	"net/http"
	"path"
	"sync/atomic"
	"time"

	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// conn is how to reach the API server, as the kubernetes plugin's options
// say it: a kubeconfig file, or an endpoint with its TLS files, or else
// the pod's own service account (in cluster).
type conn struct {
	kubeconfig, context    string
	endpoint               string
	tlsCert, tlsKey, tlsCA string
}

// String is the connection as a watch shared by blocks is keyed.
func (c conn) String() string {
	return fmt.Sprintf("kubeconfig=%q context=%q endpoint=%q tls=%q,%q,%q", c.kubeconfig, c.context, c.endpoint, c.tlsCert, c.tlsKey, c.tlsCA)
}

// restConfig is the client configuration of c, asking for protobuf (the
// smaller encoding, as the kubernetes plugin does).
func (c conn) restConfig() (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	switch {
	case c.kubeconfig != "":
		rules := &clientcmd.ClientConfigLoadingRules{ExplicitPath: c.kubeconfig}
		cfg, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: c.context}).ClientConfig()
	case c.endpoint != "":
		over := &clientcmd.ConfigOverrides{
			ClusterInfo: clientcmdapi.Cluster{Server: c.endpoint, CertificateAuthority: c.tlsCA},
			AuthInfo:    clientcmdapi.AuthInfo{ClientCertificate: c.tlsCert, ClientKey: c.tlsKey},
		}
		cfg, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(&clientcmd.ClientConfigLoadingRules{}, over).ClientConfig()
	default:
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, err
	}
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.UserAgent = "compactcache"
	return cfg, nil
}

// probeEvery is how often the API server is asked whether it is ready,
// and probeTimeout how long an answer may take. An informer does not say
// when its watch fails; a failed probe does, within probeEvery.
const (
	probeEvery   = 10 * time.Second
	probeTimeout = 5 * time.Second
)

// prober asks the API server's /readyz, which every client may read
// (the system:public-info-viewer role): it costs the API server no list
// and no watch, and a refusal never shows as a denied request.
type prober struct {
	rc rest.Interface
}

func newProber(cfg *rest.Config) (*prober, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.Timeout = probeTimeout
	cs, err := k8s.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &prober{rc: cs.Discovery().RESTClient()}, nil
}

func (p *prober) probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	return p.rc.Get().AbsPath("/readyz").Do(ctx).Error()
}

// metered counts a client's requests by kind and the bytes of their
// responses' bodies: the API load of a watch of its own. It tells
// watching the resource of each watch the API server accepts.
type metered struct {
	next                         http.RoundTripper
	lists, watches, other, bytes *atomic.Int64
	watching                     func(resource string)
}

func (m metered) RoundTrip(r *http.Request) (*http.Response, error) {
	q := r.URL.Query()
	watch := q.Get("watch") == "true" || q.Get("watch") == "1"
	switch {
	case watch:
		m.watches.Add(1)
	case r.Method == http.MethodGet && r.URL.Path != "/readyz":
		m.lists.Add(1)
	default:
		m.other.Add(1)
	}
	resp, err := m.next.RoundTrip(r)
	if err == nil && watch && resp.StatusCode/100 == 2 {
		m.watching(path.Base(r.URL.Path))
	}
	if err == nil && resp.Body != nil {
		resp.Body = countingBody{resp.Body, m.bytes}
	}
	return resp, err
}

type countingBody struct {
	body interface {
		Read([]byte) (int, error)
		Close() error
	}
	n *atomic.Int64
}

func (c countingBody) Read(p []byte) (int, error) {
	n, err := c.body.Read(p)
	c.n.Add(int64(n))
	return n, err
}

func (c countingBody) Close() error { return c.body.Close() }
