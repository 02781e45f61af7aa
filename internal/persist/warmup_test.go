package persist

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/store"
	"github.com/coredns/caddy"
)

// TestWarmupAsksThePeerAlone: the warm-up's request, which carries the
// admin token, goes to the peer at URL and nowhere else: a redirect, which
// an admin endpoint never answers, is not followed (Go's client would send
// the token on to another port of the same host), and no proxy of the
// environment is asked.
func TestWarmupAsksThePeerAlone(t *testing.T) {
	var elsewhere atomic.Int64
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "" {
			elsewhere.Add(1)
		}
	}))
	t.Cleanup(other.Close)
	peer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+r.URL.RequestURI(), http.StatusFound)
	}))
	t.Cleanup(peer.Close)
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("a-token-of-the-admin-endpoint\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := store.New(store.MinCapacity, store.PerKind{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	wc := &Warmup{url: peer.URL, tokenFile: token, timeout: 5 * time.Second}
	_, err = wc.fill(testCache{s: s}, "b")
	if err == nil || !strings.Contains(err.Error(), "302") {
		t.Errorf("a peer that redirects: error %v, want its answer, 302", err)
	}
	if n := elsewhere.Load(); n != 0 {
		t.Errorf("the token was sent on to the redirect's target %d times", n)
	}
	if tr, ok := warmupClient.Transport.(*http.Transport); !ok || tr.Proxy != nil {
		t.Errorf("the warm-up's client asks a proxy of the environment")
	}
}

// TestParseWarmup: the URL of a peer's admin endpoint, and nothing that
// would put a secret where the logs and the metrics' path label show it:
// the token comes from token_file.
func TestParseWarmup(t *testing.T) {
	for _, tc := range []struct {
		input string
		ok    bool
	}{
		{"warmup http://10.0.0.1:8053", true},
		{"warmup https://peers.kube-system.svc:8053/ {\n timeout 3s\n}", true},
		{"warmup peers:8053", false},
		{"warmup http://", false},
		{"warmup http://admin:secret@10.0.0.1:8053", false},
		{"warmup http://admin@10.0.0.1:8053", false},
		{"warmup http://10.0.0.1:8053 {\n timeout 0s\n}", false},
	} {
		c := caddy.NewTestController("dns", tc.input)
		c.Next()
		_, err := ParseWarmup(c, c.RemainingArgs())
		if (err == nil) != tc.ok {
			t.Errorf("%q: error %v, want ok %v", tc.input, err, tc.ok)
		}
	}
}

// TestWarmupSaysWhyThePeerRefused: a peer that refuses the warm-up (a
// wrong token, a block it does not have) says why, and the error, logged,
// says it too, quoted: the peer's words are not the log's lines.
func TestWarmupSaysWhyThePeerRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		code int
		body string
		want string
	}{
		{"the admin's error", http.StatusNotFound, `{"error":"block: no block \"b\"; the blocks are \"a\""}`, `404 Not Found: "block: no block \"b\"; the blocks are \"a\""`},
		{"another body", http.StatusUnauthorized, "no\nentry", `401 Unauthorized: "no\nentry"`},
		{"a long body", http.StatusBadGateway, strings.Repeat("x", 10000), `502 Bad Gateway: "` + strings.Repeat("x", 200) + `"`},
	} {
		peer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(tc.code)
			w.Write([]byte(tc.body))
		}))
		s, err := store.New(store.MinCapacity, store.PerKind{}, 0)
		if err != nil {
			t.Fatal(err)
		}
		wc := &Warmup{url: peer.URL, timeout: 5 * time.Second}
		_, err = wc.fill(testCache{s: s}, "b")
		peer.Close()
		if err == nil || !strings.HasSuffix(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want it to end %s", tc.name, err, tc.want)
		}
	}
}
